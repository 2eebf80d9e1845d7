"""Rubric-based process reward (RPR; docs/algorithms.md section 5, Orchard arXiv 2605.15040).

A judge grades a whole trajectory on seven rubrics, each in [0, 1] snapped to steps of 0.1.
J = clamp(sum_k w_k R_k, 0, 1) and the training reward is R' = R_bin + alpha J with
R_bin = +1 resolved, -1 unresolved or truncated, alpha = 0.5. A failed judge call (no scores, a
missing rubric, a non-numeric, non-finite or out-of-range score) falls back to R_bin. Evaluation uses R_bin.
"""
import dataclasses
import math
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from orchard_jax.rl.errors import RLError

# (name, weight) in the paper's order R1..R7; the weights sum to 1.
RUBRICS: tuple[tuple[str, float], ...] = (
    ("fix_quality", 0.15),
    ("reproduction", 0.18),
    ("coverage", 0.12),
    ("rigor", 0.15),
    ("discriminativeness", 0.14),
    ("regression_guard", 0.12),
    ("verification_integrity", 0.14),
)
RUBRIC_NAMES = tuple(name for name, _ in RUBRICS)
RUBRIC_WEIGHTS = np.asarray([w for _, w in RUBRICS], np.float64)

RubricScores = Union[Mapping[str, float], Sequence[float]]


def snap_score(score: float, step: float = 0.1) -> float:
  """Rounds a rubric score in [0, 1] to the nearest multiple of `step` (half up).

  Raises:
    RLError: the score lies outside [0, 1] (beyond 1e-6): the judge used another scale, and
      clamping would hide it; `rpr_reward` treats this as a judge failure.
  """
  score = float(score)
  if not -1e-6 <= score <= 1.0 + 1e-6:
    raise RLError(f"rubric scores lie in [0, 1]; saw {score}")
  clamped = min(max(score, 0.0), 1.0)
  snapped = math.floor(clamped / step + 0.5 + 1e-9) * step
  return round(min(snapped, 1.0), 10)


def _scores_vector(scores: RubricScores) -> np.ndarray:
  """The seven scores in R1..R7 order from a mapping (by name or "R1".."R7") or a sequence."""
  if isinstance(scores, Mapping):
    values = []
    for k, name in enumerate(RUBRIC_NAMES):
      for key in (name, f"R{k + 1}", f"r{k + 1}"):
        if key in scores:
          values.append(scores[key])
          break
      else:
        raise RLError(f"rubric {name!r} (R{k + 1}) is missing from the judge's scores; saw keys "
                      f"{sorted(scores)}")
  else:
    values = list(scores)
    if len(values) != len(RUBRICS):
      raise RLError(f"expected {len(RUBRICS)} rubric scores (R1..R7); saw {len(values)}")
  try:
    vector = np.asarray([float(v) for v in values], np.float64)
  except (TypeError, ValueError) as error:
    raise RLError(f"rubric scores must be numbers; saw {values}") from error
  if not np.all(np.isfinite(vector)):
    raise RLError(f"rubric scores must be finite; saw {vector.tolist()}")
  return vector


def judge_score(scores: RubricScores, weights: Sequence[float] = RUBRIC_WEIGHTS) -> float:
  """J = clamp(sum_k w_k snap(R_k), 0, 1).

  Args:
    scores: the judge's seven scores, as a mapping keyed by RUBRIC_NAMES (or "R1".."R7"), or a
      sequence in R1..R7 order.
    weights: the rubric weights (default: the paper's).
  Returns:
    J in [0, 1].
  Raises:
    RLError: a missing, non-numeric, non-finite or out-of-range score.
  """
  vector = np.asarray([snap_score(s) for s in _scores_vector(scores)])
  return float(np.clip(np.dot(np.asarray(weights, np.float64), vector), 0.0, 1.0))


@dataclasses.dataclass(frozen=True)
class RPRReward:
  """The combined reward of one trajectory.

  Attributes:
    reward: R' = R_bin + alpha J, or R_bin when the judge failed.
    binary_reward: R_bin.
    judge_score: J, or None when the judge failed.
    judge_failed: True when the fallback was used.
    failure: why the judge's output was unusable ("" when it was fine).
  """
  reward: float
  binary_reward: float
  judge_score: Optional[float]
  judge_failed: bool
  failure: str = ""


def binary_reward(resolved: bool, truncated: bool = False) -> float:
  """R_bin: +1 resolved, -1 unresolved, -1 truncated (a truncated run never counts as resolved)."""
  return 1.0 if resolved and not truncated else -1.0


def rpr_reward(resolved: bool, scores: Optional[RubricScores], *, alpha: float = 0.5,
               truncated: bool = False,
               weights: Sequence[float] = RUBRIC_WEIGHTS) -> RPRReward:
  """R' = R_bin + alpha J, with the judge-failure fallback R' = R_bin.

  Args:
    resolved: the task's tests pass.
    scores: the judge's rubric scores, or None when the judge call failed.
    alpha: weight of the judge score (0.5 in Orchard).
    truncated: the rollout hit its limit (R_bin = -1).
    weights: rubric weights.
  Returns:
    RPRReward.
  """
  r_bin = binary_reward(resolved, truncated)
  if scores is None:
    return RPRReward(r_bin, r_bin, None, True, "no judge output")
  try:
    j = judge_score(scores, weights)
  except RLError as error:
    return RPRReward(r_bin, r_bin, None, True, str(error))
  return RPRReward(r_bin + alpha * j, r_bin, j, False)


def rpr_rewards(resolved: Sequence[bool], scores: Sequence[Optional[RubricScores]], *,
                alpha: float = 0.5, truncated: Optional[Sequence[bool]] = None,
                weights: Sequence[float] = RUBRIC_WEIGHTS
                ) -> tuple[np.ndarray, list[RPRReward], dict[str, float]]:
  """`rpr_reward` over a batch, with statistics for logging.

  Returns:
    (rewards [n] float32, per-trajectory RPRReward, stats {rpr/judge_failures,
    rpr/judge_failure_rate, rpr/judge_score_mean (over successful judgements), rpr/reward_mean}).
  Raises:
    RLError: lists of different lengths.
  """
  n = len(resolved)
  if len(scores) != n or (truncated is not None and len(truncated) != n):
    raise RLError(f"resolved, scores and truncated must have one entry per trajectory; saw "
                  f"{n}, {len(scores)}, {None if truncated is None else len(truncated)}")
  truncated = [False] * n if truncated is None else truncated
  results = [rpr_reward(bool(r), s, alpha=alpha, truncated=bool(t), weights=weights)
             for r, s, t in zip(resolved, scores, truncated)]
  rewards = np.asarray([r.reward for r in results], np.float32)
  judged = [r.judge_score for r in results if not r.judge_failed]
  failures = sum(r.judge_failed for r in results)
  stats = {"rpr/judge_failures": float(failures),
           "rpr/judge_failure_rate": failures / n if n else 0.0,
           "rpr/judge_score_mean": float(np.mean(judged)) if judged else float("nan"),
           "rpr/reward_mean": float(rewards.mean()) if n else float("nan")}
  return rewards, results, stats
