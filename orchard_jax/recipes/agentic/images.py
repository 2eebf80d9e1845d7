"""Images in the loop, for a vision-language policy (ModelConfig.vision): one image processor for
serving, recording and training, and the packed batches' image arrays.

A rollout's screenshots reach the embedded engine as image_url parts through the recording
proxy, which stores each once in the run's trajectory store (by digest) and records the
widened ids it sent; training reads them back from there. `PolicyImages` is that processor
with the store:

  image_tokens(digest)   an image's language-model tokens (tokenising a text-only record, e.g. a
                         teacher's or a scripted demonstration's)
  pack_kwargs()          data.pack_sequences' image arguments (slots per row, placeholder id)
  add(packed)            the packed batches with their rows' pixels and 3-D positions
                         (train.add_images), patches per slot fixed per packing

A text-only policy gets None from `PolicyImages.of`, and every call site stays as it was.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional

from orchard_jax.recipes import ConfigError


def image_processor(model_config) -> Optional[Any]:
  """The policy's `data.images.ImageProcessor` (its patching, Qwen3-VL's pixel bounds), or
  None for a text-only policy. The engine builds the same one by default."""
  vision = getattr(model_config, "vision", None)
  if vision is None:
    return None
  from orchard_jax.data.images import ImageProcessor
  return ImageProcessor(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                        merge_size=vision.spatial_merge_size)


class PolicyImages:
  """A vision-language policy's images in training (module docstring).

  Args:
    model_config: the policy's ModelConfig (with `vision`).
    store: the trajectory store holding the images (by digest).
    images_per_row: image slots of each packed row.
    processor: the image processor (default: `image_processor(model_config)`).
  """

  def __init__(self, model_config, store, *, images_per_row: int = 4, processor=None):
    if getattr(model_config, "vision", None) is None:
      raise ConfigError("PolicyImages needs a vision-language policy (its preset has no vision)")
    if int(images_per_row) < 1:
      raise ConfigError(f"images_per_row must be >= 1, got {images_per_row}")
    self.model_config = model_config
    self.store = store
    self.images_per_row = int(images_per_row)
    self.processor = processor or image_processor(model_config)
    self._processed = functools.lru_cache(maxsize=256)(self._process)

  @classmethod
  def of(cls, model_config, store, *, images_per_row: int = 4) -> Optional["PolicyImages"]:
    """PolicyImages for a vision-language policy, None for a text-only one."""
    if getattr(model_config, "vision", None) is None:
      return None
    return cls(model_config, store, images_per_row=images_per_row)

  def _process(self, digest: str):
    return self.processor(self.store.get_image(digest))

  def image_tokens(self, digest: str) -> int:
    """An image's language-model tokens, from its size and the processor's resize rule."""
    from orchard_jax.data.images import image_size
    width, height = image_size(self.store.get_image(digest))
    return self.processor.num_tokens(width, height)

  def pack_kwargs(self) -> dict:
    return {"images_per_row": self.images_per_row,
            "image_token_id": self.model_config.vision.image_token_id}

  def add(self, packed) -> list:
    """The packed batches with image arrays (train.add_images); batches of a text-only packing
    are returned as they are."""
    from orchard_jax import train
    if not packed.row_images:
      return list(packed.batches)
    digests = {d for rows in packed.row_images for row in rows for d in row}
    if not digests:
      return list(packed.batches)
    unit = self.processor.merge_size ** 2
    largest = max(math.prod(self._processed(d).grid) for d in digests)
    patches = -(-largest // unit) * unit
    return [train.add_images(batch, rows, self._processed, self.model_config,
                             images_per_row=self.images_per_row, patches_per_image=patches)
            for batch, rows in zip(packed.batches, packed.row_images)]
