"""The vision tower shards with the rest: every parameter of a vision-language model carries a
logical axis name per dimension, a model created sharded on 8 host devices (data x fsdp x
tensor) leaves no large parameter replicated, and its loss, logits and gradients with images
equal the same parameters on one device."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from orchard_jax import models, parallel
from tests.models.conftest import tiny_vl_config

MESH = {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
IMAGE = 250


def test_every_parameter_has_logical_axes():
  model = nnx.eval_shape(lambda: models.CausalLM(models.get_preset("qwen3_vl_4b"),
                                                 rngs=nnx.Rngs(0)))
  names = set(dict(parallel.DEFAULT_RULES))
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get("logical_axes")
    where = "/".join(map(str, path))
    assert axes is not None and len(axes) == len(var.shape), where
    assert all(a is None or a in names for a in axes), (where, axes)
    if path[0] == "visual" and np.prod(var.shape) >= 2 ** 16:
      assert any(a in ("embed", "mlp", "q_heads") for a in axes), where   # shardable


def _loss(model, ids, pos, seg, patches):
  logits, _ = model(ids, pos, seg, images=patches)
  logp = jax.nn.log_softmax(logits)
  target = jnp.roll(ids, -1, axis=1)
  nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * (seg != 0)) / jnp.sum(seg != 0), logits


@pytest.mark.slow
def test_sharded_forward_and_gradients_with_images_equal_single_device():
  config = dataclasses.replace(tiny_vl_config("qwen3"), num_attention_heads=4,
                               num_key_value_heads=2)
  mesh = parallel.make_mesh(MESH)
  sharded = parallel.create_sharded(lambda: models.CausalLM(config, rngs=nnx.Rngs(0)), mesh)
  parallel.check_sharded(sharded, mesh, min_size=2048)
  graphdef, state = nnx.split(sharded)
  single = nnx.merge(graphdef, jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]),
                                            state))
  rng = np.random.default_rng(0)
  grids = [(1, 4, 6), (1, 2, 2), (1, 4, 4), (1, 2, 4)]
  rows, per_row = [], [[0], [1, 2], [], [3]]
  for images in per_row:
    ids = rng.integers(0, 240, 3).tolist()
    for k in images:
      ids += [252] + [IMAGE] * models.grid_tokens(grids[k], 2) + [253] + rng.integers(
          0, 240, 2).tolist()
    rows.append(ids)
  seq = max(map(len, rows))
  ids = np.zeros((len(rows), seq), np.int32)
  seg = np.zeros_like(ids)
  pos = np.zeros(ids.shape + (3,), np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)], seg[i, :len(row)] = row, 1
    pos[i, :len(row)] = models.mrope_positions(np.array(row), [grids[k] for k in per_row[i]],
                                               image_token_id=IMAGE, spatial_merge_size=2)[0]
  pixels = [rng.normal(size=(int(np.prod(g)), config.vision.patch_dim)).astype(np.float32)
            for g in grids]
  patches = jax.tree.map(jnp.asarray, models.image_patches(pixels, grids, config.vision))
  grad_fn = nnx.jit(nnx.value_and_grad(_loss, has_aux=True))
  (loss1, logits1), grads1 = grad_fn(single, jnp.asarray(ids), jnp.asarray(pos),
                                     jnp.asarray(seg), patches)
  batch = NamedSharding(mesh, parallel.logical_to_spec(("batch", "seq"),
                                                       mesh_shape=dict(mesh.shape)))
  with jax.set_mesh(mesh):
    (loss8, logits8), grads8 = grad_fn(
        sharded, jax.device_put(ids, batch), jax.device_put(pos, batch),
        jax.device_put(seg, batch), patches)
  np.testing.assert_allclose(np.asarray(loss8), np.asarray(loss1), rtol=1e-5)
  valid = seg != 0
  np.testing.assert_allclose(np.asarray(logits8)[valid], np.asarray(logits1)[valid], atol=1e-5)
  for (path, a), (_, b) in zip(nnx.to_flat_state(grads8), nnx.to_flat_state(grads1)):
    np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=2e-6,
                               err_msg="/".join(map(str, path)))
