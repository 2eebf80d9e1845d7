"""Metrics of a value model used as a reranker (docs/algorithms.md section 6).

For each task, k candidate trajectories with value scores and resolved labels. Reported as
SWE-RM (arXiv 2512.21919) and R2E-Gym (arXiv 2504.07164) advise: discrimination (ROC AUC),
calibration (ECE), and best-of-k (the top-scored candidate resolves) beside pass@k (any of k
resolves: the ceiling) and random@k (a uniformly random candidate resolves: the floor).
All estimators are exact expectations over random k-subsets of each task's n >= k candidates.
"""
import math
from typing import Sequence

import numpy as np

from orchard_jax.rl.errors import RLError


def _arrays(scores, labels):
  scores = np.asarray(scores, np.float64).reshape(-1)
  labels = np.asarray(labels).reshape(-1).astype(bool)
  if scores.shape != labels.shape:
    raise RLError(f"scores and labels need one entry each per candidate; saw {scores.size} "
                  f"scores and {labels.size} labels")
  if not np.all(np.isfinite(scores)):
    raise RLError("scores must be finite")
  return scores, labels


def _average_ranks(values: np.ndarray) -> np.ndarray:
  """1-based ranks, ties sharing their average rank."""
  order = np.argsort(values, kind="mergesort")
  ranks = np.empty(values.size, np.float64)
  sorted_values = values[order]
  start = 0
  while start < values.size:
    end = start
    while end + 1 < values.size and sorted_values[end + 1] == sorted_values[start]:
      end += 1
    ranks[order[start:end + 1]] = (start + end) / 2.0 + 1.0
    start = end + 1
  return ranks


def roc_auc(scores, labels) -> float:
  """Area under the ROC curve: P(score of a random positive > score of a random negative),
  ties counting one half (the Mann-Whitney U statistic over n_pos * n_neg).

  Raises:
    RLError: fewer than one positive and one negative.
  """
  scores, labels = _arrays(scores, labels)
  n_pos, n_neg = int(labels.sum()), int((~labels).sum())
  if n_pos == 0 or n_neg == 0:
    raise RLError(f"ROC AUC needs both classes; saw {n_pos} positives and {n_neg} negatives")
  ranks = _average_ranks(scores)
  u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
  return float(u / (n_pos * n_neg))


def expected_calibration_error(probs, labels, num_bins: int = 10) -> float:
  """ECE = sum_b (|b| / n) |mean(label in b) - mean(prob in b)| over equal-width bins of [0, 1].

  Bin b covers (b / B, (b + 1) / B], the first bin also holding 0 (Guo et al. 2017, "On
  Calibration of Modern Neural Networks").

  Raises:
    RLError: probabilities outside [0, 1], no candidates, or num_bins < 1.
  """
  probs, labels = _arrays(probs, labels)
  if probs.size == 0 or num_bins < 1:
    raise RLError(f"ECE needs candidates and num_bins >= 1; saw {probs.size}, {num_bins}")
  if np.any((probs < 0) | (probs > 1)):
    raise RLError("ECE takes probabilities in [0, 1]; apply a sigmoid to value logits first")
  bins = np.clip(np.ceil(probs * num_bins).astype(np.int64) - 1, 0, num_bins - 1)
  ece = 0.0
  for b in range(num_bins):
    members = bins == b
    if members.any():
      ece += members.mean() * abs(labels[members].mean() - probs[members].mean())
  return float(ece)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased pass@k = 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, arXiv 2107.03374).

  Raises:
    RLError: k outside [1, n] or c outside [0, n].
  """
  n, c = num_samples, num_correct
  if not 1 <= k <= n or not 0 <= c <= n:
    raise RLError(f"pass@k needs 1 <= k <= n and 0 <= c <= n; saw n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def best_of_k(scores, labels, k: int) -> float:
  """Expected resolution of the top-scored candidate among a uniformly random k-subset.

  With candidates sorted by score descending, the one at position i is the subset's top with
  probability C(n - 1 - i, k - 1) / C(n, k); tied scores are broken uniformly at random, so a tie
  group shares its positions' probability and contributes its mean label.

  Raises:
    RLError: k outside [1, n].
  """
  scores, labels = _arrays(scores, labels)
  n = scores.size
  if not 1 <= k <= n:
    raise RLError(f"best-of-k needs 1 <= k <= n; saw n={n}, k={k}")
  order = np.argsort(-scores, kind="mergesort")
  s, y = scores[order], labels[order].astype(np.float64)
  p_top = np.asarray([math.comb(n - 1 - i, k - 1) for i in range(n)], np.float64) / math.comb(n, k)
  total = 0.0
  start = 0
  while start < n:
    end = start
    while end + 1 < n and s[end + 1] == s[start]:
      end += 1
    total += p_top[start:end + 1].sum() * y[start:end + 1].mean()
    start = end + 1
  return float(total)


def random_at_k(labels, k: int) -> float:
  """Expected resolution of a uniformly random one of k random candidates: c / n for any k."""
  labels = np.asarray(labels).reshape(-1).astype(bool)
  if not 1 <= k <= labels.size:
    raise RLError(f"random@k needs 1 <= k <= n; saw n={labels.size}, k={k}")
  return float(labels.mean())


def reranking_report(tasks: Sequence[tuple[Sequence[float], Sequence[bool]]],
                     ks: Sequence[int] = (1, 2, 4, 8), *, num_bins: int = 10
                     ) -> dict[str, float]:
  """Every reranking metric over a set of tasks.

  Args:
    tasks: per task, (value probabilities of its candidates, their resolved labels).
    ks: the k values; a k larger than a task's candidate count skips that task for that k.
    num_bins: ECE bins.
  Returns:
    {"auc", "ece", "best_of_{k}", "pass_at_{k}", "random_at_{k}", "num_tasks_at_{k}"}; AUC and
    ECE pool all candidates (AUC is NaN when the pool holds a single class).
  """
  if not tasks:
    raise RLError("reranking_report needs at least one task")
  all_scores = np.concatenate([np.asarray(s, np.float64).reshape(-1) for s, _ in tasks])
  all_labels = np.concatenate([np.asarray(y).reshape(-1).astype(bool) for _, y in tasks])
  report = {"ece": expected_calibration_error(all_scores, all_labels, num_bins)}
  try:
    report["auc"] = roc_auc(all_scores, all_labels)
  except RLError:
    report["auc"] = float("nan")
  for k in ks:
    eligible = [(s, y) for s, y in tasks if len(y) >= k]
    report[f"num_tasks_at_{k}"] = float(len(eligible))
    if not eligible:
      continue
    report[f"best_of_{k}"] = float(np.mean([best_of_k(s, y, k) for s, y in eligible]))
    report[f"pass_at_{k}"] = float(np.mean(
        [pass_at_k(len(y), int(np.sum(np.asarray(y, bool))), k) for _, y in eligible]))
    report[f"random_at_{k}"] = float(np.mean([random_at_k(y, k) for _, y in eligible]))
  return report
