"""Credit-assignment SFT (docs/algorithms.md section 1): interpolation, credits, rise segments with
eps, per-token weights for resolved vs unresolved trajectories, and the trajectory filters."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax import rl


def test_interpolation_between_and_outside_annotations():
  values = rl.interpolate_values(7, [1, 4], [0.2, 0.8])
  # before step 1 holds 0.2; steps 1..4 rise linearly by 0.2; after step 4 holds 0.8
  np.testing.assert_allclose(values, [0.2, 0.2, 0.4, 0.6, 0.8, 0.8, 0.8])


def test_credits_are_forward_differences():
  np.testing.assert_allclose(rl.step_credits([0.1, 0.3, 0.2, 0.9]), [0.2, -0.1, 0.7])
  assert rl.step_credits([0.5]).size == 0


def test_rise_segments_by_hand():
  # credits:        c0    c1    c2     c3    c4    c5
  credits = [0.10, 0.06, 0.049, 0.30, -0.2, 0.05]
  # c0, c1 rise -> steps [0, 2]; c2 < eps stops it; c3 rises -> [3, 4]; c5 = eps -> [5, 6]
  assert rl.rise_segments(credits, eps=0.05) == [(0, 2), (3, 4), (5, 6)]
  assert rl.rise_segments([0.01, -0.3], eps=0.05) == []
  assert rl.rise_segments([], eps=0.05) == []


def test_unresolved_trains_rise_segment_actions_only():
  # 6 steps; V annotated at 0, 2, 5: 0.1 -> 0.5 -> 0.5 gives credits 0.2, 0.2, 0, 0, 0.
  mask, segments = rl.trained_steps(6, False, annotated_steps=[0, 2, 5],
                                    annotated_values=[0.1, 0.5, 0.5])
  assert segments == [(0, 2)]
  np.testing.assert_array_equal(mask, [1, 1, 1, 0, 0, 0])


def test_resolved_trains_every_action_and_needs_no_annotations():
  mask, segments = rl.trained_steps(4, True)
  assert mask.all() and segments == []


def test_token_weights_never_touch_observations():
  # tokens: prompt(-1) a0 a0 obs(-1) a1 obs(-1) a2 a2
  step_ids = [-1, 0, 0, -1, -1, 1, -1, 2, 2]
  example = rl.credit_assignment_sft(step_ids, False, annotated_steps=[0, 1, 2],
                                     annotated_values=[0.2, 0.2, 0.6])
  # credits 0.0, 0.4 -> segment [1, 2]; a0 is masked, a1 and a2 train, observations never
  np.testing.assert_array_equal(example.loss_weights, [0, 0, 0, 0, 0, 1, 0, 1, 1])
  assert example.rise_segments == ((1, 2),) and example.num_trained_tokens == 3
  resolved = rl.credit_assignment_sft(step_ids, True)
  np.testing.assert_array_equal(resolved.loss_weights, [0, 1, 1, 0, 0, 1, 0, 1, 1])


def test_unresolved_without_rise_has_no_loss():
  example = rl.credit_assignment_sft([-1, 0, -1, 1], False, annotated_steps=[0, 1],
                                     annotated_values=[0.6, 0.2])
  assert example.rise_segments == () and example.num_trained_tokens == 0


def test_one_step_trajectory():
  example = rl.credit_assignment_sft([-1, 0, 0], False, annotated_steps=[0],
                                     annotated_values=[0.9])
  assert example.num_trained_tokens == 0
  assert rl.credit_assignment_sft([-1, 0, 0], True).num_trained_tokens == 2


def test_bad_annotations_are_clear_errors():
  with pytest.raises(rl.RLError, match="needs value annotations"):
    rl.trained_steps(3, False)
  with pytest.raises(rl.RLError, match=r"\[0, 3\)"):
    rl.interpolate_values(3, [0, 3], [0.1, 0.2])
  with pytest.raises(rl.RLError, match="increasing"):
    rl.interpolate_values(3, [2, 1], [0.1, 0.2])
  with pytest.raises(rl.RLError, match=r"\[0, 1\]"):
    rl.interpolate_values(3, [0], [1.5])
  with pytest.raises(rl.RLError, match="step ids"):
    rl.token_loss_weights([0, 5], np.ones(3, bool))


def test_filters_count_each_reason():
  keep, stats = rl.filter_sft_trajectories(
      [100, 5000, 200, 9000], max_tokens=4096,
      undefined_tool_call=[False, False, True, True], unparsable_action=[False, False, True, False])
  np.testing.assert_array_equal(keep, [True, False, False, False])
  assert stats == {"total": 4, "kept": 1, "dropped": 3, "dropped_too_long": 2,
                   "dropped_undefined_tool_call": 2, "dropped_unparsable_action": 1}


def test_undefined_tool_call():
  assert rl.has_undefined_tool_call(["bash", None, "str_replace_editor"], {"bash"})
  assert not rl.has_undefined_tool_call(["bash", None], {"bash", "submit"})


@settings(max_examples=60, deadline=None)
@given(credits=st.lists(st.floats(-0.5, 0.5), max_size=20), eps=st.floats(0.0, 0.2))
def test_rise_segments_are_maximal_runs(credits, eps):
  segments = rl.rise_segments(credits, eps=eps)
  covered = np.zeros(len(credits), bool)
  for start, end in segments:
    assert end > start
    assert all(c >= eps for c in credits[start:end])            # every credit inside rises
    assert start == 0 or credits[start - 1] < eps               # cannot extend left
    assert end == len(credits) or credits[end] < eps            # cannot extend right
    covered[start:end] = True
  assert all(covered[t] == (c >= eps) for t, c in enumerate(credits))
