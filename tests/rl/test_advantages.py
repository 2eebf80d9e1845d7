"""GRPO / Dr.GRPO advantages against the formula written again in NumPy, plus properties."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from orchard_jax import rl


def test_matches_formula_per_group():
  rng = np.random.default_rng(0)
  rewards = rng.choice([-1.0, 1.0], size=(5, 8)) + 0.5 * rng.random((5, 8))
  got = rl.grpo_advantages(rewards)
  for g in range(5):
    r = rewards[g]
    expected = [(x - sum(r) / len(r)) / (np.sqrt(sum((y - sum(r) / len(r)) ** 2 for y in r) /
                                                 len(r)) + 1e-6) for x in r]
    np.testing.assert_allclose(got[g], expected, rtol=1e-5, atol=1e-6)


def test_dr_grpo_only_centres():
  rewards = np.array([[1.0, -1.0, -1.0, -1.0]])
  np.testing.assert_allclose(rl.grpo_advantages(rewards, scale="none"),
                             [[1.5, -0.5, -0.5, -0.5]])


def test_equal_rewards_give_zero_advantages():
  np.testing.assert_array_equal(rl.grpo_advantages(np.full((2, 4), -1.0)), np.zeros((2, 4)))


def test_mask_excludes_empty_slots():
  rewards = np.array([1.0, -1.0, 99.0])
  got = rl.grpo_advantages(rewards, mask=[True, True, False])
  np.testing.assert_allclose(got, [1.0, -1.0, 0.0], atol=1e-5)


def test_bad_inputs():
  with pytest.raises(rl.RLError, match="scale"):
    rl.grpo_advantages([1.0, 2.0], scale="mad")
  with pytest.raises(rl.RLError, match="finite"):
    rl.grpo_advantages([1.0, np.nan])
  with pytest.raises(rl.RLError, match="mask has shape"):
    rl.grpo_advantages([[1.0, 2.0]], mask=[True])


@settings(max_examples=50, deadline=None)
@given(rewards=hnp.arrays(np.float64, (3, 6), elements=st.floats(-5, 5)),
       shift=st.floats(-10, 10), scale=st.floats(0.5, 4))
def test_zero_mean_and_affine_invariance(rewards, shift, scale):
  adv = rl.grpo_advantages(rewards)
  np.testing.assert_allclose(adv.mean(axis=1), 0.0, atol=1e-4)
  spread = rewards.std(axis=1)
  moved = rl.grpo_advantages(rewards * scale + shift)
  well_spread = spread > 1e-2  # away from the eps = 1e-6 regime
  np.testing.assert_allclose(moved[well_spread], adv[well_spread], rtol=1e-3, atol=1e-3)
