"""Confidence intervals for success rates (pass@1) and their difference.

pass@1 of a policy is estimated from attempts graded resolved or not. With the same number of
attempts on each of n instances, the mean of the per-instance rates equals the pooled rate
s / N, and its variance (1/n^2) sum_i p_i (1 - p_i) / k is at most the binomial p (1 - p) / N,
so a binomial interval on the pooled counts is valid and, across instances of different
difficulty, conservative.

- `wilson_interval`: the Wilson score interval (E. B. Wilson, "Probable inference, the law of
  succession, and statistical inference", JASA 22, 1927), which keeps its coverage near 0 and 1
  where the normal (Wald) interval collapses to a point.
- `newcombe_interval`: the difference of two independent proportions p1 - p2 by Newcombe's
  hybrid score method (R. G. Newcombe, "Interval estimation for the difference between
  independent proportions: comparison of eleven methods", Statistics in Medicine 17, 1998,
  method 10), built from the two Wilson intervals.
Both are statsmodels' implementations (`proportion_confint`, `confint_proportions_2indep`).
"""
from orchard_jax.rl.errors import RLError


def _check(successes: int, trials: int, confidence: float) -> None:
  if trials < 1 or not 0 <= successes <= trials:
    raise RLError(f"expected 0 <= successes <= trials and trials >= 1; saw {successes} of "
                  f"{trials}")
  if not 0.0 < confidence < 1.0:
    raise RLError(f"confidence must lie in (0, 1); saw {confidence}")


def wilson_interval(successes: int, trials: int, confidence: float = 0.95
                    ) -> tuple[float, float]:
  """The Wilson score interval of a binomial proportion.

  (p + z^2/2N -+ z sqrt(p(1-p)/N + z^2/4N^2)) / (1 + z^2/N), p = successes / N, z the normal
  quantile of (1 + confidence) / 2.

  Args:
    successes: attempts that succeeded.
    trials: attempts, N >= 1.
    confidence: the coverage, e.g. 0.95.
  Returns:
    (low, high) within [0, 1], holding successes / trials.
  Raises:
    RLError: counts out of range, or a confidence outside (0, 1).
  """
  from statsmodels.stats.proportion import proportion_confint   # deferred: a heavy import
  _check(successes, trials, confidence)
  low, high = proportion_confint(successes, trials, alpha=1.0 - confidence, method="wilson")
  p = successes / trials       # rounding leaves e.g. 5e-17 above 0 for 0 successes
  return max(0.0, min(float(low), p)), min(1.0, max(float(high), p))


def newcombe_interval(successes_1: int, trials_1: int, successes_2: int, trials_2: int,
                      confidence: float = 0.95) -> tuple[float, float]:
  """The interval of p1 - p2 for two independent proportions (Newcombe's hybrid score).

  With (l_i, u_i) the Wilson intervals and d = p1 - p2:
    low  = d - sqrt((p1 - l1)^2 + (u2 - p2)^2),   high = d + sqrt((u1 - p1)^2 + (p2 - l2)^2).

  Returns:
    (low, high) within [-1, 1], holding p1 - p2.
  Raises:
    RLError: counts out of range, or a confidence outside (0, 1).
  """
  from statsmodels.stats.proportion import confint_proportions_2indep
  _check(successes_1, trials_1, confidence)
  _check(successes_2, trials_2, confidence)
  low, high = confint_proportions_2indep(successes_1, trials_1, successes_2, trials_2,
                                         method="newcomb", compare="diff",
                                         alpha=1.0 - confidence)
  d = successes_1 / trials_1 - successes_2 / trials_2
  return max(-1.0, min(float(low), d)), min(1.0, max(float(high), d))
