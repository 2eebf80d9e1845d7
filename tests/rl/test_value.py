"""Value-model BCE targets (docs/algorithms.md section 6) against NumPy."""
import jax.numpy as jnp
import numpy as np
import pytest

from orchard_jax import rl


def _bce(x, y):
  p = 1 / (1 + np.exp(-x.astype(np.float64)))
  return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def test_final_positions():
  seg = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(np.asarray(rl.final_positions(seg)),
                                [[0, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]])


def test_final_position_loss():
  rng = np.random.default_rng(0)
  seg = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  logits = rng.normal(size=seg.shape).astype(np.float32)
  labels = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], np.float32)
  weights = rl.value_loss_weights(seg)
  loss, stats = rl.value_loss(logits, labels, weights, seg)
  expected = np.mean([_bce(logits[0, 1], 1), _bce(logits[0, 4], 0), _bce(logits[1, 5], 1)])
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  finals = [(logits[0, 1], 1), (logits[0, 4], 0), (logits[1, 5], 1)]
  assert float(stats["value_accuracy"]) == pytest.approx(
      np.mean([(x > 0) == y for x, y in finals]))


def test_every_position_counts_each_trajectory_once():
  rng = np.random.default_rng(1)
  seg = np.array([[1, 1, 2, 2, 2, 0]])
  logits = rng.normal(size=seg.shape).astype(np.float32)
  labels = np.array([[1, 1, 0, 0, 0, 0]], np.float32)
  loss, _ = rl.value_loss(logits, labels, rl.value_loss_weights(seg, every_position=True), seg)
  expected = np.mean([_bce(logits[0, :2], 1).mean(), _bce(logits[0, 2:5], 0).mean()])
  assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_large_logits_stay_finite():
  seg = jnp.ones((1, 2), jnp.int32)
  loss, _ = rl.value_loss(jnp.array([[0.0, -200.0]]), jnp.ones((1, 2)),
                          rl.value_loss_weights(seg), seg)
  assert float(loss) == pytest.approx(200.0)
