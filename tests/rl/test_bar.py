"""BAR (docs/algorithms.md section 2): hand-worked examples from its rules, including the order in
which n+ values are tried, the [0, 1] fallback and the ranked fallback, and the group filter."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax import rl
from orchard_jax.rl import ScoredRollout

PAPER = rl.BARConfig(group_size=8, max_rollouts=16, stride=16, positive_fraction=(0.375, 0.625))
RELEASED = rl.BARConfig(group_size=4, max_rollouts=8, stride=8, positive_fraction=(0.25, 0.75))


def _pos(i, length=100, status=0):
  return ScoredRollout(reward=1.0, resolved=True, response_length=length, status=status,
                       rollout_id=f"p{i}")


def _neg(i, length=100, status=0):
  return ScoredRollout(reward=-1.0, resolved=False, response_length=length, status=status,
                       rollout_id=f"n{i}")


def _aborted(i, length=100):
  return ScoredRollout(reward=-1.0, resolved=False, response_length=length, aborted=True,
                       rollout_id=f"a{i}")


def _ids(assembly):
  return [r.rollout_id for r in assembly.rollouts]


def test_order_of_positive_counts():
  # round(rho* N) first, then by distance, ties to the smaller n+.
  assert rl.positive_counts_to_try(8, (0.375, 0.625)) == [4, 3, 5]      # ceil(3)..floor(5)
  assert rl.positive_counts_to_try(4, (0.25, 0.75)) == [2, 1, 3]
  assert rl.positive_counts_to_try(8, (0.0, 1.0)) == [4, 3, 5, 2, 6, 1, 7, 0, 8]
  assert rl.positive_counts_to_try(6, (0.3, 0.7)) == [3, 2, 4]           # ceil(1.8)..floor(4.2)
  # rho* N = 2.5 rounds half to even (Python's round) to 2; then 1 and 3 tie at distance 1
  # and the smaller goes first.
  assert rl.positive_counts_to_try(5, (0.2, 0.8)) == [2, 1, 3, 4]


def test_target_assembly_prefers_balanced_count():
  pool = [_pos(i) for i in range(6)] + [_neg(i) for i in range(10)]
  result = rl.assemble_group(pool, PAPER)
  assert result.mode == "target" and result.tried == (4,) and result.num_positive == 4
  assert _ids(result) == ["p0", "p1", "p2", "p3", "n0", "n1", "n2", "n3"]


def test_target_assembly_falls_to_next_count_in_order():
  # 3 positives: n+ = 4 fails (too few positives), n+ = 3 succeeds before 5 is tried.
  pool = [_neg(i) for i in range(13)] + [_pos(i) for i in range(3)]
  result = rl.assemble_group(pool, PAPER)
  assert result.mode == "target" and result.tried == (4, 3) and result.num_positive == 3
  assert _ids(result) == ["p0", "p1", "p2", "n0", "n1", "n2", "n3", "n4"]
  # 7 positives, 1 negative, pool below N_max: n+ = 4, 3, 5 need 4, 5, 3 negatives: all fail,
  # and no fallback yet (more rollouts are due).
  pool = [_pos(i) for i in range(7)] + [_neg(0)]
  assert rl.assemble_group(pool, PAPER) is None


def test_sort_by_status_then_length():
  pool = [_pos(0, length=50, status=1), _pos(1, length=900), _pos(2, length=300),
          _neg(0, length=10, status=2), _neg(1, length=400), _neg(2, length=20)]
  result = rl.assemble_group(pool, rl.BARConfig(group_size=4, max_rollouts=6, stride=6,
                                                positive_fraction=(0.5, 0.5)))
  assert _ids(result) == ["p2", "p1", "n2", "n1"]


def test_fallback_widens_to_zero_one_in_order():
  pool = [_pos(0)] + [_neg(i) for i in range(15)]
  result = rl.assemble_group(pool, PAPER)
  # target [4, 3, 5] fails; [0, 1] tries 4, 3, 5, 2, 6, 1 and takes n+ = 1
  assert result.mode == "widened" and result.tried == (4, 3, 5, 2, 6, 1)
  assert _ids(result) == ["p0"] + [f"n{i}" for i in range(7)]


def test_fallback_all_negative_group():
  result = rl.assemble_group([_neg(i) for i in range(16)], PAPER)
  assert result.mode == "widened" and result.num_positive == 0
  assert result.tried == (4, 3, 5, 2, 6, 1, 7, 0)


def test_fallback_ranked_when_too_few_finished():
  pool = [_aborted(i, length=100 - i) for i in range(11)] + [_pos(0), _pos(1, length=5)] + [
      _neg(i) for i in range(3)]
  result = rl.assemble_group(pool, PAPER)
  assert result.mode == "ranked"
  # positives (by length), negatives, then the shortest aborted rollouts
  assert _ids(result) == ["p1", "p0", "n0", "n1", "n2", "a10", "a9", "a8"]
  assert result.pool_backfill == 11 and result.pool_positive == 2
  assert result.stats()["bar/mode_ranked"] == 1.0


def test_released_config_one_positive():
  result = rl.assemble_group([_pos(0)] + [_neg(i) for i in range(7)], RELEASED)
  assert result.mode == "target" and result.tried == (2, 1)
  assert _ids(result) == ["p0", "n0", "n1", "n2"]


def test_loop_strides_until_assembled():
  config = rl.BARConfig(group_size=4, max_rollouts=8, stride=4, positive_fraction=(0.25, 0.75))
  batches = iter([[_neg(i) for i in range(4)], [_pos(0), _neg(4), _pos(1), _neg(5)]])
  requests = []

  def generate(k):
    requests.append(k)
    return next(batches)

  [result] = rl.balanced_adaptive_rollout(lambda counts: [generate(counts[0])], config)
  assert requests == [4, 4]
  assert result.mode == "target" and result.num_positive == 2 and result.pool_size == 8
  assert _ids(result) == ["p0", "p1", "n0", "n1"]


def test_loop_stops_at_first_success():
  config = rl.BARConfig(group_size=4, max_rollouts=12, stride=4, positive_fraction=(0.25, 0.75))
  requests = []

  def generate(k):
    requests.append(k)
    return [_pos(0), _neg(0), _neg(1), _neg(2)]

  [result] = rl.balanced_adaptive_rollout(lambda counts: [generate(counts[0])], config)
  assert result.tried == (2, 1)
  assert requests == [4]


def test_loop_falls_back_at_budget_even_if_generation_lost_rollouts():
  config = rl.BARConfig(group_size=4, max_rollouts=8, stride=4, positive_fraction=(0.25, 0.75))
  [result] = rl.balanced_adaptive_rollout(
      lambda counts: [[_neg(i) for i in range(counts[0] - 1)]], config)
  assert result.pool_size == 6 and result.mode == "widened" and result.num_positive == 0


def test_many_prompts_share_rounds_and_stop_independently():
  """Each round asks only the prompts without a group; one that assembles asks for no more."""
  config = rl.BARConfig(group_size=2, max_rollouts=6, stride=2, positive_fraction=(0.5, 0.5))
  outcomes = {0: iter([[_pos(0), _neg(0)]]),                           # assembles in round 1
              1: iter([[_neg(1), _neg(2)], [_pos(1), _neg(3)]]),       # in round 2
              2: iter([[_neg(4), _neg(5)]] * 3)}                       # never: fallback at N_max
  calls = []

  def generate(counts):
    calls.append(list(counts))
    return [next(outcomes[p]) if k else [] for p, k in enumerate(counts)]

  first, second, third = rl.balanced_adaptive_rollout(generate, config, num_prompts=3)
  assert calls == [[2, 2, 2], [0, 2, 2], [0, 0, 2]]
  assert (first.mode, first.pool_size) == ("target", 2)
  assert (second.mode, second.pool_size, _ids(second)) == ("target", 4, ["p1", "n1"])
  assert (third.mode, third.pool_size, third.num_positive) == ("widened", 6, 0)
  with pytest.raises(rl.RLError, match="for 1 prompts; expected 3"):
    rl.balanced_adaptive_rollout(lambda counts: [[]], config, num_prompts=3)


def test_group_filter_reasons():
  assert rl.group_filter_reasons([_pos(0), _neg(0)]) == []
  assert rl.group_filter_reasons([_pos(0), _aborted(0)]) == ["aborted"]
  assert rl.group_filter_reasons([_neg(0), _neg(1)]) == ["zero_reward_std", "no_positive"]
  assert rl.group_filter_reasons([_pos(0), _pos(1)]) == ["zero_reward_std"]


def test_rounding_noise_is_no_reward_spread():
  """An all-resolved group whose shaped rewards differ by one float rounding step is dropped
  (zero spread), and its advantages are the zeros the filter assumes; a real reward step is
  kept and gets real advantages."""
  noisy = [1.3435000000000001, 1.3435, 1.3435, 1.3435 + 2e-16]
  group = [ScoredRollout(reward=r, resolved=True) for r in noisy]
  assert np.ptp(np.asarray(noisy)) > 0                       # the old float64 test saw spread
  assert rl.group_filter_reasons(group) == ["zero_reward_std"]
  np.testing.assert_array_equal(rl.grpo_advantages(np.asarray(noisy, np.float32)), 0.0)
  # One float32 step apart (the largest rounding a float64 -> float32 cast makes differ).
  base = np.float32(1.3435)
  step = [base, np.nextafter(base, np.float32(2)), base, base]
  assert not rl.has_reward_spread(step)
  np.testing.assert_array_equal(rl.grpo_advantages(step), 0.0)
  # RPR's smallest real step: 0.5 * 0.12 * 0.1.
  real = [1.3435, 1.3435 + 0.006, 1.3435, 1.3435]
  assert rl.group_filter_reasons([ScoredRollout(reward=r, resolved=True) for r in real]) == []
  assert np.abs(rl.grpo_advantages(real)).max() > 1.0


@settings(max_examples=200, deadline=None)
@given(rewards=st.lists(st.floats(-2, 2), min_size=2, max_size=8),
       level=st.floats(-2, 2), noise=st.lists(st.floats(-1e-9, 1e-9), min_size=2, max_size=8))
def test_filter_and_advantages_agree(rewards, level, noise):
  """The filter drops a group exactly when its advantages are all zero, and rounding-size
  noise on equal rewards is never spread."""
  group = [ScoredRollout(reward=r, resolved=True) for r in rewards]
  dropped = "zero_reward_std" in rl.group_filter_reasons(group)
  assert dropped == (not np.any(rl.grpo_advantages(rewards)))
  jittered = [ScoredRollout(reward=level + n, resolved=True) for n in noise]
  assert "zero_reward_std" in rl.group_filter_reasons(jittered)


def test_shaped_reward_hides_no_signal_group():
  # docs/cases.md 3: no rollout resolved, yet R' = -1 + 0.5 J differs across the group.
  group = [ScoredRollout(reward=-1 + 0.5 * j, resolved=False) for j in (0.2, 0.9, 0.5, 0.0)]
  assert rl.group_filter_reasons(group, positive_is_resolved=True) == ["no_positive"]
  # A resolved rollout with a shaped reward counts, whatever its value.
  group[0] = ScoredRollout(reward=1.1, resolved=True)
  assert rl.group_filter_reasons(group) == []


def test_select_groups_replaces_dropped_groups_in_order():
  good = [_pos(0), _neg(0)]
  groups = [good, [_neg(0), _neg(1)], good, [_pos(0), _aborted(0)], good, good]
  kept, stats = rl.select_groups(groups, 3)
  assert kept == [0, 2, 4]
  assert stats == {"candidates": 6, "dropped": 2, "dropped_aborted": 1,
                   "dropped_zero_reward_std": 1, "dropped_no_positive": 1, "kept": 3,
                   "unused": 1, "shortfall": 0}
  kept, stats = rl.select_groups(groups[:2], 3)
  assert kept == [0] and stats["shortfall"] == 2


def test_config_validation():
  with pytest.raises(rl.RLError, match="max_rollouts >= group_size"):
    rl.BARConfig(group_size=8, max_rollouts=4)
  with pytest.raises(rl.RLError, match="rho_min <= rho_max"):
    rl.BARConfig(positive_fraction=(0.7, 0.3))


@settings(max_examples=80, deadline=None)
@given(n_pos=st.integers(0, 16), n_neg=st.integers(0, 16), n_abort=st.integers(0, 4),
       lengths=st.lists(st.integers(1, 1000), min_size=36, max_size=36))
def test_assembly_invariants(n_pos, n_neg, n_abort, lengths):
  pool = ([_pos(i, lengths[i]) for i in range(n_pos)] +
          [_neg(i, lengths[16 + i]) for i in range(n_neg)] +
          [_aborted(i, lengths[32 + i]) for i in range(n_abort)])
  result = rl.assemble_group(pool, PAPER)
  if result is None:
    assert len(pool) < PAPER.max_rollouts
    return
  assert len(result.rollouts) == min(8, len(pool))
  positives = [r for r in result.rollouts if r.positive]
  negatives = [r for r in result.rollouts if not r.positive and not r.aborted]
  if result.mode == "target":
    assert 3 <= result.num_positive <= 5
  if result.mode != "ranked":
    assert not any(r.aborted for r in result.rollouts)
  # the chosen of each class are the best-ranked of that class in the pool
  best_pos = sorted(r.response_length for r in pool if r.positive)[:len(positives)]
  best_neg = sorted(r.response_length for r in pool if not r.positive and not r.aborted)[
      :len(negatives)]
  assert sorted(r.response_length for r in positives) == best_pos
  assert sorted(r.response_length for r in negatives) == best_neg
