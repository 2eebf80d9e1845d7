"""The clipped policy loss against a NumPy re-implementation of docs/algorithms.md section 3, its
gradient against finite differences, and properties (hypothesis)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from orchard_jax import rl
from tests.rl import reference

B, T = 3, 16


def _batch(seed):
  rng = np.random.default_rng(seed)
  segment_ids, weights = reference.random_packed(rng, batch=B, seq=T)
  old = rng.normal(-2.0, 1.0, (B, T)).astype(np.float32)
  logp = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
  adv = rng.normal(size=(B, T)).astype(np.float32)
  return logp, old, adv, weights, segment_ids, rng


def _reference_loss(logp, old, adv, weights, segment_ids, mode, eps_low=0.2, eps_high=0.28,
                    behavior=None, tis_cap=None, ref=None, kl_coef=0.0, entropy=None,
                    entropy_coef=0.0):
  per_token = reference.clipped_pg(logp, old, adv, eps_low, eps_high)
  if tis_cap is not None:
    per_token = per_token * np.minimum(np.exp(old.astype(np.float64) - behavior), tis_cap)
  if kl_coef:
    x = ref.astype(np.float64) - logp
    per_token = per_token + kl_coef * (np.exp(x) - x - 1)
  if entropy_coef:
    per_token = per_token - entropy_coef * entropy
  return reference.aggregate(per_token, weights, segment_ids, mode)


@pytest.mark.parametrize("mode", rl.AGGREGATIONS)
def test_loss_matches_numpy(mode):
  logp, old, adv, weights, segment_ids, _ = _batch(0)
  loss, stats = rl.policy_loss(logp, old, adv, weights, segment_ids, aggregation=mode)
  np.testing.assert_allclose(float(loss),
                             _reference_loss(logp, old, adv, weights, segment_ids, mode),
                             rtol=1e-5, atol=1e-6)
  rho = np.exp(logp - old)
  clipped = ((adv > 0) & (rho > 1.28)) | ((adv < 0) & (rho < 0.8))
  valid = (weights > 0) & (segment_ids > 0)
  np.testing.assert_allclose(float(stats["clip_fraction"]), clipped[valid].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(stats["ratio_mean"]), rho[valid].mean(), rtol=1e-5)


def test_all_optional_terms_match_numpy():
  logp, old, adv, weights, segment_ids, rng = _batch(1)
  behavior = (old + rng.normal(0, 0.5, (B, T))).astype(np.float32)
  ref = (old + rng.normal(0, 0.2, (B, T))).astype(np.float32)
  entropy = rng.uniform(0, 3, (B, T)).astype(np.float32)
  kwargs = dict(behavior=behavior, tis_cap=1.5, ref=ref, kl_coef=0.1, entropy=entropy,
                entropy_coef=0.01)
  loss, stats = rl.policy_loss(logp, old, adv, weights, segment_ids, behavior_logp=behavior,
                               tis_cap=1.5, ref_logp=ref, kl_coef=0.1, entropy=entropy,
                               entropy_coef=0.01)
  np.testing.assert_allclose(
      float(loss), _reference_loss(logp, old, adv, weights, segment_ids, "token_mean", **kwargs),
      rtol=1e-5, atol=1e-6)
  valid = (weights > 0) & (segment_ids > 0)
  raw = np.exp(old.astype(np.float64) - behavior)
  np.testing.assert_allclose(float(stats["tis_truncated_fraction"]), (raw > 1.5)[valid].mean(),
                             rtol=1e-5)
  assert float(stats["tis_weight_mean"]) <= 1.5


def test_gradient_matches_finite_differences():
  logp, old, adv, weights, segment_ids, _ = _batch(2)
  grad = np.asarray(jax.grad(lambda lp: rl.policy_loss(
      lp, old, adv, weights, segment_ids, aggregation="sequence_mean")[0])(jnp.asarray(logp)))
  h = 1e-4
  numeric = np.zeros_like(grad, np.float64)
  base = logp.astype(np.float64)
  for b in range(B):
    for t in range(T):
      up, down = base.copy(), base.copy()
      up[b, t] += h
      down[b, t] -= h
      numeric[b, t] = (_reference_loss(up, old, adv, weights, segment_ids, "sequence_mean") -
                       _reference_loss(down, old, adv, weights, segment_ids, "sequence_mean")) / (
                           2 * h)
  np.testing.assert_allclose(grad, numeric, atol=2e-4)


def test_clipped_tokens_get_no_gradient():
  # rho = e^0.5 > 1.28 with A > 0 (clipped high); rho = e^-0.5 < 0.8 with A < 0 (clipped low);
  # rho = e^0.5 with A < 0 is not clipped (the min picks the unclipped, larger loss).
  logp = jnp.array([[0.0, 0.5, -0.5, 0.5]])
  old = jnp.zeros((1, 4))
  adv = jnp.array([[0.0, 1.0, -1.0, -1.0]])
  weights = jnp.array([[0.0, 1.0, 1.0, 1.0]])
  seg = jnp.ones((1, 4), jnp.int32)
  grad = jax.grad(lambda lp: rl.policy_loss(lp, old, adv, weights, seg)[0])(logp)
  np.testing.assert_allclose(np.asarray(grad), [[0.0, 0.0, 0.0, np.exp(0.5) / 3]], rtol=1e-6)


def test_one_token_response():
  seg = jnp.array([[1, 1, 0, 0]], jnp.int32)
  weights = jnp.array([[0.0, 1.0, 0.0, 0.0]])
  logp = jnp.array([[0.0, -1.0, 0.0, 0.0]])
  loss, _ = rl.policy_loss(logp, logp, jnp.full((1, 4), 2.0), weights, seg)
  assert float(loss) == pytest.approx(-2.0)  # rho = 1: -A


def test_placeholders_on_masked_tokens_cannot_make_nan():
  seg = jnp.array([[1, 1, 1, 0]], jnp.int32)
  weights = jnp.array([[0.0, 1.0, 0.0, 0.0]])
  logp = jnp.array([[0.0, -1.0, 0.0, 0.0]])
  old = jnp.array([[-1e4, -1.2, -1e4, -1e4]])  # overflow if the masked ratio were taken
  grad = jax.grad(lambda lp: rl.policy_loss(lp, old, jnp.ones((1, 4)), weights, seg,
                                            behavior_logp=old, tis_cap=2.0, ref_logp=old,
                                            kl_coef=0.1)[0])(logp)
  assert np.all(np.isfinite(np.asarray(grad)))


def test_bad_inputs_are_clear_errors():
  x = jnp.zeros((1, 3))
  seg = jnp.ones((1, 3), jnp.int32)
  with pytest.raises(rl.RLError, match="old_logp has shape"):
    rl.policy_loss(x, jnp.zeros((1, 4)), x, x, seg)
  with pytest.raises(rl.RLError, match="ref_logp"):
    rl.policy_loss(x, x, x, x, seg, kl_coef=0.1)
  with pytest.raises(rl.RLError, match="entropy"):
    rl.policy_loss(x, x, x, x, seg, entropy_coef=0.1)
  with pytest.raises(rl.RLError, match="behavior_logp"):
    rl.policy_loss(x, x, x, x, seg, tis_cap=2.0)


_logps = hnp.arrays(np.float32, (2, 8), elements=st.floats(-6, 0, width=32))


@settings(max_examples=25, deadline=None)
@given(logp=_logps, old=_logps, mode=st.sampled_from(rl.AGGREGATIONS))
def test_zero_advantage_gives_zero_loss_and_gradient(logp, old, mode):
  seg = np.array([[1] * 5 + [2] * 3, [1] * 8], np.int32)
  weights = np.ones((2, 8), np.float32)
  weights[:, 0] = 0
  zeros = jnp.zeros((2, 8))
  loss_fn = lambda lp: rl.policy_loss(lp, old, zeros, weights, seg, aggregation=mode)[0]
  loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(logp))
  assert float(loss) == 0.0
  assert np.all(np.asarray(grad) == 0.0)


@settings(max_examples=25, deadline=None)
@given(logp=_logps, ref=_logps)
def test_k3_is_non_negative(logp, ref):
  assert np.all(np.asarray(rl.k3_kl(logp, ref)) >= 0.0)


@settings(max_examples=25, deadline=None)
@given(logp=_logps, sign=st.sampled_from([-1.0, 1.0]))
def test_on_policy_gradient_direction(logp, sign):
  # At rho = 1 (on-policy) the gradient w.r.t. each weighted token's logp is -A / n_tokens:
  # positive advantages raise the sampled tokens' log-probs, negative ones lower them.
  seg = np.ones((2, 8), np.int32)
  weights = np.ones((2, 8), np.float32)
  adv = np.full((2, 8), sign, np.float32)
  grad = jax.grad(lambda lp: rl.policy_loss(lp, jnp.asarray(logp), adv, weights, seg)[0])(
      jnp.asarray(logp))
  np.testing.assert_allclose(np.asarray(grad), -sign / 16.0, rtol=1e-6)
