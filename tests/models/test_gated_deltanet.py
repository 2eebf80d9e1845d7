"""Gated DeltaNet: the chunked delta rule against a NumPy per-token recurrence written here
(with segment resets and padding), against transformers' torch_recurrent_gated_delta_rule,
gradients of chunked vs recurrent, and the segment-aware causal conv."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf_qwen35

from orchard_jax.models import gated_deltanet as gdn

B, T, H, DK, DV = 2, 21, 3, 8, 5


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, T, H, DK)).astype(np.float32)
  k = rng.normal(size=(B, T, H, DK)).astype(np.float32)
  q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(DK)
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.normal(size=(B, T, H, DV)).astype(np.float32)
  g = -rng.uniform(0.01, 2.0, size=(B, T, H)).astype(np.float32)
  beta = rng.uniform(0.0, 1.0, size=(B, T, H)).astype(np.float32)
  # row 0: segments [0, 7), [7, 16), padding [16, 18), segment [18, 21)
  # row 1: padding [0, 3) then one segment
  seg = np.zeros((B, T), np.int32)
  seg[0, :7], seg[0, 7:16], seg[0, 18:] = 1, 2, 3
  seg[1, 3:] = 1
  return q, k, v, g, beta, seg


def _numpy_reference(q, k, v, g, beta, seg):
  """S_t = exp(g_t) S_{t-1} + k_t u_t^T, u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),
  o_t = S_t^T q_t; S restarts at 0 at every segment start; padding leaves S unchanged."""
  out = np.zeros((B, T, H, DV), np.float64)
  final = np.zeros((B, H, DK, DV), np.float64)
  for b in range(B):
    s = np.zeros((H, DK, DV))
    prev = None
    for t in range(T):
      if seg[b, t] == 0:
        continue
      if seg[b, t] != prev:
        s = np.zeros((H, DK, DV))
        prev = seg[b, t]
      for h in range(H):
        decayed = np.exp(g[b, t, h]) * s[h]
        u = beta[b, t, h] * (v[b, t, h] - decayed.T @ k[b, t, h])
        s[h] = decayed + np.outer(k[b, t, h], u)
        out[b, t, h] = s[h].T @ q[b, t, h]
    final[b] = s
  return out, final


def _masked(q, k, v, g, beta, seg):
  valid = (seg != 0)[..., None]
  return q, k, v, np.where(valid, g, 0), np.where(valid, beta, 0)


@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_chunked_delta_rule_matches_numpy_recurrence_with_segments(chunk):
  q, k, v, g, beta, seg = _inputs()
  expected, final = _numpy_reference(q, k, v, g, beta, seg)
  runs = gdn.segment_runs(jnp.asarray(seg))
  out, state = jax.jit(gdn.delta_rule_chunked, static_argnums=7)(
      *map(jnp.asarray, _masked(q, k, v, g, beta, seg)), runs,
      jnp.zeros((B, H, DK, DV)), chunk)
  valid = seg != 0
  np.testing.assert_allclose(np.asarray(out)[valid], expected[valid], atol=2e-5)
  np.testing.assert_allclose(np.asarray(state), final, atol=2e-5)


def test_single_segment_matches_transformers_recurrent_kernel():
  q, k, v, g, beta, _ = _inputs(1)
  seg = np.ones((B, T), np.int32)
  initial = np.random.default_rng(2).normal(size=(B, H, DK, DV)).astype(np.float32)
  # transformers normalises q and k inside its kernel; ours come normalised (q also scaled).
  ref_out, ref_state = hf_qwen35.torch_recurrent_gated_delta_rule(
      torch.tensor(q), torch.tensor(k), torch.tensor(v), g=torch.tensor(g),
      beta=torch.tensor(beta), initial_state=torch.tensor(initial), output_final_state=True,
      use_qk_l2norm_in_kernel=True)
  qn = q / np.linalg.norm(q, axis=-1, keepdims=True) / np.sqrt(DK)
  out, state = gdn.delta_rule_chunked(
      *map(jnp.asarray, (qn, k, v, g, beta)), gdn.segment_runs(jnp.asarray(seg)),
      jnp.asarray(initial), 8)
  np.testing.assert_allclose(np.asarray(out), ref_out.numpy(), atol=2e-5)
  np.testing.assert_allclose(np.asarray(state), ref_state.numpy(), atol=2e-5)


def test_chunked_and_recurrent_gradients_agree():
  q, k, v, g, beta, _ = _inputs(3)
  seg = jnp.ones((B, T), jnp.int32)
  args = tuple(map(jnp.asarray, (q, k, v, g, beta)))
  state0 = jnp.zeros((B, H, DK, DV))

  def loss_chunked(*a):
    out, state = gdn.delta_rule_chunked(*a, gdn.segment_runs(seg), state0, 8)
    return jnp.sum(jnp.sin(out)) + jnp.sum(state ** 2)

  def loss_recurrent(*a):
    out, state = gdn.delta_rule_recurrent(*a, state0)
    return jnp.sum(jnp.sin(out)) + jnp.sum(state ** 2)

  grads_c = jax.jit(jax.grad(loss_chunked, argnums=tuple(range(5))))(*args)
  grads_r = jax.jit(jax.grad(loss_recurrent, argnums=tuple(range(5))))(*args)
  for a, b in zip(grads_c, grads_r):
    np.testing.assert_allclose(a, b, atol=5e-5)


def test_chunked_gradients_with_segments_and_padding_match_per_segment_recurrence():
  # Row 0: segments [0, 7), [7, 16), padding, [18, 21); row 1: padding then [3, 21). T = 21
  # with chunks of 8 also pads the last chunk.
  q, k, v, g, beta, seg = _inputs(4)
  args = tuple(map(jnp.asarray, _masked(q, k, v, g, beta, seg)))
  valid = jnp.asarray(seg != 0)[..., None, None]
  state0 = jnp.zeros((B, H, DK, DV))
  spans = {0: [(0, 7), (7, 16), (18, 21)], 1: [(3, 21)]}

  def loss_chunked(*a):
    out, state = gdn.delta_rule_chunked(*a, gdn.segment_runs(jnp.asarray(seg)), state0, 8)
    return jnp.sum(jnp.sin(out) * valid) + jnp.sum(state ** 2)

  def loss_per_segment(*a):
    total = 0.0
    for row, pieces in spans.items():
      for start, end in pieces:
        out, state = gdn.delta_rule_recurrent(*(x[row:row + 1, start:end] for x in a),
                                              state0[:1])
        total = total + jnp.sum(jnp.sin(out))
      total = total + jnp.sum(state ** 2)          # the state after the row's last segment
    return total

  np.testing.assert_allclose(loss_chunked(*args), loss_per_segment(*args), rtol=1e-5)
  grads_c = jax.jit(jax.grad(loss_chunked, argnums=tuple(range(5))))(*args)
  grads_r = jax.jit(jax.grad(loss_per_segment, argnums=tuple(range(5))))(*args)
  for a, b in zip(grads_c, grads_r):
    np.testing.assert_allclose(a, b, atol=5e-5)


@pytest.mark.parametrize("n", [5, 16])
def test_unit_lower_inverse_and_its_gradient_match_the_dense_inverse(n):
  rng = np.random.default_rng(n)
  a = jnp.asarray(np.tril(rng.normal(size=(3, n, n)) * 0.3, -1).astype(np.float32))
  probe = jnp.asarray(rng.normal(size=(3, n, n)).astype(np.float32))
  eye = jnp.eye(n, dtype=jnp.float32)
  np.testing.assert_allclose(gdn.unit_lower_inverse(a), np.linalg.inv(np.eye(n) + a),
                             atol=1e-5)
  grad = jax.grad(lambda x: jnp.sum(gdn.unit_lower_inverse(x) * probe))(a)
  # jnp.linalg.inv differentiated by JAX; the function reads only a's strictly lower part.
  ref = jax.grad(lambda x: jnp.sum(jnp.linalg.inv(eye + jnp.tril(x, -1)) * probe))(a)
  np.testing.assert_allclose(grad, ref, atol=1e-5)


def test_segment_runs_and_conv_do_not_cross_segments():
  seg = np.array([[0, 1, 1, 2, 2, 0, 3, 3]], np.int32)
  runs = np.asarray(gdn.segment_runs(jnp.asarray(seg)))
  # padding continues the previous run; a new id starts a new run
  assert list(runs[0]) == [0, 1, 1, 2, 2, 2, 3, 3]
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, 8, 3)).astype(np.float32)
  w = rng.normal(size=(4, 3)).astype(np.float32)
  out = np.asarray(gdn.causal_conv(jnp.asarray(x), jnp.asarray(w), jnp.asarray(runs), 0))
  expected = np.zeros_like(x)
  for t in range(8):
    for lag in range(4):
      if t - lag >= 0 and runs[0, t - lag] == runs[0, t]:
        expected[0, t] += w[3 - lag] * x[0, t - lag]
  np.testing.assert_allclose(out, expected, atol=1e-6)
