"""On-policy distillation with a sampled-token estimator (docs/algorithms.md section 4).

The student samples; the teacher scores the student's own tokens (teacher top-k = 1), so each
position has log pi_s and log pi_t of one token. With d = log pi_s - log pi_t:

- k1 = stopgrad(d) * log pi_s. Its gradient d * grad log pi_s is the score-function estimator
  of grad KL(pi_s || pi_t) (reverse KL; GKD arXiv 2306.13649; Thinking Machines' "On-policy
  distillation", 2025). Reported divergence: d.
- k2 = d^2 / 2; gradient d * grad log pi_s as well, with a non-negative value.
- k3 = exp(-d) - 1 + d (>= 0); gradient (1 - exp(-d)) grad log pi_s, bounded for d << 0.
- js_skew: the skew reverse KL to the mixture m = (1 - lam) pi_s + lam pi_t, KL(pi_s || m),
  estimated per sample by log(pi_s / m) = -log((1 - lam) + lam exp(-d)) (GKD's generalised JSD
  skews toward the student as lam -> 0). Used through the same score-function surrogate as k1:
  stopgrad(log(pi_s / m)) * log pi_s. lam = 0.5 by default.

Loss mode: L = L_GRPO + c L_OPD (or L = L_OPD alone), L_OPD aggregated like the policy loss.
Reward mode: A_t += c r_t with r_t = -d (k1) or log(lam pi_t / pi_s + 1 - lam) (js_skew), a
per-token reward the clipped policy loss then uses.
Tokens the teacher cannot score (a different vocabulary, a token outside its tokenizer) have
teacher_mask 0 and carry neither OPD loss nor OPD reward.
"""
from typing import Optional

import jax
import jax.numpy as jnp

from orchard_jax.rl import aggregation as agg
from orchard_jax.rl.errors import RLError

OPD_DIVERGENCES = ("k1", "k2", "k3", "js_skew")
OPD_REWARD_DIVERGENCES = ("k1", "js_skew")


def _check(kind: str, lam: float, allowed=OPD_DIVERGENCES) -> None:
  if kind not in allowed:
    raise RLError(f"OPD divergence is {kind!r}; expected one of {allowed}")
  if kind == "js_skew" and not 0.0 < lam <= 1.0:
    raise RLError(f"js_skew mixture weight lam must lie in (0, 1]; saw {lam}")


def _log_student_over_mixture(d: jax.Array, lam: float) -> jax.Array:
  """log(pi_s / m) with m = (1 - lam) pi_s + lam pi_t, d = log pi_s - log pi_t, computed stably."""
  # log((1 - lam) + lam exp(-d)) = logaddexp(log(1 - lam), log(lam) - d); lam = 1 -> -(-d) = d.
  if lam == 1.0:
    return d
  return -jnp.logaddexp(jnp.log1p(-lam), jnp.log(lam) - d)


def _sanitize(student_logp, teacher_logp, teacher_mask):
  """Invalid teacher entries (any value, even NaN or -inf) become d = 0 so no NaN leaks into
  gradients through the masked branch."""
  return jnp.where(jnp.asarray(teacher_mask) > 0, teacher_logp,
                   jax.lax.stop_gradient(student_logp))


def opd_token_terms(student_logp: jax.Array, teacher_logp: jax.Array, *, kind: str = "js_skew",
                    lam: float = 0.5) -> tuple[jax.Array, jax.Array]:
  """Per-token OPD surrogate (to minimise) and divergence estimate.

  Args:
    student_logp: [batch, seq] log pi_s of the sampled tokens; differentiable.
    teacher_logp: [batch, seq] log pi_t of the same tokens; treated as a constant.
    kind: "k1", "k2", "k3" or "js_skew".
    lam: the teacher's weight in js_skew's mixture.
  Returns:
    (surrogate [batch, seq], divergence [batch, seq]); the surrogate's gradient is the
    estimator named in the module docstring; the divergence has no gradient.
  Raises:
    RLError: unknown kind or lam outside (0, 1].
  """
  _check(kind, lam)
  teacher_logp = jax.lax.stop_gradient(teacher_logp)
  d = student_logp - teacher_logp
  d_const = jax.lax.stop_gradient(d)
  if kind == "k1":
    return d_const * student_logp, d_const
  if kind == "k2":
    return 0.5 * d * d, 0.5 * d_const * d_const
  if kind == "k3":
    k3 = jnp.maximum(jnp.expm1(-d) + d, 0.0)  # expm1: no float32 cancellation near d = 0
    return k3, jax.lax.stop_gradient(k3)
  divergence = jax.lax.stop_gradient(_log_student_over_mixture(d, lam))
  return divergence * student_logp, divergence


def opd_loss(student_logp: jax.Array, teacher_logp: jax.Array, loss_weights: jax.Array,
             teacher_mask: jax.Array, segment_ids: jax.Array, *, kind: str = "js_skew",
             lam: float = 0.5, aggregation: str = "token_mean",
             normalizer: Optional[jax.Array] = None, max_tokens: Optional[int] = None,
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """L_OPD: the per-token surrogate aggregated over tokens the teacher can score.

  Args:
    student_logp, teacher_logp: [batch, seq] log-probs of the sampled tokens.
    loss_weights: [batch, seq] 1 on model-generated tokens.
    teacher_mask: [batch, seq] 1 where the teacher's log-prob is valid.
    segment_ids: [batch, seq] int, 0 = padding.
    kind, lam: see `opd_token_terms`.
    aggregation, normalizer, max_tokens: see orchard_jax.rl.aggregation. For the loss-mode sum
      L_GRPO + c L_OPD to mean what it says, pass the policy loss's normalizer here too.
  Returns:
    (loss scalar, stats {opd_loss, opd_divergence, opd_valid_fraction}).
  """
  teacher_logp = _sanitize(student_logp, teacher_logp, teacher_mask)
  surrogate, divergence = opd_token_terms(student_logp, teacher_logp, kind=kind, lam=lam)
  weights = jnp.where(segment_ids > 0, jnp.asarray(loss_weights, jnp.float32), 0.0)
  valid = weights * jnp.asarray(teacher_mask, jnp.float32)
  surrogate = jnp.where(valid != 0, surrogate, 0.0)
  loss = agg.aggregate(surrogate, valid, segment_ids, aggregation, normalizer=normalizer,
                       max_tokens=max_tokens)
  stats = {"opd_loss": jax.lax.stop_gradient(loss),
           "opd_divergence": agg.weighted_mean(jnp.where(valid != 0, divergence, 0.0), valid),
           "opd_valid_fraction": agg.weighted_mean(
               (jnp.asarray(teacher_mask) > 0).astype(jnp.float32), weights)}
  return loss, stats


def opd_rewards(student_logp: jax.Array, teacher_logp: jax.Array, teacher_mask: jax.Array, *,
                kind: str = "js_skew", lam: float = 0.5) -> jax.Array:
  """Reward-mode per-token rewards r_t (no gradient), 0 where the teacher's log-prob is invalid.

  Args:
    student_logp: [batch, seq] log pi_s of the sampled tokens (the sampling policy's).
    teacher_logp: [batch, seq] log pi_t.
    teacher_mask: [batch, seq] 1 where valid.
    kind: "k1" (r = -d) or "js_skew" (r = log(lam pi_t / pi_s + 1 - lam)).
    lam: js_skew's mixture weight.
  Returns:
    [batch, seq] float32; add c * r to the advantages (A_t += c r_t).
  Raises:
    RLError: kind is not a reward-mode divergence.
  """
  _check(kind, lam, OPD_REWARD_DIVERGENCES)
  teacher_logp = _sanitize(student_logp, teacher_logp, teacher_mask)
  d = jax.lax.stop_gradient(student_logp - teacher_logp)
  reward = -d if kind == "k1" else -_log_student_over_mixture(d, lam)
  return jnp.where(jnp.asarray(teacher_mask) > 0, reward, 0.0).astype(jnp.float32)
