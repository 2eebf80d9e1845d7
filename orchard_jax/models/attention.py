"""Grouped-query softmax attention with q/k RMSNorm, (partial) RoPE and the Qwen3.5 output gate.

Math as transformers' Qwen3MoeAttention / Qwen3_5MoeAttention:
  q = RMSNorm(x Wq) , k = RMSNorm(x Wk), v = x Wv          (norms over head_dim)
  q, k = RoPE(q, positions), RoPE(k, positions)           (first rotary_dim dims)
  o = softmax(q k^T / sqrt(head_dim) + mask) v            (each kv head serves H/Hkv q heads)
  o = o * sigmoid(x Wgate)                                (Qwen3.5 only; per q element)
  out = o Wo
Masks are built once per call by the decoder (`causal_segment_mask`, `cache_mask`).
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from orchard_jax.models.cache import AttentionCache
from orchard_jax.models.config import ModelConfig
from orchard_jax.models.decode import cached_attention, write_cache
from orchard_jax.models.layers import RMSNorm, apply_rope, dtype_of, normal, param
from orchard_jax.parallel.rules import constrain


def causal_segment_mask(segment_ids: jax.Array) -> jax.Array:
  """[batch, seq] segment ids -> [batch, seq, seq] bool: query t may attend key s.

  True when s <= t, both tokens share a segment id and the key is not padding (id 0).
  """
  seq = segment_ids.shape[1]
  causal = jnp.tril(jnp.ones((seq, seq), bool))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return causal[None] & same & (segment_ids != 0)[:, None, :]


def cache_slots(lengths: jax.Array, segment_ids: jax.Array, max_len: int) -> tuple[jax.Array,
                                                                                    jax.Array]:
  """Cache slots of this call's tokens.

  Args:
    lengths: [batch] tokens each row held before this call.
    segment_ids: [batch, seq]; 0 marks padding.
    max_len: cache capacity.
  Returns:
    write_slots: [batch, seq] slot of each valid token, max_len (dropped) for padding.
    query_slots: [batch, seq] the slot each token reads up to (inclusive).
  """
  valid = segment_ids != 0
  query_slots = lengths[:, None] + jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
  write_slots = jnp.where(valid, query_slots, max_len)
  return write_slots, query_slots


def cache_mask(query_slots: jax.Array, max_len: int) -> jax.Array:
  """[batch, seq] query slots -> [batch, seq, max_len] bool: query may read cache slot j."""
  return jnp.arange(max_len)[None, None, :] <= query_slots[:, :, None]


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """Softmax attention with grouped key/value heads, softmax in float32.

  Args:
    q: [batch, q_len, heads, head_dim].
    k, v: [batch, kv_len, kv_heads, head_dim]; heads % kv_heads == 0 and q head h reads kv
      head h // (heads // kv_heads) (transformers' repeat_kv order).
    mask: [batch, q_len, kv_len] bool.
  Returns:
    [batch, q_len, heads, head_dim] in q's dtype. Rows with no visible key get a uniform
    average (finite), never NaN.
  """
  return _attention_core(q, k, v, mask)


# Keep only the attention probabilities for the backward pass (q, k, v and the mask are
# inputs): the masked scores and the softmax's intermediates would triple the memory of the
# largest activation.
@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names(
    "attention_probs"))
def _attention_core(q, k, v, mask):
  b, t, h, d = q.shape
  kvh = k.shape[2]
  q = q.reshape(b, t, kvh, h // kvh, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = scores * (d ** -0.5)
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  probs = checkpoint_name(probs, "attention_probs")
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(b, t, h, d)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                     block: int, recompute: bool = False) -> jax.Array:
  """Causal attention within segments, skipping key blocks that lie wholly in the future.

  Queries are split into blocks of `block` rows; query block i reads keys [0, (i + 1) block)
  only, so about half of the [seq, seq] score matrix is never computed (exact: the skipped
  scores are all masked). Heads are laid out [batch, kv_heads, seq * group, head_dim] (the
  `group` query heads of one kv head folded into the rows), so every product is a plain
  batched matmul with no transpose of a score-sized array. The backward pass is written out
  (custom VJP, the FlashAttention-2 equations, Dao 2023, section 3.1) from the saved
  probabilities: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(d),
  dK = dS^T Q / sqrt(d); nothing else of score size is kept. With `recompute` the
  probabilities are not kept either: the backward pass recomputes each block's from q and k
  (FlashAttention's choice): [batch, heads, seq, ~seq/2] floats less memory per layer for one
  more QK^T matmul and softmax per block (the core's forward + backward from 6 to 7 matmuls).

  Args:
    q: [batch, seq, heads, head_dim].
    k, v: [batch, seq, kv_heads, head_dim] (q head h reads kv head h // (heads // kv_heads)).
    segment_ids: [batch, seq]; a query reads earlier keys of its own non-zero segment.
    block: query rows per block.
    recompute: recompute the probabilities in the backward pass instead of storing them.
  Returns:
    [batch, seq, heads, head_dim] in q's dtype. Rows with no visible key (padding) get a
    uniform average (finite), never NaN.
  """
  b, t, h, d = q.shape
  kvh = k.shape[2]
  g = h // kvh
  qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 1, 3, 4)          # [b, kvh, t, g, d]
  kh = k.transpose(0, 2, 1, 3)                                         # [b, kvh, s, d]
  vh = v.transpose(0, 2, 1, 3)
  out = _blocked_attention(qh, kh, vh, segment_ids, min(block, t), recompute)
  return out.transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)


def fused_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                           implementation: str) -> jax.Array:
  """causal_attention through jax.nn.dot_product_attention (ModelConfig.attention_impl).

  The causal mask is the function's own (is_causal, what cuDNN's fused kernel applies
  without materialising it); packed segments add an explicit [batch, 1, seq, seq] mask of
  same-segment pairs. Padding queries (segment 0) may read nothing: their rows are zeroed, as
  their outputs are never used.

  Args:
    q: [batch, seq, heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim].
    segment_ids: [batch, seq] int.
    implementation: "xla" or "cudnn" (jax.nn.dot_product_attention's).
  Returns:
    [batch, seq, heads, head_dim] in q's dtype.
  """
  same = ((segment_ids[:, :, None] == segment_ids[:, None, :])
          & (segment_ids[:, None, :] != 0))[:, None]
  out = jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=True,
                                     implementation=implementation)
  return jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))


def _block_bounds(t: int, block: int) -> list[tuple[int, int]]:
  return [(start, min(t, start + block)) for start in range(0, t, block)]


def _block_mask(segment_ids: jax.Array, start: int, end: int) -> jax.Array:
  """[batch, 1, end - start, 1, end] bool: query start + i may read key j (causal, same
  non-zero segment)."""
  rows, cols = jnp.arange(start, end), jnp.arange(end)
  mask = ((cols[None, :] <= rows[:, None])[None]
          & (segment_ids[:, start:end, None] == segment_ids[:, None, :end])
          & (segment_ids[:, None, :end] != 0))
  return mask[:, None, :, None, :]


def _block_probs(qh, kh, segment_ids, start, end):
  """Softmax probabilities of query block [start, end): [b, kvh, rows * g, end] float32."""
  b, kvh, _, g, d = qh.shape
  qi = qh[:, :, start:end].reshape(b, kvh, (end - start) * g, d)
  scores = jnp.einsum("bkmd,bksd->bkms", qi, kh[:, :, :end],
                      preferred_element_type=jnp.float32) * (d ** -0.5)
  scores = scores.reshape(b, kvh, end - start, g, end)
  scores = jnp.where(_block_mask(segment_ids, start, end), scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  return probs.reshape(b, kvh, (end - start) * g, end)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blocked_attention(qh, kh, vh, segment_ids, block, recompute):
  return _blocked_attention_fwd(qh, kh, vh, segment_ids, block, recompute)[0]


def _blocked_attention_fwd(qh, kh, vh, segment_ids, block, recompute):
  b, kvh, t, g, d = qh.shape
  outs, saved = [], []
  for start, end in _block_bounds(t, block):
    probs = _block_probs(qh, kh, segment_ids, start, end)
    o = jnp.einsum("bkms,bksd->bkmd", probs.astype(vh.dtype), vh[:, :, :end])
    outs.append(o.reshape(b, kvh, end - start, g, d))
    if not recompute:
      saved.append(probs.astype(vh.dtype))
  out = jnp.concatenate(outs, axis=2)
  return out, (qh, kh, vh, segment_ids, out, saved)


def _blocked_attention_bwd(block, recompute, res, dout):
  qh, kh, vh, segment_ids, out, saved = res
  b, kvh, t, g, d = qh.shape
  scale = d ** -0.5
  dq_blocks = []
  dk = jnp.zeros(kh.shape, jnp.float32)
  dv = jnp.zeros(vh.shape, jnp.float32)
  for i, (start, end) in enumerate(_block_bounds(t, block)):
    if recompute:
      probs = _block_probs(qh, kh, segment_ids, start, end).astype(vh.dtype)
    else:
      probs = saved[i]
    rows = (end - start) * g
    qi = qh[:, :, start:end].reshape(b, kvh, rows, d)
    doi = dout[:, :, start:end].reshape(b, kvh, rows, d)
    oi = out[:, :, start:end].reshape(b, kvh, rows, d)
    delta = jnp.sum(doi.astype(jnp.float32) * oi.astype(jnp.float32), axis=-1)   # [b,kvh,rows]
    dp = jnp.einsum("bkmd,bksd->bkms", doi, vh[:, :, :end], preferred_element_type=jnp.float32)
    ds = (probs.astype(jnp.float32) * (dp - delta[..., None]) * scale).astype(qh.dtype)
    dq_blocks.append(jnp.einsum("bkms,bksd->bkmd", ds, kh[:, :, :end]).reshape(
        b, kvh, end - start, g, d))
    pad = [(0, 0), (0, 0), (0, t - end), (0, 0)]
    dk = dk + jnp.pad(jnp.einsum("bkms,bkmd->bksd", ds, qi,
                                 preferred_element_type=jnp.float32), pad)
    dv = dv + jnp.pad(jnp.einsum("bkms,bkmd->bksd", probs, doi,
                                 preferred_element_type=jnp.float32), pad)
  dq = jnp.concatenate(dq_blocks, axis=2)
  return dq, dk.astype(kh.dtype), dv.astype(vh.dtype), None


_blocked_attention.defvjp(_blocked_attention_fwd, _blocked_attention_bwd)


class Attention(nnx.Module):
  """One full-attention block (no residual, no input norm; the decoder layer adds those)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, h, kvh, hd = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                     config.head_dim)
    pdt = dtype_of(config.param_dtype)
    init = normal(config.initializer_range)
    self.dtype = dtype_of(config.dtype)
    self.block = config.attention_block_size
    self.impl = config.attention_impl
    self.recompute = config.attention_recompute
    self.q_proj = param(rngs, init, (d, h, hd), ("embed", "q_heads", "head_dim"), pdt)
    self.k_proj = param(rngs, init, (d, kvh, hd), ("embed", "kv_heads", "head_dim"), pdt)
    self.v_proj = param(rngs, init, (d, kvh, hd), ("embed", "kv_heads", "head_dim"), pdt)
    self.o_proj = param(rngs, init, (h, hd, d), ("q_heads", "head_dim", "embed"), pdt)
    self.gate_proj = (param(rngs, init, (d, h, hd), ("embed", "q_heads", "head_dim"), pdt)
                      if config.attention_output_gate else None)
    norm = dict(eps=config.rms_norm_eps, zero_centered=config.zero_centered_norm, param_dtype=pdt,
                rngs=rngs)
    self.q_norm = RMSNorm(hd, **norm)
    self.k_norm = RMSNorm(hd, **norm)

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
               segment_ids: jax.Array, mask: Optional[jax.Array] = None, *,
               cache: Optional[AttentionCache] = None,
               write_slots: Optional[jax.Array] = None
               ) -> tuple[jax.Array, Optional[AttentionCache]]:
    """Attends within segments, or over the cache.

    Args:
      x: [batch, seq, hidden] normalised hidden states.
      cos, sin: [batch, seq, rotary_dim // 2] RoPE tables of this call's positions.
      segment_ids: [batch, seq]; without a cache, attention is causal within segments.
      mask: [batch, seq, max_len] bool over cache slots (with a cache; see cache_mask).
      cache: this layer's keys/values, or None.
      write_slots: [batch, seq] cache slot per token (max_len = do not write); with a cache.
    Returns:
      ([batch, seq, hidden], updated cache or None).
    """
    dt = self.dtype
    x = x.astype(dt)
    q = jnp.einsum("btd,dhk->bthk", x, self.q_proj[...].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", x, self.k_proj[...].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", x, self.v_proj[...].astype(dt))
    q = apply_rope(self.q_norm(q), cos, sin)
    k = apply_rope(self.k_norm(k), cos, sin)
    q = constrain(q, ("batch", "seq", "act_heads", "head_dim"))
    new_cache = None
    if cache is None and self.impl == "blocked":
      o = causal_attention(q, k, v, segment_ids, self.block, self.recompute)
    elif cache is None:
      o = fused_causal_attention(q, k, v, segment_ids, self.impl)
    else:
      new_cache = write_cache(cache, k, v, write_slots)
      o = cached_attention(q, new_cache.k, new_cache.v, mask)
    if self.gate_proj is not None:
      gate = jnp.einsum("btd,dhk->bthk", x, self.gate_proj[...].astype(dt))
      o = o * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(dt)
    out = jnp.einsum("bthk,hkd->btd", o, self.o_proj[...].astype(dt))
    return out, new_cache
