"""`--suite vlm`: the vision-language policy served by the embedded engine against transformers'
Qwen3-VL in the same run.

Both sides run the same preset (`tiny_vl`: dense, hidden 256, 4 layers, a 4-block vision
encoder of width 128; `small_vl`: Qwen3-MoE backbone of the `small` sizes, 16 experts top-4,
a 4-block encoder of width 256), float32, random init, on one 1280x1000 screenshot preprocessed
by transformers' own image processor at Qwen3-VL's published settings (1280x992 pixels, 4,960
patches, 1,240 image tokens) inside a one-turn chat (about 1,260 prompt tokens):

- prefill: time to the first sampled token of the request, preprocessing of the screenshot
  included on both sides (it is the same library), reported as prompt tokens/s. The engine's
  image feature cache is emptied and its prefix cache is off, so every repeat runs the vision
  encoder and the whole prefill. transformers: `generate(max_new_tokens=1)`.
- decode: greedy decode of N = 64 tokens after that prompt, batch 1, with the prompt already
  in the cache on both sides (the engine's prefix cache holds it from a warm-up request;
  transformers continues a `generate` from the cache of a forward over the prompt
  but its last token, and its output is checked against a plain `generate`), reported as new
  tokens/s of the whole call.
Medians of `_REPEATS` runs after a warm-up (which compiles / allocates); torch limited to 2
threads, as docs/peers.md measures transformers.
"""
from __future__ import annotations

import dataclasses
import io
import statistics

import numpy as np

from launch.benchmarks import common

_SIZE = (1280, 1000)       # width, height: Orchard-GUI's viewport
_NEW, _REPEATS = 64, 3
_PRESETS = ("tiny_vl", "small_vl")


def _screenshot() -> bytes:
  """A synthetic 1280x1000 page: bands of flat colour with text-like noise (PNG bytes)."""
  from PIL import Image

  rng = np.random.default_rng(0)
  w, h = _SIZE
  page = np.full((h, w, 3), 245, np.uint8)
  for top in range(0, h, 40):
    page[top:top + 30, 40:w - 40] = rng.integers(0, 255, 3)
    page[top + 8:top + 22, 60:w - 200] = rng.integers(0, 255, (14, w - 260, 3))
  buf = io.BytesIO()
  Image.fromarray(page).save(buf, "PNG")
  return buf.getvalue()


def _prompt(tokenizer, processor, screenshot: bytes) -> tuple[list[int], list[int]]:
  """(ids with one placeholder, ids widened to the screenshot's 1,240 tokens)."""
  from orchard_jax.data.images import data_url, expand_image_tokens

  messages = [{"role": "user", "content": [
      {"type": "text", "text": "Click the search button and type 'orchard'."},
      {"type": "image_url", "image_url": {"url": data_url(screenshot)}}]}]
  ids = tokenizer.render_chat(messages)
  n = processor(screenshot).num_tokens
  return ids, expand_image_tokens(ids, tokenizer.image_token_id, [n])


def _ours(preset: str, screenshot: bytes) -> tuple[float, float, int]:
  """(prefill prompt tokens/s, decode new tokens/s, compilations) of the engine."""
  from flax import nnx

  from orchard_jax.data import load_tokenizer
  from orchard_jax.data.images import ImageProcessor, data_url
  from orchard_jax.models import CausalLM, get_preset
  from orchard_jax.rollout import Engine, EngineConfig, SamplingParams, SingleGenerateRequest

  config = dataclasses.replace(get_preset(preset), dtype="float32", param_dtype="float32")
  model = CausalLM(config, rngs=nnx.Rngs(0))
  tokenizer = load_tokenizer("tiny_vl")
  processor = ImageProcessor()
  ids, expanded = _prompt(tokenizer, processor, screenshot)

  def request(new: int) -> SingleGenerateRequest:
    return SingleGenerateRequest(input_ids=ids, image_data=[data_url(screenshot)],
                                 sampling_params=SamplingParams(max_new_tokens=new,
                                                                temperature=0.0,
                                                                ignore_eos=True))

  compiles = 0
  for prefix_cache in (False, True):
    # Chunks of 1,024 and 256: the ~1,265-token prompt pads to 1,280, not 2,048.
    engine_config = EngineConfig(max_batch_size=1, batch_buckets=(1,), max_seq_len=2048,
                                 cache_len_buckets=(2048,), prefill_chunk_buckets=(256, 1024),
                                 decode_steps=16, seed=0, prefix_cache=prefix_cache)
    with Engine(model, tokenizer, config=engine_config, image_processor=processor) as engine:
      if not prefix_cache:                     # prefill: encoder and whole prompt every time
        def first():
          engine.runner.vision.clear()
          [out] = engine.generate([request(1)])
          assert out.meta_info.prompt_tokens == len(expanded)

        prefill = len(expanded) / statistics.median(
            common.time_calls(first, warmup=1, repeats=_REPEATS))
      else:                                    # decode: the prompt is a resident row
        def decode():
          [out] = engine.generate([request(_NEW)])
          assert len(out.output_ids) == _NEW
          assert out.meta_info.cached_tokens == len(expanded) - 1

        engine.generate([request(1)])          # the prompt becomes a resident row
        decode_rate = _NEW / statistics.median(
            common.time_calls(decode, warmup=1, repeats=_REPEATS))
      compiles += engine.compile_count
  return prefill, decode_rate, compiles


def _transformers(preset: str, screenshot: bytes) -> tuple[float, float, str]:
  import copy

  import torch
  import transformers
  from PIL import Image

  from orchard_jax.data import load_tokenizer
  from orchard_jax.data.images import ImageProcessor
  from orchard_jax.models import get_preset, hf

  torch.set_num_threads(2)
  torch.manual_seed(0)
  config = dataclasses.replace(get_preset(preset), dtype="float32", param_dtype="float32")
  hf_config = transformers.AutoConfig.for_model(**hf.config_to_hf(config))
  model = transformers.AutoModelForImageTextToText.from_config(hf_config).eval()
  tokenizer = load_tokenizer("tiny_vl")
  ours = ImageProcessor()
  _, expanded = _prompt(tokenizer, ours, screenshot)
  processor = transformers.Qwen2VLImageProcessorPil(**{
      k: v for k, v in ours.config().items() if k != "image_processor_type"})
  ids = torch.tensor([expanded])
  mm = (ids == config.vision.image_token_id).long()

  def inputs():
    pixels = processor(images=[Image.open(io.BytesIO(screenshot)).convert("RGB")],
                       return_tensors="pt")
    return dict(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                mm_token_type_ids=mm, attention_mask=torch.ones_like(ids))

  def generate(new: int, **kwargs):
    with torch.no_grad():
      out = model.generate(input_ids=ids, do_sample=False, max_new_tokens=new,
                           min_new_tokens=new, pad_token_id=0, **kwargs)
    assert out.shape[1] == ids.shape[1] + new
    return out

  prefill = len(expanded) / statistics.median(
      common.time_calls(lambda: generate(1, **inputs()), warmup=1, repeats=_REPEATS))
  # The prompt but its last token in a cache (this also sets the model's M-RoPE offsets).
  with torch.no_grad():
    head = {k: (v[:, :-1] if k in ("mm_token_type_ids", "attention_mask") else v)
            for k, v in inputs().items()}
    out = model(input_ids=ids[:, :-1], use_cache=True, **head)
  # transformers renamed `past_key_values` to `cache` during 5.x (outputs and generate's
  # argument alike); use whichever this version returns.
  cache_name = "cache" if "cache" in out else "past_key_values"
  cached = out[cache_name]
  reference = generate(_NEW, **inputs())

  def decode():
    out = generate(_NEW, **{cache_name: copy.deepcopy(cached)}, mm_token_type_ids=mm,
                   attention_mask=torch.ones_like(ids))
    assert torch.equal(out, reference)

  decode_rate = _NEW / statistics.median(common.time_calls(decode, warmup=1, repeats=_REPEATS))
  name = f"transformers {transformers.__version__} (torch {torch.__version__}, 2 threads)"
  return prefill, decode_rate, name


def run() -> list[common.Row]:
  screenshot = _screenshot()
  rows = []
  for preset in _PRESETS:
    their_prefill, their_decode, name = _transformers(preset, screenshot)
    our_prefill, our_decode, compiles = _ours(preset, screenshot)
    rows.append(common.Row(
        case=f"{preset}: prefill of a chat with one 1280x1000 screenshot (1,240 image tokens; "
             "preprocessing and vision encoder included)",
        metric="prompt tokens/s", ours=our_prefill, baseline=their_prefill, baseline_name=name))
    rows.append(common.Row(
        case=f"{preset}: greedy decode after that prompt (cached), batch 1, {_NEW} new tokens",
        metric="new tokens/s", ours=our_decode, baseline=their_decode, baseline_name=name))
    rows.append(common.Row(case=f"{preset}: engine compilations for these requests",
                           metric="count", ours=float(compiles), higher_is_better=False))
  return rows
