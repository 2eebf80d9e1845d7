"""ValueModel: per-position values from the policy backbone's hidden states and a linear head,
initialised from a policy by copy."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models
from orchard_jax.models.value import ValueModel
from tests.models.conftest import padded_batch, random_model


def test_from_policy_copies_the_backbone_and_applies_a_linear_head(tiny_models):
  policy = tiny_models["qwen3"]
  vm = ValueModel.from_policy(policy, rngs=nnx.Rngs(1))
  ids, pos, seg = padded_batch(3, (16, 9), 16)
  hidden = np.asarray(nnx.jit(lambda m, i, p, s: m.hidden_states(i, p, s))(
      policy, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg)))
  values = np.asarray(nnx.jit(lambda m, i, p, s: m(i, p, s))(
      vm, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg)))
  assert values.shape == (2, 16) and values.dtype == np.float32
  head = np.asarray(vm.value_head[...])
  bias = float(vm.value_bias[...])
  expected = (hidden @ head + bias) * (seg != 0)
  np.testing.assert_allclose(values, expected, atol=1e-5)
  assert np.all(values[seg == 0] == 0)
  # copies, not aliases: the policy's arrays are distinct buffers
  a = policy.model.embed_tokens[...]
  b = vm.model.embed_tokens[...]
  assert a is not b and np.array_equal(np.asarray(a), np.asarray(b))


def test_value_gradients_reach_backbone_and_head(tiny_models):
  vm = random_model(tiny_models["qwen3_5_moe"].config, 5, cls=ValueModel)
  ids, pos, seg = padded_batch(4, (12, 12), 12)
  label = jnp.asarray([1.0, 0.0])

  def loss(m):
    values, aux = m(jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg), return_aux=True)
    final = values[:, -1]
    bce = jnp.mean(jnp.logaddexp(0.0, final) - label * final)
    return bce + 0.01 * aux["load_balancing_loss"]

  grads = nnx.jit(nnx.grad(loss))(vm)
  norms = {"/".join(map(str, p)): float(jnp.linalg.norm(v[...]))
           for p, v in nnx.to_flat_state(grads)}
  assert norms["value_head"] > 0 and norms["value_bias"] > 0
  assert norms["model/layers/0/linear_attn/q_proj"] > 0
  assert norms["model/layers/1/self_attn/q_proj"] > 0
  assert norms["model/layers/0/mlp/router"] > 0


def test_from_policy_rejects_a_config_with_other_shapes(tiny_models):
  policy = tiny_models["qwen3"]
  other = dataclasses.replace(policy.config, intermediate_size=32)
  with pytest.raises(models.ModelError, match="changes the backbone"):
    ValueModel.from_policy(policy, rngs=nnx.Rngs(0), config=other)
