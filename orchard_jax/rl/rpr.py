"""Rubric-based process reward (RPR; docs/algorithms.md section 5, Orchard arXiv 2605.15040).

A judge grades a whole trajectory on a domain's rubric set (SWE: the paper's seven rubrics),
each score in [0, 1] snapped to steps of 0.1. J = clamp(sum_k w_k R_k, 0, 1) and the training
reward is R' = R_bin + alpha J with R_bin = +1 resolved, -1 unresolved or truncated,
alpha = 0.5 (a domain may give its own outcome reward in place of R_bin). A failed judge call
(no scores, a missing rubric, a non-numeric, non-finite or out-of-range score) falls back to the
outcome reward. Evaluation uses R_bin. The rubric set is data the caller passes in: this module
knows no rubric names.
"""
import dataclasses
import math
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from orchard_jax.rl.errors import RLError

RubricScores = Union[Mapping[str, float], Sequence[float]]


@dataclasses.dataclass(frozen=True)
class RubricSet:
  """A domain's rubrics: names and weights, in the order R1..Rn (data, passed in by the caller).

  Each domain brings its own set (the SWE domain's seven rubrics are the paper's, in
  tasks/swe/rubrics.py); the functions below take it as a parameter and know no rubric names.

  Attributes:
    rubrics: ((name, weight), ...) in R1..Rn order; names unique and non-empty, weights finite
      and non-negative. J = clamp(sum_k w_k R_k, 0, 1), so weights that sum past 1 saturate.
  Raises:
    RLError: no rubric, a repeated or empty name, or a negative or non-finite weight.
  """
  rubrics: tuple[tuple[str, float], ...]

  def __post_init__(self):
    rubrics = tuple((str(name), float(weight)) for name, weight in self.rubrics)
    if not rubrics:
      raise RLError("a rubric set needs at least one rubric")
    names = [name for name, _ in rubrics]
    if any(not name for name in names) or len(set(names)) != len(names):
      raise RLError(f"rubric names must be non-empty and unique; saw {names}")
    if not all(math.isfinite(w) and w >= 0.0 for _, w in rubrics):
      raise RLError(f"rubric weights must be finite and >= 0; saw {[w for _, w in rubrics]}")
    object.__setattr__(self, "rubrics", rubrics)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.rubrics)

  @property
  def weights(self) -> np.ndarray:
    """[n] float64 weights in R1..Rn order."""
    return np.asarray([w for _, w in self.rubrics], np.float64)

  def __len__(self) -> int:
    return len(self.rubrics)

  def named_scores(self, scores: "RubricScores") -> dict[str, float]:
    """{name: raw score} from a mapping keyed by name or "R1".."Rn" (or "r1"), or a sequence
    in R1..Rn order; checked as `judge_score` checks it.

    Raises:
      RLError: a missing, non-numeric or non-finite score, or a sequence of the wrong length.
    """
    return dict(zip(self.names, _scores_vector(scores, self).tolist()))


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


def _scores_vector(scores: RubricScores, rubrics: RubricSet) -> np.ndarray:
  """The scores in R1..Rn order from a mapping (by name or "R1".."Rn") or a sequence."""
  if isinstance(scores, Mapping):
    values = []
    for k, name in enumerate(rubrics.names):
      for key in (name, f"R{k + 1}", f"r{k + 1}"):
        if key in scores:
          values.append(scores[key])
          break
      else:
        raise RLError(f"rubric {name!r} (R{k + 1}) is missing from the judge's scores; saw keys "
                      f"{sorted(scores)}")
  else:
    values = list(scores)
    if len(values) != len(rubrics):
      raise RLError(f"expected {len(rubrics)} rubric scores (R1..R{len(rubrics)}); saw "
                    f"{len(values)}")
  try:
    vector = np.asarray([float(v) for v in values], np.float64)
  except (TypeError, ValueError) as error:
    raise RLError(f"rubric scores must be numbers; saw {values}") from error
  if not np.all(np.isfinite(vector)):
    raise RLError(f"rubric scores must be finite; saw {vector.tolist()}")
  return vector


def judge_score(scores: RubricScores, rubrics: RubricSet) -> float:
  """J = clamp(sum_k w_k snap(R_k), 0, 1).

  Args:
    scores: the judge's scores, as a mapping keyed by the set's names (or "R1".."Rn"), or a
      sequence in R1..Rn order.
    rubrics: the domain's rubric set (names and weights).
  Returns:
    J in [0, 1].
  Raises:
    RLError: a missing, non-numeric, non-finite or out-of-range score.
  """
  vector = np.asarray([snap_score(s) for s in _scores_vector(scores, rubrics)])
  return float(np.clip(np.dot(rubrics.weights, vector), 0.0, 1.0))


@dataclasses.dataclass(frozen=True)
class RPRReward:
  """The combined reward of one trajectory.

  Attributes:
    reward: R' = R_out + alpha J, or R_out when the judge failed.
    binary_reward: R_out, the outcome reward (R_bin unless the domain gave its own).
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


def rpr_reward(resolved: bool, scores: Optional[RubricScores], *, rubrics: RubricSet,
               alpha: float = 0.5, truncated: bool = False,
               outcome_reward: Optional[float] = None, failure: str = "") -> RPRReward:
  """R' = R_out + alpha J, with the judge-failure fallback R' = R_out.

  Args:
    resolved: the task's success test passed.
    scores: the judge's rubric scores, or None when the judge call failed.
    rubrics: the domain's rubric set.
    alpha: weight of the judge score (0.5 in Orchard).
    truncated: the rollout hit its limit (R_bin = -1).
    outcome_reward: the domain's own outcome reward in place of R_bin (e.g. a graded score);
      None: R_bin.
    failure: why the judge gave no scores (kept on the result when `scores` is None).
  Returns:
    RPRReward.
  """
  r_out = binary_reward(resolved, truncated) if outcome_reward is None else float(outcome_reward)
  if scores is None:
    return RPRReward(r_out, r_out, None, True, failure or "no judge output")
  try:
    j = judge_score(scores, rubrics)
  except RLError as error:
    return RPRReward(r_out, r_out, None, True, str(error))
  return RPRReward(r_out + alpha * j, r_out, j, False)


def rpr_rewards(resolved: Sequence[bool], scores: Sequence[Optional[RubricScores]], *,
                rubrics: RubricSet, alpha: float = 0.5,
                truncated: Optional[Sequence[bool]] = None
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
  results = [rpr_reward(bool(r), s, rubrics=rubrics, alpha=alpha, truncated=bool(t))
             for r, s, t in zip(resolved, scores, truncated)]
  rewards = np.asarray([r.reward for r in results], np.float32)
  judged = [r.judge_score for r in results if not r.judge_failed]
  failures = sum(r.judge_failed for r in results)
  stats = {"rpr/judge_failures": float(failures),
           "rpr/judge_failure_rate": failures / n if n else 0.0,
           "rpr/judge_score_mean": float(np.mean(judged)) if judged else float("nan"),
           "rpr/reward_mean": float(rewards.mean()) if n else float("nan")}
  return rewards, results, stats
