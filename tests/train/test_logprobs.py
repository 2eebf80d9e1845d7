"""Chunked log-probs against a NumPy log-softmax of the full logits, their gradients against
the unchunked computation, and the memory bound that is their reason to exist."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchard_jax import train

B, T, H, V = 2, 16, 8, 40


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(B, T, H)).astype(np.float32)
  w = rng.normal(size=(H, V)).astype(np.float32)
  ids = rng.integers(0, V, (B, T)).astype(np.int32)
  seg = np.array([[1] * 6 + [2] * 7 + [0] * 3, [1] * 16], np.int32)
  return hidden, w, ids, seg


def _numpy_reference(hidden, w, ids, seg):
  logits = hidden.astype(np.float64) @ w
  logits -= logits.max(-1, keepdims=True)
  logsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  p = np.exp(logsm)
  logp = np.zeros((B, T))
  ent = np.zeros((B, T))
  for b in range(B):
    for t in range(1, T):
      if seg[b, t] > 0 and seg[b, t] == seg[b, t - 1]:
        logp[b, t] = logsm[b, t - 1, ids[b, t]]
        ent[b, t] = -(p[b, t - 1] * logsm[b, t - 1]).sum()
  return logp, ent


@pytest.mark.parametrize("chunk", [1, 5, 15, 64])
def test_matches_numpy_log_softmax(chunk):
  hidden, w, ids, seg = _inputs()
  logp, ent = jax.jit(lambda h: train.chunked_token_logprobs(
      lambda x: x @ w, h, ids, seg, chunk_size=chunk))(jnp.asarray(hidden))
  ref_logp, ref_ent = _numpy_reference(hidden, w, ids, seg)
  np.testing.assert_allclose(np.asarray(logp), ref_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), ref_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [3, 64])
def test_per_token_temperatures_match_numpy(chunk):
  """With the batch's temperatures, logp[b, t] is log_softmax(logits[b, t - 1] / T[b, t])
  [ids[b, t]]: the temperature token t was sampled at scales the logits that predict it."""
  hidden, w, ids, seg = _inputs(3)
  temps = np.where(np.arange(T) % 2 == 0, 0.7, 1.3)[None].repeat(B, 0).astype(np.float32)
  logp, ent = jax.jit(lambda h, t: train.chunked_token_logprobs(
      lambda x: x @ w, h, ids, seg, chunk_size=chunk, temperatures=t))(jnp.asarray(hidden),
                                                                       jnp.asarray(temps))
  logits = hidden.astype(np.float64) @ w
  ref_logp, ref_ent = np.zeros((B, T)), np.zeros((B, T))
  for b in range(B):
    for t in range(1, T):
      if seg[b, t] > 0 and seg[b, t] == seg[b, t - 1]:
        z = logits[b, t - 1] / temps[b, t]
        logsm = z - z.max() - np.log(np.exp(z - z.max()).sum())
        ref_logp[b, t] = logsm[ids[b, t]]
        ref_ent[b, t] = -(np.exp(logsm) * logsm).sum()
  np.testing.assert_allclose(np.asarray(logp), ref_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), ref_ent, rtol=1e-5, atol=1e-5)
  ones, _ = train.chunked_token_logprobs(lambda x: x @ w, jnp.asarray(hidden), ids, seg,
                                         chunk_size=chunk, temperatures=jnp.ones((B, T)))
  np.testing.assert_allclose(np.asarray(ones), _numpy_reference(hidden, w, ids, seg)[0],
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(train.TrainError, match="temperatures"):
    train.chunked_token_logprobs(lambda x: x @ w, jnp.asarray(hidden), ids, seg,
                                 temperatures=jnp.ones((B, T + 1)))


def test_gradient_matches_unchunked():
  hidden, w, ids, seg = _inputs(1)
  weights = jnp.asarray(np.random.default_rng(2).random((B, T)), jnp.float32)

  def chunked(w):
    logp, ent = train.chunked_token_logprobs(lambda h: h @ w, jnp.asarray(hidden), ids, seg,
                                             chunk_size=4)
    return jnp.sum(logp * weights) + 0.1 * jnp.sum(ent * weights)

  def full(w):
    logsm = jax.nn.log_softmax(jnp.asarray(hidden) @ w, axis=-1)[:, :-1]
    logp = jnp.take_along_axis(logsm, ids[:, 1:, None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(logsm) * logsm, -1)
    valid = (seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1])
    return (jnp.sum(jnp.where(valid, logp, 0) * weights[:, 1:]) +
            0.1 * jnp.sum(jnp.where(valid, ent, 0) * weights[:, 1:]))

  np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(chunked))(jnp.asarray(w))),
                             np.asarray(jax.jit(jax.grad(full))(jnp.asarray(w))),
                             rtol=1e-4, atol=1e-5)


def test_backward_never_holds_full_logits():
  batch, seq, hidden_size, vocab, chunk = 2, 1024, 32, 4096, 64
  full_logits_bytes = batch * seq * vocab * 4
  h = jax.ShapeDtypeStruct((batch, seq, hidden_size), jnp.float32)
  w = jax.ShapeDtypeStruct((hidden_size, vocab), jnp.float32)
  ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

  def loss(w, h, ids, chunk_size):
    logp, _ = train.chunked_token_logprobs(lambda x: x @ w, h, ids, jnp.ones_like(ids),
                                           chunk_size=chunk_size, with_entropy=False)
    return jnp.sum(logp)

  def temp_bytes(chunk_size):
    compiled = jax.jit(jax.grad(loss), static_argnums=3).lower(w, h, ids, chunk_size).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  chunked = temp_bytes(chunk)
  unchunked = temp_bytes(seq)
  assert unchunked >= full_logits_bytes          # the naive path does materialise them
  chunk_logits_bytes = batch * chunk * vocab * 4
  assert chunked <= 3 * chunk_logits_bytes       # the chunked one holds a couple of chunks
  assert chunked < full_logits_bytes / 4


def test_short_and_bad_inputs():
  logp, ent = train.chunked_token_logprobs(lambda h: h, jnp.zeros((1, 1, 3)),
                                           jnp.zeros((1, 1), jnp.int32),
                                           jnp.ones((1, 1), jnp.int32))
  assert logp.shape == (1, 1) and float(logp[0, 0]) == 0.0
  with pytest.raises(train.TrainError, match="chunk_size"):
    train.chunked_token_logprobs(lambda h: h, jnp.zeros((1, 4, 3)), jnp.zeros((1, 4), jnp.int32),
                                 jnp.ones((1, 4), jnp.int32), chunk_size=0)
