"""The GRPO/DAPO token-level clipped policy loss (docs/algorithms.md section 3).

Per token (i, t) with rho = exp(log pi_theta - log pi_old) and advantage A:

  pg = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)

(PPO's clipped surrogate, arXiv 1707.06347, with DAPO's asymmetric "clip-higher",
arXiv 2503.14476 section 3.1). Optional terms, each per token and aggregated like pg:

- truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"): when pi_old was recomputed by the trainer but the
  tokens were sampled by an inference engine whose numerics differ, pg is multiplied by
  w = min(pi_old / pi_engine, C), a constant (no gradient) capped at C.
- KL to a reference policy with GRPO's unbiased, non-negative k3 estimator
  (arXiv 2402.03300 eq. 4): exp(ref - logp) - (ref - logp) - 1.
- entropy bonus: -entropy_coef * H_t, with H_t the policy's entropy at position t.
"""
from typing import Optional

import jax
import jax.numpy as jnp

from orchard_jax.rl import aggregation as agg
from orchard_jax.rl.errors import RLError


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k3 estimate of KL(pi_theta || pi_ref) from samples of pi_theta; always >= 0.

  exp(ref - logp) - (ref - logp) - 1 (Schulman, "Approximating KL divergence", 2020; GRPO eq. 4).
  """
  delta = ref_logp - logp
  # expm1 avoids the cancellation of exp(x) - 1 - x near x = 0, which in float32 goes negative.
  return jnp.maximum(jnp.expm1(delta) - delta, 0.0)


def policy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                loss_weights: jax.Array, segment_ids: jax.Array, *,
                eps_low: float = 0.2, eps_high: float = 0.28,
                aggregation: str = "token_mean",
                normalizer: Optional[jax.Array] = None,
                max_tokens: Optional[int] = None,
                behavior_logp: Optional[jax.Array] = None,
                tis_cap: Optional[float] = None,
                ref_logp: Optional[jax.Array] = None, kl_coef: float = 0.0,
                entropy: Optional[jax.Array] = None, entropy_coef: float = 0.0,
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token-level clipped surrogate with asymmetric clipping, optional TIS, KL and entropy terms.

  Args:
    logp: [batch, seq] float32 log pi_theta of each token (aligned with input_ids: position t
      scores token t, docs/contracts.md); differentiable.
    old_logp: [batch, seq] log pi_old of the same tokens (the policy the ratio is taken to).
    advantages: [batch, seq] per-token advantage (a sequence advantage broadcast to its tokens).
    loss_weights: [batch, seq] 1 for model-generated tokens, 0 for prompt, tool output, padding.
    segment_ids: [batch, seq] int sequence ids, 0 = padding.
    eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] of the ratio (DAPO: 0.2, 0.28).
    aggregation: "token_mean" (DAPO), "sequence_mean" (GRPO) or "sequence_sum_norm" (Dr.GRPO);
      see orchard_jax.rl.aggregation.
    normalizer: global denominator for gradient accumulation (aggregation.loss_normalizer).
    max_tokens: Dr.GRPO's constant (default seq).
    behavior_logp: [batch, seq] log-probs the inference engine reported when sampling; with
      tis_cap, enables the truncated importance-sampling weight min(pi_old / pi_behavior, cap).
    tis_cap: the cap C of the TIS weight (e.g. 2.0); None disables TIS.
    ref_logp: [batch, seq] reference-policy log-probs, needed when kl_coef != 0.
    kl_coef: weight of the k3 KL penalty (0 in Orchard).
    entropy: [batch, seq] policy entropy in nats at each position, needed when entropy_coef != 0.
    entropy_coef: weight of the entropy bonus (1e-4 in Orchard's SWE script).
  Returns:
    loss: scalar float32.
    stats: dict of scalars (no gradient): pg_loss, clip_fraction, clip_low_fraction,
      clip_high_fraction, ratio_mean, ratio_max, approx_kl (k3 estimate of KL(pi_old || pi_theta)
      from the sampled tokens),
      advantage_mean, and tis_weight_mean / tis_truncated_fraction, kl_ref, entropy when used.
  Raises:
    RLError: shapes differ, a coefficient is set without its input, or bad clip ranges.
  """
  shape = jnp.shape(logp)
  named = dict(old_logp=old_logp, advantages=advantages, loss_weights=loss_weights,
               segment_ids=segment_ids, behavior_logp=behavior_logp, ref_logp=ref_logp,
               entropy=entropy)
  for name, value in named.items():
    if value is not None and jnp.shape(value) != shape:
      raise RLError(f"{name} has shape {jnp.shape(value)}; expected logp's shape {shape}")
  if not (0.0 <= eps_low < 1.0) or eps_high < 0.0:
    raise RLError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0; saw eps_low={eps_low}, "
                  f"eps_high={eps_high}")
  if kl_coef and ref_logp is None:
    raise RLError(f"kl_coef is {kl_coef} but no ref_logp was given")
  if entropy_coef and entropy is None:
    raise RLError(f"entropy_coef is {entropy_coef} but no entropy was given")
  if tis_cap is not None and behavior_logp is None:
    raise RLError(f"tis_cap is {tis_cap} but no behavior_logp was given")

  weights = jnp.where(segment_ids > 0, jnp.asarray(loss_weights, jnp.float32), 0.0)
  # Masked positions may hold placeholders (old_logprobs 0 "unknown"); zero their log-ratio so
  # an overflow there cannot turn into NaN through the masked branch of the gradient.
  log_ratio = jnp.where(weights > 0, logp - old_logp, 0.0)
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  pg = -jnp.minimum(ratio * advantages, clipped_ratio * advantages)
  stats = {}
  if tis_cap is not None:
    raw = jnp.exp(jnp.where(weights > 0, old_logp - behavior_logp, 0.0))
    tis = jax.lax.stop_gradient(jnp.minimum(raw, tis_cap))
    pg = pg * tis
    stats["tis_weight_mean"] = agg.weighted_mean(tis, weights)
    stats["tis_truncated_fraction"] = agg.weighted_mean((raw > tis_cap).astype(jnp.float32),
                                                        weights)
  per_token = pg
  if ref_logp is not None:
    ref_logp = jnp.where(weights > 0, ref_logp, jax.lax.stop_gradient(logp))
  if kl_coef:
    kl = k3_kl(logp, ref_logp)
    per_token = per_token + kl_coef * kl
    stats["kl_ref"] = agg.weighted_mean(jax.lax.stop_gradient(kl), weights)
  elif ref_logp is not None:
    stats["kl_ref"] = agg.weighted_mean(jax.lax.stop_gradient(k3_kl(logp, ref_logp)), weights)
  if entropy is not None:
    if entropy_coef:
      per_token = per_token - entropy_coef * entropy
    stats["entropy"] = agg.weighted_mean(jax.lax.stop_gradient(entropy), weights)

  loss = agg.aggregate(per_token, weights, segment_ids, aggregation, normalizer=normalizer,
                       max_tokens=max_tokens)
  sg_ratio = jax.lax.stop_gradient(ratio)
  clip_low = (advantages < 0) & (sg_ratio < 1.0 - eps_low)
  clip_high = (advantages > 0) & (sg_ratio > 1.0 + eps_high)
  stats.update(
      pg_loss=jax.lax.stop_gradient(
          agg.aggregate(pg, weights, segment_ids, aggregation, normalizer=normalizer,
                        max_tokens=max_tokens)),
      clip_fraction=agg.weighted_mean((clip_low | clip_high).astype(jnp.float32), weights),
      clip_low_fraction=agg.weighted_mean(clip_low.astype(jnp.float32), weights),
      clip_high_fraction=agg.weighted_mean(clip_high.astype(jnp.float32), weights),
      ratio_mean=agg.weighted_mean(sg_ratio, weights),
      ratio_max=jnp.max(jnp.where(weights > 0, sg_ratio, 0.0)),
      approx_kl=agg.weighted_mean(jax.lax.stop_gradient(k3_kl(old_logp, logp)), weights),
      advantage_mean=agg.weighted_mean(advantages, weights),
  )
  return loss, stats
