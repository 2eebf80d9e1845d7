"""The learning-rate schedule against its formula, and AdamW's decay mask."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchard_jax import train


def _expected(step, peak=1e-3, end=1e-4, warmup=10, total=50):
  if step < warmup:
    return peak * step / warmup
  progress = min((step - warmup) / (total - warmup), 1.0)
  return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


def test_warmup_cosine_matches_formula():
  schedule = train.learning_rate_schedule(train.OptimizerConfig(
      learning_rate=1e-3, end_learning_rate=1e-4, warmup_steps=10, total_steps=50))
  for step in (0, 1, 5, 10, 11, 30, 49, 50, 80):
    assert float(schedule(step)) == pytest.approx(_expected(step), rel=1e-5, abs=1e-10)


def test_constant_and_linear():
  constant = train.learning_rate_schedule(train.OptimizerConfig(
      learning_rate=1e-6, warmup_steps=0, total_steps=10, schedule="constant"))
  assert [float(constant(s)) for s in (0, 5, 100)] == pytest.approx([1e-6] * 3)
  linear = train.learning_rate_schedule(train.OptimizerConfig(
      learning_rate=1.0, end_learning_rate=0.0, warmup_steps=2, total_steps=6, schedule="linear"))
  assert [float(linear(s)) for s in range(7)] == pytest.approx([0, 0.5, 1, 0.75, 0.5, 0.25, 0])


def test_weight_decay_only_on_matrices():
  config = train.OptimizerConfig(learning_rate=0.1, warmup_steps=0, total_steps=10,
                                 schedule="constant", weight_decay=0.5, max_grad_norm=0.0)
  opt = train.make_optimizer(config)
  params = {"w": jnp.ones((2, 2)), "scale": jnp.ones(2)}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = opt.update(zeros, opt.init(params), params)
  np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_allclose(updates["scale"], 0.0)


def test_global_norm_clipping():
  # b1 = b2 = 0 and a huge eps make Adam's step linear in the gradient: g / (|g| + eps) ~ g / eps,
  # so the clip to global norm 1 shows: [3, 4] -> [0.6, 0.8].
  config = train.OptimizerConfig(learning_rate=1.0, warmup_steps=0, total_steps=10,
                                 schedule="constant", weight_decay=0.0, max_grad_norm=1.0,
                                 b1=0.0, b2=0.0, eps=1e6)
  opt = train.make_optimizer(config)
  grads = {"a": jnp.array([3.0, 4.0])}
  updates, _ = opt.update(grads, opt.init(grads), grads)
  np.testing.assert_allclose(updates["a"], -np.array([0.6, 0.8]) / 1e6, rtol=1e-5)


def test_bad_config():
  with pytest.raises(train.TrainError, match="schedule"):
    train.OptimizerConfig(schedule="step")
  with pytest.raises(train.TrainError, match="total_steps is 0"):
    train.learning_rate_schedule(train.OptimizerConfig())   # the Trainer fills it in
