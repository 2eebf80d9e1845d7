"""Decode-time kernels (models.decode) against NumPy re-implementations: the cache write in the
keys [batch, kv_heads, head_dim, max_len] / values [batch, kv_heads, max_len, head_dim] layouts
(padding dropped), grouped-query attention over the cache, and the "decode" MoE dispatch in both of its regimes (gathered experts when tokens * k <
experts, experts over per-expert buffers otherwise, every run-time capacity), including padding
tokens; and the MoE block with moe_dispatch="decode" against the dense reference path."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax.models import decode, moe
from orchard_jax.models.cache import AttentionCache
from tests.models.conftest import random_model, tiny_config


def _np_swiglu_moe(x, weights, indices, valid, wg, wu, wd):
  n, d = x.shape
  y = np.zeros((n, d), np.float64)
  for t in range(n):
    if not valid[t]:
      continue
    for w, e in zip(weights[t], indices[t]):
      g = x[t] @ wg[e]
      h = g / (1 + np.exp(-g)) * (x[t] @ wu[e])
      y[t] += w * (h @ wd[e])
  return y


@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 1), (8, 1), (3, 5)])
def test_decode_dispatch_matches_numpy(batch, seq):
  rng = np.random.default_rng(batch * 10 + seq)
  e, k, d, f = 8, 2, 16, 12
  x = rng.normal(size=(batch, seq, d)).astype(np.float32)
  indices = np.stack([rng.choice(e, k, replace=False) for _ in range(batch * seq)]).reshape(
      batch, seq, k).astype(np.int32)
  weights = rng.uniform(0.1, 1.0, (batch, seq, k)).astype(np.float32)
  valid = np.ones((batch, seq), bool)
  if batch > 1:
    valid[-1, -1] = False
  wg, wu = (rng.normal(size=(e, d, f)).astype(np.float32) * 0.3 for _ in range(2))
  wd = rng.normal(size=(e, f, d)).astype(np.float32) * 0.3
  got = decode.decode_dispatch(*map(jnp.asarray, (x, weights, indices, valid, wg, wu, wd)))
  want = _np_swiglu_moe(x.reshape(-1, d), weights.reshape(-1, k), indices.reshape(-1, k),
                        valid.reshape(-1), wg, wu, wd).reshape(batch, seq, d)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fullest", [3, 4, 6, 8])
def test_decode_dispatch_capacity_holds_the_fullest_expert(fullest):
  """8 tokens, top-2 of 8 experts: the first `fullest` tokens all pick expert 5, the others
  spread, so each run-time capacity branch (3, 4, 6, 8) is taken; nothing may be dropped."""
  rng = np.random.default_rng(fullest)
  n, e, k, d, f = 8, 8, 2, 16, 12
  others = [x for x in range(e) if x != 5]
  indices = np.array([[5, others[t % 7]] if t < fullest else
                      [others[2 * t % 7], others[(2 * t + 1) % 7]] for t in range(n)], np.int32)
  assert np.bincount(indices.ravel()).max() == fullest
  x = rng.normal(size=(n, 1, d)).astype(np.float32)
  weights = rng.uniform(0.1, 1.0, (n, 1, k)).astype(np.float32)
  valid = np.ones((n, 1), bool)
  wg, wu = (rng.normal(size=(e, d, f)).astype(np.float32) * 0.3 for _ in range(2))
  wd = rng.normal(size=(e, f, d)).astype(np.float32) * 0.3
  got = decode.decode_dispatch(*map(jnp.asarray, (x, weights, indices[:, None], valid, wg, wu,
                                                   wd)))
  want = _np_swiglu_moe(x.reshape(n, d), weights.reshape(n, k), indices, valid.reshape(n), wg,
                        wu, wd).reshape(n, 1, d)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


def test_write_cache_and_cached_attention_match_numpy():
  rng = np.random.default_rng(0)
  b, t, h, kvh, d, max_len = 3, 2, 4, 2, 8, 6
  old_k = rng.normal(size=(b, kvh, d, max_len)).astype(np.float32)
  old_v = rng.normal(size=(b, kvh, max_len, d)).astype(np.float32)
  k = rng.normal(size=(b, t, kvh, d)).astype(np.float32)
  v = rng.normal(size=(b, t, kvh, d)).astype(np.float32)
  q = rng.normal(size=(b, t, h, d)).astype(np.float32)
  # Row 0 writes slots 2, 3; row 1 slot 4 then padding; row 2 is all padding.
  slots = np.array([[2, 3], [4, max_len], [max_len, max_len]], np.int32)
  cache = decode.write_cache(AttentionCache(k=jnp.asarray(old_k), v=jnp.asarray(old_v)),
                             jnp.asarray(k), jnp.asarray(v), jnp.asarray(slots))
  want_k, want_v = old_k.copy(), old_v.copy()
  for r in range(b):
    for c in range(t):
      if slots[r, c] < max_len:
        want_k[r, :, :, slots[r, c]] = k[r, c]
        want_v[r, :, slots[r, c]] = v[r, c]
  np.testing.assert_array_equal(np.asarray(cache.k), want_k)
  np.testing.assert_array_equal(np.asarray(cache.v), want_v)

  mask = rng.random((b, t, max_len)) < 0.6
  mask[2, 1] = False                       # a query that sees nothing: uniform, finite
  got = np.asarray(decode.cached_attention(jnp.asarray(q), cache.k, cache.v, jnp.asarray(mask)))
  want = np.zeros_like(q, dtype=np.float64)
  for r in range(b):
    for c in range(t):
      for head in range(h):
        g = head // (h // kvh)
        s = q[r, c, head] @ want_k[r, g] / np.sqrt(d)
        s = np.where(mask[r, c], s, -np.inf) if mask[r, c].any() else np.zeros_like(s)
        p = np.exp(s - s.max())
        want[r, c, head] = (p / p.sum()) @ want_v[r, g]
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_moe_block_decode_dispatch_equals_dense(arch):
  dense = tiny_config(arch, moe_dispatch="dense")
  block = random_model(dense, 3, cls=moe.MoE)
  other = nnx.eval_shape(lambda: moe.MoE(dataclasses.replace(dense, moe_dispatch="decode"),
                                         rngs=nnx.Rngs(0)))
  nnx.update(other, nnx.state(block, nnx.Param))
  rng = np.random.default_rng(1)
  for batch in (1, 8):
    x = jnp.asarray(rng.normal(size=(batch, 1, dense.hidden_size)).astype(np.float32))
    valid = jnp.ones((batch, 1), bool)
    want, want_stats = block(x, valid)
    got, got_stats = other(x, valid)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got_stats["counts"]),
                                  np.asarray(want_stats["counts"]))
