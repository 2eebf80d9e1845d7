"""The jitted, sharded train step: microbatched gradient accumulation, AdamW, metrics.

The train state is a pytree of plain dicts (portable across orbax, meshes and rooms):
  {"step": int32 scalar (optimiser updates taken), "params": nested dict of arrays (the model's
   nnx.Param values as nnx.to_pure_dict gives them, in param_dtype: float32 master weights by
   default; all of them, frozen or not), "opt_state": optax state over the trained params
   (`partition_params`: all params unless some are frozen), "rng": uint32[2] PRNG key}.

Frozen parameters (layer freezing, a frozen vision tower; OptimizerConfig.frozen) are split off
before differentiation: the gradient is taken with respect to the trained params alone and the
frozen ones enter the loss as constants, so JAX neither differentiates nor back-propagates
through computation that depends on frozen params only.

Mixed precision: the model computes in ModelConfig.dtype (bfloat16 for real runs) from its
float32 parameters (ModelConfig.param_dtype), so gradients and AdamW moments stay float32.
"""
import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orchard_jax import parallel
from orchard_jax.train.errors import TrainError
from orchard_jax.train.optimizer import frozen_mask

BATCH_AXES = ("data", "fsdp", "expert")


def batch_partition_spec(mesh: Mesh, shape: tuple[int, ...]) -> PartitionSpec:
  """How a [batch, seq, ...] batch array is laid out: the logical "batch" axis under the current
  rules (data, fsdp, expert by default), dropping mesh axes that do not divide it."""
  logical = ("batch", "seq") + (None,) * (len(shape) - 2)
  return parallel.logical_to_spec(logical[:len(shape)], mesh_shape=dict(mesh.shape),
                                  shape=shape)


def data_parallel_size(mesh: Mesh) -> int:
  """Number of ways the batch dimension is split (product of the data-like mesh axes)."""
  shape = dict(mesh.shape)
  size = 1
  for axis in BATCH_AXES:
    size *= shape.get(axis, 1)
  return size


@dataclasses.dataclass
class ModelParts:
  """A model split for functional training: graphdef + Param template + the rest of its state."""
  graphdef: Any
  param_template: Any
  rest: Any

  @classmethod
  def of(cls, model) -> "ModelParts":
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return cls(graphdef, params, rest)

  def pure_params(self) -> dict:
    return nnx.to_pure_dict(self.param_template)

  def param_shardings(self, mesh: Mesh) -> dict:
    """NamedShardings of the params on `mesh`, from each Param's logical axis names (so the
    layout follows the mesh, whatever devices the params live on now)."""
    return nnx.to_pure_dict(parallel.state_shardings(self.param_template, mesh))

  def merge(self, params: dict):
    """A model module whose Params hold `params` (usable inside jit and grad)."""
    state = jax.tree.map(lambda x: x, self.param_template)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(self.graphdef, state, self.rest)


def partition_params(params: dict, frozen: tuple[str, ...] = ()) -> tuple[dict, dict]:
  """(trained, frozen) halves of a nested params dict: the same nesting, each holding only its
  own leaves (a dict left empty is dropped). `frozen` holds path prefixes (optimizer.frozen_mask).

  Raises:
    TrainError: a prefix names no parameter, or every parameter is frozen.
  """
  if not frozen:
    return params, {}
  mask = frozen_mask(params, frozen)

  def split(tree, flags):
    if not isinstance(tree, dict):
      return (None, tree) if flags else (tree, None)
    trained, held = {}, {}
    for key, value in tree.items():
      a, b = split(value, flags[key])
      if a is not None:
        trained[key] = a
      if b is not None:
        held[key] = b
    return trained or None, held or None

  trained, held = split(params, mask)
  if trained is None:
    raise TrainError(f"frozen {list(frozen)} covers every parameter; nothing would be trained")
  return trained, held or {}


def merge_params(trained: dict, frozen: dict) -> dict:
  """The inverse of `partition_params`: one nested dict holding both halves' leaves."""
  if not frozen:
    return trained
  out = dict(trained)
  for key, value in frozen.items():
    out[key] = merge_params(out[key], value) if key in out else value
  return out


def state_shardings(optimizer: optax.GradientTransformation, params: dict, mesh: Mesh,
                    shardings: Optional[dict] = None, *, frozen: tuple[str, ...] = ()) -> dict:
  """Shardings of the whole train state: optimiser moments follow their params.

  Args:
    optimizer: the optax transformation.
    params: the params pytree (arrays or ShapeDtypeStructs).
    mesh: the mesh.
    shardings: the params' shardings (ModelParts.param_shardings); default replicated.
    frozen: frozen parameter prefixes (the optimiser state covers the others only); the same
      as build_train_step's and init_train_state's.
  """
  replicated = NamedSharding(mesh, PartitionSpec())
  if shardings is None:
    shardings = jax.tree.map(lambda _: replicated, params)
  trained, _ = partition_params(params, frozen)
  trained_shardings, _ = partition_params(shardings, frozen)
  abstract_opt = jax.eval_shape(optimizer.init, trained)
  opt_shardings = optax.tree_utils.tree_map_params(
      optimizer, lambda _, s: s, abstract_opt, trained_shardings,
      transform_non_params=lambda _: replicated)
  return {"step": replicated, "params": shardings, "opt_state": opt_shardings,
          "rng": replicated}


def init_train_state(optimizer: optax.GradientTransformation, params: dict, *, seed: int,
                     shardings: dict, frozen: tuple[str, ...] = ()) -> dict:
  """The step-0 train state, laid out on `shardings` (from `state_shardings` with the same
  `frozen`): the optimiser state is over the trained params only."""
  def init(params):
    trained, _ = partition_params(params, frozen)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": optimizer.init(trained), "rng": jax.random.PRNGKey(seed)}
  params = jax.device_put(params, shardings["params"])
  return jax.jit(init, out_shardings=shardings)(params)


def _split_microbatches(batch: dict, microbatches: int) -> dict:
  """[B, ...] -> [M, B / M, ...], microbatch m = rows m, M + m, 2M + m, ... so every device's
  contiguous block of rows contributes equally to each microbatch."""
  def split(x):
    rows = x.shape[0]
    return x.reshape(rows // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def build_train_step(parts: ModelParts, loss: Any, optimizer: optax.GradientTransformation,
                     schedule: Callable[[Any], Any], *, mesh: Mesh, shardings: dict,
                     microbatches: int = 1, load_balancing_coef: float = 0.0,
                     donate: bool = True,
                     frozen: tuple[str, ...] = ()) -> Callable[[dict, dict], tuple[dict, dict]]:
  """A jitted `(state, batch) -> (state, metrics)` for one optimiser update.

  Args:
    parts: the model split by ModelParts.of.
    loss: an SFTLoss / PolicyLoss / ValueLoss (or anything with normalizer and __call__).
    optimizer: from make_optimizer. schedule: its learning-rate schedule (for the metrics).
    mesh: the device mesh; the batch is sharded over its data-like axes.
    shardings: the train state's shardings (state_shardings).
    microbatches: gradient-accumulation steps per update; the global batch must split evenly
      into microbatches and each microbatch evenly over the data-parallel devices.
    load_balancing_coef: weight of the MoE load-balancing loss added to the objective.
    donate: donate the old state's buffers to the new state.
    frozen: parameter path prefixes that are not trained (optimizer.frozen_prefixes; the same
      as state_shardings' and init_train_state's): the gradient is taken with respect to the
      other params only and the frozen ones enter the loss as constants, so nothing is
      differentiated through them (a frozen vision tower, or the layers below the trained top
      of a partial fine-tune, cost their forward pass only).
  Returns:
    The step function. metrics holds "loss" (the objective without the load-balancing term),
    "total_loss", "grad_norm" (of the trained params, before clipping), "learning_rate",
    "tokens" (sum of loss weights),
    the loss's own metrics, and for MoE models "moe/load_balancing_loss" and
    "moe/expert_load" [layers, experts] with its max and min relative to a uniform load.
  """
  if microbatches < 1:
    raise TrainError(f"microbatches must be >= 1; saw {microbatches}")

  partition_params(parts.pure_params(), frozen)   # a prefix naming nothing fails here

  def micro_loss(trained, held, micro, normalizer):
    model = parts.merge(merge_params(trained, held))
    value, metrics, aux = loss(model, micro, normalizer)
    total = value
    if "load_balancing_loss" in aux:
      total = total + load_balancing_coef * aux["load_balancing_loss"] / microbatches
    return total, (value, metrics, aux)

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def step(state, batch):
    normalizer = loss.normalizer(batch)
    params, held = partition_params(state["params"], frozen)
    micro_batches = _split_microbatches(batch, microbatches)

    def accumulate(carry, micro):
      grads_sum, total_sum = carry
      (total, (value, metrics, aux)), grads = grad_fn(params, held, micro, normalizer)
      grads_sum = jax.tree.map(jnp.add, grads_sum, grads)
      return (grads_sum, total_sum + total), (value, metrics, aux)

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, total), (values, metrics, aux) = jax.lax.scan(
        accumulate, (zeros, jnp.zeros((), jnp.float32)), micro_batches)
    updates, opt_state = optimizer.update(grads, state["opt_state"], params)
    new_params = merge_params(optax.apply_updates(params, updates), held)
    out = {name: jnp.mean(value, axis=0) for name, value in metrics.items()}
    out.update(loss=jnp.sum(values), total_loss=total, grad_norm=optax.global_norm(grads),
               learning_rate=jnp.asarray(schedule(state["step"]), jnp.float32),
               tokens=jnp.sum(jnp.where(batch["segment_ids"] > 0,
                                        batch.get("loss_weights", batch["segment_ids"] > 0),
                                        0).astype(jnp.float32)))
    if "load_balancing_loss" in aux:
      out["moe/load_balancing_loss"] = jnp.mean(aux["load_balancing_loss"])
    if "expert_load" in aux and aux["expert_load"].size:
      load = jnp.mean(aux["expert_load"], axis=0)      # [moe layers, experts], rows sum to 1
      out["moe/expert_load"] = load
      # 1.0 = perfectly balanced; the busiest / idlest expert's share relative to 1 / experts
      out["moe/expert_load_max_over_mean"] = jnp.max(load) * load.shape[-1]
      out["moe/expert_load_min_over_mean"] = jnp.min(load) * load.shape[-1]
    new_state = {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state,
                 "rng": state["rng"]}
    return new_state, out

  def run(state, batch):
    with jax.set_mesh(mesh):
      return jitted(state, batch)

  jitted = jax.jit(step, in_shardings=(shardings, None), out_shardings=(shardings, None),
                   donate_argnums=(0,) if donate else ())
  run.jitted = jitted
  return run


def build_eval_step(parts: ModelParts, loss: Any, *, mesh: Mesh, param_shardings: dict
                    ) -> Callable[[dict, dict], dict]:
  """A jitted `(params, batch) -> metrics` with "loss", "normalizer" and the loss's metrics."""
  def evaluate(params, batch):
    normalizer = loss.normalizer(batch)
    value, metrics, aux = loss(parts.merge(params), batch, normalizer)
    out = dict(metrics)
    out["loss"] = value
    # the policy loss's own denominator weighs batches (its OPD term has another one)
    main = normalizer["pg"] if isinstance(normalizer, dict) else normalizer
    out["normalizer"] = jnp.asarray(main, jnp.float32)
    return out

  jitted = jax.jit(evaluate, in_shardings=(param_shardings, None))

  def run(params, batch):
    with jax.set_mesh(mesh):
      return jitted(params, batch)
  return run


def build_logprob_step(parts: ModelParts, *, mesh: Mesh, param_shardings: dict,
                       chunk_size: int = 512) -> Callable[[dict, dict], jax.Array]:
  """A jitted `(params, batch) -> logp [batch, seq]` of the batch's own tokens (aligned as
  docs/contracts.md says), for reference-policy, proximal or teacher log-probs of a packed batch;
  at the batch's `temperatures` when it has them (the temperature each token was sampled at,
  so these agree with the policy loss's pi_theta and the recorded old log-probs)."""
  from orchard_jax.train.logprobs import token_logprobs

  from orchard_jax.train.multimodal import batch_images

  def logprobs(params, batch):
    logp, _, _ = token_logprobs(parts.merge(params), batch["input_ids"], batch["positions"],
                                batch["segment_ids"], chunk_size=chunk_size, with_entropy=False,
                                images=batch_images(batch),
                                temperatures=batch.get("temperatures"))
    return logp

  jitted = jax.jit(logprobs, in_shardings=(param_shardings, None))

  def run(params, batch):
    with jax.set_mesh(mesh):
      return jitted(params, batch)
  return run
