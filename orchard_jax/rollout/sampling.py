"""Next-token sampling: temperature, top-k, top-p, min-p, per-row seeds, and recorded log-probs.

Pure jax functions on [batch, vocab] logits, used inside the engine's jitted decode step. Every
row carries its own settings, so requests with different sampling parameters share a batch.

Recorded log-probs are of the distribution the token was sampled from: log_softmax(logits / T)
[token] in float32 at the row's temperature T, as SGLang reports them and as verl and slime
train (docs/algorithms.md section 3). The trainer computes the same quantity from the same
temperature, which travels with each recorded call (`data.ModelCall.temperature`), so the
policy ratio compares pi_theta and pi_old of the distribution the samples came from. A greedy
row (T below `MIN_TEMPERATURE`, SGLang's rule) records log-probs of the raw distribution
(T = 1), as SGLang does; `logprob_temperature` gives the temperature a row's log-probs are of.

Top-k, top-p and min-p truncation is not in the recorded log-probs (stated approximation, as in
SGLang, verl and slime): the sampling distribution of a truncated row is the tempered one
renormalised over the kept set, so its log-prob is the recorded one plus log(1 / kept mass).
A sampled token is always in the kept set, and the ratio pi_theta / pi_old of two tempered
distributions equals that of the truncated ones whenever both keep the same set and mass; the
difference is the change of the kept mass between the two policies, second order for the
small policy updates a clipped ratio allows. Top logprobs (`top_logprobs`) are of the same
tempered, untruncated distribution.

Randomness is a function of (request seed, position): row b's key at a step is
fold_in(PRNGKey(seed_b), position_b). A request with a fixed seed therefore samples the same
tokens whatever batch it shares, and in whichever bucket it lands.
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np

# Temperatures below this sample greedily (SGLang's _SAMPLING_EPS rule).
MIN_TEMPERATURE = 1e-6


def logprob_temperature(temperature):
  """The temperature a row's recorded log-probs are of: its sampling temperature, or 1.0 for
  a greedy row (temperature < MIN_TEMPERATURE). Works on floats and on arrays (NumPy or jax).
  """
  if isinstance(temperature, (int, float)):
    return float(temperature) if temperature >= MIN_TEMPERATURE else 1.0
  xp = jnp if isinstance(temperature, jax.Array) else np
  return xp.where(temperature >= MIN_TEMPERATURE, temperature, 1.0)


class SamplingMode(enum.Enum):
  """Which sampling code a batch needs (a static argument of the jitted step).

  GREEDY: every row is greedy (temperature 0): argmax only.
  SAMPLE: plain temperature sampling, no truncation in any row.
  FILTERED: some row uses top-k, top-p or min-p: a per-row sort of the vocabulary.
  """
  GREEDY = "greedy"
  SAMPLE = "sample"
  FILTERED = "filtered"


def row_keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
  """Per-row PRNG keys from seeds [batch] (uint32) and positions [batch] (int32) -> [batch, 2]."""
  return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.PRNGKey(s), p))(seeds, positions)


def truncate_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array,
                    min_p: jax.Array) -> jax.Array:
  """Set to -inf every logit outside each row's top-k / top-p nucleus / min-p set.

  Definitions (as in SGLang's sampler and the Hugging Face warpers): top-k keeps the k largest;
  top-p keeps the smallest prefix of the sorted distribution whose mass reaches top_p (the
  most likely token always stays); min-p keeps tokens with p >= min_p * max p. Ties at a
  top-k boundary keep the earlier index (stable sort).

  Args:
    logits: [batch, vocab] float32, already divided by the temperature.
    top_k: [batch] int32; 0 or less keeps all tokens.
    top_p: [batch] float32 in (0, 1]; 1 keeps all.
    min_p: [batch] float32 in [0, 1]; 0 keeps all.
  Returns:
    [batch, vocab] float32 logits with the excluded tokens at -inf.
  """
  vocab = logits.shape[-1]
  order = jnp.argsort(-logits, axis=-1, stable=True)
  sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  rank = jnp.arange(vocab)[None, :]
  k = jnp.where(top_k > 0, top_k, vocab)[:, None]
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = (rank < k) & ((mass_before < top_p[:, None]) | (rank == 0))
  keep &= probs >= min_p[:, None] * probs[:, :1]
  keep_sorted = jnp.where(keep, sorted_logits, -jnp.inf)
  # Scatter back to vocabulary order.
  inverse = jnp.argsort(order, axis=-1)
  return jnp.take_along_axis(keep_sorted, inverse, axis=-1)


def sample_next(logits: jax.Array, keys: jax.Array, temperature: jax.Array,
                top_k: jax.Array, top_p: jax.Array, min_p: jax.Array,
                mode: SamplingMode) -> tuple[jax.Array, jax.Array]:
  """Sample one token per row and return it with its recorded log-prob.

  Args:
    logits: [batch, vocab] float32 raw model logits at the last position.
    keys: [batch, 2] uint32 PRNG keys (see `row_keys`).
    temperature: [batch] float32; 0 = greedy for that row.
    top_k, top_p, min_p: [batch] per-row truncation (see `truncate_logits`).
    mode: static; GREEDY ignores keys and truncation, SAMPLE ignores truncation.
  Returns:
    tokens [batch] int32 and logprobs [batch] float32 = log_softmax(logits / T)[token] with T
    = logprob_temperature(temperature) per row (module docstring).
  """
  logits = logits.astype(jnp.float32)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  greedy = _first_argmax(logits, row_max)
  if mode is SamplingMode.GREEDY:
    return greedy, _token_logprob(logits, row_max, greedy)
  scaled = logits / logprob_temperature(temperature)[:, None]
  sample_from = scaled
  if mode is SamplingMode.FILTERED:
    sample_from = truncate_logits(scaled, top_k, top_p, min_p)
  # jax.random.categorical's Gumbel-max draw, argmax(logits + gumbel(key)), with the
  # cheaper argmax (same tokens for the same keys).
  noisy = jax.vmap(lambda key, row: row + jax.random.gumbel(key, row.shape, row.dtype))(
      keys, sample_from)
  sampled = _first_argmax(noisy, jnp.max(noisy, axis=-1, keepdims=True))
  tokens = jnp.where(temperature >= MIN_TEMPERATURE, sampled, greedy)
  # Positive scaling keeps the argmax, so a greedy row's max is the raw one divided by 1.
  return tokens, _token_logprob(scaled, jnp.max(scaled, axis=-1, keepdims=True), tokens)


def _first_argmax(logits: jax.Array, row_max: jax.Array) -> jax.Array:
  """jnp.argmax(logits, -1) (first maximal index; the first NaN if a row has one) as two
  plain reductions: XLA:CPU runs argmax's (value, index) reduction as a scalar loop, several
  times slower than a max and a min over [batch, vocab]."""
  vocab = logits.shape[-1]
  index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  hit = (logits == row_max) | jnp.isnan(logits)
  return jnp.min(jnp.where(hit, index, vocab), axis=-1)


def _token_logprob(logits: jax.Array, row_max: jax.Array, tokens: jax.Array) -> jax.Array:
  """log_softmax(logits)[b, tokens[b]] without the [batch, vocab] log-prob array: the same
  float32 operations as jax.nn.log_softmax, (x_t - max) - log(sum(exp(x - max)))."""
  shifted_lse = jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1))
  picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
  return (picked - row_max[:, 0]) - shifted_lse


def top_logprobs(logits: jax.Array, k: int, temperature: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array]:
  """The k most likely tokens of each row and their log-probs at the row's log-prob
  temperature (raw logits when temperature is None).

  Args:
    logits: [batch, vocab] float32.
    k: static count (at most the vocabulary is returned).
    temperature: [batch] sampling temperatures, or None.
  Returns:
    values [batch, k] float32 log-probs (descending) and ids [batch, k] int32.
  """
  k = min(k, logits.shape[-1])   # a bucket of the request's count may exceed the vocabulary
  logits = logits.astype(jnp.float32)
  if temperature is not None:
    logits = logits / logprob_temperature(temperature)[:, None]
  values, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), k)
  return values, ids.astype(jnp.int32)
