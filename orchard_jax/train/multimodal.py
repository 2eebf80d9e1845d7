"""Packed multimodal batches: the image arrays and 3-D position ids beside the packed ids.

`data.pack_sequences(..., images_per_row=K)` places vision-language sequences into rows with at
most K images each and lists each row's image digests (PackedData.row_images). `add_images`
turns a packed batch and its rows' images into what the vision-language model reads:

  positions          [batch, seq, 3] int32 Qwen3-VL position ids (models.mrope_positions of
                     each packed segment, restarting at 0 per segment; padding 0)
  pixel_values       [batch, K, patches, patch_dim] float32 the image processor's pixels of
                     row b's k-th image (zero-padded; an empty slot is all padding)
  image_rows, image_cols, image_pos_index, image_pos_weight, image_valid
                     [batch, K, patches(, 4)] the per-patch tables of models.image_patches

Every array keeps the batch on axis 0, so microbatching and data-parallel sharding split the
images with their rows; the model flattens [batch, K] to images in placeholder order
(`batch_images`). Fixed K and patches keep the step's shapes constant (no recompiles).
"""
from typing import Callable, Mapping, Optional, Sequence, Union

import jax.numpy as jnp
import numpy as np

from orchard_jax.data.images import ProcessedImage
from orchard_jax.models import ImagePatches, ModelConfig, image_patches, mrope_positions
from orchard_jax.models.errors import ModelError
from orchard_jax.train.errors import TrainError

IMAGE_KEYS = ("pixel_values", "image_rows", "image_cols", "image_pos_index", "image_pos_weight",
              "image_valid")
_FIELDS = dict(zip(IMAGE_KEYS, ("pixel_values", "rows", "cols", "pos_index", "pos_weight",
                                "valid")))

ImageSource = Union[Callable[[str], ProcessedImage], Mapping[str, ProcessedImage]]


def add_images(batch: Mapping[str, np.ndarray], row_images: Sequence[Sequence[str]],
               images: ImageSource, config: ModelConfig, *, images_per_row: int,
               patches_per_image: int) -> dict:
  """A copy of a packed batch with 3-D positions and its rows' images (module docstring).

  Args:
    batch: a packed batch (input_ids, segment_ids, positions [batch, seq], ...).
    row_images: per row, the digests of its images in placeholder order
      (PackedData.row_images[i] for batch i).
    images: digest -> ProcessedImage (the image processor's output), a callable or mapping.
    config: the vision-language model's config.
    images_per_row: K, the image slots of each row (as packed).
    patches_per_image: patches of each slot (a multiple of spatial_merge_size^2 at least as
      large as every image's t * h * w; bound it with the image processor's max_pixels).
  Returns:
    The batch with "positions" replaced by [batch, seq, 3] and the IMAGE_KEYS arrays added.
  Raises:
    TrainError: a row lists more than K images, an image is larger than patches_per_image,
      or a segment's placeholders do not match its images.
  """
  if config.vision is None:
    raise TrainError("add_images needs a vision-language model config (config.vision)")
  vc = config.vision
  ids, seg = np.asarray(batch["input_ids"]), np.asarray(batch["segment_ids"])
  rows = ids.shape[0]
  if len(row_images) != rows:
    raise TrainError(f"row_images lists {len(row_images)} rows; the batch has {rows}")
  lookup = images.__getitem__ if isinstance(images, Mapping) else images
  positions = np.zeros(ids.shape + (3,), np.int32)
  arrays = {key: [] for key in IMAGE_KEYS}
  for b in range(rows):
    digests = list(row_images[b])
    if len(digests) > images_per_row:
      raise TrainError(f"row {b} holds {len(digests)} images; images_per_row is "
                       f"{images_per_row}")
    processed = [lookup(d) for d in digests]
    grids = [p.grid for p in processed]
    used = 0
    for segment in np.unique(seg[b][seg[b] > 0]):
      cols = np.flatnonzero(seg[b] == segment)
      tokens = ids[b, cols]
      runs = _runs(tokens == vc.image_token_id)
      try:
        positions[b, cols] = mrope_positions(tokens, grids[used:used + runs],
                                             image_token_id=vc.image_token_id,
                                             spatial_merge_size=vc.spatial_merge_size)[0]
      except ModelError as e:
        raise TrainError(f"row {b} segment {segment}: {e}") from e
      used += runs
    if used != len(grids):
      raise TrainError(f"row {b} lists {len(grids)} images but its segments hold {used} "
                       "image placeholder runs")
    try:
      patches = image_patches([p.pixel_values for p in processed], grids, vc,
                              pad_patches=patches_per_image, pad_images=images_per_row)
    except ModelError as e:
      raise TrainError(f"row {b}: {e}") from e
    for key in IMAGE_KEYS:
      arrays[key].append(getattr(patches, _FIELDS[key]))
  out = dict(batch)
  out["positions"] = positions
  for key in IMAGE_KEYS:
    out[key] = np.stack(arrays[key])
  return out


def batch_images(batch: Mapping) -> Optional[ImagePatches]:
  """The ImagePatches of a batch made by `add_images` ([batch, K, ...] flattened to
  [batch * K, ...] images in placeholder order), or None for a text-only batch."""
  if "pixel_values" not in batch:
    return None
  def flat(x):
    x = jnp.asarray(x)
    return x.reshape((-1,) + x.shape[2:])
  return ImagePatches(**{_FIELDS[key]: flat(batch[key]) for key in IMAGE_KEYS})


def _runs(mask: np.ndarray) -> int:
  """Number of runs of True in a 1-D bool array."""
  return int(np.count_nonzero(mask[1:] & ~mask[:-1]) + (1 if mask.size and mask[0] else 0))
