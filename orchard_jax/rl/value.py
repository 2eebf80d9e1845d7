"""Value-model targets and loss (historical experience distillation; docs/algorithms.md section 6).

The value model reads a whole trajectory and predicts P(resolved). Orchard released no formula;
this project trains with binary cross-entropy between the value logit and the resolved label
at each trajectory's final position, and optionally at every position (each prefix then also
predicts the outcome, as a Monte-Carlo value target), following SWE-RM (arXiv 2512.21919) and
R2E-Gym (arXiv 2504.07164).
"""
from typing import Optional

import jax
import jax.numpy as jnp

from orchard_jax.rl import aggregation as agg
from orchard_jax.rl.errors import RLError


def final_positions(segment_ids: jax.Array) -> jax.Array:
  """[batch, seq] bool, True at the last token of every sequence (segment) in a packed row."""
  segment_ids = jnp.asarray(segment_ids)
  following = jnp.concatenate([segment_ids[:, 1:], jnp.zeros_like(segment_ids[:, :1])], axis=1)
  return (segment_ids > 0) & (following != segment_ids)


def value_loss_weights(segment_ids: jax.Array, *, every_position: bool = False) -> jax.Array:
  """Where the value BCE applies: each sequence's final token, or every token of it.

  Args:
    segment_ids: [batch, seq] int, 0 = padding.
    every_position: also train every prefix on the trajectory's label.
  Returns:
    [batch, seq] float32 weights.
  """
  segment_ids = jnp.asarray(segment_ids)
  mask = (segment_ids > 0) if every_position else final_positions(segment_ids)
  return mask.astype(jnp.float32)


def sigmoid_bce(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Elementwise -[y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], stable for large |x|."""
  logits = jnp.asarray(logits, jnp.float32)
  return jnp.maximum(logits, 0.0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))


def value_loss(value_logits: jax.Array, labels: jax.Array, weights: jax.Array,
               segment_ids: jax.Array, *, aggregation: str = "sequence_mean",
               normalizer: Optional[jax.Array] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Binary cross-entropy of the value logits against the resolved label.

  Args:
    value_logits: [batch, seq] float32 logits of P(resolved | prefix up to and including t).
    labels: [batch, seq] float 1.0 / 0.0, the trajectory's resolved label on its tokens.
    weights: [batch, seq] from `value_loss_weights`.
    segment_ids: [batch, seq] int, 0 = padding.
    aggregation: "sequence_mean" (default: each trajectory counts once even with every
      position on) or "token_mean".
    normalizer: global denominator for gradient accumulation.
  Returns:
    (loss, stats {value_bce, value_accuracy, value_prob_mean, value_label_mean}); accuracy and
    means are taken at final positions.
  Raises:
    RLError: shapes differ.
  """
  if jnp.shape(value_logits) != jnp.shape(labels) or jnp.shape(labels) != jnp.shape(weights):
    raise RLError(f"value_logits, labels and weights must share a shape; saw "
                  f"{jnp.shape(value_logits)}, {jnp.shape(labels)}, {jnp.shape(weights)}")
  labels = jnp.asarray(labels, jnp.float32)
  bce = sigmoid_bce(value_logits, labels)
  loss = agg.aggregate(bce, weights, segment_ids, aggregation, normalizer=normalizer)
  final = final_positions(segment_ids).astype(jnp.float32)
  probs = jax.nn.sigmoid(jax.lax.stop_gradient(value_logits))
  stats = {"value_bce": jax.lax.stop_gradient(loss),
           "value_accuracy": agg.weighted_mean(((probs > 0.5) == (labels > 0.5)).astype(
               jnp.float32), final),
           "value_prob_mean": agg.weighted_mean(probs, final),
           "value_label_mean": agg.weighted_mean(labels, final)}
  return loss, stats
