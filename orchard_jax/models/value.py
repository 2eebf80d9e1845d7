"""Value model: the policy backbone with a scalar head (docs/algorithms.md section 6).

values[b, t] is the logit of P(resolved | tokens up to and including t of row b's segment);
the value recipe trains it with binary cross-entropy on the trajectory's resolved label, at
the final position (or every position), and reranks k candidates by it.
"""
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from orchard_jax.models.config import ModelConfig
from orchard_jax.models.decoder import CausalLM, Decoder
from orchard_jax.models.errors import ModelError
from orchard_jax.models.layers import constant, dtype_of, normal, param


class ValueModel(nnx.Module):
  """Decoder backbone + linear scalar head.

  Call:
    values = vm(input_ids, positions, segment_ids)          # [batch, seq] float32 logits
    values, aux = vm(input_ids, positions, segment_ids, return_aux=True)
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.model = Decoder(config, rngs=rngs)
    self.value_head, self.value_bias = self._head(config, rngs)

  @staticmethod
  def _head(config: ModelConfig, rngs: nnx.Rngs) -> tuple[nnx.Param, nnx.Param]:
    pdt = dtype_of(config.param_dtype)
    return (param(rngs, normal(config.initializer_range), (config.hidden_size,), ("embed",),
                  pdt),
            param(rngs, constant(0.0), (), (), pdt))

  def __call__(self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array, *,
               return_aux: bool = False):
    """Per-position value logits.

    Args:
      input_ids, positions, segment_ids: [batch, seq] int32, as CausalLM.__call__.
      return_aux: also return the backbone's aux (load-balancing loss, expert load).
    Returns:
      values [batch, seq] float32 (0 where segment_ids == 0), and aux when asked.
    """
    h, aux, _ = self.model(input_ids, positions, segment_ids)
    values = jnp.einsum("bsd,d->bs", h.astype(jnp.float32),
                        self.value_head[...].astype(jnp.float32))
    values = (values + self.value_bias[...].astype(jnp.float32)) * (segment_ids != 0)
    return (values, aux) if return_aux else values

  @classmethod
  def from_policy(cls, policy: CausalLM, *, rngs: nnx.Rngs,
                  config: Optional[ModelConfig] = None) -> "ValueModel":
    """A value model whose backbone starts as a copy of `policy`'s (embedding, layers, final
    norm); the head is freshly initialised. Arrays are copied, so donating one model's buffers
    in a jitted step never invalidates the other's.

    Args:
      policy: a CausalLM (e.g. from models.hf.load_pretrained).
      rngs: for the head.
      config: defaults to policy.config; may differ only in computation fields (dtype, remat,
        dispatch), not in shapes.
    Raises:
      ModelError: `config` changes the backbone's parameter shapes.
    """
    config = config or policy.config
    # Build the structure abstractly (no wasted initialisation of a backbone that is about to
    # be overwritten), copy the policy's backbone in, then initialise only the head.
    vm = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    backbone = nnx.state(policy.model, nnx.Param)
    target = nnx.state(vm.model, nnx.Param)
    shapes_a = jax.tree.map(lambda x: (x.shape, x.dtype), backbone)
    shapes_b = jax.tree.map(lambda x: (x.shape, x.dtype), target)
    if jax.tree.structure(shapes_a) != jax.tree.structure(shapes_b) or jax.tree.leaves(
        shapes_a) != jax.tree.leaves(shapes_b):
      raise ModelError("ValueModel.from_policy: the config changes the backbone's parameters; "
                       "expected the policy's shapes and dtypes")
    nnx.update(vm.model, jax.tree.map(jnp.copy, backbone))
    head = cls._head(config, rngs)
    vm.value_head, vm.value_bias = head
    return vm
