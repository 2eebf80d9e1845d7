"""The Qwen3-VL vision front: ViT encoder, patch merger and DeepStack mergers.

Math as transformers' Qwen3VLVisionModel (qwen3_vl/modeling_qwen3_vl.py), per image of
t x h x w patches (t = frames / temporal_patch_size, 1 for a still image):
  x   = pixels P + b                               patch embedding (the Conv3d with stride =
                                                   kernel is a linear map of each flattened
                                                   [channels, frames, patch, patch] patch)
  x  += sum_k w_k pos_table[i_k]                   the learned side x side position table,
                                                   bilinearly resampled (align_corners) to the
                                                   h x w grid: 4 taps per patch
  block: x += Attn(LN(x)) ; x += MLP(LN(x))        bidirectional attention within the image,
                                                   2-D RoPE on q and k: the first half of the
                                                   rotated pairs follows the patch row, the
                                                   second the column; MLP fc2(gelu_tanh(fc1))
  merger(x)   = fc2(gelu(fc1(concat_4(LN(x)))))    one token per 2x2 block of patches
  deepstack_j = fc2(gelu(fc1(LN(concat_4(x_j)))))  x_j: output of block deepstack_visual_indexes[j]
Patches arrive in merge-block order (the image processor's), so a merged token is 4
consecutive patches.

Images are batched as rows of `ImagePatches` (models.vision_inputs): [images, patches,
patch_dim] with per-patch tables computed on the host from each image's grid (rotary row and
column, position-table taps and weights, validity), so one compiled program serves any mix of
image sizes that fits the padded shape. Attention runs per image row over its valid patches,
in query blocks of `_QUERY_BLOCK` rows so a 1280 x 1000 screenshot (4,960 patches) never
materialises a full [patches, patches] score matrix per head.
"""
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from orchard_jax.models.config import ModelConfig, VisionConfig
from orchard_jax.models.layers import LayerNorm, constant, dtype_of, normal, param
from orchard_jax.models.vision_inputs import ImagePatches

_QUERY_BLOCK = 1024


def _gelu(x: jax.Array, act: str) -> jax.Array:
  """"gelu_pytorch_tanh": the tanh approximation; "gelu": the exact erf form."""
  return jax.nn.gelu(x, approximate=(act == "gelu_pytorch_tanh"))


class _Linear(nnx.Module):
  """y = x W + b with W stored [in, out] and both annotated with logical axes."""

  def __init__(self, n_in: int, n_out: int, axes: tuple[Optional[str], Optional[str]], *,
               std: float, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs):
    self.dtype = dtype
    self.weight = param(rngs, normal(std), (n_in, n_out), axes, param_dtype)
    self.bias = param(rngs, constant(0.0), (n_out,), (axes[1],), param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    dt = self.dtype
    return x.astype(dt) @ self.weight[...].astype(dt) + self.bias[...].astype(dt)


class VisionAttention(nnx.Module):
  """Multi-head bidirectional attention with 2-D RoPE (Qwen3VLVisionAttention); q, k, v
  projections stored per head ([hidden, heads, head_dim]) with biases."""

  def __init__(self, vc: VisionConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    d, h, hd = vc.hidden_size, vc.num_heads, vc.head_dim
    init = normal(vc.initializer_range)
    self.dtype = dtype
    for name in ("q", "k", "v"):
      setattr(self, f"{name}_proj", param(rngs, init, (d, h, hd),
                                          ("embed", "q_heads", "head_dim"), param_dtype))
      setattr(self, f"{name}_bias", param(rngs, constant(0.0), (h, hd), ("q_heads", "head_dim"),
                                          param_dtype))
    self.o_proj = param(rngs, init, (h, hd, d), ("q_heads", "head_dim", "embed"), param_dtype)
    self.o_bias = param(rngs, constant(0.0), (d,), ("embed",), param_dtype)

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
               valid: jax.Array) -> jax.Array:
    """x [images, patches, hidden]; cos, sin [images, patches, head_dim // 2]; valid
    [images, patches] bool -> [images, patches, hidden]."""
    dt = self.dtype
    x = x.astype(dt)

    def project(name):                     # head-major: [images, heads, patches, head_dim]
      w, b = getattr(self, f"{name}_proj"), getattr(self, f"{name}_bias")
      return (jnp.einsum("bpd,dhk->bhpk", x, w[...].astype(dt))
              + b[...].astype(dt)[None, :, None, :])

    rope = (cos[:, None], sin[:, None])
    q = _rotate(project("q"), *rope)
    k = _rotate(project("k"), *rope)
    o = _bidirectional_attention(q, k, project("v"), valid)
    return jnp.einsum("bhpk,hkd->bpd", o, self.o_proj[...].astype(dt)) + self.o_bias[...].astype(dt)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate-half RoPE of x [..., head_dim] by cos/sin [..., head_dim // 2] (float32 math, as
  layers.apply_rope, in the head-major layout)."""
  half = cos.shape[-1]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _bidirectional_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                             valid: jax.Array) -> jax.Array:
  """Softmax attention of every patch over the valid patches of its image.

  q, k, v: [images, heads, patches, head_dim] (head-major: both products are plain batched
  matmuls; the position-major layout of the decoder's kernel ran 2.4x slower here on
  XLA:CPU). Queries go in blocks of _QUERY_BLOCK rows, each rematerialised in the backward
  pass, so neither pass holds a [patches, patches] score matrix per head. Padding keys get a
  -1e30 bias (a padding image's rows average uniformly: finite). Returns q's shape.
  """
  scale = q.shape[-1] ** -0.5
  bias = jnp.where(valid, 0.0, -1e30).astype(jnp.float32)[:, None, None, :]

  @jax.checkpoint
  def block(qb, k, v, bias):
    scores = jnp.einsum("bhqd,bhkd->bhqk", qb, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores * scale + bias, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)

  n = q.shape[2]
  outs = [block(q[:, :, s:s + _QUERY_BLOCK], k, v, bias) for s in range(0, n, _QUERY_BLOCK)]
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)


class VisionBlock(nnx.Module):
  """Pre-norm ViT block: x += Attn(LN1(x)); x += MLP(LN2(x)) (Qwen3VLVisionBlock)."""

  def __init__(self, vc: VisionConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    std = vc.initializer_range
    self.act = vc.hidden_act
    self.norm1 = LayerNorm(vc.hidden_size, eps=vc.layer_norm_eps, param_dtype=param_dtype,
                           rngs=rngs)
    self.norm2 = LayerNorm(vc.hidden_size, eps=vc.layer_norm_eps, param_dtype=param_dtype,
                           rngs=rngs)
    self.attn = VisionAttention(vc, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.linear_fc1 = _Linear(vc.hidden_size, vc.intermediate_size, ("embed", "mlp"), std=std,
                              dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.linear_fc2 = _Linear(vc.intermediate_size, vc.hidden_size, ("mlp", "embed"), std=std,
                              dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x, cos, sin, valid):
    x = x + self.attn(self.norm1(x), cos, sin, valid).astype(x.dtype)
    y = self.linear_fc2(_gelu(self.linear_fc1(self.norm2(x)), self.act))
    return x + y.astype(x.dtype)


class PatchMerger(nnx.Module):
  """Concatenates each spatial_merge_size^2 block of patches and projects it to the language
  model's width: fc2(gelu(fc1(.))) after a LayerNorm over each patch (the main merger) or over
  the concatenation (`postshuffle`, the DeepStack mergers). Qwen3VLVisionPatchMerger."""

  def __init__(self, vc: VisionConfig, *, postshuffle: bool, dtype, param_dtype,
               rngs: nnx.Rngs):
    wide = vc.hidden_size * vc.merge_unit
    std = vc.initializer_range
    self.postshuffle = postshuffle
    self.wide = wide
    self.norm = LayerNorm(wide if postshuffle else vc.hidden_size, eps=1e-6,
                          param_dtype=param_dtype, rngs=rngs)
    self.linear_fc1 = _Linear(wide, wide, ("embed", "mlp"), std=std, dtype=dtype,
                              param_dtype=param_dtype, rngs=rngs)
    self.linear_fc2 = _Linear(wide, vc.out_hidden_size, ("mlp", "embed"), std=std, dtype=dtype,
                              param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """x [images, patches, hidden] -> [images, patches / merge_unit, out_hidden_size]."""
    b, n, d = x.shape
    tokens = n * d // self.wide
    if self.postshuffle:
      x = self.norm(x.reshape(b, tokens, self.wide))
    else:
      x = self.norm(x).reshape(b, tokens, self.wide)
    return self.linear_fc2(_gelu(self.linear_fc1(x), "gelu"))


class VisionEncoder(nnx.Module):
  """Patch embedding, learned + rotary positions, encoder blocks, merger and DeepStack
  mergers (see the module docstring).

  Call:
    tokens, deepstack = encoder(patches)
      tokens [images, tokens_per_image, hidden] (language-model width), deepstack
      [levels, images, tokens_per_image, hidden]; rows past an image's own token count are
      padding (finite, never used).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    vc = config.vision
    self.vision_config = vc
    dtype, pdt = dtype_of(config.dtype), dtype_of(config.param_dtype)
    self.dtype = dtype
    self.patch_embed = param(rngs, normal(vc.initializer_range), (vc.patch_dim, vc.hidden_size),
                             (None, "embed"), pdt)
    self.patch_bias = param(rngs, constant(0.0), (vc.hidden_size,), ("embed",), pdt)
    self.pos_embed = param(rngs, normal(vc.initializer_range),
                           (vc.num_position_embeddings, vc.hidden_size), (None, "embed"), pdt)
    kw = dict(dtype=dtype, param_dtype=pdt, rngs=rngs)
    self.blocks = nnx.List([VisionBlock(vc, **kw) for _ in range(vc.depth)])
    self.merger = PatchMerger(vc, postshuffle=False, **kw)
    self.deepstack_merger_list = nnx.List([PatchMerger(vc, postshuffle=True, **kw)
                                           for _ in vc.deepstack_visual_indexes])

  def __call__(self, patches: ImagePatches) -> tuple[jax.Array, jax.Array]:
    """Encodes a batch of images.

    Args:
      patches: ImagePatches (pixel_values [images, patches, patch_dim], rows / cols /
        pos_index / pos_weight / valid per patch; models.vision_inputs.image_patches).
    Returns:
      (tokens [images, patches / merge_unit, out_hidden], deepstack [levels, images,
      patches / merge_unit, out_hidden]).
    """
    vc = self.vision_config
    dt = self.dtype
    x = patches.pixel_values.astype(dt) @ self.patch_embed[...].astype(dt)
    x = x + self.patch_bias[...].astype(dt)
    table = self.pos_embed[...].astype(jnp.float32)
    pos = jnp.einsum("bpk,bpkd->bpd", patches.pos_weight.astype(jnp.float32),
                     jnp.take(table, patches.pos_index, axis=0))
    x = x + pos.astype(dt)
    cos, sin = _rotary_2d(patches.rows, patches.cols, vc.head_dim, vc.rope_theta)
    valid = patches.valid
    levels = []
    for i, block in enumerate(self.blocks):
      x = block(x, cos, sin, valid)
      if i in vc.deepstack_visual_indexes:
        levels.append(self.deepstack_merger_list[vc.deepstack_visual_indexes.index(i)](x))
    tokens = self.merger(x)
    if levels:
      deepstack = jnp.stack(levels)
    else:
      deepstack = jnp.zeros((0,) + tokens.shape, tokens.dtype)
    return tokens, deepstack


def _rotary_2d(rows: jax.Array, cols: jax.Array, head_dim: int,
               theta: float) -> tuple[jax.Array, jax.Array]:
  """cos/sin [images, patches, head_dim // 2] of the 2-D rotary embedding: head_dim // 4
  frequencies theta^(-4i / head_dim) of the row, then the same of the column (transformers'
  Qwen3VLVisionRotaryEmbedding, rotating all of head_dim in the rotate-half layout)."""
  spatial = head_dim // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, spatial, 2, dtype=jnp.float32) / spatial))
  freqs = jnp.concatenate([rows.astype(jnp.float32)[..., None] * inv_freq,
                           cols.astype(jnp.float32)[..., None] * inv_freq], axis=-1)
  return jnp.cos(freqs), jnp.sin(freqs)
