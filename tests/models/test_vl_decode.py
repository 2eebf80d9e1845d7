"""Vision-language decoding: the images are encoded once, a chunked prefill passes each chunk
its slice of the image tokens (a chunk boundary falls inside an image), then one-token decode
steps continue from each row's next M-RoPE position with 1-D (text) positions; every logit
equals the full-sequence forward with the images. Rows mix two images, one image and none."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models
from tests.models.conftest import random_model, tiny_vl_config

TOL = 1e-4
IMAGE, START, END = 250, 252, 253
CHUNK = 8


@nnx.jit(donate_argnums=4)
def _step(model, ids, pos, seg, cache, visual):
  return model(ids, pos, seg, cache=cache, visual=visual)


@nnx.jit(donate_argnums=4)
def _text_step(model, ids, pos, seg, cache):
  return model(ids, pos, seg, cache=cache)


@nnx.jit
def _full(model, ids, pos, seg, patches):
  return model(ids, pos, seg, images=patches)[0]


@nnx.jit
def _visual(model, ids, patches):
  return model.visual_tokens(ids, patches)


def _rows(rng):
  """(tokens, grids, prompt length) per row: the prompt ends with text after the images;
  the tokens after it are what decoding feeds."""
  def img(grid):
    return [START] + [IMAGE] * models.grid_tokens(grid, 2) + [END]

  def text(n):
    return rng.integers(0, 240, n).tolist()
  a, b, c = (1, 4, 6), (1, 2, 2), (1, 6, 4)
  row0 = text(3) + img(a) + text(2)              # the first chunk ends inside the image
  row1 = text(2) + img(b) + text(1) + img(c) + text(3)
  row2 = text(9)
  return [(row0 + text(7), [a], len(row0)), (row1 + text(5), [b, c], len(row1)),
          (row2 + text(6), [], len(row2))]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_chunked_prefill_with_images_then_steps_equal_full_sequence(arch):
  config = tiny_vl_config(arch)
  model = random_model(config, seed=3)
  rng = np.random.default_rng(0)
  rows = _rows(rng)
  grids = [g for _, gs, _ in rows for g in gs]
  pixels = [rng.normal(size=(t * h * w, config.vision.patch_dim)).astype(np.float32)
            for t, h, w in grids]
  patches = jax.tree.map(jnp.asarray, models.image_patches(pixels, grids, config.vision))
  seq = max(len(r) for r, _, _ in rows)
  b = len(rows)
  ids = np.zeros((b, seq), np.int32)
  seg = np.zeros((b, seq), np.int32)
  pos = np.zeros((b, seq, 3), np.int32)
  next_pos = []
  for i, (tokens, gs, prompt) in enumerate(rows):
    ids[i, :len(tokens)] = tokens
    seg[i, :len(tokens)] = 1
    pos[i, :len(tokens)] = models.mrope_positions(np.array(tokens), gs, image_token_id=IMAGE,
                                                  spatial_merge_size=2)[0]
    next_pos.append(models.mrope_positions(np.array(tokens[:prompt]), gs,
                                           image_token_id=IMAGE, spatial_merge_size=2)[1])
  full = np.asarray(_full(model, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg), patches))

  prompts = np.array([p for _, _, p in rows])
  pre = -(-prompts.max() // CHUNK) * CHUNK
  prompt_ids = np.where(np.arange(pre)[None] < prompts[:, None], np.pad(ids, ((0, 0), (0, max(
      0, pre - seq))))[:, :pre], 0)
  visual = _visual(model, jnp.asarray(prompt_ids), patches)       # encoder runs once
  cache = model.init_cache(b, 64)
  for start in range(0, pre, CHUNK):
    cols = slice(start, start + CHUNK)
    chunk_seg = (np.arange(start, start + CHUNK)[None] < prompts[:, None]).astype(np.int32)
    chunk_pos = np.pad(pos, ((0, 0), (0, max(0, pre - seq)), (0, 0)))[:, cols]
    part = models.VisualTokens(embeds=visual.embeds[:, cols], mask=visual.mask[:, cols],
                               deepstack=visual.deepstack[:, :, cols])
    logits, _, cache = _step(model, jnp.asarray(prompt_ids[:, cols]), jnp.asarray(chunk_pos),
                             jnp.asarray(chunk_seg), cache, part)
    logits = np.asarray(logits)
    for r in range(b):
      for c in range(CHUNK):
        t = start + c
        if t < prompts[r]:
          np.testing.assert_allclose(logits[r, c], full[r, t], atol=TOL,
                                     err_msg=f"{arch} row {r} prompt token {t}")
  np.testing.assert_array_equal(np.asarray(cache.lengths), prompts)
  lengths = np.array([len(r) for r, _, _ in rows])
  for s in range(int((lengths - prompts).max())):
    t = prompts + s
    live = t < lengths
    step_ids = np.where(live, ids[np.arange(b), np.minimum(t, seq - 1)], 0)[:, None]
    step_pos = (np.array(next_pos) + s)[:, None].astype(np.int32)      # 1-D: text positions
    logits, _, cache = _text_step(model, jnp.asarray(step_ids, jnp.int32), jnp.asarray(step_pos),
                                  jnp.asarray(live[:, None].astype(np.int32)), cache)
    for r in np.flatnonzero(live):
      np.testing.assert_allclose(np.asarray(logits)[r, 0], full[r, t[r]], atol=TOL,
                                 err_msg=f"{arch} row {r} decode step {s}")
  np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)
