"""Decode-time kernels: attention over the KV cache and MoE dispatch for a few tokens.

A decode step runs one token per batch row, so every matmul has a handful of rows and the
costs that matter on CPU are memory layout and weight traffic, not FLOPs:

* The KV cache stores keys [batch, kv_heads, head_dim, max_len] and values [batch, kv_heads,
  max_len, head_dim] (models.cache.AttentionCache): each is in the [contracted, output] order
  of its matmul (scores contract head_dim, the weighted sum contracts positions), so attention
  over the cache is two batched matmuls over (batch, kv head) with no transpose or repacking of
  the cache. A step writes its keys/values with one scatter each (in place when the cache is
  donated). Keys stored position-major made the scores matmul about twice as slow (the kernel
  repacks a transposed operand: 107 vs 48 us per layer for 8 rows x 256 slots on XLA:CPU), and
  the older [batch, max_len, kv_heads, head_dim] layout made XLA copy the whole cache for every
  layer at every step.
* MoE ("decode" dispatch, ModelConfig.moe_dispatch): with n tokens and top-k routing,
  - n * k < experts: gather each assignment's expert weights and run batched mat-vecs
    (reads k weight sets per token, never the unselected experts);
  - otherwise tokens are grouped by expert into [experts, capacity, hidden] buffers (one-hot
    dispatch and combine matmuls, tiny at decode sizes) and every expert runs on its buffer as
    one batched matmul over experts in the weights' own [experts, hidden, mlp] layout (no
    per-step weight transpose). The capacity is picked at run time (lax.switch) as the
    smallest of a few sizes (1.5, 2 and 3 times the mean load n * k / experts, and n) that
    holds the fullest expert, so nothing is dropped and the work follows the routing: at 8
    tokens, top-2 of 8 experts, the fullest expert holds 3-4 tokens about 3 times in 4 and
    the MoE block runs about 15% faster than with all n tokens in every expert (capacity n,
    what the "dense" reference computes). Reading all expert weights once costs less than
    gathering k per token when n * k >= experts.
  Both compute the same y as models.moe's other paths (module docstring there) up to float
  rounding, and no assignment is ever dropped.
"""
import math

import jax
import jax.numpy as jnp

from orchard_jax.models.cache import AttentionCache


def write_cache(cache: AttentionCache, k: jax.Array, v: jax.Array,
                write_slots: jax.Array) -> AttentionCache:
  """Stores this call's keys and values in their cache slots.

  Args:
    cache: k [batch, kv_heads, head_dim, max_len], v [batch, kv_heads, max_len, head_dim].
    k, v: [batch, seq, kv_heads, head_dim] this call's keys (RoPE applied) and values.
    write_slots: [batch, seq] int32 slot of each token; max_len (out of range) for padding,
      which is dropped.
  Returns:
    the updated AttentionCache (same shapes and dtype).
  """
  rows = jnp.arange(k.shape[0])[:, None]
  # Advanced indices (rows, slots) separated by slices: numpy puts their broadcast shape
  # [batch, seq] first, so the indexed block is [batch, seq, kv_heads, head_dim] for both
  # layouts, exactly k's and v's shape.
  ck = cache.k.at[rows, :, :, write_slots].set(k.astype(cache.k.dtype), mode="drop")
  cv = cache.v.at[rows, :, write_slots].set(v.astype(cache.v.dtype), mode="drop")
  return AttentionCache(k=ck, v=cv)


def cached_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
                     mask: jax.Array) -> jax.Array:
  """Grouped-query softmax attention of this call's queries over the cache.

  Same math as models.attention.dot_product_attention (softmax in float32; q head h reads kv
  head h // (heads // kv_heads); a query with no visible key gets a finite uniform average).

  Args:
    q: [batch, q_len, heads, head_dim].
    k_cache: [batch, kv_heads, head_dim, max_len]; v_cache: [batch, kv_heads, max_len,
      head_dim] (AttentionCache's layouts).
    mask: [batch, q_len, max_len] bool, query t may read slot s.
  Returns:
    [batch, q_len, heads, head_dim] in q's dtype.
  """
  b, t, h, d = q.shape
  kvh = k_cache.shape[1]
  g = h // kvh
  # [batch, kv_heads, group * q_len, head_dim]: the small query moves, the cache does not.
  qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, d)
  k_cache = k_cache.astype(q.dtype)
  v_cache = v_cache.astype(q.dtype)
  scores = jnp.einsum("bkqd,bkds->bkqs", qh, k_cache, preferred_element_type=jnp.float32)
  scores = scores * (d ** -0.5)
  visible = jnp.broadcast_to(mask[:, None, None], (b, 1, g, t, mask.shape[-1]))
  scores = jnp.where(visible.reshape(b, 1, g * t, -1), scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
  out = jnp.einsum("bkqs,bksd->bkqd", probs, v_cache)
  return out.reshape(b, kvh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def decode_dispatch(x: jax.Array, weights: jax.Array, indices: jax.Array, valid: jax.Array,
                    w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
  """MoE experts for a few tokens (decode steps); see the module docstring.

  Args:
    x: [batch, seq, hidden]; weights, indices: [batch, seq, k] routing (models.moe.route);
      valid: [batch, seq] bool (padding gets y = 0).
    w_gate, w_up: [experts, hidden, mlp]; w_down: [experts, mlp, hidden].
  Returns:
    y [batch, seq, hidden] = sum over the k routed experts of weight * SwiGLU_e(x).
  """
  b, s, d = x.shape
  k = indices.shape[-1]
  e, _, f = w_gate.shape
  n = b * s
  xf = x.reshape(n, d)
  w = jnp.where(valid[:, :, None], weights, 0.0).reshape(n, k)
  if n * k < e:
    ids = indices.reshape(n * k)
    xs = jnp.repeat(xf, k, axis=0)[:, None, :]                                 # [n*k, 1, d]
    hidden = jax.nn.silu(jax.lax.batch_matmul(xs, jnp.take(w_gate, ids, axis=0))) * (
        jax.lax.batch_matmul(xs, jnp.take(w_up, ids, axis=0)))                # [n*k, 1, f]
    y = jax.lax.batch_matmul(hidden, jnp.take(w_down, ids, axis=0)).reshape(n, k, d)
    return jnp.einsum("nkd,nk->nd", y, w.astype(y.dtype)).reshape(b, s, d)
  onehot = jax.nn.one_hot(indices.reshape(n, k), e, dtype=jnp.float32)        # [n, k, e]
  combine = jnp.sum(onehot * w[..., None], axis=1)                             # [n, e]
  # A token routes to an expert at most once: routed is 0/1, rank is the token's slot in
  # that expert's buffer (order of arrival), most is the fullest expert's token count.
  routed = jnp.sum(onehot, axis=1) * valid.reshape(n, 1).astype(jnp.float32)   # [n, e]
  rank = jnp.cumsum(routed, axis=0) - routed
  most = jnp.max(jnp.sum(routed, axis=0))
  caps = _capacities(n, k, e)

  def run(cap):
    def branch(xf, combine, routed, rank):
      slot = (routed[:, :, None] > 0) & (rank[:, :, None] == jnp.arange(cap, dtype=jnp.float32))
      dispatch = slot.astype(xf.dtype)                                         # [n, e, cap]
      buf = jnp.einsum("nec,nd->ecd", dispatch, xf)                            # [e, cap, d]
      hidden = jax.nn.silu(jax.lax.batch_matmul(buf, w_gate)) * jax.lax.batch_matmul(buf, w_up)
      out = jax.lax.batch_matmul(hidden, w_down)                               # [e, cap, d]
      gate = dispatch * combine[:, :, None].astype(xf.dtype)
      return jnp.einsum("nec,ecd->nd", gate, out)
    return branch

  branch = jnp.sum(jnp.asarray(caps[:-1]) < most)
  y = jax.lax.switch(branch, [run(c) for c in caps], xf, combine, routed, rank)
  return y.reshape(b, s, d)


def _capacities(n: int, k: int, experts: int) -> tuple[int, ...]:
  """Per-expert buffer sizes the all-experts decode path picks from at run time: 1.5, 2 and 3
  times the mean load n * k / experts (rounded up), and n (every token; never drops)."""
  mean = n * k / experts
  return tuple(sorted({min(n, math.ceil(m * mean)) for m in (1.5, 2, 3)} | {n}))
