"""Reranking metrics against brute force over candidates and subsets (itertools)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax import rl


def _auc_pairs(scores, labels):
  pos = [s for s, y in zip(scores, labels) if y]
  neg = [s for s, y in zip(scores, labels) if not y]
  return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg])


def _best_of_k_brute(scores, labels, k):
  total, count = 0.0, 0
  for subset in itertools.combinations(range(len(scores)), k):
    top = max(scores[i] for i in subset)
    tied = [i for i in subset if scores[i] == top]
    total += np.mean([labels[i] for i in tied])   # random tie-break
    count += 1
  return total / count


def _pass_at_k_brute(labels, k):
  subsets = list(itertools.combinations(range(len(labels)), k))
  return np.mean([any(labels[i] for i in s) for s in subsets])


def test_auc_by_hand_with_ties():
  assert rl.roc_auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx((1 + 1 + 0.5 + 1) / 4)
  with pytest.raises(rl.RLError, match="both classes"):
    rl.roc_auc([0.1, 0.2], [1, 1])


def test_ece_by_hand():
  probs = [0.05, 0.15, 0.95, 0.95]
  labels = [0, 1, 1, 0]
  # bins: (0, .1] -> {0.05: 0}, (.1, .2] -> {0.15: 1}, (.9, 1] -> {0.95: 1, 0.95: 0}
  expected = 0.25 * 0.05 + 0.25 * 0.85 + 0.5 * 0.45
  assert rl.expected_calibration_error(probs, labels) == pytest.approx(expected)
  with pytest.raises(rl.RLError, match="sigmoid"):
    rl.expected_calibration_error([1.5], [1])


def test_pass_at_k_closed_form():
  assert rl.pass_at_k(10, 3, 1) == pytest.approx(0.3)
  assert rl.pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
  assert rl.pass_at_k(4, 0, 4) == 0.0 and rl.pass_at_k(4, 1, 4) == 1.0


def test_report_ordering_for_a_good_reranker():
  rng = np.random.default_rng(0)
  tasks = []
  for _ in range(20):
    labels = rng.random(8) < 0.3
    scores = np.clip(labels * 0.6 + rng.random(8) * 0.5, 0, 1)
    tasks.append((scores, labels))
  report = rl.reranking_report(tasks, ks=(1, 4, 8))
  assert report["random_at_4"] <= report["best_of_4"] <= report["pass_at_4"]
  assert report["best_of_1"] == pytest.approx(report["random_at_1"])
  assert report["auc"] > 0.8 and report["num_tasks_at_8"] == 20


_candidates = st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=2, max_size=7)


@settings(max_examples=60, deadline=None)
@given(candidates=_candidates, data=st.data())
def test_against_brute_force(candidates, data):
  scores = [float(s) for s, _ in candidates]   # small integer scores force ties
  labels = [y for _, y in candidates]
  k = data.draw(st.integers(1, len(candidates)))
  assert rl.best_of_k(scores, labels, k) == pytest.approx(_best_of_k_brute(scores, labels, k))
  assert rl.pass_at_k(len(labels), sum(labels), k) == pytest.approx(
      _pass_at_k_brute(labels, k))
  assert rl.random_at_k(labels, k) == pytest.approx(np.mean(labels))
  if 0 < sum(labels) < len(labels):
    assert rl.roc_auc(scores, labels) == pytest.approx(_auc_pairs(scores, labels))
    assert rl.roc_auc(scores, labels) + rl.roc_auc([-s for s in scores], labels) == (
        pytest.approx(1.0))
