"""Host-side inputs of the vision front: per-patch tables, 3-D position ids, and the image
tokens handed to the decoder.

Everything here that depends on an image's grid (t, h, w in patches) is computed with NumPy
before the compiled model runs, as transformers' vision_utils precomputes it, so the model
compiles once per padded shape and never per image size:

  ImagePatches   the encoder's input: pixel values [images, patches, patch_dim] in the image
                 processor's merge-block order, and per patch its rotary row / column, the 4
                 bilinear taps into the learned position table with their weights, validity.
  mrope_positions  Qwen3-VL's 3-D (temporal, height, width) position ids of a token sequence
                 (transformers' Qwen3VLModel.get_rope_index): text tokens advance all three by
                 one; an image's tokens take (p, p + row, p + col) over its merged grid from the
                 current position p, after which text resumes at p + max(rows, cols).
  VisualTokens   per-token image features aligned with input_ids (what the decoder adds):
                 embeds [batch, seq, hidden] replacing the placeholders' token embeddings, the
                 placeholder mask, and DeepStack features [levels, batch, seq, hidden]. A
                 prefill chunk takes a slice of them, so an image may span chunks.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from orchard_jax.models.errors import ModelError

Grid = tuple[int, int, int]


@struct.dataclass
class ImagePatches:
  """A batch of images as padded rows of patches (see the module docstring).

  Attributes:
    pixel_values: [images, patches, patch_dim] float, the image processor's pixel_values
      of each image, zero-padded to a common patch count (a multiple of merge_unit).
    rows, cols: [images, patches] int32 patch row / column within its frame (rotary ids).
    pos_index: [images, patches, 4] int32 taps into the learned position table.
    pos_weight: [images, patches, 4] float32 bilinear weights of those taps.
    valid: [images, patches] bool, False for padding patches.
  """
  pixel_values: jax.Array
  rows: jax.Array
  cols: jax.Array
  pos_index: jax.Array
  pos_weight: jax.Array
  valid: jax.Array

  @property
  def num_images(self) -> int:
    return self.pixel_values.shape[0]


@struct.dataclass
class VisualTokens:
  """Image features aligned with a [batch, seq] token array (see the module docstring).

  Attributes:
    embeds: [batch, seq, hidden] merged image tokens at placeholder positions (0 elsewhere).
    mask: [batch, seq] bool, True at image placeholder positions.
    deepstack: [levels, batch, seq, hidden] DeepStack features (0 off the placeholders).
  """
  embeds: jax.Array
  mask: jax.Array
  deepstack: jax.Array


def grid_tokens(grid: Grid, spatial_merge_size: int) -> int:
  """Language-model tokens of an image of grid (t, h, w) patches: t * h * w / merge^2."""
  t, h, w = grid
  return t * (h // spatial_merge_size) * (w // spatial_merge_size)


def _check_grid(grid, merge: int) -> Grid:
  t, h, w = (int(x) for x in grid)
  if t < 1 or h < merge or w < merge or h % merge or w % merge:
    raise ModelError(f"image grid (t, h, w) = {(t, h, w)} patches: expected t >= 1 and h, w "
                     f"positive multiples of spatial_merge_size {merge}")
  return t, h, w


def _patch_coordinates(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
  """(row, col) of each of a frame's h * w patches in merge-block order: block rows, block
  columns, then the merge x merge patches of a block row by row (the image processor's
  order)."""
  r = np.arange(h).reshape(h // merge, merge)[:, None, :, None]
  c = np.arange(w).reshape(w // merge, merge)[None, :, None, :]
  rows = np.broadcast_to(r, (h // merge, w // merge, merge, merge)).reshape(-1)
  cols = np.broadcast_to(c, (h // merge, w // merge, merge, merge)).reshape(-1)
  return rows, cols


def _bilinear_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
  """Two taps and weights per target index on an axis of `size` resampled from `side` table
  entries, align_corners: target i sits at source i * (side - 1) / (size - 1)."""
  src = index.astype(np.float64) * (side - 1) / max(size - 1, 1)
  low = np.floor(src)
  frac = src - low
  taps = np.stack([low, low + 1], -1).astype(np.int64)
  weights = np.stack([1.0 - frac, frac], -1)
  return np.clip(taps, 0, side - 1), weights


def image_patches(pixel_values: Sequence[np.ndarray], grids: Sequence[Grid], vision_config,
                  *, pad_patches: Optional[int] = None,
                  pad_images: Optional[int] = None) -> ImagePatches:
  """Builds the encoder input for images already run through the image processor.

  Args:
    pixel_values: per image, [t * h * w, patch_dim] float (the processor's pixel_values rows
      of that image).
    grids: per image, its (t, h, w) grid in patches (the processor's image_grid_thw row).
    vision_config: the model's VisionConfig.
    pad_patches: patches per row (default: the largest image's); at least every image's.
    pad_images: rows (default: len(pixel_values)); extra rows are all padding.
  Returns:
    ImagePatches of NumPy arrays ([rows, patches, ...]).
  Raises:
    ModelError: a grid that is not a positive multiple of spatial_merge_size, or pixel
      values whose shape does not match their grid.
  """
  vc = vision_config
  merge, side = vc.spatial_merge_size, vc.position_grid_side
  if len(pixel_values) != len(grids):
    raise ModelError(f"{len(pixel_values)} pixel arrays but {len(grids)} grids")
  grids = [_check_grid(g, merge) for g in grids]
  counts = [t * h * w for t, h, w in grids]
  for i, (pv, n) in enumerate(zip(pixel_values, counts)):
    if tuple(np.shape(pv)) != (n, vc.patch_dim):
      raise ModelError(f"image {i}: pixel values of shape {tuple(np.shape(pv))}; its grid "
                       f"{grids[i]} needs ({n}, {vc.patch_dim})")
  longest = max(counts, default=merge * merge)
  width = longest if pad_patches is None else int(pad_patches)
  if width < longest or width % vc.merge_unit:
    raise ModelError(f"pad_patches={width}: expected a multiple of {vc.merge_unit} of at least "
                     f"{longest} (the largest image)")
  rows_n = len(grids) if pad_images is None else int(pad_images)
  if rows_n < len(grids):
    raise ModelError(f"pad_images={rows_n} is fewer than the {len(grids)} images")
  out = dict(pixel_values=np.zeros((rows_n, width, vc.patch_dim), np.float32),
             rows=np.zeros((rows_n, width), np.int32), cols=np.zeros((rows_n, width), np.int32),
             pos_index=np.zeros((rows_n, width, 4), np.int32),
             pos_weight=np.zeros((rows_n, width, 4), np.float32),
             valid=np.zeros((rows_n, width), bool))
  for i, ((t, h, w), pv) in enumerate(zip(grids, pixel_values)):
    n = t * h * w
    rows, cols = _patch_coordinates(h, w, merge)
    rows, cols = np.tile(rows, t), np.tile(cols, t)
    rt, rw = _bilinear_taps(rows, h, side)
    ct, cw = _bilinear_taps(cols, w, side)
    out["pixel_values"][i, :n] = pv
    out["rows"][i, :n], out["cols"][i, :n] = rows, cols
    out["pos_index"][i, :n] = (rt[:, :, None] * side + ct[:, None, :]).reshape(n, 4)
    out["pos_weight"][i, :n] = (rw[:, :, None] * cw[:, None, :]).reshape(n, 4)
    out["valid"][i, :n] = True
  return ImagePatches(**out)


def mrope_positions(input_ids: np.ndarray, grids: Sequence[Grid], *, image_token_id: int,
                    spatial_merge_size: int, start: int = 0) -> tuple[np.ndarray, int]:
  """3-D position ids of one token sequence (see the module docstring).

  Args:
    input_ids: [seq] token ids; each image is a run of grid_tokens(grid) image_token_id
      placeholders (runs of consecutive images are split by their grids, in order).
    grids: the (t, h, w) patch grid of each image, in order of appearance.
    image_token_id: the placeholder id.
    spatial_merge_size: the vision config's merge size.
    start: position id of the first token (0 for a fresh sequence).
  Returns:
    (positions [seq, 3] int32, next_position): the id a token appended after the sequence
    takes on all three axes (decode steps continue from there).
  Raises:
    ModelError: the placeholders do not add up to the images' token counts.
  """
  ids = np.asarray(input_ids).reshape(-1)
  is_image = ids == image_token_id
  pos = np.zeros((ids.size, 3), np.int32)
  current, i, k = int(start), 0, 0
  grids = list(grids)
  while i < ids.size:
    if not is_image[i]:
      j = i + int(np.argmax(is_image[i:])) if is_image[i:].any() else ids.size
      pos[i:j] = (current + np.arange(j - i))[:, None]
      current += j - i
      i = j
      continue
    if k >= len(grids):
      raise ModelError(f"image placeholder at token {i} but only {len(grids)} image grid(s)")
    t, h, w = grids[k]
    gh, gw = h // spatial_merge_size, w // spatial_merge_size
    n = t * gh * gw
    if i + n > ids.size or not is_image[i:i + n].all():
      run = int(np.argmin(is_image[i:])) if not is_image[i:].all() else ids.size - i
      raise ModelError(f"image {k} (grid {(t, h, w)}) needs {n} placeholder tokens at token "
                       f"{i}; the run there has {run}")
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
    pos[i:i + n] = current + np.stack([tt, hh, ww], -1).reshape(n, 3)
    current += max(gh, gw)
    i += n
    k += 1
  if k != len(grids):
    raise ModelError(f"{len(grids)} image grid(s) but {k} placeholder run(s) in the tokens")
  return pos, current


def scatter_visual_tokens(input_ids: jax.Array, tokens: jax.Array, deepstack: jax.Array,
                          valid_tokens: jax.Array, image_token_id: int) -> VisualTokens:
  """Places encoder outputs at the image placeholders of a token batch (jit-friendly).

  The k-th placeholder of input_ids in row-major order takes the k-th valid image token in
  image order (transformers' masked_scatter), so images must be listed in the order their
  placeholders appear across the batch.

  Args:
    input_ids: [batch, seq] int.
    tokens: [images, per_image, hidden] encoder tokens (VisionEncoder output).
    deepstack: [levels, images, per_image, hidden].
    valid_tokens: [images, per_image] bool, which rows of each image are real tokens.
    image_token_id: the placeholder id.
  Returns:
    VisualTokens for input_ids. Placeholders beyond the number of valid image tokens get
    zeros (the caller checks counts on the host; models.vision_inputs.mrope_positions does).
  """
  b, s = input_ids.shape
  mask = input_ids == image_token_id
  flat_valid = valid_tokens.reshape(-1)
  total = flat_valid.shape[0]
  hidden = tokens.shape[-1]
  if total == 0:                           # no image rows at all
    zeros = jnp.zeros((b, s, hidden), tokens.dtype)
    return VisualTokens(embeds=zeros, mask=mask,
                        deepstack=jnp.zeros((deepstack.shape[0], b, s, hidden), tokens.dtype))
  order = jnp.nonzero(flat_valid, size=total, fill_value=0)[0]         # valid rows, in order
  rank = jnp.cumsum(mask.reshape(-1).astype(jnp.int32)) - 1              # placeholder index
  src = jnp.take(order, jnp.clip(rank, 0, total - 1))
  present = mask.reshape(-1) & (rank < jnp.sum(flat_valid))
  embeds = jnp.take(tokens.reshape(total, hidden), src, axis=0)
  embeds = jnp.where(present[:, None], embeds, 0).reshape(b, s, hidden)
  levels = deepstack.shape[0]
  ds = jnp.take(deepstack.reshape(levels, total, hidden), src, axis=1)
  ds = jnp.where(present[None, :, None], ds, 0).reshape(levels, b, s, hidden)
  return VisualTokens(embeds=embeds, mask=mask, deepstack=ds)


def valid_token_mask(patches: ImagePatches, merge_unit: int) -> jax.Array:
  """[images, patches / merge_unit] bool: which merged rows are real tokens."""
  v = patches.valid
  return v.reshape(v.shape[0], v.shape[1] // merge_unit, merge_unit).all(-1)
