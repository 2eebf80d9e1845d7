"""Decoding state and packed segments: prefill + one-token steps reproduce the full-sequence
logits (rows of different lengths, right- and left-padded prefill, a jitted step with the
cache donated), reset_rows, and packed sequences equal separate forward passes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.models.conftest import forward, padded_batch

TOL = 1e-4


@nnx.jit(donate_argnums=4)
def _step(model, ids, pos, seg, cache):
  return model(ids, pos, seg, cache=cache)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_prefill_then_steps_equal_full_sequence(tiny_models, arch):
  model = tiny_models[arch]
  lengths, seq, prompt = (30, 23, 11), 30, 9
  ids, pos, seg = padded_batch(0, lengths, seq)
  full, _ = forward(model, ids, pos, seg)

  cache = model.init_cache(len(lengths), 40)
  # Prefill: rows hold min(prompt, length) tokens, right-padded; row 2 also left-padded in a
  # separate fresh cache below.
  pre_seg = seg[:, :prompt]
  logits, aux, cache = _step(model, jnp.asarray(ids[:, :prompt]), jnp.asarray(pos[:, :prompt]),
                             jnp.asarray(pre_seg), cache)
  np.testing.assert_allclose(np.asarray(logits)[:, :prompt], full[:, :prompt], atol=TOL)
  assert aux["expert_load"].shape[0] == (1 if arch == "qwen3_moe" else 2)
  shapes = jax.tree.map(lambda x: x.shape, cache)
  for t in range(prompt, seq):
    logits, _, cache = _step(model, jnp.asarray(ids[:, t:t + 1]), jnp.asarray(pos[:, t:t + 1]),
                             jnp.asarray(seg[:, t:t + 1]), cache)
    assert jax.tree.map(lambda x: x.shape, cache) == shapes
    for b, n in enumerate(lengths):
      if t < n:
        np.testing.assert_allclose(np.asarray(logits)[b, 0], full[b, t], atol=TOL,
                                   err_msg=f"row {b} step {t}")
  np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_left_padded_prefill_and_reset_rows(tiny_models, arch):
  model = tiny_models[arch]
  lengths, seq = (12, 7), 12
  ids, pos, seg = padded_batch(1, lengths, seq, left=True)
  full, _ = forward(model, ids, pos, seg)
  cache = model.init_cache(2, 24)
  logits, _, cache = _step(model, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg), cache)
  valid = seg != 0
  np.testing.assert_allclose(np.asarray(logits)[valid], full[valid], atol=TOL)

  # Row 0 continues with token 5; then row 1 is reset, re-filled with row 0's prompt and given
  # the same token while row 0 idles (padding): row 1 must reproduce row 0's logits.
  step0, _, cache = _step(model, jnp.asarray([[5], [6]], jnp.int32),
                          jnp.asarray([[12], [7]], jnp.int32), jnp.ones((2, 1), jnp.int32), cache)
  cache = cache.reset_rows(jnp.asarray([False, True]))
  assert list(np.asarray(cache.lengths)) == [13, 0]
  refill_ids = np.stack([np.zeros(seq, np.int32), ids[0]])
  refill_seg = np.asarray([[0] * seq, [1] * seq], np.int32)
  refill_pos = np.asarray([[0] * seq, list(range(seq))], np.int32)
  _, _, cache = _step(model, jnp.asarray(refill_ids), jnp.asarray(refill_pos),
                      jnp.asarray(refill_seg), cache)
  step1, _, cache = _step(model, jnp.asarray([[0], [5]], jnp.int32),
                          jnp.asarray([[0], [12]], jnp.int32), jnp.asarray([[0], [1]], jnp.int32),
                          cache)
  assert list(np.asarray(cache.lengths)) == [13, 13]
  np.testing.assert_allclose(np.asarray(step1)[1], np.asarray(step0)[0], atol=TOL)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_packed_segments_equal_separate_sequences(tiny_models, arch):
  model = tiny_models[arch]
  rng = np.random.default_rng(2)
  a, b = rng.integers(0, 256, 13).astype(np.int32), rng.integers(0, 256, 9).astype(np.int32)
  seq = 26
  ids = np.zeros((1, seq), np.int32)
  ids[0, :13], ids[0, 13:22] = a, b
  seg = np.zeros((1, seq), np.int32)
  seg[0, :13], seg[0, 13:22] = 1, 2
  pos = np.zeros((1, seq), np.int32)
  pos[0, :13], pos[0, 13:22] = np.arange(13), np.arange(9)
  packed, _ = forward(model, ids, pos, seg)
  for tokens, cols in ((a, slice(0, 13)), (b, slice(13, 22))):
    n = len(tokens)
    alone, _ = forward(model, tokens[None], np.arange(n, dtype=np.int32)[None],
                       np.ones((1, n), np.int32))
    np.testing.assert_allclose(packed[0, cols], alone[0], atol=TOL)
