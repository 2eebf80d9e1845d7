"""Host-side vision inputs against transformers' own functions, over random layouts:
mrope_positions vs Qwen3VLModel.get_rope_index, and the per-patch tables of image_patches vs
transformers.vision_utils (rotary position ids, bilinear position-table taps) and the
learned-position resampling vs torch's F.interpolate."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import vision_utils

from orchard_jax import models
from orchard_jax.models import hf
from orchard_jax.models.vision_inputs import scatter_visual_tokens
from tests.models.conftest import tiny_vl_config

IMAGE = 250
VC = tiny_vl_config().vision

grid = st.tuples(st.just(1), st.integers(1, 5).map(lambda x: 2 * x),
                 st.integers(1, 5).map(lambda x: 2 * x))
item = st.one_of(st.integers(1, 6), grid)


@pytest.fixture(scope="module")
def rope_index():
  config = transformers.AutoConfig.for_model(**hf.config_to_hf(tiny_vl_config()))
  model = transformers.Qwen3VLModel(config)
  return model.get_rope_index


@settings(max_examples=40, deadline=None)
@given(items=st.lists(item, min_size=1, max_size=6), start_pad=st.integers(0, 3))
def test_mrope_positions_match_get_rope_index(rope_index, items, start_pad):
  ids, grids = [], []
  for x in items:
    if isinstance(x, int):
      ids += [7] * x
    else:
      ids += [252] + [IMAGE] * models.grid_tokens(x, 2) + [253]
      grids.append(x)
  ours, next_pos = models.mrope_positions(np.array(ids), grids, image_token_id=IMAGE,
                                          spatial_merge_size=2)
  # transformers on a left-padded row: positions of the valid tokens only.
  padded = np.array([0] * start_pad + ids)
  mask = np.array([0] * start_pad + [1] * len(ids))
  kwargs = dict(attention_mask=torch.tensor(mask[None]),
                mm_token_type_ids=torch.tensor((padded == IMAGE)[None].astype(np.int64)))
  if grids:
    kwargs["image_grid_thw"] = torch.tensor(grids)
  expected, delta = rope_index(torch.tensor(padded[None]), **kwargs)
  expected = expected[:, 0, start_pad:].numpy().T
  np.testing.assert_array_equal(ours, expected)
  assert next_pos == len(ids) + int(delta[0, 0])


def test_mrope_positions_reject_placeholders_that_do_not_fit_the_grids():
  with pytest.raises(models.ModelError, match="needs 4 placeholder tokens at token 1; the run "
                                              "there has 3"):
    models.mrope_positions(np.array([1, IMAGE, IMAGE, IMAGE, 2]), [(1, 4, 4)],
                           image_token_id=IMAGE, spatial_merge_size=2)
  with pytest.raises(models.ModelError, match="2 image grid"):
    models.mrope_positions(np.array([1, IMAGE, 2]), [(1, 2, 2), (1, 2, 2)],
                           image_token_id=IMAGE, spatial_merge_size=2)


@settings(max_examples=25, deadline=None)
@given(grids=st.lists(grid, min_size=1, max_size=3), extra=st.integers(0, 2))
def test_patch_tables_match_transformers_vision_utils(grids, extra):
  pixels = [np.random.default_rng(0).normal(size=(t * h * w, VC.patch_dim)).astype(np.float32)
            for t, h, w in grids]
  longest = max(t * h * w for t, h, w in grids)
  patches = models.image_patches(pixels, grids, VC, pad_patches=longest + 4 * extra)
  thw = torch.tensor(grids)
  rope_ids = vision_utils.get_vision_position_ids(thw, 2).numpy()
  taps, weights = vision_utils.get_vision_interpolation_indices_and_weights(
      thw, num_grid_per_side=VC.position_grid_side, mode="bilinear", align_corners=True,
      spatial_merge_size=2)
  offset = 0
  for i, (t, h, w) in enumerate(grids):
    n = t * h * w
    rows = slice(offset, offset + n)
    np.testing.assert_array_equal(patches.rows[i, :n], rope_ids[rows, 0])
    np.testing.assert_array_equal(patches.cols[i, :n], rope_ids[rows, 1])
    # Same resampling: compare the weighted sums on a random table (tap order may differ).
    table = np.random.default_rng(1).normal(size=(VC.num_position_embeddings, 3))
    ours = np.einsum("pk,pkd->pd", patches.pos_weight[i, :n], table[patches.pos_index[i, :n]])
    theirs = np.einsum("pk,pkd->pd", weights[rows].numpy(), table[taps[rows].numpy()])
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_array_equal(patches.pixel_values[i, :n], pixels[i])
    assert patches.valid[i, :n].all() and not patches.valid[i, n:].any()
    offset += n


def test_resampled_positions_equal_bilinear_interpolation_of_the_table():
  """The taps reproduce F.interpolate(bilinear, align_corners=True) of the side x side table
  to the image grid (then read in merge-block order)."""
  side, (h, w) = VC.position_grid_side, (6, 10)
  table = np.random.default_rng(2).normal(size=(side * side, 5)).astype(np.float32)
  patches = models.image_patches([np.zeros((h * w, VC.patch_dim), np.float32)], [(1, h, w)], VC)
  ours = np.einsum("pk,pkd->pd", patches.pos_weight[0], table[patches.pos_index[0]])
  grid = torch.tensor(table.T.reshape(1, 5, side, side))
  expected = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=True)[0]
  expected = expected.numpy()[:, patches.rows[0], patches.cols[0]].T
  np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_image_patches_rejects_bad_input():
  with pytest.raises(models.ModelError, match="multiples of spatial_merge_size 2"):
    models.image_patches([np.zeros((3, VC.patch_dim))], [(1, 1, 3)], VC)
  with pytest.raises(models.ModelError, match=r"image 0: pixel values of shape \(4, 5\)"):
    models.image_patches([np.zeros((4, 5))], [(1, 2, 2)], VC)
  with pytest.raises(models.ModelError, match="pad_patches=6: expected a multiple of 4"):
    models.image_patches([np.zeros((4, VC.patch_dim))], [(1, 2, 2)], VC, pad_patches=6)


def test_scatter_places_image_tokens_in_placeholder_order():
  """Two images (2 and 1 valid tokens of 3 rows each) over a batch of two rows: the k-th
  placeholder in row-major order gets the k-th valid token."""
  tokens = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
  deepstack = np.stack([tokens, -tokens])
  valid = np.array([[True, True, False], [True, False, False]])
  ids = np.array([[1, IMAGE, IMAGE, 2], [IMAGE, 3, 4, 5]])
  out = scatter_visual_tokens(ids, tokens, deepstack, valid, IMAGE)
  expected = np.zeros((2, 4, 2), np.float32)
  expected[0, 1], expected[0, 2], expected[1, 0] = tokens[0, 0], tokens[0, 1], tokens[1, 0]
  np.testing.assert_array_equal(out.embeds, expected)
  np.testing.assert_array_equal(out.deepstack[1], -expected)
  np.testing.assert_array_equal(out.mask, ids == IMAGE)
