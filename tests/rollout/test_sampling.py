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


def test_sampled_tokens_stay_in_the_allowed_set_and_logprob_is_raw():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(4, 30)).astype(np.float32))
  temperature = jnp.asarray([0.0, 0.7, 1.3, 1.0], jnp.float32)
  top_k = jnp.asarray([0, 3, 0, 0], jnp.int32)
  top_p = jnp.asarray([1.0, 1.0, 0.6, 1.0], jnp.float32)
  min_p = jnp.zeros(4, jnp.float32)
  raw = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  seen = {1: set(), 2: set(), 3: set()}
  draw = jax.jit(lambda position: sample_next(
    logits, row_keys(jnp.arange(4, dtype=jnp.uint32), jnp.full((4,), position, jnp.int32)),
    temperature, top_k, top_p, min_p, SamplingMode.FILTERED))
  for position in range(200):
    tokens, lps = (np.asarray(x) for x in draw(position))
    assert tokens[0] == int(np.argmax(raw[0]))  # temperature 0 is greedy
    np.testing.assert_allclose(lps, raw[np.arange(4), tokens], rtol=0, atol=1e-6)
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
