"""Images of vision-language chats: where they come from, their content hash, and their
preprocessing with transformers' own image processor.

An image travels as a *source* (what a request carries: a data URL, a file path, a bare
base64 string, or raw bytes), is decoded to its encoded file bytes once, and from then on is
named by its content hash, `image_digest(bytes)` = "sha256:<hex>" of those bytes: the
trajectory store keeps one blob per digest, recorded messages carry the digest in place of the
data, and the inference engine keys its image cache (and the prefix cache's token keys) by it.

Preprocessing is transformers' Qwen2VLImageProcessor (PIL backend; what Qwen3-VL's processor
uses): resize so both sides are multiples of patch_size * merge_size with the pixel count
within [min_pixels, max_pixels], rescale, normalise (mean = std = 0.5 for Qwen3-VL), and cut
into temporal_patch_size x patch_size x patch_size patches in merge-block order.
`ImageProcessor(...)(image)` gives pixel_values [t * h * w, channels * temporal * patch^2] and
the grid (t, h, w) in patches; the image takes t * h * w / merge^2 language-model tokens.

In token ids an image is one <|image_pad|> per merged token between <|vision_start|> and
<|vision_end|>; a chat template writes one <|image_pad|>, which `expand_image_tokens` widens
to the image's token count (what Qwen3VLProcessor does to the text).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from orchard_jax.data.errors import DataError

# Qwen3-VL's published preprocessor_config.json: size {"shortest_edge": 65536,
# "longest_edge": 16777216} (pixel counts), patch 16, merge 2, temporal 2, mean = std = 0.5.
MIN_PIXELS = 65536
MAX_PIXELS = 16777216
MAX_IMAGE_BYTES = 64 * 2 ** 20          # largest encoded image accepted from a request
MAX_DECODED_PIXELS = 64 * 2 ** 20       # largest decoded image (decompression bombs)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                 "<|video_pad|>")
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,",
                       re.IGNORECASE)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")


class ImageError(DataError):
  """An image source cannot be read or decoded, or is too large."""


def image_digest(data: bytes) -> str:
  """Content hash of an encoded image: "sha256:" + the hex digest of its bytes."""
  return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: Any) -> bool:
  """Whether value is an image digest ("sha256:" + 64 hex digits)."""
  return isinstance(value, str) and bool(_DIGEST.match(value))


def image_bytes(source: Any, *, allow_files: bool = True) -> bytes:
  """The encoded image bytes of a request's image source.

  Args:
    source: a data URL ("data:image/png;base64,..."), a file path or "file://" URL (when
      allow_files), a bare base64 string, or bytes.
    allow_files: read file paths on this machine (SGLang's image_data does; a service that
      must not read its own files turns it off).
  Returns:
    The bytes (not yet decoded; `open_image` checks they are an image).
  Raises:
    ImageError: a remote URL (never fetched), a missing or unreadable file, invalid base64,
      or more than MAX_IMAGE_BYTES.
  """
  if isinstance(source, (bytes, bytearray, memoryview)):
    data = bytes(source)
  elif not isinstance(source, str) or not source:
    raise ImageError(f"expected an image as a data URL, a file path or base64 text; got "
                     f"{type(source).__name__}")
  elif source[:5].lower() == "data:":
    match = _DATA_URL.match(source)
    if match is None:
      raise ImageError("a data URL image must be base64-encoded (data:image/png;base64,...); "
                       f"got {source[:40]!r}...")
    data = _b64decode(source[match.end():], "the data URL")
  elif re.match(r"^(https?|ftp)://", source, re.IGNORECASE):
    raise ImageError(f"image URL {source[:80]!r}: remote images are not fetched; send it as a "
                     "data URL (data:image/png;base64,...) or a file path")
  elif source.lower().startswith("file://") or _looks_like_path(source):
    if not allow_files:
      raise ImageError("file paths are not accepted here; send the image as a data URL")
    path = Path(source[7:] if source.lower().startswith("file://") else source).expanduser()
    try:
      size = path.stat().st_size
      if not path.is_file():
        raise ImageError(f"image path {str(path)!r} is not a file")
      if size > MAX_IMAGE_BYTES:
        raise ImageError(f"image file {str(path)!r} has {size} bytes; at most "
                         f"{MAX_IMAGE_BYTES} are accepted")
      data = path.read_bytes()
    except OSError as e:
      raise ImageError(f"cannot read image file {str(path)!r}: {e.strerror or e}") from e
  else:
    data = _b64decode(source, "the image (neither a data URL, a file path nor base64)")
  if len(data) > MAX_IMAGE_BYTES:
    raise ImageError(f"the image has {len(data)} bytes; at most {MAX_IMAGE_BYTES} are accepted")
  if not data:
    raise ImageError("the image is empty (0 bytes)")
  return data


def _looks_like_path(source: str) -> bool:
  return source.startswith(("/", "./", "../", "~")) or (
      len(source) < 4096 and "\n" not in source and os.path.exists(source))


def _b64decode(text: str, what: str) -> bytes:
  try:
    return base64.b64decode("".join(text.split()), validate=True)
  except (binascii.Error, ValueError) as e:
    raise ImageError(f"{what} is not valid base64: {e}") from e


def open_image(data: bytes):
  """Decodes encoded image bytes into an RGB PIL image.

  Raises:
    ImageError: not an image PIL can decode, truncated, or larger than MAX_DECODED_PIXELS.
  """
  from PIL import Image

  try:
    with Image.open(io.BytesIO(data)) as probe:
      width, height = probe.size
      if width * height > MAX_DECODED_PIXELS:
        raise ImageError(f"the image is {width}x{height} pixels; at most {MAX_DECODED_PIXELS} "
                         "pixels are accepted")
      probe.load()
      image = probe.convert("RGB")
  except ImageError:
    raise
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ImageError(f"cannot decode the image ({len(data)} bytes): {e}") from e
  if image.width < 1 or image.height < 1:
    raise ImageError(f"the image is {image.width}x{image.height} pixels")
  return image


@dataclasses.dataclass(frozen=True)
class ProcessedImage:
  """One image as the model takes it.

  Attributes:
    pixel_values: [t * h * w, channels * temporal_patch_size * patch_size^2] float32.
    grid: (t, h, w) in patches.
    num_tokens: language-model tokens of the image: t * h * w / merge_size^2.
    digest: content hash of the encoded bytes it came from ("" when processed from pixels).
  """
  pixel_values: np.ndarray
  grid: tuple[int, int, int]
  num_tokens: int
  digest: str = ""


class ImageProcessor:
  """transformers' Qwen2VLImageProcessor (PIL backend) with a model's patching settings.

  Args:
    patch_size, temporal_patch_size, merge_size: the vision config's (VisionConfig's
      patch_size, temporal_patch_size, spatial_merge_size).
    min_pixels, max_pixels: bounds on the resized image's pixel count (Qwen3-VL's published
      65,536 and 16,777,216; a 1280 x 1000 screenshot stays 1280 x 992 = 4,960 patches).
    image_mean, image_std: per-channel normalisation (0.5 for Qwen3-VL).
  """

  def __init__(self, *, patch_size: int = 16, temporal_patch_size: int = 2, merge_size: int = 2,
               min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS,
               image_mean: Sequence[float] = (0.5, 0.5, 0.5),
               image_std: Sequence[float] = (0.5, 0.5, 0.5)):
    if not 0 < min_pixels <= max_pixels:
      raise ImageError(f"need 0 < min_pixels <= max_pixels; got {min_pixels}, {max_pixels}")
    from transformers import Qwen2VLImageProcessorPil

    self.patch_size, self.temporal_patch_size = int(patch_size), int(temporal_patch_size)
    self.merge_size = int(merge_size)
    self.min_pixels, self.max_pixels = int(min_pixels), int(max_pixels)
    self._hf = Qwen2VLImageProcessorPil(
        patch_size=self.patch_size, temporal_patch_size=self.temporal_patch_size,
        merge_size=self.merge_size, image_mean=list(image_mean), image_std=list(image_std),
        size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels})

  @classmethod
  def from_pretrained(cls, folder: str | os.PathLike, **overrides) -> "ImageProcessor":
    """Settings from a checkpoint folder's preprocessor_config.json (Qwen3-VL's names:
    patch_size, temporal_patch_size, merge_size, size.shortest_edge / longest_edge or
    min_pixels / max_pixels, image_mean, image_std); `overrides` win.

    Raises:
      ImageError: the file is missing or not valid JSON.
    """
    path = Path(folder) / "preprocessor_config.json"
    try:
      spec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
      raise ImageError(f"cannot read {path}: {e}") from e
    size = spec.get("size") or {}
    values = dict(
        patch_size=spec.get("patch_size", 16),
        temporal_patch_size=spec.get("temporal_patch_size", 2),
        merge_size=spec.get("merge_size", 2),
        min_pixels=spec.get("min_pixels") or size.get("shortest_edge") or MIN_PIXELS,
        max_pixels=spec.get("max_pixels") or size.get("longest_edge") or MAX_PIXELS,
        image_mean=spec.get("image_mean", (0.5, 0.5, 0.5)),
        image_std=spec.get("image_std", (0.5, 0.5, 0.5)))
    values.update(overrides)
    return cls(**values)

  def grid(self, width: int, height: int) -> tuple[int, int, int]:
    """(t, h, w) patch grid of a still image of width x height pixels, from the processor's
    own resize rule (transformers' smart_resize) without processing any pixel.

    Raises:
      ImageError: a size the processor refuses (an aspect ratio above 200).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    try:
      h, w = smart_resize(int(height), int(width), factor=self.patch_size * self.merge_size,
                          min_pixels=self.min_pixels, max_pixels=self.max_pixels)
    except ValueError as e:
      raise ImageError(f"the image processor refuses a {width}x{height} image: {e}") from e
    return 1, h // self.patch_size, w // self.patch_size

  def num_tokens(self, width: int, height: int) -> int:
    """Language-model tokens of a still image of width x height pixels (see `grid`)."""
    t, h, w = self.grid(width, height)
    return t * h * w // self.merge_size ** 2

  def config(self) -> dict[str, Any]:
    """The settings, as a preprocessor_config.json would hold them."""
    return {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size, "merge_size": self.merge_size,
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "image_mean": list(self._hf.image_mean), "image_std": list(self._hf.image_std)}

  def __call__(self, image: Any) -> ProcessedImage:
    """Preprocesses one image: encoded bytes (or any source `image_bytes` reads) or a PIL
    image.

    Raises:
      ImageError: the source cannot be read or decoded.
    """
    digest = ""
    if not hasattr(image, "convert"):
      data = image_bytes(image)
      digest = image_digest(data)
      image = open_image(data)
    try:
      out = self._hf(images=[image.convert("RGB")], return_tensors="np")
    except ValueError as e:          # e.g. an aspect ratio above 200
      raise ImageError(f"the image processor refused the {image.width}x{image.height} image: "
                       f"{e}") from e
    grid = tuple(int(x) for x in out["image_grid_thw"][0])
    t, h, w = grid
    return ProcessedImage(pixel_values=np.asarray(out["pixel_values"], np.float32), grid=grid,
                          num_tokens=t * h * w // self.merge_size ** 2, digest=digest)


def image_size(data: bytes) -> tuple[int, int]:
  """(width, height) of an encoded image from its header, without decoding the pixels.

  Raises:
    ImageError: not an image format PIL recognises.
  """
  from PIL import Image

  try:
    with Image.open(io.BytesIO(data)) as probe:
      return probe.size
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ImageError(f"cannot read the image ({len(data)} bytes): {e}") from e


def image_mime(data: bytes) -> str:
  """The MIME type of an encoded image from its header ("image/png", ...)."""
  from PIL import Image

  try:
    with Image.open(io.BytesIO(data)) as probe:
      return Image.MIME.get(probe.format or "", "image/png")
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ImageError(f"cannot read the image ({len(data)} bytes): {e}") from e


def data_url(data: bytes) -> str:
  """A data URL of encoded image bytes ("data:image/png;base64,...")."""
  return f"data:{image_mime(data)};base64,{base64.b64encode(data).decode()}"


def expand_image_tokens(ids: Sequence[int], image_token_id: int,
                        num_tokens: Sequence[int]) -> list[int]:
  """Widens each image's <|image_pad|> run to its token count.

  A run of one placeholder is widened to num_tokens[k]; a run already num_tokens[k] long is
  kept (ids recorded after expansion pass through unchanged).

  Args:
    ids: token ids with one placeholder run per image, in order.
    image_token_id: the <|image_pad|> id.
    num_tokens: language-model tokens of each image, in order.
  Returns:
    The expanded ids.
  Raises:
    ImageError: the number of runs differs from the number of images, or a run is neither 1
      nor its image's token count long.
  """
  ids = [int(i) for i in ids]
  out: list[int] = []
  k, i = 0, 0
  while i < len(ids):
    if ids[i] != image_token_id:
      out.append(ids[i])
      i += 1
      continue
    j = i
    while j < len(ids) and ids[j] == image_token_id:
      j += 1
    if k >= len(num_tokens):
      raise ImageError(f"the prompt holds more image placeholder runs than the "
                       f"{len(num_tokens)} image(s) given")
    run = j - i
    if run not in (1, num_tokens[k]):
      raise ImageError(f"image {k}: its placeholder run has {run} tokens; expected 1 (to be "
                       f"expanded) or its {num_tokens[k]} tokens")
    out.extend([image_token_id] * num_tokens[k])
    k += 1
    i = j
  if k != len(num_tokens):
    raise ImageError(f"{len(num_tokens)} image(s) given but the prompt holds {k} image "
                     "placeholder run(s) (<|vision_start|><|image_pad|><|vision_end|> each)")
  return out


def image_parts(messages: Iterable[dict]) -> list[Any]:
  """The image sources of a chat's content parts, in rendering order (message by message,
  part by part): OpenAI "image_url" parts ({"image_url": {"url": ...}} or {"image_url":
  "..."}) and "image" parts ({"image": ...}), as Qwen3-VL's chat template renders them."""
  sources = []
  for message in messages:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
      continue
    for part in content:
      if isinstance(part, dict) and part.get("type") in ("image_url", "image"):
        sources.append(part_source(part))
  return sources


def part_source(part: dict) -> Any:
  """The image source of one "image_url" / "image" content part (ImageError if it has none)."""
  value = part.get("image_url") if part.get("type") == "image_url" else part.get("image")
  if isinstance(value, dict):
    value = value.get("url")
  if value is None or value == "":
    raise ImageError(f"a {part.get('type')!r} content part without an image (expected "
                     "{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,...'}})")
  return value


def with_image_digests(messages: Sequence[dict], digests: Sequence[str]) -> list[dict]:
  """A copy of messages whose image parts name their image by digest instead of carrying it
  ({"type": "image_url", "image_url": {"url": "sha256:..."}}), in image_parts order: what the
  trajectory store records, the images themselves stored once as blobs."""
  digests = list(digests)
  out, k = [], 0
  for message in messages:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
      out.append(message)
      continue
    parts = []
    for part in content:
      if isinstance(part, dict) and part.get("type") in ("image_url", "image"):
        if k >= len(digests):
          raise ImageError(f"the messages hold more image parts than the {len(digests)} "
                           "digests given")
        part = {**{key: v for key, v in part.items() if key not in ("image", "image_url")},
                "type": "image_url", "image_url": {"url": digests[k]}}
        k += 1
      parts.append(part)
    out.append({**message, "content": parts})
  if k != len(digests):
    raise ImageError(f"{len(digests)} digests given for {k} image parts")
  return out
