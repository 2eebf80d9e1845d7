"""Building blocks shared by every architecture: parameters with logical axes, RMSNorm
(plain and zero-centred), LayerNorm (the vision encoder's), rotary position embedding (full,
partial and interleaved multimodal), the SwiGLU MLP.

Parameter layout: weights are stored input-dimension first ([embed, heads, head_dim],
[embed, mlp], ...), each with logical axis names (parallel.rules) in the `logical_axes`
metadata of its nnx.Param (not flax's `out_sharding`, which nnx.eval_shape would try to
resolve against whatever mesh is active). models.hf converts to and from transformers'
[out, in] matrices.
"""
import functools
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard_jax.models.config import ModelConfig
from orchard_jax.parallel.rules import constrain

Initializer = Callable[[jax.Array, Sequence[int], jnp.dtype], jax.Array]


def dtype_of(name: str) -> jnp.dtype:
  """jnp dtype from a config string ("float32", "bfloat16", "float16")."""
  return jnp.dtype(name)


def param(rngs: nnx.Rngs, init: Initializer, shape: Sequence[int], axes: Sequence[Optional[str]],
          dtype: jnp.dtype) -> nnx.Param:
  """An nnx.Param of `shape` from `init`, annotated with logical axis names.

  The names live in the `logical_axes` metadata; parameters are placed on devices by
  parallel.create_sharded (under jit with output shardings) or stay on the default device.
  """
  if len(shape) != len(axes):
    raise ValueError(f"param: {len(shape)} dims {tuple(shape)} but {len(axes)} axis names {axes}")
  return nnx.Param(init(rngs.params(), tuple(shape), dtype), logical_axes=tuple(axes))


def normal(std: float) -> Initializer:
  return jax.nn.initializers.normal(std)


def constant(value: float) -> Initializer:
  return lambda key, shape, dtype: jnp.full(shape, value, dtype)


class RMSNorm(nnx.Module):
  """Root-mean-square norm over the last axis (Zhang and Sennrich 2019), computed in float32.

  y = x / sqrt(mean(x^2) + eps) * w                       (Qwen3: w initialised to 1)
  y = x / sqrt(mean(x^2) + eps) * (1 + w)                 (Qwen3.5 zero-centred: w init 0)
  as transformers' Qwen3MoeRMSNorm and Qwen3_5MoeRMSNorm.
  """

  def __init__(self, dim: int, *, eps: float, zero_centered: bool, param_dtype: jnp.dtype,
               rngs: nnx.Rngs):
    self.eps = eps
    self.zero_centered = zero_centered
    self.weight = param(rngs, constant(0.0 if zero_centered else 1.0), (dim,), ("norm",),
                        param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., dim] -> [..., dim] in x's dtype."""
    return rms_norm(x, self.weight[...], self.eps, self.zero_centered)


@functools.partial(jax.checkpoint, static_argnums=(2, 3))
def rms_norm(x: jax.Array, weight: jax.Array, eps: float, zero_centered: bool) -> jax.Array:
  """RMSNorm (RMSNorm.__call__'s formula) of x [..., dim] with weight [dim], in x's dtype.

  Recomputed in the backward pass (jax.checkpoint): its backward then keeps only x, which the
  layer's residual stream or projection keeps anyway, instead of also a float32 normalised
  copy of x (one activation-sized array per norm; four per decoder layer).
  """
  h = x.astype(jnp.float32)
  h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
  w = weight.astype(jnp.float32)
  scale = 1.0 + w if zero_centered else w
  return (h * scale).astype(x.dtype)


class LayerNorm(nnx.Module):
  """Layer normalisation with scale and bias over the last axis (Ba et al. 2016), computed in
  float32: y = (x - mean) / sqrt(var + eps) * w + b (torch.nn.LayerNorm; the vision encoder's
  norms)."""

  def __init__(self, dim: int, *, eps: float, param_dtype: jnp.dtype, rngs: nnx.Rngs,
               axis_name: str = "norm"):
    self.eps = eps
    self.weight = param(rngs, constant(1.0), (dim,), (axis_name,), param_dtype)
    self.bias = param(rngs, constant(0.0), (dim,), (axis_name,), param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., dim] -> [..., dim] in x's dtype."""
    h = x.astype(jnp.float32)
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(var + self.eps)
    h = h * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
    return h.astype(x.dtype)


def rope_tables(positions: jax.Array, rotary_dim: int, theta: float) -> tuple[jax.Array,
                                                                               jax.Array]:
  """cos and sin tables of rotary embedding (Su et al. 2021, RoFormer) for integer positions.

  Args:
    positions: [batch, seq] int32.
    rotary_dim: number of rotated dimensions (even).
    theta: RoPE base.
  Returns:
    (cos, sin), each [batch, seq, rotary_dim // 2] float32, frequency i = theta^(-2i/dim).
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(freqs), jnp.sin(freqs)


def mrope_tables(positions: jax.Array, rotary_dim: int, theta: float,
                 mrope_section: Sequence[int]) -> tuple[jax.Array, jax.Array]:
  """cos and sin tables of interleaved multimodal RoPE (Qwen3-VL) for 3-D position ids.

  Frequency i = theta^(-2i/dim) is applied to the height id when i % 3 == 1 and
  i < 3 * mrope_section[1], to the width id when i % 3 == 2 and i < 3 * mrope_section[2], and
  to the temporal id otherwise (transformers' Qwen3VLTextRotaryEmbedding with
  mrope_interleaved). With the three ids equal this is rope_tables of that id.

  Args:
    positions: [batch, seq, 3] int32 (temporal, height, width) position ids.
    rotary_dim: number of rotated dimensions (even).
    theta: RoPE base.
    mrope_section: (temporal, height, width) frequency counts.
  Returns:
    (cos, sin), each [batch, seq, rotary_dim // 2] float32.
  """
  half = rotary_dim // 2
  axis = np.zeros(half, np.int32)
  for which in (1, 2):
    axis[which:min(3 * mrope_section[which], half):3] = which
  inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  chosen = jnp.take(positions, jnp.asarray(axis), axis=-1).astype(jnp.float32)
  freqs = chosen * inv_freq
  return jnp.cos(freqs), jnp.sin(freqs)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates the first 2 * cos.shape[-1] dims of x in the rotate-half layout (GPT-NeoX /
  transformers' rotate_half): dims [0, d/2) pair with [d/2, d). Remaining dims pass through
  (partial RoPE, Qwen3.5).

  Args:
    x: [batch, seq, heads, head_dim].
    cos, sin: [batch, seq, rotary_dim // 2] from rope_tables.
  """
  half = cos.shape[-1]
  rot, rest = x[..., :2 * half], x[..., 2 * half:]
  x1, x2 = rot[..., :half].astype(jnp.float32), rot[..., half:].astype(jnp.float32)
  c, s = cos[:, :, None, :], sin[:, :, None, :]
  out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)
  return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(x @ gate) * (x @ up)) (Shazeer 2020; Qwen3MLP)."""

  def __init__(self, hidden: int, intermediate: int, *, config: ModelConfig, rngs: nnx.Rngs):
    pdt = dtype_of(config.param_dtype)
    init = normal(config.initializer_range)
    self.dtype = dtype_of(config.dtype)
    self.gate_proj = param(rngs, init, (hidden, intermediate), ("embed", "mlp"), pdt)
    self.up_proj = param(rngs, init, (hidden, intermediate), ("embed", "mlp"), pdt)
    self.down_proj = param(rngs, init, (intermediate, hidden), ("mlp", "embed"), pdt)

  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., hidden] -> [..., hidden]."""
    dt = self.dtype
    return swiglu(x.astype(dt), self.gate_proj[...].astype(dt), self.up_proj[...].astype(dt),
                  self.down_proj[...].astype(dt))


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
  """down(silu(x @ gate) * (x @ up)): x [..., hidden], w_gate and w_up [hidden, mlp], w_down
  [mlp, hidden] -> [..., hidden].

  The backward pass keeps the two projections x @ gate and x @ up (jax.checkpoint saving
  matmul outputs only) and recomputes the activation from them, instead of also keeping
  silu's intermediates and the product (up to three more [..., mlp] arrays).
  """
  h = jax.nn.silu(x @ w_gate) * (x @ w_up)
  if h.ndim == 3:
    h = constrain(h, ("batch", "seq", "mlp"))
  return h @ w_down
