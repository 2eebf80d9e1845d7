"""Turning per-token loss terms into one scalar: token-mean, sequence-mean, constant normaliser.

Packed batches hold several sequences per row (docs/contracts.md, "Packed batch"); a sequence is one
(row, segment id) pair with a non-zero segment id. The three modes are the ones the RL
literature compares:

- "token_mean": sum_{i,t} w x / sum_{i,t} w over the whole batch. DAPO (arXiv 2503.14476,
  section 3.3, "token-level policy gradient loss"); Orchard's setting.
- "sequence_mean": mean over sequences of (sum_t w x / sum_t w). GRPO (arXiv 2402.03300, eq. 3).
- "sequence_sum_norm": sum_{i,t} w x / (num_sequences * max_tokens) with a constant max_tokens.
  Dr.GRPO (arXiv 2503.20783, section 3.1) removes the per-sequence length normaliser, which
  biases toward long wrong answers, and divides by a constant instead.

With gradient accumulation or data parallelism, a microbatch's loss must be divided by the
normaliser of the whole global batch, not its own: compute `loss_normalizer` once on the full
batch and pass it as `normalizer` to `aggregate` for every microbatch; the microbatch losses
then sum to the full-batch loss exactly.
"""
from typing import Optional

import jax
import jax.numpy as jnp

from orchard_jax.rl.errors import RLError

AGGREGATIONS = ("token_mean", "sequence_mean", "sequence_sum_norm")


def check_aggregation(mode: str) -> None:
  """Raises RLError unless `mode` is one of AGGREGATIONS."""
  if mode not in AGGREGATIONS:
    raise RLError(f"aggregation is {mode!r}; expected one of {AGGREGATIONS}")


def _flat_sequence_index(segment_ids: jax.Array) -> tuple[jax.Array, int]:
  """Maps each token to a batch-wide sequence index; padding (segment 0) maps to index 0.

  Returns (index [batch, seq] int32, number of indices). Row r's segment s gets
  r * (seq + 1) + s, so indices never collide across rows and index 0 is only ever padding.
  """
  batch, seq = segment_ids.shape
  rows = jnp.arange(batch, dtype=jnp.int32)[:, None]
  index = jnp.where(segment_ids > 0, rows * (seq + 1) + segment_ids, 0)
  return index, batch * (seq + 1)


def sequence_sums(values: jax.Array, segment_ids: jax.Array) -> jax.Array:
  """Sums `values` [batch, seq] within each sequence; returns [batch * (seq + 1)] (0 = padding)."""
  index, num = _flat_sequence_index(segment_ids)
  values = jnp.where(segment_ids > 0, values, 0.0)
  return jax.ops.segment_sum(values.reshape(-1), index.reshape(-1), num_segments=num)


def loss_normalizer(weights: jax.Array, segment_ids: jax.Array, mode: str) -> jax.Array:
  """The denominator `aggregate` uses for this batch in `mode` (before any constant).

  Args:
    weights: [batch, seq] float per-token loss weights (0 = no loss).
    segment_ids: [batch, seq] int, 0 = padding.
    mode: one of AGGREGATIONS.
  Returns:
    Scalar float32: total weight for "token_mean"; the number of sequences with non-zero total
    weight for "sequence_mean" and "sequence_sum_norm".
  """
  check_aggregation(mode)
  weights = jnp.asarray(weights, jnp.float32)
  if mode == "token_mean":
    return jnp.sum(jnp.where(segment_ids > 0, weights, 0.0))
  totals = sequence_sums(weights, segment_ids)
  return jnp.sum((totals > 0).astype(jnp.float32))


def aggregate(per_token: jax.Array, weights: jax.Array, segment_ids: jax.Array, mode: str, *,
              normalizer: Optional[jax.Array] = None,
              max_tokens: Optional[int] = None) -> jax.Array:
  """Reduces per-token terms to a scalar loss in one of the modes in the module docstring.

  Args:
    per_token: [batch, seq] float loss term per token.
    weights: [batch, seq] float per-token weights; tokens with weight 0 never contribute.
    segment_ids: [batch, seq] int sequence ids within each row, 0 = padding (never counted).
    mode: "token_mean", "sequence_mean" or "sequence_sum_norm".
    normalizer: replaces this batch's own denominator (total weight, or number of sequences)
      by a global one; see the module docstring on gradient accumulation.
    max_tokens: the constant of "sequence_sum_norm" (Dr.GRPO); defaults to seq.
  Returns:
    Scalar float32 loss. An empty batch (all weights 0) gives 0, not NaN.
  Raises:
    RLError: unknown mode, or shapes that differ.
  """
  check_aggregation(mode)
  per_token = jnp.asarray(per_token, jnp.float32)
  weights = jnp.asarray(weights, jnp.float32)
  if per_token.shape != weights.shape or per_token.shape != segment_ids.shape:
    raise RLError(f"per_token, weights and segment_ids must share a [batch, seq] shape; saw "
                  f"{per_token.shape}, {weights.shape}, {segment_ids.shape}")
  weighted = jnp.where((segment_ids > 0) & (weights != 0), per_token * weights, 0.0)
  if normalizer is None:
    normalizer = loss_normalizer(weights, segment_ids, mode)
  denominator = jnp.maximum(jnp.asarray(normalizer, jnp.float32), 1e-8)
  if mode == "token_mean":
    return jnp.sum(weighted) / denominator
  if mode == "sequence_sum_norm":
    constant = per_token.shape[1] if max_tokens is None else max_tokens
    return jnp.sum(weighted) / (denominator * float(constant))
  sums = sequence_sums(weighted, segment_ids)
  totals = sequence_sums(jnp.where(weights != 0, weights, 0.0), segment_ids)
  means = jnp.where(totals > 0, sums / jnp.where(totals > 0, totals, 1.0), 0.0)
  return jnp.sum(means) / denominator


def weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
  """sum(w x) / sum(w) over all tokens, 0 when every weight is 0; for logging stats."""
  weights = jnp.asarray(weights, jnp.float32)
  total = jnp.sum(weights)
  return jnp.where(total > 0, jnp.sum(jnp.where(weights != 0, values * weights, 0.0)) /
                   jnp.maximum(total, 1e-8), 0.0)
