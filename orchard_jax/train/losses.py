"""The losses the one train step is parametrised by: SFT, GRPO policy loss (+ OPD), value BCE.

Each loss is a small frozen dataclass with
  `normalizer(batch) -> pytree`: computed once on the whole global batch, so that gradient
    accumulation over microbatches reproduces the full-batch gradient exactly
    (see orchard_jax.rl.aggregation);
  `__call__(model, batch, normalizer) -> (loss, metrics, aux)`: loss of one microbatch, its
    metrics (scalars, averaged over microbatches by the step), and the model's aux dict
    ({"load_balancing_loss", "expert_load"} for MoE models, to which the step adds the
    weighted load-balancing term).

Batches are the packed format of docs/contracts.md: dicts of [batch, seq] arrays; a
vision-language batch also carries its images and 3-D positions (train.multimodal), which the
policy losses pass to the model.
"""
import dataclasses
from typing import Any, Optional

import jax

from orchard_jax import rl
from orchard_jax.train.errors import TrainError
from orchard_jax.train.logprobs import token_logprobs
from orchard_jax.train.multimodal import batch_images

Batch = dict[str, jax.Array]


def _require(batch: Batch, keys, loss_name: str) -> None:
  missing = [k for k in keys if k not in batch]
  if missing:
    raise TrainError(f"{loss_name} needs batch keys {list(keys)}; missing {missing} (batch has "
                     f"{sorted(batch)})")


@dataclasses.dataclass(frozen=True)
class SFTLoss:
  """Weighted next-token negative log-likelihood: sum_t w_t (-log pi(x_t | x_<t)) / normaliser.

  Plain SFT uses loss_weights 1 on every token after a segment's first (or on assistant turns
  only); credit-assignment SFT passes the weights of orchard_jax.rl.credit_assignment_sft.

  Attributes:
    aggregation: "token_mean" (default), "sequence_mean" or "sequence_sum_norm".
    chunk_size: sequence positions per LM-head call (memory bound on the logits).
  """
  aggregation: str = "token_mean"
  chunk_size: int = 512
  name = "sft"
  keys = ("input_ids", "positions", "segment_ids", "loss_weights")

  def __post_init__(self):
    rl.check_aggregation(self.aggregation)

  def normalizer(self, batch: Batch) -> jax.Array:
    return rl.loss_normalizer(batch["loss_weights"], batch["segment_ids"], self.aggregation)

  def __call__(self, model, batch: Batch, normalizer) -> tuple[jax.Array, dict, dict]:
    _require(batch, self.keys, "SFTLoss")
    logp, _, aux = token_logprobs(model, batch["input_ids"], batch["positions"],
                                  batch["segment_ids"], chunk_size=self.chunk_size,
                                  with_entropy=False, images=batch_images(batch))
    weights = batch["loss_weights"]
    loss = rl.aggregate(-logp, weights, batch["segment_ids"], self.aggregation,
                        normalizer=normalizer)
    metrics = {"nll": rl.weighted_mean(-logp, weights * (batch["segment_ids"] > 0))}
    return loss, metrics, aux


OPD_MODES = ("none", "loss", "reward", "only")


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
  """GRPO/DAPO clipped policy loss (docs/algorithms.md 3), optionally with OPD (docs/algorithms.md 4).

  The batch's `old_logprobs` are the log-probs the sampler reported (the behaviour policy), of
  the distribution each token was sampled from (logits / its temperature); pi_theta, the
  entropy bonus and the reference/teacher terms are computed at the batch's `temperatures`
  too (train/logprobs.py; all ones when the batch has none), so every term compares the
  same tempered distributions (docs/algorithms.md section 3).
  Without TIS they are pi_old in the ratio. With `tis_cap`, pi_old is the trainer's own
  log-probs before this update (the batch's `proximal_logprobs` when given, else the current
  policy's log-probs with stop-gradient, exact when each rollout batch takes one optimiser
  step, as Orchard's on-policy RL does) and the engine's are corrected by the truncated
  importance weight min(pi_old / pi_engine, tis_cap).

  Attributes:
    eps_low, eps_high: asymmetric clip range (0.2, 0.28).
    aggregation: "token_mean" (DAPO, Orchard), "sequence_mean" (GRPO), "sequence_sum_norm"
      (Dr.GRPO; constant max_tokens, default the batch's seq length).
    max_tokens: Dr.GRPO's constant.
    kl_coef: k3 KL to the batch's `ref_logprobs` (0 in Orchard).
    entropy_coef: entropy bonus (1e-4 in Orchard's SWE script).
    tis_cap: truncated importance-sampling cap (None: off).
    opd_mode: "none", "loss" (L_GRPO + opd_coef L_OPD), "reward" (A_t += opd_coef r_t) or
      "only" (L = L_OPD); OPD needs `teacher_logprobs` and `teacher_mask` in the batch.
    opd_divergence: "k1", "k2", "k3" or "js_skew" (reward mode: "k1" or "js_skew").
    opd_coef: c.
    opd_lambda: js_skew's mixture weight.
    chunk_size: sequence positions per LM-head call.
  """
  eps_low: float = 0.2
  eps_high: float = 0.28
  aggregation: str = "token_mean"
  max_tokens: Optional[int] = None
  kl_coef: float = 0.0
  entropy_coef: float = 0.0
  tis_cap: Optional[float] = None
  opd_mode: str = "none"
  opd_divergence: str = "js_skew"
  opd_coef: float = 1.0
  opd_lambda: float = 0.5
  chunk_size: int = 512
  name = "policy"

  def __post_init__(self):
    rl.check_aggregation(self.aggregation)
    if self.opd_mode not in OPD_MODES:
      raise TrainError(f"opd_mode is {self.opd_mode!r}; expected one of {OPD_MODES}")
    allowed = rl.OPD_REWARD_DIVERGENCES if self.opd_mode == "reward" else rl.OPD_DIVERGENCES
    if self.opd_mode != "none" and self.opd_divergence not in allowed:
      raise TrainError(f"opd_divergence is {self.opd_divergence!r}; with opd_mode "
                       f"{self.opd_mode!r} expected one of {allowed}")

  @property
  def keys(self) -> tuple[str, ...]:
    keys = ("input_ids", "positions", "segment_ids", "loss_weights", "old_logprobs",
            "advantages")
    if self.opd_mode != "none":
      keys += ("teacher_logprobs", "teacher_mask")
    if self.kl_coef:
      keys += ("ref_logprobs",)
    return keys

  def _opd_weights(self, batch):
    return batch["loss_weights"] * batch["teacher_mask"]

  def normalizer(self, batch: Batch) -> dict[str, jax.Array]:
    out = {"pg": rl.loss_normalizer(batch["loss_weights"], batch["segment_ids"],
                                    self.aggregation)}
    if self.opd_mode in ("loss", "only"):
      out["opd"] = rl.loss_normalizer(self._opd_weights(batch), batch["segment_ids"],
                                      self.aggregation)
    return out

  def __call__(self, model, batch: Batch, normalizer) -> tuple[jax.Array, dict, dict]:
    _require(batch, self.keys, "PolicyLoss")
    seg = batch["segment_ids"]
    logp, entropy, aux = token_logprobs(model, batch["input_ids"], batch["positions"], seg,
                                        chunk_size=self.chunk_size, with_entropy=True,
                                        images=batch_images(batch),
                                        temperatures=batch.get("temperatures"))
    metrics: dict[str, Any] = {}
    opd = None
    if self.opd_mode in ("loss", "only"):
      opd, opd_stats = rl.opd_loss(logp, batch["teacher_logprobs"], batch["loss_weights"],
                                   batch["teacher_mask"], seg, kind=self.opd_divergence,
                                   lam=self.opd_lambda, aggregation=self.aggregation,
                                   normalizer=normalizer["opd"], max_tokens=self.max_tokens)
      metrics.update(opd_stats)
    if self.opd_mode == "only":
      metrics["entropy"] = rl.weighted_mean(jax.lax.stop_gradient(entropy),
                                            batch["loss_weights"] * (seg > 0))
      return opd, metrics, aux
    advantages = batch["advantages"]
    if self.opd_mode == "reward":
      reward = rl.opd_rewards(batch["old_logprobs"], batch["teacher_logprobs"],
                              batch["teacher_mask"], kind=self.opd_divergence,
                              lam=self.opd_lambda)
      advantages = advantages + self.opd_coef * reward
      metrics["opd_reward_mean"] = rl.weighted_mean(reward, batch["loss_weights"] *
                                                    batch["teacher_mask"])
    if self.tis_cap is not None:
      old = batch.get("proximal_logprobs", jax.lax.stop_gradient(logp))
      behavior = batch["old_logprobs"]
    else:
      old, behavior = batch["old_logprobs"], None
    loss, stats = rl.policy_loss(
        logp, old, advantages, batch["loss_weights"], seg, eps_low=self.eps_low,
        eps_high=self.eps_high, aggregation=self.aggregation, normalizer=normalizer["pg"],
        max_tokens=self.max_tokens, behavior_logp=behavior, tis_cap=self.tis_cap,
        ref_logp=batch.get("ref_logprobs"), kl_coef=self.kl_coef, entropy=entropy,
        entropy_coef=self.entropy_coef)
    metrics.update(stats)
    if self.opd_mode == "loss":
      loss = loss + self.opd_coef * opd
    return loss, metrics, aux


@dataclasses.dataclass(frozen=True)
class ValueLoss:
  """Binary cross-entropy of a ValueModel's logits against the resolved label (docs/algorithms.md 6).

  The batch carries `value_labels` [batch, seq] float (the trajectory's resolved label, 1.0 or
  0.0, on its tokens; `data.pack_sequences(..., value_labels=labels)` writes it); the loss
  applies at each sequence's final token, or at every token with `every_position`.

  Attributes:
    every_position: train every prefix too.
    aggregation: "sequence_mean" (each trajectory counts once) or "token_mean".
  """
  every_position: bool = False
  aggregation: str = "sequence_mean"
  name = "value"
  keys = ("input_ids", "positions", "segment_ids", "value_labels")

  def __post_init__(self):
    rl.check_aggregation(self.aggregation)

  def _weights(self, batch):
    return rl.value_loss_weights(batch["segment_ids"], every_position=self.every_position)

  def normalizer(self, batch: Batch) -> jax.Array:
    return rl.loss_normalizer(self._weights(batch), batch["segment_ids"], self.aggregation)

  def __call__(self, model, batch: Batch, normalizer) -> tuple[jax.Array, dict, dict]:
    _require(batch, self.keys, "ValueLoss")
    values, aux = model(batch["input_ids"], batch["positions"], batch["segment_ids"],
                        return_aux=True)
    loss, stats = rl.value_loss(values, batch["value_labels"], self._weights(batch),
                                batch["segment_ids"], aggregation=self.aggregation,
                                normalizer=normalizer)
    return loss, stats, dict(aux or {})


def make_loss(name: str, **settings) -> Any:
  """A loss by name ("sft", "policy", "value") with its dataclass fields as keyword settings."""
  classes = {"sft": SFTLoss, "policy": PolicyLoss, "value": ValueLoss}
  if name not in classes:
    raise TrainError(f"loss is {name!r}; expected one of {sorted(classes)}")
  fields = {f.name for f in dataclasses.fields(classes[name])}
  unknown = sorted(set(settings) - fields)
  if unknown:
    raise TrainError(f"{name} loss has no settings {unknown}; it takes {sorted(fields)}")
  return classes[name](**settings)


