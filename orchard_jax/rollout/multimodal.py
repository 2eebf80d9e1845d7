"""Images in the embedded engine (vision-language policies).

A request with images goes through three steps:

1. `prepare_images` (on the submitting thread, before the request is queued): each source
   (data URL, file path, base64; SGLang's `image_data`) is read and hashed, its grid taken from
   the image processor's resize rule, its <|image_pad|> placeholder widened to the image's
   token count, and the prompt's 3-D M-RoPE positions computed. An image whose features are
   not cached is also preprocessed here (transformers' image processor), so a broken image is
   this request's 400; a cached one (a screenshot repeated in an agent's history) is not. The request also gets its
   prefix-cache key: the prompt ids with every image token replaced by a negative number
   derived from the image's digest, so a resident row holding a screenshot matches only that
   screenshot (any other image, even of the same size, differs at its first token).
2. `ImageEncoder.features` (on the scheduler thread, when a prefill is about to read an
   image's tokens): the vision front runs once per image digest; its tokens and DeepStack
   features are kept in an LRU cache (dropped on weight updates), so a screenshot repeated in
   an agent's history is never encoded again, and one wholly inside a reused prefix is never
   encoded at all.
3. `chunk_visual`: a prefill chunk's slice of each row's image features, placed at the
   columns where its image tokens fall (an image may span chunks).
Decode steps use 1-D positions continuing from the prompt's next M-RoPE position
(`RequestImages.rope_delta`).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard_jax.data.images import (ImageError, ImageProcessor, data_url, expand_image_tokens,
                                     image_bytes, image_digest, image_parts, image_size,
                                     with_image_digests)
from orchard_jax.models import VisualTokens, image_patches, mrope_positions
from orchard_jax.models.errors import ModelError
from orchard_jax.rollout.errors import RequestError


@dataclasses.dataclass
class EngineImage:
  """One image of a request.

  Attributes:
    digest: content hash of its bytes (data.images.image_digest).
    data: the encoded bytes.
    grid: (t, h, w) in patches; num_tokens: its language-model tokens.
    pixel_values: the image processor's output, or None until the encoder needs it.
  """
  digest: str
  data: bytes
  grid: tuple[int, int, int]
  num_tokens: int
  pixel_values: Optional[np.ndarray] = None


@dataclasses.dataclass
class RequestImages:
  """A request's images and what the scheduler needs of them.

  Attributes:
    images: its EngineImages, in placeholder order.
    spans: [start, end) of each image's placeholder run in the prompt.
    positions: [prompt_len, 3] int32 M-RoPE position ids of the prompt.
    next_position: the position id of the first token after the prompt.
    key: [prompt_len] int64 prefix-cache key (module docstring).
    features: per image, (tokens [n, hidden], deepstack [levels, n, hidden]) once encoded
      (None for an image not needed yet, e.g. inside a reused prefix).
  """
  images: list[EngineImage]
  spans: list[tuple[int, int]]
  positions: np.ndarray
  next_position: int
  key: np.ndarray
  features: Optional[list[Optional[tuple[np.ndarray, np.ndarray]]]] = None

  @property
  def rope_delta(self) -> int:
    """M-RoPE position minus token index after the prompt (decode positions add it)."""
    return self.next_position - len(self.key)

  def first_image_token(self, start: int) -> Optional[int]:
    """The first prompt index >= start that is an image token, or None."""
    for lo, hi in self.spans:
      if hi > start:
        return max(lo, start)
    return None


def image_key(digest: str) -> int:
  """The negative prefix-cache id of an image's tokens (from its sha256 digest)."""
  return -1 - (int.from_bytes(hashlib.sha256(digest.encode()).digest()[:7], "little"))


def prepare_images(prompt: np.ndarray, sources: Sequence[Any], *, processor: ImageProcessor,
                   vision_config: Any, encoder: Optional["ImageEncoder"] = None,
                   allow_files: bool = True) -> tuple[np.ndarray, RequestImages]:
  """Reads and hashes a request's images and widens their placeholders (module docstring).

  Args:
    prompt: [n] token ids with one <|image_pad|> run per image (of length 1, or already the
      image's token count).
    sources: the images (data URLs, file paths, base64 strings or bytes), in order.
    processor: the policy's image processor.
    vision_config: the policy's VisionConfig.
    encoder: the engine's ImageEncoder: images whose features it holds are not preprocessed.
    allow_files: read file paths (data.images.image_bytes).
  Returns:
    (the expanded prompt, RequestImages).
  Raises:
    RequestError: an image cannot be read or decoded, or the placeholders do not match the
      images (naming which).
  """
  vc = vision_config
  images = []
  for k, source in enumerate(sources):
    try:
      data = image_bytes(source, allow_files=allow_files)
      digest = image_digest(data)
      grid = processor.grid(*image_size(data))
      pixels = None
      if encoder is None or not encoder.holds(digest):
        processed = processor(data)
        pixels, grid = processed.pixel_values, processed.grid
    except ImageError as e:
      raise RequestError(f"image_data[{k}]: {e}") from None
    t, h, w = grid
    images.append(EngineImage(digest, data, grid, t * h * w // vc.merge_unit, pixels))
  try:
    ids = np.asarray(expand_image_tokens(prompt, vc.image_token_id,
                                         [image.num_tokens for image in images]), np.int64)
  except ImageError as e:
    raise RequestError(f"{e} (each image is <|vision_start|><|image_pad|><|vision_end|> in "
                       "the prompt)") from None
  is_image = np.concatenate([[False], ids == vc.image_token_id, [False]])
  edges = np.flatnonzero(is_image[1:] != is_image[:-1])
  spans = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]
  try:
    positions, next_position = mrope_positions(ids, [image.grid for image in images],
                                               image_token_id=vc.image_token_id,
                                               spatial_merge_size=vc.spatial_merge_size)
  except ModelError as e:
    raise RequestError(str(e)) from None
  key = ids.copy()
  for (lo, hi), image in zip(spans, images):
    key[lo:hi] = image_key(image.digest)
  return ids, RequestImages(images, spans, positions.astype(np.int32), int(next_position), key)


@dataclasses.dataclass
class ChatImages:
  """The images of a chat request as the recording proxy handles them (in placeholder order):
  digests (what records name them by), the encoded bytes (stored once in the trajectory
  store, sent upstream as data URLs) and their token counts (to widen placeholders)."""
  digests: list[str]
  blobs: list[bytes]
  num_tokens: list[int]

  def data_urls(self) -> list[str]:
    return [data_url(blob) for blob in self.blobs]


def resolve_chat_images(messages: Sequence[dict], processor: Optional[ImageProcessor]
                        ) -> tuple[list[dict], Optional[ChatImages]]:
  """A chat's image parts read (data URLs or base64 only: a harness's file paths would name
  files on the proxy's machine) and named by digest; with a processor, also each image's
  token count (0 without one: a text-level upstream renders its own prompt).

  Returns:
    (the messages with image parts naming their digests (data.images.with_image_digests),
    ChatImages), or (messages, None) when the chat shows no image.
  Raises:
    RequestError: a part whose image cannot be read, naming it.
  """
  sources = image_parts(messages)
  if not sources:
    return list(messages), None
  digests, blobs, counts = [], [], []
  for k, source in enumerate(sources):
    try:
      data = image_bytes(source, allow_files=False)
      counts.append(processor.num_tokens(*image_size(data)) if processor is not None else 0)
    except ImageError as e:
      raise RequestError(f"image {k} of the messages: {e}") from None
    blobs.append(data)
    digests.append(image_digest(data))
  return with_image_digests(messages, digests), ChatImages(digests, blobs, counts)


def chunk_visual(rows: Sequence[Optional[tuple[RequestImages, int, int]]], batch: int,
                 chunk: int) -> Optional[VisualTokens]:
  """The image tokens of one prefill chunk.

  Args:
    rows: per cache row, None or (its RequestImages, first prompt index of the chunk, tokens
      taken); the images whose tokens fall in the chunk have their features.
    batch, chunk: the chunk's shape.
  Returns:
    VisualTokens ([batch, chunk, ...] NumPy arrays in the features' dtype), or None when no
    row has an image token in the chunk (the text-only program runs).
  """
  embeds = mask = deepstack = None
  for r, entry in enumerate(rows):
    if entry is None:
      continue
    images, start, take = entry
    for (lo, hi), feature in zip(images.spans, images.features or ()):
      a, b = max(lo, start), min(hi, start + take)
      if a >= b or feature is None:
        continue
      tokens, ds = feature
      if embeds is None:
        embeds = np.zeros((batch, chunk, tokens.shape[-1]), tokens.dtype)
        mask = np.zeros((batch, chunk), bool)
        deepstack = np.zeros((ds.shape[0], batch, chunk, tokens.shape[-1]), tokens.dtype)
      embeds[r, a - start:b - start] = tokens[a - lo:b - lo]
      deepstack[:, r, a - start:b - start] = ds[:, a - lo:b - lo]
      mask[r, a - start:b - start] = True
  if embeds is None:
    return None
  return VisualTokens(embeds=embeds, mask=mask, deepstack=deepstack)


def patch_bucket(n: int) -> int:
  """Padded patch count of an image of n patches: a multiple of 16 and of a power of two at
  most an eighth of n, so padding stays under 12.5% (above 128 patches) with few shapes."""
  step = max(16, 1 << max(0, n.bit_length() - 4))
  return -(-n // step) * step


class ImageEncoder:
  """The vision front of a served model, run once per image digest (module docstring).

  Args:
    runner: the engine's ModelRunner (its current params are used).
    cache_bytes: budget of the feature cache (least recently used images evicted first).
  """

  def __init__(self, runner: Any, cache_bytes: int):
    self.runner = runner
    self.cache_bytes = int(cache_bytes)
    self.encoded = 0                    # vision front runs (images encoded)
    self._cache: "collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]]" = (
      collections.OrderedDict())
    self._size = 0
    self._lock = threading.Lock()
    self._inflight: dict[str, threading.Lock] = {}
    self._encode = jax.jit(self._encode_impl)

  def _encode_impl(self, params, patches):
    self.runner._count_trace()
    model = nnx.merge(self.runner.graphdef, params, self.runner.rest)
    return model.encode_images(patches)

  def clear(self) -> None:
    """Drop every cached feature (the weights changed)."""
    with self._lock:
      self._cache.clear()
      self._size = 0

  def holds(self, digest: str) -> bool:
    """Whether the features of image `digest` are cached."""
    with self._lock:
      return digest in self._cache

  def features(self, image: EngineImage, processor: ImageProcessor
               ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n, hidden], deepstack [levels, n, hidden]) of one image, from the cache or by
    running the vision front once (preprocessing it first if that was skipped)."""
    with self._lock:
      hit = self._cache.get(image.digest)
      if hit is not None:
        self._cache.move_to_end(image.digest)
        return hit
      # Two schedulers (data parallelism) needing one new image: the second waits for the
      # first's encoding instead of running the encoder again.
      pending = self._inflight.setdefault(image.digest, threading.Lock())
    with pending:
      try:
        return self._encode_once(image, processor)
      finally:
        with self._lock:
          self._inflight.pop(image.digest, None)

  def _encode_once(self, image: EngineImage, processor: ImageProcessor
                   ) -> tuple[np.ndarray, np.ndarray]:
    with self._lock:
      hit = self._cache.get(image.digest)
      if hit is not None:
        return hit
    if image.pixel_values is None:       # evicted since the request was prepared
      image.pixel_values = processor(image.data).pixel_values
    config = self.runner.config.vision
    n = int(np.prod(image.grid))
    patches = image_patches([image.pixel_values], [image.grid], config,
                            pad_patches=patch_bucket(n))
    tokens, deepstack = self._encode(self.runner.params, jax.tree.map(jnp.asarray, patches))
    count = image.num_tokens
    out = (np.asarray(tokens[0, :count]), np.asarray(deepstack[:, 0, :count]))
    with self._lock:
      self.encoded += 1
      if image.digest not in self._cache:
        self._cache[image.digest] = out
        self._size += out[0].nbytes + out[1].nbytes
        while self._size > self.cache_bytes and len(self._cache) > 1:
          _, (a, b) = self._cache.popitem(last=False)
          self._size -= a.nbytes + b.nbytes
    image.pixel_values = None            # the features hold what the prefill needs
    return out
