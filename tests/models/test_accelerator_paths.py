"""The paths an accelerator run takes, held on CPU to the reference path: fused attention
(jax.nn.dot_product_attention) against the blocked causal attention, bf16 compute with float32
master weights against float32, and layer remat and attention recomputation against none. (Ragged-dot MoE dispatch against
the dense reference: tests/models/test_moe.py; sharding on a mesh: tests/parallel.)"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models
from tests.models.conftest import random_model, tiny_config, with_config


def _packed_batch():
  """Two rows: two packed sequences then padding, and one full sequence."""
  rng = np.random.default_rng(3)
  ids = rng.integers(0, 256, (2, 48)).astype(np.int32)
  seg = np.ones((2, 48), np.int32)
  seg[0, 20:40] = 2
  seg[0, 40:] = 0
  pos = np.concatenate([np.arange(20), np.arange(20), np.zeros(8, int)]).astype(np.int32)
  pos = np.stack([pos, np.arange(48, dtype=np.int32)])
  return jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg)


def _loss_and_grads(model, batch):
  ids, pos, seg = batch

  def loss(model):
    return models.next_token_loss(model, ids, pos, seg)[0]
  return nnx.jit(nnx.value_and_grad(loss))(model)


def _assert_same(a, b, atol):
  (loss_a, grads_a), (loss_b, grads_b) = a, b
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5)
  for (path, x), (_, y) in zip(nnx.to_flat_state(grads_a), nnx.to_flat_state(grads_b)):
    np.testing.assert_allclose(x[...], y[...], atol=atol, err_msg=str(path))


def test_fused_attention_matches_blocked_loss_and_gradients():
  # qwen3_5_moe's gated attention applies its gate after the same call: one architecture does.
  config = tiny_config("qwen3_moe")
  model = random_model(config, seed=1)
  batch = _packed_batch()
  fused = with_config(model, dataclasses.replace(config, attention_impl="xla"))
  _assert_same(_loss_and_grads(fused, batch), _loss_and_grads(model, batch), atol=2e-5)


def test_remat_changes_nothing_but_memory():
  config = tiny_config("qwen3_moe")
  model = random_model(config, seed=2)
  batch = _packed_batch()
  remat = with_config(model, dataclasses.replace(config, remat=True))
  _assert_same(_loss_and_grads(remat, batch), _loss_and_grads(model, batch), atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_attention_recompute_changes_nothing_but_memory(arch):
  config = tiny_config(arch)
  model = random_model(config, seed=5)
  batch = _packed_batch()
  other = with_config(model, dataclasses.replace(config, attention_recompute=True,
                                                 attention_block_size=16))
  base = with_config(model, dataclasses.replace(config, attention_recompute=False,
                                                attention_block_size=16))
  _assert_same(_loss_and_grads(other, batch), _loss_and_grads(base, batch), atol=1e-6)


def test_bf16_compute_with_float32_master_weights_follows_float32():
  # The same float32 weights; bf16 matmuls (8 mantissa bits: relative error ~ 2^-8 per
  # product) must keep the next-token distribution: KL per token and gradient direction.
  config = tiny_config("qwen3_moe", moe_dispatch="ragged")
  model = random_model(config, seed=4)
  low = with_config(model, dataclasses.replace(config, dtype="bfloat16"))
  ids, pos, seg = _packed_batch()
  ref = jax.nn.log_softmax(nnx.jit(lambda m: m(ids, pos, seg)[0])(model).astype(jnp.float32))
  out = jax.nn.log_softmax(nnx.jit(lambda m: m(ids, pos, seg)[0])(low).astype(jnp.float32))
  valid = np.asarray(seg) != 0
  kl = np.sum(np.exp(ref) * (ref - out), axis=-1)[valid]
  assert float(kl.max()) < 1e-3
  (_, g_ref), (_, g_low) = _loss_and_grads(model, _packed_batch()), _loss_and_grads(
      low, _packed_batch())
  flat_ref = np.concatenate([np.ravel(x[...]) for _, x in nnx.to_flat_state(g_ref)])
  flat_low = np.concatenate([np.ravel(x[...]) for _, x in nnx.to_flat_state(g_low)])
  assert all(x[...].dtype == jnp.float32 for _, x in nnx.to_flat_state(g_low))
  cosine = flat_ref @ flat_low / (np.linalg.norm(flat_ref) * np.linalg.norm(flat_low))
  assert cosine > 0.99
