"""On-policy distillation terms (docs/algorithms.md section 4) against NumPy written from the
definitions, in probability space where the definition is a mixture."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from orchard_jax import rl
from tests.rl import reference

B, T = 2, 12


def _inputs(seed):
  rng = np.random.default_rng(seed)
  segment_ids, weights = reference.random_packed(rng, batch=B, seq=T)
  student = rng.uniform(-4, -0.05, (B, T)).astype(np.float32)
  teacher = rng.uniform(-4, -0.05, (B, T)).astype(np.float32)
  mask = (rng.random((B, T)) < 0.8).astype(np.float32)
  return student, teacher, weights, mask, segment_ids


def _gradient_coefficient(student, teacher, kind, lam=0.5):
  """d(surrogate)/d(log pi_s) per token, from each estimator's definition."""
  ps, pt = np.exp(student.astype(np.float64)), np.exp(teacher.astype(np.float64))
  d = np.log(ps) - np.log(pt)
  if kind in ("k1", "k2"):
    return d
  if kind == "k3":
    return 1 - pt / ps
  m = (1 - lam) * ps + lam * pt
  return np.log(ps / m)


@pytest.mark.parametrize("kind", rl.OPD_DIVERGENCES)
def test_loss_gradient_matches_estimator(kind):
  student, teacher, weights, mask, segment_ids = _inputs(0)
  grad = jax.grad(lambda s: rl.opd_loss(s, teacher, weights, mask, segment_ids, kind=kind)[0])(
      jnp.asarray(student))
  valid = weights * mask * (segment_ids > 0)
  expected = _gradient_coefficient(student, teacher, kind) * valid / valid.sum()
  np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", rl.OPD_DIVERGENCES)
def test_divergence_estimates(kind):
  student, teacher, weights, mask, segment_ids = _inputs(1)
  _, divergence = rl.opd_token_terms(student, teacher, kind=kind, lam=0.3)
  ps, pt = np.exp(student.astype(np.float64)), np.exp(teacher.astype(np.float64))
  expected = {"k1": np.log(ps / pt), "k2": 0.5 * np.log(ps / pt) ** 2,
              "k3": pt / ps - 1 - np.log(pt / ps),
              "js_skew": np.log(ps / (0.7 * ps + 0.3 * pt))}[kind]
  np.testing.assert_allclose(np.asarray(divergence), expected, rtol=1e-4, atol=1e-6)


def test_reward_mode():
  student, teacher, _, mask, _ = _inputs(2)
  ps, pt = np.exp(student.astype(np.float64)), np.exp(teacher.astype(np.float64))
  np.testing.assert_allclose(np.asarray(rl.opd_rewards(student, teacher, mask, kind="k1")),
                             -np.log(ps / pt) * mask, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      np.asarray(rl.opd_rewards(student, teacher, mask, kind="js_skew", lam=0.5)),
      np.log(0.5 * pt / ps + 0.5) * mask, rtol=1e-5, atol=1e-6)
  with pytest.raises(rl.RLError, match="k1"):
    rl.opd_rewards(student, teacher, mask, kind="k3")


def test_teacher_mask_drops_tokens_even_with_garbage_values():
  student, teacher, weights, mask, segment_ids = _inputs(3)
  teacher = np.where(mask > 0, teacher, -np.inf).astype(np.float32)  # unscorable tokens
  loss, grad = jax.value_and_grad(
      lambda s: rl.opd_loss(s, teacher, weights, mask, segment_ids, kind="k3")[0])(
          jnp.asarray(student))
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
  assert np.all(np.asarray(grad)[mask == 0] == 0)
  rewards = rl.opd_rewards(student, teacher, mask)
  assert np.all(np.asarray(rewards)[mask == 0] == 0)


def test_bad_kind_and_lambda():
  x = jnp.zeros((1, 2))
  with pytest.raises(rl.RLError, match="js_skew"):
    rl.opd_token_terms(x, x, kind="fkl")
  with pytest.raises(rl.RLError, match=r"\(0, 1\]"):
    rl.opd_token_terms(x, x, kind="js_skew", lam=0.0)


_logps = hnp.arrays(np.float32, (1, 8), elements=st.floats(-12, 0, width=32))


@settings(max_examples=30, deadline=None)
@given(student=_logps, teacher=_logps)
def test_k2_k3_non_negative_and_zero_when_equal(student, teacher):
  for kind in ("k2", "k3"):
    _, divergence = rl.opd_token_terms(student, teacher, kind=kind)
    assert np.all(np.asarray(divergence) >= 0)
    _, same = rl.opd_token_terms(student, student, kind=kind)
    assert np.all(np.asarray(same) == 0)


@settings(max_examples=30, deadline=None)
@given(student=_logps, teacher=_logps, lam=st.floats(0.01, 1.0))
def test_js_skew_lies_between_zero_and_k1_toward_the_teacher(student, teacher, lam):
  # log(pi_s / m) is monotone in lam, from 0 (lam -> 0) to d (lam = 1), so it shares d's sign
  # and never exceeds it in magnitude.
  _, js = rl.opd_token_terms(student, teacher, kind="js_skew", lam=lam)
  d = student.astype(np.float64) - teacher
  js = np.asarray(js, np.float64)
  assert np.all(np.abs(js) <= np.abs(d) + 1e-4)
  assert np.all(js * d >= -1e-6)
