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
                     block: int) -> jax.Array:
  """Causal attention within segments, skipping key blocks that lie wholly in the future.

  Queries are split into blocks of `block` rows; query block i reads keys [0, (i + 1) block)
  only, so about half of the [seq, seq] score matrix is never computed (exact: the skipped
  scores are all masked). Shapes as dot_product_attention; segment_ids [batch, seq].
  """
  seq = q.shape[1]
  if seq <= block:
    return dot_product_attention(q, k, v, causal_segment_mask(segment_ids))
  outs = []
  for start in range(0, seq, block):
    end = min(seq, start + block)
    rows, cols = jnp.arange(start, end), jnp.arange(end)
    mask = ((cols[None, :] <= rows[:, None])[None]
            & (segment_ids[:, start:end, None] == segment_ids[:, None, :end])
            & (segment_ids[:, None, :end] != 0))
    outs.append(dot_product_attention(q[:, start:end], k[:, :end], v[:, :end], mask))
  return jnp.concatenate(outs, axis=1)


class Attention(nnx.Module):
  """One full-attention block (no residual, no input norm; the decoder layer adds those)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, h, kvh, hd = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                     config.head_dim)
    pdt = dtype_of(config.param_dtype)
    init = normal(config.initializer_range)
    self.dtype = dtype_of(config.dtype)
    self.block = config.attention_block_size
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
    if cache is None:
      o = causal_attention(q, k, v, segment_ids, self.block)
    else:
      new_cache = write_cache(cache, k, v, write_slots)
      o = cached_attention(q, new_cache.k, new_cache.v, mask)
    if self.gate_proj is not None:
      gate = jnp.einsum("btd,dhk->bthk", x, self.gate_proj[...].astype(dt))
      o = o * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(dt)
    out = jnp.einsum("bthk,hkd->btd", o, self.o_proj[...].astype(dt))
    return out, new_cache
