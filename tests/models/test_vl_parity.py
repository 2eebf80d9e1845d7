"""Parity with transformers' Qwen3-VL: tiny random Qwen3VLForConditionalGeneration (dense
text model) and Qwen3VLMoeForConditionalGeneration (MoE text model), saved with
save_pretrained and loaded by orchard_jax; logits compared on padded batches (right- and
left-padded rows) holding no image, one image, and several images of different sizes (two
in one row). transformers computes its own 3-D position ids from mm_token_type_ids and the
attention mask, so our host-side mrope_positions is checked too. Pixel values come from
transformers' image processor. Then orchard_jax's export (sharded) loads back into
transformers with the same logits."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from PIL import Image

from orchard_jax import models
from orchard_jax.models import hf
from tests.models.conftest import tiny_vl_config

TOL = 1e-4
IMAGE, START, END = 250, 252, 253
SIZES = ((40, 70), (100, 60), (32, 32))       # pixel (height, width) of the test images


def _processor():
  """transformers' own Qwen3-VL image preprocessing (the PIL backend: no torchvision here),
  with small pixel bounds so the images stay a few patches."""
  return transformers.Qwen2VLImageProcessorPil(
      patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
      image_std=[0.5] * 3, size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})


@pytest.fixture(scope="module")
def images():
  """[(pixel_values [patches, 1536], grid (t, h, w))] for SIZES."""
  rng = np.random.default_rng(0)
  proc = _processor()
  out = []
  for h, w in SIZES:
    pixels = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    o = proc(images=[pixels], return_tensors="np")
    out.append((o["pixel_values"], tuple(int(x) for x in o["image_grid_thw"][0])))
  assert len({g for _, g in out}) == len(out)          # three different sizes
  return out


def _reference(arch, folder):
  torch.manual_seed(0)
  config = transformers.AutoConfig.for_model(**hf.config_to_hf(tiny_vl_config(arch)))
  config._attn_implementation = "eager"
  model = transformers.AutoModelForImageTextToText.from_config(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(torch.randn_like(p) * 0.2)
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def pair(request, tmp_path_factory):
  """(arch, transformers model, orchard_jax config, orchard_jax model loaded from its save)."""
  folder = tmp_path_factory.mktemp(f"vl-{request.param}")
  reference = _reference(request.param, str(folder))
  config, model = hf.load_pretrained(str(folder))
  assert config == tiny_vl_config(request.param)
  return request.param, reference, config, model


def _batch(images, layout, seed):
  """Token rows from a layout: per row, a list of items (an int n = n random text tokens, or
  "img:k" = image k wrapped in vision start/end), and whether the row is left-padded.

  Returns ids [B, S], attention mask [B, S], the images in placeholder order, per-row grids.
  """
  rng = np.random.default_rng(seed)
  rows, grids_per_row, order = [], [], []
  for items, _ in layout:
    row, grids = [], []
    for item in items:
      if isinstance(item, int):
        row += rng.integers(0, 240, item).tolist()
      else:
        k = int(item.split(":")[1])
        grid = images[k][1]
        row += [START] + [IMAGE] * models.grid_tokens(grid, 2) + [END]
        grids.append(grid)
        order.append(k)
    rows.append(row)
    grids_per_row.append(grids)
  seq = max(map(len, rows)) + 3
  ids = np.zeros((len(rows), seq), np.int32)
  mask = np.zeros((len(rows), seq), np.int32)
  for i, (row, (_, left)) in enumerate(zip(rows, layout)):
    cols = slice(seq - len(row), seq) if left else slice(0, len(row))
    ids[i, cols] = row
    mask[i, cols] = 1
  return ids, mask, order, grids_per_row


def _positions(ids, mask, grids_per_row):
  """Our 3-D position ids: mrope_positions of each row's valid tokens, from 0."""
  pos = np.zeros(ids.shape + (3,), np.int32)
  for i, grids in enumerate(grids_per_row):
    valid = mask[i] == 1
    pos[i, valid] = models.mrope_positions(ids[i][valid], grids, image_token_id=IMAGE,
                                           spatial_merge_size=2)[0]
  return pos


def _hf_logits(model, ids, mask, images, order):
  kwargs = dict(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long))
  if order:
    kwargs.update(
        pixel_values=torch.tensor(np.concatenate([images[k][0] for k in order])),
        image_grid_thw=torch.tensor([images[k][1] for k in order]),
        mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)))
  else:   # text only: transformers would ignore the padding in default positions
    kwargs["position_ids"] = torch.tensor(np.maximum(np.cumsum(mask, 1) - 1, 0))
  with torch.no_grad():
    return model(**kwargs).logits.float().numpy()


@nnx.jit
def _forward(model, ids, pos, seg, patches):
  return model(ids, pos, seg, images=patches)[0]


@nnx.jit
def _forward_text(model, ids, pos, seg):
  return model(ids, pos, seg)[0]


def _our_logits(model, config, ids, mask, images, order, grids_per_row):
  if not order:
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
    return np.asarray(_forward_text(model, jnp.asarray(ids), jnp.asarray(pos),
                                    jnp.asarray(mask)))
  patches = models.image_patches([images[k][0] for k in order], [images[k][1] for k in order],
                                 config.vision)
  pos = _positions(ids, mask, grids_per_row)
  return np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask),
                             jax.tree.map(jnp.asarray, patches)))


LAYOUTS = {
    "no_image": [([17], False), ([9], True), ([23], False)],
    "one_image": [([5, "img:0", 7], False), ([12], True), ([3], False)],
    "several_images": [([5, "img:0", 6], False), ([3, "img:1", 2, "img:2", 4], True),
                       (["img:2", 8], True)],
}


def _max_diff(a, b, mask):
  return float(np.abs(a - b)[mask == 1].max())


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_logits_match_transformers(pair, images, case):
  arch, reference, config, model = pair
  ids, mask, order, grids = _batch(images, LAYOUTS[case], seed=len(case))
  expected = _hf_logits(reference, ids, mask, images, order)
  ours = _our_logits(model, config, ids, mask, images, order, grids)
  assert ours.shape == expected.shape
  assert _max_diff(ours, expected, mask) <= TOL


def test_export_loads_back_into_transformers(pair, images, tmp_path):
  arch, reference, config, model = pair
  files = hf.save_pretrained(model, config, str(tmp_path / "ours"), max_shard_bytes=150_000)
  assert len(files) > 1 and os.path.exists(tmp_path / "ours" / "model.safetensors.index.json")
  reloaded = transformers.AutoModelForImageTextToText.from_pretrained(str(tmp_path / "ours"))
  reloaded.eval().config._attn_implementation = "eager"
  assert type(reloaded) is type(reference)
  ids, mask, order, grids = _batch(images, LAYOUTS["several_images"], seed=5)
  expected = _hf_logits(reference, ids, mask, images, order)
  assert _max_diff(_hf_logits(reloaded, ids, mask, images, order), expected, mask) <= TOL
  config2, model2 = hf.load_pretrained(str(tmp_path / "ours"))
  assert config2 == config
  assert _max_diff(_our_logits(model2, config2, ids, mask, images, order, grids), expected,
                   mask) <= TOL
