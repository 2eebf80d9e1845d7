"""RPR (docs/algorithms.md section 5): snapping, weights, clamp, R' = R_bin + alpha J, judge failure."""
import numpy as np
import pytest

from orchard_jax import rl

WEIGHTS = [0.15, 0.18, 0.12, 0.15, 0.14, 0.12, 0.14]  # the table, R1..R7


def test_weights_are_the_papers():
  np.testing.assert_allclose(rl.RUBRIC_WEIGHTS, WEIGHTS)
  assert abs(sum(WEIGHTS) - 1.0) < 1e-12


def test_snap_to_tenths():
  assert [rl.snap_score(x) for x in (0.0, 0.04, 0.05, 0.149, 0.76, 1.0)] == [
      0.0, 0.0, 0.1, 0.1, 0.8, 1.0]
  with pytest.raises(rl.RLError, match=r"\[0, 1\]"):
    rl.snap_score(7)


def test_judge_score_by_hand():
  scores = [0.83, 0.5, 1.0, 0.0, 0.26, 0.94, 0.41]
  snapped = [0.8, 0.5, 1.0, 0.0, 0.3, 0.9, 0.4]
  expected = sum(w * s for w, s in zip(WEIGHTS, snapped))
  assert rl.judge_score(scores) == pytest.approx(expected)
  by_name = dict(zip(rl.RUBRIC_NAMES, scores))
  assert rl.judge_score(by_name) == pytest.approx(expected)
  by_id = {f"R{k + 1}": s for k, s in enumerate(scores)}
  assert rl.judge_score(by_id) == pytest.approx(expected)


def test_clamp_with_custom_weights():
  assert rl.judge_score([1.0] * 7, weights=[0.5] * 7) == 1.0


def test_combined_reward():
  full = [1.0] * 7
  assert rl.rpr_reward(True, full).reward == pytest.approx(1.5)
  assert rl.rpr_reward(False, full).reward == pytest.approx(-0.5)
  truncated = rl.rpr_reward(True, [0.2] * 7, truncated=True, alpha=0.25)
  assert truncated.binary_reward == -1.0 and truncated.reward == pytest.approx(-1 + 0.25 * 0.2)


@pytest.mark.parametrize("scores", [None, [0.5] * 6, {"fix_quality": 0.5}, [0.5] * 6 + ["high"],
                                    [0.5] * 6 + [float("nan")], [0.5] * 6 + [8.0]])
def test_judge_failure_falls_back_to_binary(scores):
  result = rl.rpr_reward(False, scores)
  assert result.judge_failed and result.reward == -1.0 and result.judge_score is None
  assert result.failure


def test_batch_and_stats():
  rewards, results, stats = rl.rpr_rewards([True, False, True], [[1.0] * 7, None, [0.0] * 7])
  np.testing.assert_allclose(rewards, [1.5, -1.0, 1.0])
  assert stats["rpr/judge_failures"] == 1.0
  assert stats["rpr/judge_score_mean"] == pytest.approx(0.5)
  with pytest.raises(rl.RLError, match="one entry per trajectory"):
    rl.rpr_rewards([True], [])
