"""Confidence intervals of pass@1 and of a change in it, against published worked examples and
the formulas written again in NumPy."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from orchard_jax import rl

Z95 = 1.959963984540054


def wilson_by_hand(s, n, z=Z95):
  p = s / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return centre - half, centre + half


def test_newcombe_1998_worked_example():
  # Newcombe (1998), Table II, example (a): 56/70 vs 48/80, method 10: 0.0524 to 0.3339.
  low, high = rl.newcombe_interval(56, 70, 48, 80)
  assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)


def test_wilson_at_the_edges_keeps_width():
  # 0 of 10: the Wald interval is [0, 0]; Wilson's upper end is z^2 / (n + z^2).
  low, high = rl.wilson_interval(0, 10)
  assert low == pytest.approx(0.0, abs=1e-12)
  assert high == pytest.approx(Z95 ** 2 / (10 + Z95 ** 2))
  assert rl.wilson_interval(10, 10)[0] == pytest.approx(10 / (10 + Z95 ** 2))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 500), data=st.data())
def test_wilson_matches_the_formula(n, data):
  s = data.draw(st.integers(0, n))
  low, high = rl.wilson_interval(s, n)
  want = wilson_by_hand(s, n)
  assert low == pytest.approx(max(0.0, want[0]), abs=1e-9)
  assert high == pytest.approx(min(1.0, want[1]), abs=1e-9)
  assert low <= s / n <= high


@settings(max_examples=200, deadline=None)
@given(n1=st.integers(1, 200), n2=st.integers(1, 200), data=st.data())
def test_newcombe_matches_the_formula(n1, n2, data):
  s1, s2 = data.draw(st.integers(0, n1)), data.draw(st.integers(0, n2))
  p1, p2 = s1 / n1, s2 / n2
  (l1, u1), (l2, u2) = wilson_by_hand(s1, n1), wilson_by_hand(s2, n2)
  low, high = rl.newcombe_interval(s1, n1, s2, n2)
  assert low == pytest.approx(p1 - p2 - math.hypot(p1 - l1, u2 - p2), abs=1e-9)
  assert high == pytest.approx(p1 - p2 + math.hypot(u1 - p1, p2 - l2), abs=1e-9)
  assert low <= p1 - p2 <= high


@pytest.mark.parametrize("args", [(3, 2), (-1, 5), (0, 0)])
def test_bad_counts_are_refused(args):
  with pytest.raises(rl.RLError, match="successes <= trials"):
    rl.wilson_interval(*args)
  with pytest.raises(rl.RLError, match="confidence"):
    rl.wilson_interval(1, 2, confidence=1.0)
