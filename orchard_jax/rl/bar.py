"""Balanced Adaptive Rollout: assembling GRPO groups with a balanced positive fraction.

docs/algorithms.md section 2 (Orchard, arXiv 2605.15040). For one prompt, rollouts are generated in
strides of s, scored and pooled; after each stride the pool is offered to TryAssemble with the
target positive-fraction interval [rho_min, rho_max], and generation stops as soon as a group
assembles or the pool holds N_max rollouts. Then the fallback runs: TryAssemble with [0, 1],
and if that fails too, the top-N ranked rollouts.

TryAssemble(pool, [lo, hi]):
- positives have reward > 0, negatives reward <= 0; aborted or over-time rollouts go to a
  backfill pile and are never chosen by TryAssemble;
- each class is sorted by (status, response length), ascending;
- n+ runs over ceil(lo N) .. floor(hi N), tried in order of |n+ - round(rho* N)| with
  rho* = (lo + hi) / 2 (ties: the smaller n+ first; `round` is Python's, half to even);
- the first n+ for which the pool has >= n+ positives and >= N - n+ negatives wins: the group is
  the first n+ positives and the first N - n+ negatives.

The group filter (applied before training) drops a group with an aborted rollout, zero reward
std, or no positive, where "positive" means resolved when the reward is shaped (RPR; docs/cases.md 3).
"Zero reward std" is `advantages.has_reward_spread` on the float32 rewards the advantages are
computed from, with its stated tolerance (REWARD_SPREAD_TOL, 1e-5 relative): rounding noise
between shaped rewards is no spread.

Pure Python over small lists; `balanced_adaptive_rollout` drives the loop for many prompts at
once through a callback (the agentic loop's rollouts run behind it).
"""
import dataclasses
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from orchard_jax.rl.advantages import has_reward_spread
from orchard_jax.rl.errors import RLError


@dataclasses.dataclass(frozen=True)
class ScoredRollout:
  """One finished (or aborted) rollout with what BAR needs to know about it.

  Attributes:
    reward: the scalar reward (R_bin in {+1, -1}, or a shaped R' = R_bin + alpha J).
    resolved: the binary outcome (the task's tests pass); used by the group filter.
    response_length: number of generated tokens (shorter ranks first).
    status: finish-status rank, lower is better (e.g. 0 = the agent submitted, 1 = it ran out of
      steps); the first sort key within a class.
    aborted: aborted or over its time budget: goes to the backfill pile.
    rollout_id: the caller's handle (trajectory id, index), carried through untouched.
  """
  reward: float
  resolved: bool
  response_length: int = 0
  status: int = 0
  aborted: bool = False
  rollout_id: Any = None

  @property
  def positive(self) -> bool:
    """BAR's class: reward > 0 (an aborted rollout is backfill, never positive)."""
    return not self.aborted and self.reward > 0


@dataclasses.dataclass(frozen=True)
class BARConfig:
  """BAR's settings (paper: N=8, N_max=16, s=16, [0.375, 0.625]; released: 4, 8, 8, [0.25, 0.75]).

  Attributes:
    group_size: N, rollouts per assembled group.
    max_rollouts: N_max, the most rollouts generated for one prompt.
    stride: s, rollouts generated per round.
    positive_fraction: (rho_min, rho_max), the target interval of positives in a group.
  """
  group_size: int = 8
  max_rollouts: int = 16
  stride: int = 16
  positive_fraction: tuple[float, float] = (0.375, 0.625)

  def __post_init__(self):
    lo, hi = self.positive_fraction
    if self.group_size < 1 or self.stride < 1 or self.max_rollouts < self.group_size:
      raise RLError(f"BAR needs group_size >= 1, stride >= 1 and max_rollouts >= group_size; "
                    f"saw {self.group_size}, {self.stride}, {self.max_rollouts}")
    if not 0.0 <= lo <= hi <= 1.0:
      raise RLError(f"positive_fraction must satisfy 0 <= rho_min <= rho_max <= 1; saw "
                    f"{self.positive_fraction}")


@dataclasses.dataclass(frozen=True)
class Assembly:
  """What BAR chose for one prompt, and why.

  Attributes:
    rollouts: the chosen group (positives first, then negatives, then backfill); has
      group_size entries unless the whole pool was smaller.
    mode: "target" (assembled in [rho_min, rho_max]), "widened" (fallback with [0, 1]) or
      "ranked" (fallback: top-N by rank).
    num_positive: positives in the group.
    tried: the n+ values TryAssemble tried in its last call, in order.
    pool_size, pool_positive, pool_negative, pool_backfill: the pool at assembly time.
  """
  rollouts: tuple[ScoredRollout, ...]
  mode: str
  num_positive: int
  tried: tuple[int, ...]
  pool_size: int
  pool_positive: int
  pool_negative: int
  pool_backfill: int

  def stats(self) -> dict[str, float]:
    """Numbers for logging: the mode as one-hot, counts, and the group's positive fraction."""
    n = max(len(self.rollouts), 1)
    return {"bar/pool_size": self.pool_size, "bar/pool_positive": self.pool_positive,
            "bar/pool_negative": self.pool_negative, "bar/pool_backfill": self.pool_backfill,
            "bar/num_positive": self.num_positive, "bar/positive_fraction": self.num_positive / n,
            "bar/mode_target": float(self.mode == "target"),
            "bar/mode_widened": float(self.mode == "widened"),
            "bar/mode_ranked": float(self.mode == "ranked")}


def _rank_key(rollout: ScoredRollout):
  return (rollout.status, rollout.response_length)


def _split(pool: Sequence[ScoredRollout]):
  positives = sorted((r for r in pool if r.positive), key=_rank_key)
  negatives = sorted((r for r in pool if not r.aborted and not r.positive), key=_rank_key)
  backfill = sorted((r for r in pool if r.aborted), key=_rank_key)
  return positives, negatives, backfill


def positive_counts_to_try(group_size: int, interval: tuple[float, float]) -> list[int]:
  """The n+ values TryAssemble tries, in order (see the module docstring).

  Example: N=8, [0.375, 0.625] -> [4, 3, 5]; N=4, [0.25, 0.75] -> [2, 1, 3];
  N=8, [0, 1] -> [4, 3, 5, 2, 6, 1, 7, 0, 8].
  """
  lo, hi = interval
  target = round((lo + hi) / 2 * group_size)
  # A tiny tolerance keeps 0.375 * 8 = 3.0 from becoming 3.0000000001 -> ceil 4.
  first = math.ceil(lo * group_size - 1e-9)
  last = math.floor(hi * group_size + 1e-9)
  return sorted(range(first, last + 1), key=lambda n: abs(n - target))


def try_assemble(pool: Sequence[ScoredRollout], group_size: int,
                 interval: tuple[float, float]) -> tuple[Optional[list[ScoredRollout]], list[int]]:
  """TryAssemble(pool, interval): a balanced group, or None.

  Returns:
    (group or None, the n+ values tried in order up to and including the winner).
  """
  positives, negatives, _ = _split(pool)
  tried = []
  for n_pos in positive_counts_to_try(group_size, interval):
    tried.append(n_pos)
    if len(positives) >= n_pos and len(negatives) >= group_size - n_pos:
      return positives[:n_pos] + negatives[:group_size - n_pos], tried
  return None, tried


def _assemble(pool: Sequence[ScoredRollout], config: BARConfig,
              allow_fallback: bool) -> Optional[Assembly]:
  positives, negatives, backfill = _split(pool)
  n = config.group_size
  group, tried = try_assemble(pool, n, config.positive_fraction)
  mode = "target"
  if group is None:
    if not allow_fallback:
      return None
    group, tried = try_assemble(pool, n, (0.0, 1.0))
    mode = "widened"
  if group is None:
    group = (positives + negatives + backfill)[:n]
    mode = "ranked"
  return Assembly(rollouts=tuple(group), mode=mode, num_positive=sum(r.positive for r in group),
                  tried=tuple(tried), pool_size=len(pool), pool_positive=len(positives),
                  pool_negative=len(negatives), pool_backfill=len(backfill))


def assemble_group(pool: Sequence[ScoredRollout], config: BARConfig) -> Optional[Assembly]:
  """One assembly attempt after a stride: the group, or None when more rollouts are needed.

  Tries the target interval; when that fails and the pool holds max_rollouts (or more), runs
  the fallback ([0, 1], then top-N ranked) and always returns an Assembly.
  """
  return _assemble(pool, config, allow_fallback=len(pool) >= config.max_rollouts)


def rollouts_to_request(pool_size: int, config: BARConfig) -> int:
  """How many rollouts to generate next: min(stride, N_max - pool size), at least 0."""
  return max(0, min(config.stride, config.max_rollouts - pool_size))


def balanced_adaptive_rollout(
    generate: Callable[[Sequence[int]], Sequence[Sequence[ScoredRollout]]], config: BARConfig,
    num_prompts: int = 1) -> list[Assembly]:
  """BAR's loop for `num_prompts` prompts at once: each round asks every prompt without a group
  for its next stride (one `generate` call for all of them, so their rollouts run side by side),
  then tries to assemble each; a prompt is done when its group assembles, or once N_max
  rollouts were requested for it (the fallback then always gives a group).

  Args:
    generate: called with counts [num_prompts] (0 for a prompt that is done), returns for each
      prompt its newly generated and scored rollouts (fewer when some could not be produced; the
      budget counts requests, so the loop still ends). A rollout_id may be anything the caller
      needs to find the rollout again.
    config: BARConfig.
    num_prompts: prompts (groups) to assemble.
  Returns:
    One Assembly per prompt, in order.
  Raises:
    RLError: `generate` answered for a different number of prompts.
  """
  pools: list[list[ScoredRollout]] = [[] for _ in range(num_prompts)]
  requested = [0] * num_prompts
  assemblies: list[Optional[Assembly]] = [None] * num_prompts
  while any(a is None for a in assemblies):
    counts = [0 if assemblies[p] is not None else rollouts_to_request(requested[p], config)
              for p in range(num_prompts)]
    new = list(generate(counts))
    if len(new) != num_prompts:
      raise RLError(f"generate answered for {len(new)} prompts; expected {num_prompts}")
    for p in range(num_prompts):
      if assemblies[p] is not None:
        continue
      pools[p].extend(new[p])
      requested[p] += counts[p]
      assemblies[p] = _assemble(pools[p], config,
                                allow_fallback=requested[p] >= config.max_rollouts)
  return assemblies


GROUP_FILTER_REASONS = ("aborted", "zero_reward_std", "no_positive")


def group_filter_reasons(group: Sequence[ScoredRollout], *,
                         positive_is_resolved: bool = True) -> list[str]:
  """Why a group would be dropped before training (empty list: keep it).

  Args:
    group: the assembled rollouts.
    positive_is_resolved: count a rollout as positive when it resolved (the right test under a
      shaped reward, docs/cases.md 3); False counts reward > 0.
  Returns:
    The reasons from GROUP_FILTER_REASONS that apply, in that order ("zero_reward_std": the
    float32 rewards differ by no more than REWARD_SPREAD_TOL, module docstring).
  """
  reasons = []
  if any(r.aborted for r in group):
    reasons.append("aborted")
  # The float32 values advantages are computed from, compared with a stated tolerance
  # (advantages.has_reward_spread): rounding noise is no spread.
  if not has_reward_spread(np.asarray([r.reward for r in group], np.float32)):
    reasons.append("zero_reward_std")
  positive = [r.resolved if positive_is_resolved else r.reward > 0 for r in group]
  if not any(positive):
    reasons.append("no_positive")
  return reasons


def select_groups(groups: Sequence[Sequence[ScoredRollout]], num_groups: int, *,
                  positive_is_resolved: bool = True) -> tuple[list[int], dict[str, int]]:
  """Applies the group filter and keeps the first `num_groups` surviving groups, in order.

  Over-sample prompts (pass more groups than `num_groups`) so dropped groups are replaced and
  the batch keeps its size (docs/algorithms.md section 2; docs/cases.md 4).

  Args:
    groups: candidate groups in prompt order.
    num_groups: groups the batch needs.
    positive_is_resolved: see `group_filter_reasons`.
  Returns:
    (indices of the kept groups, stats): stats count "candidates", "kept", "dropped" (groups
    inspected and dropped), "dropped_<reason>" per reason (a group can have several), "unused"
    (groups not inspected because the batch was already full) and "shortfall" (num_groups - kept; the trainer pads these
    rows with zero loss weight).
  """
  kept: list[int] = []
  stats = {"candidates": len(groups), "dropped": 0}
  stats.update({f"dropped_{reason}": 0 for reason in GROUP_FILTER_REASONS})
  inspected = 0
  for index, group in enumerate(groups):
    if len(kept) == num_groups:
      break
    inspected += 1
    reasons = group_filter_reasons(group, positive_is_resolved=positive_is_resolved)
    if reasons:
      stats["dropped"] += 1
      for reason in reasons:
        stats[f"dropped_{reason}"] += 1
    else:
      kept.append(index)
  stats["kept"] = len(kept)
  stats["unused"] = len(groups) - inspected
  stats["shortfall"] = num_groups - len(kept)
  return kept, stats
