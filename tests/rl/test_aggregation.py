"""Loss aggregation modes against loop-by-loop NumPy (DAPO token-mean, GRPO sequence-mean,
Dr.GRPO constant normaliser), and the global-normaliser rule for gradient accumulation."""
import numpy as np
import pytest

from orchard_jax import rl
from tests.rl import reference


@pytest.mark.parametrize("mode", rl.AGGREGATIONS)
def test_modes_match_numpy(mode):
  rng = np.random.default_rng(0)
  for _ in range(3):
    segment_ids, weights = reference.random_packed(rng)
    x = rng.normal(size=weights.shape).astype(np.float32)
    got = float(rl.aggregate(x, weights, segment_ids, mode))
    np.testing.assert_allclose(got, reference.aggregate(x, weights, segment_ids, mode),
                               rtol=1e-5, atol=1e-6)


def test_dr_grpo_constant():
  rng = np.random.default_rng(1)
  segment_ids, weights = reference.random_packed(rng)
  x = rng.normal(size=weights.shape).astype(np.float32)
  got = float(rl.aggregate(x, weights, segment_ids, "sequence_sum_norm", max_tokens=100))
  np.testing.assert_allclose(
      got, reference.aggregate(x, weights, segment_ids, "sequence_sum_norm", max_tokens=100),
      rtol=1e-5)


def test_padding_and_zero_weights_never_count():
  segment_ids = np.array([[1, 1, 1, 0, 0]], np.int32)
  weights = np.array([[0, 1, 1, 1, 1]], np.float32)  # weight on padding must be ignored
  x = np.array([[100.0, 2.0, 4.0, 1e6, 1e6]], np.float32)
  for mode in ("token_mean", "sequence_mean"):
    assert float(rl.aggregate(x, weights, segment_ids, mode)) == pytest.approx(3.0)


def test_empty_batch_is_zero_not_nan():
  segment_ids = np.zeros((2, 4), np.int32)
  weights = np.zeros((2, 4), np.float32)
  for mode in rl.AGGREGATIONS:
    assert float(rl.aggregate(np.ones((2, 4)), weights, segment_ids, mode)) == 0.0


@pytest.mark.parametrize("mode", rl.AGGREGATIONS)
def test_global_normalizer_makes_microbatches_sum_to_full_batch(mode):
  rng = np.random.default_rng(2)
  segment_ids, weights = reference.random_packed(rng, batch=4)
  x = rng.normal(size=weights.shape).astype(np.float32)
  full = float(rl.aggregate(x, weights, segment_ids, mode))
  normalizer = rl.loss_normalizer(weights, segment_ids, mode)
  parts = sum(float(rl.aggregate(x[i:i + 2], weights[i:i + 2], segment_ids[i:i + 2], mode,
                                 normalizer=normalizer, max_tokens=x.shape[1]))
              for i in (0, 2))
  np.testing.assert_allclose(parts, full, rtol=1e-5, atol=1e-6)


def test_unknown_mode_names_the_choices():
  with pytest.raises(rl.RLError, match="token_mean"):
    rl.aggregate(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2), np.int32), "mean")
