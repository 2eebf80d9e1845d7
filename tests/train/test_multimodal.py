"""Packed multimodal batches and the train step on a vision-language model: sequences with
images packed several to a row, their log-probs equal each sequence's own full forward with
its images (NumPy log-softmax of the model's logits), the SFT step's loss equals the NumPy
loss on 2 data-parallel devices with 2 microbatches, and a frozen vision tower stays
bit-identical while a trained one moves. Packing invariants over random layouts (hypothesis).
"""
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax import data, models, train
from orchard_jax.data.images import ProcessedImage
from tests.models.conftest import random_model, tiny_vl_config
from tests.train.conftest import mesh_of

IMAGE, START, END = 250, 252, 253
GRIDS = [(1, 2, 4), (1, 4, 4), (1, 2, 2), (1, 6, 2)]
K, PATCHES, SEQ = 2, 24, 48


def _digest(i):
  return "sha256:" + hashlib.sha256(str(i).encode()).hexdigest()


@pytest.fixture(scope="module")
def world():
  config = tiny_vl_config("qwen3_moe")
  model = random_model(config, seed=5)
  rng = np.random.default_rng(0)
  images = {}
  for i, grid in enumerate(GRIDS):
    t, h, w = grid
    pixels = rng.normal(size=(t * h * w, config.vision.patch_dim)).astype(np.float32)
    images[_digest(i)] = ProcessedImage(pixels, grid, models.grid_tokens(grid, 2), _digest(i))
  layouts = [[4, 0, 3], [5], [2, 1, 2, 2, 4], [3, 3, 2], [6, 1, 1], [2, 3, 5]]
  sequences = []
  for layout in layouts:
    ids, digests = [], []
    for j, item in enumerate(layout):
      if j % 2:                        # odd items are images (by index into GRIDS)
        ids += [START] + [IMAGE] * models.grid_tokens(GRIDS[item], 2) + [END]
        digests.append(_digest(item))
      else:
        ids += rng.integers(0, 240, item).tolist()
    ids += rng.integers(0, 240, 4).tolist()                 # a "response" of 4 tokens
    weights = np.zeros(len(ids), np.float32)
    weights[-4:] = 1.0
    sequences.append(data.TrainingSequence(
        input_ids=ids, loss_weights=weights, old_logprobs=np.zeros(len(ids)),
        action_ids=np.full(len(ids), -1), images=tuple(digests)))
  packed = data.pack_sequences(sequences, batch_size=4, seq_len=SEQ, images_per_row=K,
                               image_token_id=IMAGE, seed=1)
  assert packed.stats.packed == len(sequences) and packed.stats.batches == 1
  batch = train.add_images(packed.batches[0], packed.row_images[0], images, config,
                           images_per_row=K, patches_per_image=PATCHES)
  return dict(config=config, model=model, images=images, sequences=sequences, packed=packed,
              batch=batch)


@nnx.jit
def _full_logits(model, ids, pos, seg, patches):
  return model(ids, pos, seg, images=patches)[0]


def _reference_logp(world, i):
  """log pi(x_t | x_<t) of sequence i alone, from the model's full logits with its images."""
  seq, config = world["sequences"][i], world["config"]
  grids = [world["images"][d].grid for d in seq.images]
  pos = models.mrope_positions(seq.input_ids, grids, image_token_id=IMAGE,
                               spatial_merge_size=2)[0]
  patches = models.image_patches([world["images"][d].pixel_values for d in seq.images], grids,
                                 config.vision)
  logits = np.asarray(_full_logits(world["model"], jnp.asarray(seq.input_ids[None]),
                                   jnp.asarray(pos[None]), jnp.ones((1, len(seq)), jnp.int32),
                                   jax.tree.map(jnp.asarray, patches)), np.float64)[0]
  logsm = logits - logits.max(-1, keepdims=True)
  logsm -= np.log(np.exp(logsm).sum(-1, keepdims=True))
  out = np.zeros(len(seq))
  out[1:] = logsm[np.arange(len(seq) - 1), seq.input_ids[1:]]
  return out


def test_batch_layout(world):
  batch, packed = world["batch"], world["packed"]
  assert batch["positions"].shape == (4, SEQ, 3)
  assert batch["pixel_values"].shape == (4, K, PATCHES, world["config"].vision.patch_dim)
  for row, digests in enumerate(packed.row_images[0]):
    assert len(digests) <= K
    valid = batch["image_valid"][row]
    for k in range(K):
      n = int(np.prod(world["images"][digests[k]].grid)) if k < len(digests) else 0
      assert valid[k].sum() == n


def test_packed_logprobs_equal_each_sequence_alone(world):
  batch = world["batch"]
  logp, _, _ = nnx.jit(lambda m, b: train.token_logprobs(
      m, b["input_ids"], b["positions"], b["segment_ids"], chunk_size=16, with_entropy=False,
      images=train.batch_images(b)))(world["model"], {k: jnp.asarray(v) for k, v in batch.items()})
  logp = np.asarray(logp)
  for i, place in enumerate(world["packed"].placements):
    span = slice(place.start + 1, place.start + place.length)
    np.testing.assert_allclose(logp[place.row, span], _reference_logp(world, i)[1:], atol=1e-4,
                               err_msg=f"sequence {i}")


def _step(config, model, loss, mesh, frozen, microbatches):
  parts = train.ModelParts.of(model)
  opt = train.OptimizerConfig(learning_rate=1e-2, warmup_steps=0, total_steps=4,
                              schedule="constant", frozen=frozen)
  optimizer = train.make_optimizer(opt)
  params = parts.pure_params()
  shardings = train.state_shardings(optimizer, params, mesh, parts.param_shardings(mesh),
                                   frozen=frozen)
  state = train.init_train_state(optimizer, params, seed=0, shardings=shardings, frozen=frozen)
  step = train.build_train_step(parts, loss, optimizer, train.learning_rate_schedule(opt),
                                mesh=mesh, shardings=shardings, microbatches=microbatches,
                                donate=False, frozen=frozen)
  return state, step


@pytest.mark.parametrize("frozen", [("visual",), ()])
def test_sft_step_with_images_frozen_or_trained_vision(world, frozen):
  batch, packed = world["batch"], world["packed"]
  expected_num, expected_den = 0.0, 0.0
  for i, place in enumerate(packed.placements):
    w = world["sequences"][i].loss_weights[1:]
    expected_num += float((w * _reference_logp(world, i)[1:]).sum())
    expected_den += float(w.sum())
  state, step = _step(world["config"], world["model"], train.SFTLoss(chunk_size=16),
                      mesh_of(2), frozen, microbatches=2)
  new_state, metrics = step(state, batch)
  assert float(metrics["loss"]) == pytest.approx(-expected_num / expected_den, rel=1e-4)
  old, new = jax.device_get(state["params"]), jax.device_get(new_state["params"])
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), old, new)
  vision_moved = jax.tree.leaves(moved["visual"])
  text_moved = jax.tree.leaves(moved["model"])
  assert any(text_moved)
  if frozen:
    assert not any(vision_moved)          # no update, no weight decay
  else:
    assert any(vision_moved)


def test_frozen_prefix_that_names_nothing_is_refused(world):
  with pytest.raises(train.TrainError, match=r"frozen \['vision'\] name no parameter"):
    _step(world["config"], world["model"], train.SFTLoss(), mesh_of(1), ("vision",), 1)


def test_add_images_refuses_mismatched_rows(world):
  packed = world["packed"]
  rows = [list(r) for r in packed.row_images[0]]
  first = next(i for i, r in enumerate(rows) if r)
  rows[first] = rows[first][:-1]
  with pytest.raises(train.TrainError, match=f"row {first}"):
    train.add_images(packed.batches[0], rows, world["images"], world["config"],
                     images_per_row=K, patches_per_image=PATCHES)
  with pytest.raises(train.TrainError, match="larger|pad_patches"):
    train.add_images(packed.batches[0], packed.row_images[0], world["images"], world["config"],
                     images_per_row=K, patches_per_image=8)


sequence = st.lists(st.one_of(st.integers(1, 5), st.sampled_from(range(len(GRIDS))).map(
    lambda g: ("img", g))), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(layouts=st.lists(sequence, min_size=1, max_size=8), seq_len=st.integers(8, 40),
       per_row=st.integers(1, 3), seed=st.integers(0, 3))
def test_packing_keeps_whole_images_in_order(layouts, seq_len, per_row, seed):
  sequences = []
  for n, layout in enumerate(layouts):
    ids, digests = [], []
    for item in layout:
      if isinstance(item, tuple):
        ids += [START] + [IMAGE] * models.grid_tokens(GRIDS[item[1]], 2) + [END]
        digests.append(_digest(item[1]))
      else:
        ids += [n % 7 + 1] * item
    sequences.append(data.TrainingSequence(
        input_ids=ids, loss_weights=np.ones(len(ids)), old_logprobs=np.zeros(len(ids)),
        action_ids=np.zeros(len(ids)), images=tuple(digests)))
  packed = data.pack_sequences(sequences, batch_size=2, seq_len=seq_len, images_per_row=per_row,
                               image_token_id=IMAGE, seed=seed)
  if packed.row_images is None:     # no sequence had images
    return
  for b, batch in enumerate(packed.batches):
    for r in range(2):
      expected = []
      row_places = sorted((p.start, i) for i, p in enumerate(packed.placements)
                          if p is not None and (p.batch, p.row) == (b, r))
      for _, i in row_places:
        p = packed.placements[i]
        kept = batch["input_ids"][r, p.start:p.start + p.length]
        np.testing.assert_array_equal(kept, sequences[i].input_ids[:p.length])
        # whole images only: the kept ids end outside any placeholder run
        full = sequences[i].input_ids
        assert p.length == len(full) or not (full[p.length - 1] == IMAGE
                                             and full[p.length] == IMAGE)
        runs = int(np.count_nonzero(np.diff(np.concatenate([[0], kept == IMAGE])) == 1))
        expected += list(sequences[i].images[:runs])
      assert list(packed.row_images[b][r]) == expected
      assert len(expected) <= per_row
