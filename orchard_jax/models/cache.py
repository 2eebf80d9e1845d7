"""Decoding state: a KV cache for attention layers, conv + recurrent state for Gated DeltaNet.

`DecodeCache` is a pytree of fixed-shape arrays (flax.struct dataclasses), so a jitted decode
step takes it as an argument, returns the updated one, and can donate the old one
(`jax.jit(step, donate_argnums=...)`): the shapes never change between steps.

Row semantics: every row of the batch holds one sequence. `lengths[b]` counts the tokens row b
has stored. A call with `segment_ids[b, t] == 0` treats that token as padding: it is not
written and leaves the row's state untouched. In one call the valid tokens of a row must be
contiguous; a row that already holds tokens must continue at column 0 (right padding), a fresh
row may also be left-padded. `reset_rows` empties chosen rows for a new request (continuous
batching).
"""
from typing import Union

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class AttentionCache:
  """Keys and values of one full-attention layer, RoPE already applied.

  Both layouts make attention over the cache a batched matmul over (batch, kv head) whose
  cache operand is already in the matmul's [contracted, output] order, so no kernel transposes
  or repacks the cache (models.decode): the scores q . k contract head_dim, so keys are stored
  head_dim-major; the weighted sum p . v contracts positions, so values are stored
  position-major.

  Attributes:
    k: [batch, num_key_value_heads, head_dim, max_len].
    v: [batch, num_key_value_heads, max_len, head_dim].
  """
  k: jax.Array
  v: jax.Array


@struct.dataclass
class DeltaNetCache:
  """State of one Gated DeltaNet layer.

  Attributes:
    conv: [batch, conv_kernel - 1, conv_channels] the last inputs of the causal conv
      (channels = 2 * key heads * key dim + value heads * value dim, order q | k | v).
    recurrent: [batch, value_heads, key_head_dim, value_head_dim] float32 delta-rule state.
  """
  conv: jax.Array
  recurrent: jax.Array


LayerCache = Union[AttentionCache, DeltaNetCache]


@struct.dataclass
class DecodeCache:
  """Per-layer decoding state plus the number of tokens each row holds.

  Attributes:
    lengths: [batch] int32 tokens stored per row.
    layers: one AttentionCache or DeltaNetCache per decoder layer.
  """
  lengths: jax.Array
  layers: tuple[LayerCache, ...]

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_len(self) -> int:
    """Capacity of the attention caches in tokens (0 for a model without attention)."""
    for layer in self.layers:
      if isinstance(layer, AttentionCache):
        return layer.v.shape[2]
    return 0

  def reset_rows(self, rows: jax.Array) -> "DecodeCache":
    """Empties the rows where `rows` [batch] bool is True (jit-friendly).

    Attention entries are left in place (they are masked by `lengths`); DeltaNet states are
    zeroed.
    """
    keep = ~rows

    def clear(x):
      return x * keep.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)

    layers = tuple(
        DeltaNetCache(conv=clear(c.conv), recurrent=clear(c.recurrent))
        if isinstance(c, DeltaNetCache) else c for c in self.layers)
    return DecodeCache(lengths=jnp.where(rows, 0, self.lengths), layers=layers)
