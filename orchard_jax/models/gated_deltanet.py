"""Gated DeltaNet linear attention (Yang, Kautz and Hatamizadeh 2024, arXiv 2412.06464), the
"linear_attention" layers of Qwen3.5 (transformers' Qwen3_5MoeGatedDeltaNet).

Per token t and value head (key heads are shared by linear_num_value_heads / num_key_heads
consecutive value heads):
  q, k, v = silu(causal_conv1d(x Wq | x Wk | x Wv))      (depthwise, kernel K, per segment)
  q, k = l2norm(q), l2norm(k);  q = q / sqrt(key_head_dim)
  beta = sigmoid(x Wb);  g = -exp(A_log) * softplus(x Wa + dt_bias)      (log decay, <= 0)
  S_t = exp(g_t) S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
  o_t = S_t^T q_t
  out = (RMSNorm(o) * w * silu(x Wz)) Wo                  (gated norm over value_head_dim)

Multi-token calls use the chunked (WY / UT-transform) form: inside a chunk of C tokens the
delta-rule updates become one unit-lower-triangular solve and a few matmuls; a lax.scan carries
the state across chunks. Segment boundaries (packed sequences) reset the state: intra-chunk
terms between different segments are masked and a segment that starts inside a chunk does not
read the carried state. Padding tokens (segment id 0) are no-ops (beta = 0, g = 0), so the
state after a padded row equals the state after its last real token. Single-token decode uses
the recurrent form directly.
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from orchard_jax.models.cache import DeltaNetCache
from orchard_jax.models.config import ModelConfig
from orchard_jax.models.layers import constant, dtype_of, normal, param

_L2_EPS = 1e-6


def l2_normalize(x: jax.Array) -> jax.Array:
  """x * rsqrt(sum(x^2) + 1e-6) over the last axis (the FLA / transformers l2norm)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _L2_EPS)


def segment_runs(segment_ids: jax.Array) -> jax.Array:
  """[batch, seq] segment ids -> [batch, seq] int32 run ids that change exactly where a new
  segment starts. Padding (id 0) continues the run of the last real token before it."""
  seq = segment_ids.shape[1]
  valid = segment_ids != 0
  last_valid = jax.lax.cummax(jnp.where(valid, jnp.arange(seq)[None, :], -1), axis=1)
  effective = jnp.where(last_valid >= 0,
                        jnp.take_along_axis(segment_ids, jnp.maximum(last_valid, 0), axis=1), 0)
  starts = jnp.concatenate([jnp.zeros_like(effective[:, :1]),
                            (effective[:, 1:] != effective[:, :-1]).astype(jnp.int32)], axis=1)
  return jnp.cumsum(starts, axis=1)


def causal_conv(x: jax.Array, weight: jax.Array, runs: jax.Array, history: int) -> jax.Array:
  """Depthwise causal convolution that does not cross run boundaries.

  Args:
    x: [batch, history + seq, channels] inputs, the first `history` from earlier calls.
    weight: [kernel, channels]; weight[kernel - 1] multiplies the current token (the layout of
      torch's Conv1d weight[:, 0, :] with left padding kernel - 1).
    runs: [batch, history + seq] run ids; a tap is used only within the token's run.
    history: number of leading positions that are context only.
  Returns:
    [batch, seq, channels] float32 pre-activation outputs.
  """
  kernel = weight.shape[0]
  total = x.shape[1]
  seq = total - history
  xf = x.astype(jnp.float32)
  wf = weight.astype(jnp.float32)
  out = jnp.zeros((x.shape[0], seq, x.shape[2]), jnp.float32)
  for lag in range(kernel):
    # source position p - lag for output position p = history + t.
    idx = jnp.arange(history, total) - lag
    ok = idx >= 0
    src = xf[:, jnp.maximum(idx, 0)]
    same = runs[:, jnp.maximum(idx, 0)] == runs[:, history:]
    mask = (ok[None, :] & same).astype(jnp.float32)[..., None]
    out = out + src * mask * wf[kernel - 1 - lag]
  return out


@functools.partial(jax.checkpoint, static_argnums=(3,))
def conv_silu(x: jax.Array, weight: jax.Array, runs: jax.Array, history: int) -> jax.Array:
  """silu(causal_conv(x, weight, runs, history)) in float32; arguments as causal_conv.

  Recomputed in the backward pass (jax.checkpoint): it keeps only its input, instead of each
  tap's masked shifted copy of x and silu's intermediates (about six [batch, seq, channels]
  float32 arrays per layer), for a few elementwise passes over x.
  """
  return jax.nn.silu(causal_conv(x, weight, runs, history))


@functools.partial(jax.checkpoint, static_argnums=(3,))
def gated_rms_norm(o: jax.Array, z: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """Gated RMSNorm (transformers' Qwen3_5MoeRMSNormGated): RMSNorm of o over its last axis,
  scaled by weight, times silu(z); o, z [..., value_dim], weight [value_dim] -> float32.

  Recomputed in the backward pass (jax.checkpoint): it keeps o and z, which the delta rule
  and the z projection keep anyway, instead of the normalised o, silu(z) and their products.
  """
  o = o.astype(jnp.float32)
  o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + eps)
  return o * weight.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))


def delta_rule_recurrent(q, k, v, g, beta, state):
  """Reference per-token gated delta rule (lax.scan over time). Inputs as delta_rule_chunked,
  without segment handling (callers reset `state` themselves)."""
  def step(s, inputs):
    qt, kt, vt, gt, bt = inputs
    s = s * jnp.exp(gt)[..., None, None]
    kv = jnp.einsum("bhkv,bhk->bhv", s, kt)
    u = bt[..., None] * (vt - kv)
    s = s + kt[..., :, None] * u[..., None, :]
    return s, jnp.einsum("bhkv,bhk->bhv", s, qt)

  xs = tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta))
  state, out = jax.lax.scan(step, state, xs)
  return jnp.moveaxis(out, 0, 1), state


@jax.custom_vjp
def unit_lower_inverse(a: jax.Array) -> jax.Array:
  """(I + a)^-1 for strictly lower-triangular a [..., n, n], by recursive block inversion:
  [[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]], doubling the block size each step.

  Only batched matmuls (no LAPACK custom call, no loop), so it partitions cleanly under SPMD
  and is as accurate as forward substitution. n is padded to a power of two internally.
  Only the strictly lower triangle of a is read. The gradient is the inverse's own, written
  out (custom VJP): with B = (I + a)^-1, dB = -B da B, so da = -tril(B^T dB B^T, -1), from B
  alone, where autodiff through the recursion would keep every level's blocks.
  """
  return _unit_lower_inverse(a)


def _unit_lower_inverse(a):
  n = a.shape[-1]
  size = 1 << max(0, (n - 1).bit_length())
  if size != n:
    a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, size - n), (0, size - n)])
  batch = a.shape[:-2]
  inv = jnp.ones(batch + (size, 1, 1), a.dtype)         # inverses of the 1x1 diagonal blocks
  block = 1
  while block < size:
    pairs = size // (2 * block)
    # off-diagonal block C of each pair: rows [2i*b + b, 2i*b + 2b), cols [2i*b, 2i*b + b)
    blocks = a.reshape(batch + (pairs, 2, block, pairs, 2, block))
    idx = jnp.arange(pairs)
    c = blocks[..., idx, 1, :, idx, 0, :]               # [pairs, ..., block, block]
    c = jnp.moveaxis(c, 0, -3)                          # [..., pairs, block, block]
    inv = inv.reshape(batch + (pairs, 2, block, block))
    upper, lower = inv[..., 0, :, :], inv[..., 1, :, :]
    corner = -(lower @ (c @ upper))
    zeros = jnp.zeros_like(corner)
    top = jnp.concatenate([upper, zeros], axis=-1)
    bottom = jnp.concatenate([corner, lower], axis=-1)
    inv = jnp.concatenate([top, bottom], axis=-2)       # [..., pairs, 2 block, 2 block]
    block *= 2
  inv = inv.reshape(batch + (size, size))
  return inv[..., :n, :n]


def _unit_lower_inverse_fwd(a):
  inv = _unit_lower_inverse(a)
  return inv, inv


def _unit_lower_inverse_bwd(inv, d_inv):
  inv_t = jnp.swapaxes(inv, -1, -2)
  da = -(inv_t @ d_inv @ inv_t)
  n = inv.shape[-1]
  return (jnp.where(jnp.tril(jnp.ones((n, n), bool), -1), da, jnp.zeros((), da.dtype)),)


unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def delta_rule_chunked(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                       runs: jax.Array, state: jax.Array, chunk: int
                       ) -> tuple[jax.Array, jax.Array]:
  """Chunked gated delta rule with segment resets.

  Args:
    q, k: [batch, seq, heads, key_dim] float32, l2-normalised (q also scaled).
    v: [batch, seq, heads, value_dim] float32.
    g: [batch, seq, heads] log decay (<= 0); beta: [batch, seq, heads] write strength.
    runs: [batch, seq] run ids (segment_runs); the state carried in belongs to runs[:, 0].
    state: [batch, heads, key_dim, value_dim] state before the first token.
    chunk: chunk length C.
  Returns:
    o [batch, seq, heads, value_dim] float32 and the state after the last token.

  Layout: chunks are laid out [n, batch, heads, C, ...] once, chunk index first, which is what
  the scan over chunks reads, so no per-input relayout sits between the intra-chunk terms and
  the scan. The intra-chunk terms (`_chunk_terms`) are recomputed in the backward pass from
  q, k, v, g, beta: the scan keeps its inputs anyway, and the terms' own intermediates (decay
  masks, the triangular solve's operands; about seven [batch, heads, seq, C] arrays per layer)
  would otherwise be kept too.
  """
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  pad = (-t) % chunk
  if pad:
    def padt(a):
      return jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
    q, k, v, g, beta = map(padt, (q, k, v, g, beta))
    runs = jnp.concatenate([runs, jnp.repeat(runs[:, -1:], pad, axis=1)], axis=1)
  n = (t + pad) // chunk

  def chunks(a):   # [b, T, h, ...] -> [n, b, h, C, ...]
    a = a.reshape((b, n, chunk) + a.shape[2:])
    return jnp.moveaxis(jnp.moveaxis(a, 1, 0), 3, 2)

  q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
  runs = jnp.moveaxis(runs.reshape(b, n, chunk), 1, 0)                       # [n, b, C]
  xs = _chunk_terms(q, k, v, g, beta, runs)

  def step(s, xs):
    u, w, qd, at, kt, cd = xs
    v_new = u - jnp.einsum("bhik,bhkv->bhiv", w, s)
    o = jnp.einsum("bhik,bhkv->bhiv", qd, s) + jnp.einsum("bhij,bhjv->bhiv", at, v_new)
    s = s * cd[..., None, None] + jnp.einsum("bhjk,bhjv->bhkv", kt, v_new)
    return s, o

  state, out = jax.lax.scan(step, state, xs)                                  # [n, b, h, C, dv]
  out = out.transpose(1, 0, 3, 2, 4).reshape(b, n * chunk, h, dv)[:, :t]
  return out, state


@jax.checkpoint
def _chunk_terms(q, k, v, g, beta, runs):
  """The scan inputs of delta_rule_chunked from its chunked inputs ([n, b, h, C, ...]; runs
  [n, b, C]): new values u, state weights w, decayed queries, intra-chunk attention, tail-
  decayed keys [n, b, h, C, ...] and the chunk decay [n, b, h]."""
  dv = v.shape[-1]
  chunk = q.shape[3]
  prev_run = jnp.concatenate([runs[:1, :, 0], runs[:-1, :, -1]], axis=0)     # [n, b]
  carry = (runs == prev_run[:, :, None]).astype(jnp.float32)[:, :, None]     # [n, b, 1, C]
  same = (runs[:, :, :, None] == runs[:, :, None, :])[:, :, None]            # [n, b, 1, C, C]
  idx = jnp.arange(chunk)
  lower_incl = idx[:, None] >= idx[None, :]
  lower_strict = idx[:, None] > idx[None, :]

  gamma = jnp.cumsum(g, axis=-1)                                              # [n, b, h, C]
  diff = gamma[..., :, None] - gamma[..., None, :]
  decay = jnp.exp(jnp.where(same & lower_incl, diff, -jnp.inf))               # [n, b, h, C, C]
  k_beta = k * beta[..., None]
  a = jnp.einsum("nbhik,nbhjk->nbhij", k_beta, k) * decay
  a = jnp.where(lower_strict, a, 0.0)
  big_gamma = jnp.exp(gamma) * carry                                          # [n, b, h, C]
  rhs = jnp.concatenate([v * beta[..., None], k_beta * big_gamma[..., None]], axis=-1)
  solved = unit_lower_inverse(a) @ rhs
  new_values, k_cumdecay = solved[..., :dv], solved[..., dv:]
  attn = jnp.einsum("nbhik,nbhjk->nbhij", q, k) * decay
  q_decayed = q * big_gamma[..., None]
  last_same = same[..., -1, :].astype(jnp.float32)                           # [n, b, 1, C]
  tail = jnp.exp(gamma[..., -1:] - gamma) * last_same                         # [n, b, h, C]
  k_tail = k * tail[..., None]
  chunk_decay = (jnp.exp(gamma[..., -1]) * carry[..., -1])                    # [n, b, h]
  return new_values, k_cumdecay, q_decayed, attn, k_tail, chunk_decay


class GatedDeltaNet(nnx.Module):
  """One Gated DeltaNet token mixer (no residual / input norm; the decoder layer adds them)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d = config.hidden_size
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    ks = config.linear_conv_kernel_dim
    pdt = dtype_of(config.param_dtype)
    init = normal(config.initializer_range)
    self.config = config
    self.dtype = dtype_of(config.dtype)
    self.q_proj = param(rngs, init, (d, nk, dk), ("embed", "linear_k_heads", "head_dim"), pdt)
    self.k_proj = param(rngs, init, (d, nk, dk), ("embed", "linear_k_heads", "head_dim"), pdt)
    self.v_proj = param(rngs, init, (d, nv, dv), ("embed", "linear_v_heads", "head_dim"), pdt)
    self.z_proj = param(rngs, init, (d, nv, dv), ("embed", "linear_v_heads", "head_dim"), pdt)
    self.b_proj = param(rngs, init, (d, nv), ("embed", "linear_v_heads"), pdt)
    self.a_proj = param(rngs, init, (d, nv), ("embed", "linear_v_heads"), pdt)
    conv_init = normal(ks ** -0.5)
    self.conv_q = param(rngs, conv_init, (ks, nk, dk), ("conv", "linear_k_heads", "head_dim"), pdt)
    self.conv_k = param(rngs, conv_init, (ks, nk, dk), ("conv", "linear_k_heads", "head_dim"), pdt)
    self.conv_v = param(rngs, conv_init, (ks, nv, dv), ("conv", "linear_v_heads", "head_dim"), pdt)
    self.dt_bias = param(rngs, constant(1.0), (nv,), ("linear_v_heads",), pdt)
    self.A_log = param(
        rngs, lambda key, shape, dtype: jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.01,
                                                                   16.0)).astype(dtype),
        (nv,), ("linear_v_heads",), pdt)
    self.norm = param(rngs, constant(1.0), (dv,), ("norm",), pdt)
    self.out_proj = param(rngs, init, (nv, dv, d), ("linear_v_heads", "head_dim", "embed"), pdt)

  @property
  def conv_channels(self) -> int:
    c = self.config
    return 2 * c.linear_num_key_heads * c.linear_key_head_dim + (
        c.linear_num_value_heads * c.linear_value_head_dim)

  def __call__(self, x: jax.Array, segment_ids: jax.Array, *,
               cache: Optional[DeltaNetCache] = None
               ) -> tuple[jax.Array, Optional[DeltaNetCache]]:
    """Mixes tokens within segments, or continues each row's cached state.

    Args:
      x: [batch, seq, hidden] normalised hidden states.
      segment_ids: [batch, seq]; 0 = padding. Without a cache, segments are independent
        sequences; with a cache every row is one sequence (see models.cache).
      cache: this layer's conv and recurrent state, or None.
    Returns:
      ([batch, seq, hidden], updated cache or None).
    """
    cfg = self.config
    dt = self.dtype
    b, t, _ = x.shape
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    ks = cfg.linear_conv_kernel_dim
    valid = segment_ids != 0
    x = (x * valid[..., None]).astype(dt)

    def proj(w):
      return jnp.einsum("btd,d...->bt...", x, w[...].astype(dt))

    mixed = jnp.concatenate([proj(self.q_proj).reshape(b, t, nk * dk),
                             proj(self.k_proj).reshape(b, t, nk * dk),
                             proj(self.v_proj).reshape(b, t, nv * dv)], axis=-1)
    conv_w = jnp.concatenate([self.conv_q[...].reshape(ks, nk * dk),
                              self.conv_k[...].reshape(ks, nk * dk),
                              self.conv_v[...].reshape(ks, nv * dv)], axis=-1)
    z = proj(self.z_proj)                                                     # [b, t, nv, dv]
    beta = jax.nn.sigmoid(proj(self.b_proj).astype(jnp.float32))
    g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
        proj(self.a_proj).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
    beta = jnp.where(valid[..., None], beta, 0.0)
    g = jnp.where(valid[..., None], g, 0.0)

    if cache is None:
      runs = segment_runs(segment_ids)
      conv_out = conv_silu(mixed, conv_w, runs, 0)
      state = jnp.zeros((b, nv, dk, dv), jnp.float32)
    else:
      runs = jnp.zeros((b, t), jnp.int32)
      history = ks - 1
      ext = jnp.concatenate([cache.conv.astype(mixed.dtype), mixed], axis=1)
      conv_out = conv_silu(ext, conv_w, jnp.zeros((b, history + t), jnp.int32), history)
      state = cache.recurrent
    q, k, v = jnp.split(conv_out, [nk * dk, 2 * nk * dk], axis=-1)
    q = l2_normalize(q.reshape(b, t, nk, dk)) * (dk ** -0.5)
    k = l2_normalize(k.reshape(b, t, nk, dk))
    v = v.reshape(b, t, nv, dv)
    if nv != nk:
      q = jnp.repeat(q, nv // nk, axis=2)
      k = jnp.repeat(k, nv // nk, axis=2)

    if cache is not None and t == 1:
      o, state = delta_rule_recurrent(q, k, v, g, beta, state)
    else:
      chunk = min(cfg.gdn_chunk_size, -(-t // 8) * 8)
      o, state = delta_rule_chunked(q, k, v, g, beta, runs, state, chunk)

    new_cache = None
    if cache is not None:
      new_cache = DeltaNetCache(conv=_last_inputs(ext, valid, ks - 1).astype(cache.conv.dtype),
                                recurrent=state)
    o = gated_rms_norm(o, z, self.norm[...], cfg.rms_norm_eps)
    out = jnp.einsum("bthv,hvd->btd", o.astype(dt), self.out_proj[...].astype(dt))
    return out, new_cache


def _last_inputs(ext: jax.Array, valid: jax.Array, history: int) -> jax.Array:
  """The `history` conv inputs ending at each row's last valid token.

  Args:
    ext: [batch, history + seq, channels] cached inputs followed by this call's inputs.
    valid: [batch, seq] bool (valid tokens of a row are contiguous, see models.cache).
  Returns:
    [batch, history, channels].
  """
  if history == 0:
    return ext[:, :0]
  seq = valid.shape[1]
  last = jnp.max(jnp.where(valid, jnp.arange(seq)[None, :], -1), axis=1)      # -1: none valid
  end = history + last                                                        # inclusive
  start = end - history + 1

  def take(row, s):
    return jax.lax.dynamic_slice_in_dim(row, s, history, axis=0)

  return jax.vmap(take)(ext, start)
