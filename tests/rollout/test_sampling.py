"""Sampling math against NumPy references written out here (top-k, top-p, min-p, log-probs)."""
import jax
import jax.numpy as jnp
import numpy as np

from orchard_jax.rollout.sampling import SamplingMode, row_keys, sample_next, truncate_logits


def _numpy_keep(logits: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
  """The set of tokens a top-k / top-p / min-p sampler may draw (Hugging Face warper rules)."""
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  order = np.argsort(-logits, kind="stable")
  keep = np.zeros(len(logits), bool)
  mass = 0.0
  for rank, token in enumerate(order):
    if top_k > 0 and rank >= top_k:
      break
    if rank > 0 and mass >= top_p:
      break
    if probs[token] < min_p * probs[order[0]]:
      break
    keep[token] = True
    mass += probs[token]
  return keep


def test_truncation_matches_numpy_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 50)).astype(np.float32) * 2
  settings = [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.5, 0.0), (0, 1.0, 0.3), (3, 0.9, 0.05),
              (1, 1.0, 0.0)]
  top_k = np.array([s[0] for s in settings], np.int32)
  top_p = np.array([s[1] for s in settings], np.float32)
  min_p = np.array([s[2] for s in settings], np.float32)
  out = np.asarray(truncate_logits(jnp.asarray(logits), jnp.asarray(top_k), jnp.asarray(top_p),
                                   jnp.asarray(min_p)))
  for row, (k, p, m) in enumerate(settings):
    expected = _numpy_keep(logits[row], k, p, m)
    np.testing.assert_array_equal(np.isfinite(out[row]), expected, err_msg=str(settings[row]))
    np.testing.assert_allclose(out[row][expected], logits[row][expected])


def _numpy_log_softmax(logits: np.ndarray) -> np.ndarray:
  x = logits.astype(np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_sampled_tokens_stay_in_the_allowed_set_and_logprob_is_of_the_tempered_distribution():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(4, 30)).astype(np.float32))
  temperature = jnp.asarray([0.0, 0.7, 1.3, 1.0], jnp.float32)
  top_k = jnp.asarray([0, 3, 0, 0], jnp.int32)
  top_p = jnp.asarray([1.0, 1.0, 0.6, 1.0], jnp.float32)
  min_p = jnp.zeros(4, jnp.float32)
  raw = _numpy_log_softmax(np.asarray(logits))
  # Each row's distribution sampled from: logits / T; greedy rows report the raw logits'
  # (SGLang's rule). Truncation is not in the log-prob (rollout/sampling.py, the stated
  # approximation).
  tempered = np.stack([_numpy_log_softmax(np.asarray(logits[r]) / t) if t > 0 else raw[r]
                       for r, t in enumerate(np.asarray(temperature))])
  seen = {1: set(), 2: set(), 3: set()}
  draw = jax.jit(lambda position: sample_next(
    logits, row_keys(jnp.arange(4, dtype=jnp.uint32), jnp.full((4,), position, jnp.int32)),
    temperature, top_k, top_p, min_p, SamplingMode.FILTERED))
  for position in range(200):
    tokens, lps = (np.asarray(x) for x in draw(position))
    assert tokens[0] == int(np.argmax(raw[0]))  # temperature 0 is greedy
    np.testing.assert_allclose(lps, tempered[np.arange(4), tokens], rtol=0, atol=2e-6)
    for row in seen:
      seen[row].add(int(tokens[row]))
  assert seen[1] <= set(np.argsort(-raw[1])[:3].tolist()) and len(seen[1]) == 3
  scaled = np.asarray(logits[2]) / 1.3
  assert seen[2] <= set(np.flatnonzero(_numpy_keep(scaled, 0, 0.6, 0.0)).tolist())
  assert len(seen[3]) > 15  # plain sampling explores the whole vocabulary


def test_same_seed_and_position_give_same_token_whatever_the_row():
  rng = np.random.default_rng(2)
  row = rng.normal(size=(1, 40)).astype(np.float32)
  logits = jnp.asarray(np.concatenate([row, rng.normal(size=(2, 40)).astype(np.float32)]))
  ones = jnp.ones(3, jnp.float32)
  args = (ones, jnp.zeros(3, jnp.int32), ones, jnp.zeros(3, jnp.float32), SamplingMode.SAMPLE)
  a, _ = sample_next(logits, row_keys(jnp.asarray([7, 1, 2], jnp.uint32),
                                      jnp.asarray([5, 5, 5], jnp.int32)), *args)
  b, _ = sample_next(logits[::-1], row_keys(jnp.asarray([2, 1, 7], jnp.uint32),
                                            jnp.asarray([5, 5, 5], jnp.int32)), *args)
  assert int(a[0]) == int(b[2])


def test_logprob_at_temperature_0_7_matches_numpy_in_every_mode():
  """The recorded log-prob of a token sampled at T = 0.7 is log_softmax(logits / 0.7)[token],
  plain or truncated sampling, and the top log-probs are of the same distribution."""
  from orchard_jax.rollout.sampling import top_logprobs

  rng = np.random.default_rng(3)
  logits = rng.normal(size=(3, 64)).astype(np.float32) * 3
  expected = _numpy_log_softmax(logits / 0.7)
  temperature = jnp.full((3,), 0.7, jnp.float32)
  keys = row_keys(jnp.arange(3, dtype=jnp.uint32), jnp.full((3,), 9, jnp.int32))
  for mode, top_p in ((SamplingMode.SAMPLE, 1.0), (SamplingMode.FILTERED, 0.8)):
    tokens, lps = sample_next(jnp.asarray(logits), keys, temperature, jnp.zeros(3, jnp.int32),
                              jnp.full((3,), top_p, jnp.float32), jnp.zeros(3, jnp.float32),
                              mode)
    np.testing.assert_allclose(np.asarray(lps), expected[np.arange(3), np.asarray(tokens)],
                               rtol=0, atol=2e-6)
    assert not np.allclose(np.asarray(lps),
                           _numpy_log_softmax(logits)[np.arange(3), np.asarray(tokens)])
  values, ids = top_logprobs(jnp.asarray(logits), 5, temperature)
  np.testing.assert_array_equal(np.asarray(ids), np.argsort(-logits, axis=-1)[:, :5])
  np.testing.assert_allclose(np.asarray(values), np.sort(expected, axis=-1)[:, ::-1][:, :5],
                             rtol=0, atol=2e-6)
