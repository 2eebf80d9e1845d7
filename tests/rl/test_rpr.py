"""RPR (docs/algorithms.md section 5): snapping, weights, clamp, R' = R_out + alpha J, judge
failure, with the rubric set passed in (the SWE set, and sets of other sizes)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchard_jax import rl
from orchard_jax.tasks.swe.rubrics import RUBRICS as SWE_RUBRICS

WEIGHTS = [0.15, 0.18, 0.12, 0.15, 0.14, 0.12, 0.14]  # the table, R1..R7
SWE = rl.RubricSet(SWE_RUBRICS)


def test_weights_are_the_papers():
  np.testing.assert_allclose(SWE.weights, WEIGHTS)
  assert abs(sum(WEIGHTS) - 1.0) < 1e-12 and len(SWE) == 7


def test_snap_to_tenths():
  assert [rl.snap_score(x) for x in (0.0, 0.04, 0.05, 0.149, 0.76, 1.0)] == [
      0.0, 0.0, 0.1, 0.1, 0.8, 1.0]
  with pytest.raises(rl.RLError, match=r"\[0, 1\]"):
    rl.snap_score(7)


def test_judge_score_by_hand():
  scores = [0.83, 0.5, 1.0, 0.0, 0.26, 0.94, 0.41]
  snapped = [0.8, 0.5, 1.0, 0.0, 0.3, 0.9, 0.4]
  expected = sum(w * s for w, s in zip(WEIGHTS, snapped))
  assert rl.judge_score(scores, SWE) == pytest.approx(expected)
  by_name = dict(zip(SWE.names, scores))
  assert rl.judge_score(by_name, SWE) == pytest.approx(expected)
  by_id = {f"R{k + 1}": s for k, s in enumerate(scores)}
  assert rl.judge_score(by_id, SWE) == pytest.approx(expected)
  assert SWE.named_scores(by_id) == by_name


def test_clamp_with_custom_weights():
  heavy = rl.RubricSet(tuple((f"r{k}", 0.5) for k in range(7)))
  assert rl.judge_score([1.0] * 7, heavy) == 1.0


def test_a_domain_brings_its_own_rubric_set():
  # Two rubrics of another domain: its names, its weights; the SWE names mean nothing here.
  claw = rl.RubricSet((("completion", 0.7), ("safety", 0.3)))
  assert rl.judge_score({"completion": 1.0, "safety": 0.5}, claw) == pytest.approx(0.85)
  assert rl.judge_score({"R1": 0.0, "R2": 1.0}, claw) == pytest.approx(0.3)
  with pytest.raises(rl.RLError, match="'safety'"):
    rl.judge_score({"completion": 1.0, "fix_quality": 1.0}, claw)
  with pytest.raises(rl.RLError, match="expected 2 rubric scores"):
    rl.judge_score([1.0] * 7, claw)


@pytest.mark.parametrize("rubrics, message", [
    ((), "at least one"), ((("a", 0.5), ("a", 0.5)), "unique"), ((("", 1.0),), "unique"),
    ((("a", -0.1),), ">= 0"), ((("a", float("nan")),), ">= 0")])
def test_bad_rubric_sets_are_refused(rubrics, message):
  with pytest.raises(rl.RLError, match=message):
    rl.RubricSet(rubrics)


def test_combined_reward():
  full = [1.0] * 7
  assert rl.rpr_reward(True, full, rubrics=SWE).reward == pytest.approx(1.5)
  assert rl.rpr_reward(False, full, rubrics=SWE).reward == pytest.approx(-0.5)
  truncated = rl.rpr_reward(True, [0.2] * 7, rubrics=SWE, truncated=True, alpha=0.25)
  assert truncated.binary_reward == -1.0 and truncated.reward == pytest.approx(-1 + 0.25 * 0.2)
  # A domain's own outcome reward replaces R_bin; the judge term is added the same way.
  scored = rl.rpr_reward(False, full, rubrics=SWE, outcome_reward=0.4, alpha=0.5)
  assert scored.binary_reward == 0.4 and scored.reward == pytest.approx(0.9)


@pytest.mark.parametrize("scores", [None, [0.5] * 6, {"fix_quality": 0.5}, [0.5] * 6 + ["high"],
                                    [0.5] * 6 + [float("nan")], [0.5] * 6 + [8.0]])
def test_judge_failure_falls_back_to_binary(scores):
  result = rl.rpr_reward(False, scores, rubrics=SWE)
  assert result.judge_failed and result.reward == -1.0 and result.judge_score is None
  assert result.failure


def test_a_failed_judgement_keeps_its_reason():
  result = rl.rpr_reward(True, None, rubrics=SWE, failure="GraderError: no JSON")
  assert result.reward == 1.0 and result.failure == "GraderError: no JSON"


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=9),
       data=st.data(), resolved=st.booleans(), alpha=st.floats(0.0, 2.0))
def test_reward_matches_the_formula_for_any_rubric_set(weights, data, resolved, alpha):
  rubrics = rl.RubricSet(tuple((f"rubric_{k}", w) for k, w in enumerate(weights)))
  scores = data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(weights),
                              max_size=len(weights)))
  snapped = [math.floor(s * 10 + 0.5 + 1e-9) / 10 for s in scores]
  j = min(max(sum(w * s for w, s in zip(weights, snapped)), 0.0), 1.0)
  result = rl.rpr_reward(resolved, dict(zip(rubrics.names, scores)), rubrics=rubrics,
                         alpha=alpha)
  assert result.judge_score == pytest.approx(j, abs=1e-9)
  assert result.reward == pytest.approx((1.0 if resolved else -1.0) + alpha * j, abs=1e-9)


def test_batch_and_stats():
  rewards, results, stats = rl.rpr_rewards([True, False, True], [[1.0] * 7, None, [0.0] * 7],
                                           rubrics=SWE)
  np.testing.assert_allclose(rewards, [1.5, -1.0, 1.0])
  assert stats["rpr/judge_failures"] == 1.0
  assert stats["rpr/judge_score_mean"] == pytest.approx(0.5)
  with pytest.raises(rl.RLError, match="one entry per trajectory"):
    rl.rpr_rewards([True], [], rubrics=SWE)
