"""Meshes from config, logical axis rules, parameters created sharded, and sharded forward +
gradients equal to one device on 8 XLA host devices with a (data 2, fsdp 2, tensor 1,
expert 2) mesh."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from orchard_jax import models, parallel
from tests.models.conftest import padded_batch, tiny_config

MESH = {"data": 2, "fsdp": 2, "tensor": 1, "expert": 2}


def test_mesh_shape_from_config():
  assert parallel.mesh_shape({"data": -1, "tensor": 2}, 8) == {
      "data": 4, "fsdp": 1, "tensor": 2, "expert": 1}
  with pytest.raises(parallel.MeshError, match="unknown"):
    parallel.mesh_shape({"model": 2}, 8)
  with pytest.raises(parallel.MeshError, match="has 6 devices; 8 are available"):
    parallel.mesh_shape({"data": 3, "fsdp": 2}, 8)
  with pytest.raises(parallel.MeshError, match="at most one"):
    parallel.mesh_shape({"data": -1, "fsdp": -1}, 8)
  mesh = parallel.make_mesh(MESH)
  assert mesh.axis_names == parallel.MESH_AXES and dict(mesh.shape) == MESH


def test_logical_to_spec_uses_each_mesh_axis_once_and_only_when_it_divides():
  shape = {"data": 2, "fsdp": 2, "tensor": 4, "expert": 2}
  spec = parallel.logical_to_spec(("experts", "embed", "expert_mlp"), mesh_shape=shape,
                                  shape=(8, 64, 128))
  assert spec == PartitionSpec("expert", "fsdp", "tensor")
  # 2 kv heads cannot split 4 ways: replicated on that dimension
  assert parallel.logical_to_spec(("embed", "kv_heads", "head_dim"), mesh_shape=shape,
                                  shape=(64, 2, 16)) == PartitionSpec("fsdp", None, None)
  assert parallel.logical_to_spec(("batch", "seq"), mesh_shape=shape, shape=(8, 5)) == (
      PartitionSpec(("data", "fsdp", "expert"), None))
  # mesh axes missing from a (trainer's data-only) mesh are dropped
  assert parallel.logical_to_spec(("batch", "embed"), mesh_shape={"data": 8},
                                  shape=(8, 64)) == PartitionSpec("data", None)
  custom = (("embed", "tensor"),)
  assert parallel.logical_to_spec(("embed",), rules=custom, mesh_shape=shape, shape=(64,)) == (
      PartitionSpec("tensor"))


def _loss(model, ids, pos, seg):
  logits, aux = model(ids, pos, seg)
  logp = jax.nn.log_softmax(logits)
  target = jnp.roll(ids, -1, axis=1)
  nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * (seg != 0)) / jnp.sum(seg != 0) + 0.01 * aux["load_balancing_loss"], logits


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_sharded_forward_and_gradients_equal_single_device(arch):
  # chunk 8 < seq 24: the DeltaNet chunk scan runs several steps under SPMD too
  config = tiny_config(arch, moe_expert_loop="einsum", gdn_chunk_size=8)
  mesh = parallel.make_mesh(MESH)
  sharded = parallel.create_sharded(lambda: models.CausalLM(config, rngs=nnx.Rngs(0)), mesh)
  parallel.check_sharded(sharded, mesh, min_size=2048)
  w = sharded.model.layers[0].mlp.w_gate[...]
  assert w.sharding.spec == PartitionSpec("expert", "fsdp", None)
  # The same parameters on one device.
  graphdef, state = nnx.split(sharded)
  single = nnx.merge(graphdef, jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]),
                                            state))

  ids, pos, seg = padded_batch(0, (24, 17, 24, 9, 24, 20, 13, 24), 24)
  grad_fn = nnx.jit(nnx.value_and_grad(_loss, has_aux=True))
  (loss1, logits1), grads1 = grad_fn(single, jnp.asarray(ids), jnp.asarray(pos),
                                     jnp.asarray(seg))
  batch = NamedSharding(mesh, parallel.logical_to_spec(("batch", "seq"),
                                                       mesh_shape=dict(mesh.shape)))
  with jax.set_mesh(mesh):
    (loss8, logits8), grads8 = grad_fn(sharded, *(jax.device_put(x, batch)
                                                  for x in (ids, pos, seg)))
  assert len(logits8.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(loss8), np.asarray(loss1), rtol=1e-5)
  valid = seg != 0
  np.testing.assert_allclose(np.asarray(logits8)[valid], np.asarray(logits1)[valid], atol=1e-5)
  for (path, a), (_, b) in zip(nnx.to_flat_state(grads8), nnx.to_flat_state(grads1)):
    np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=2e-6,
                               err_msg="/".join(map(str, path)))


def test_check_sharded_fails_on_a_replicated_large_parameter():
  config = tiny_config("qwen3", vocab_size=512)
  mesh = parallel.make_mesh(MESH)
  model = nnx.eval_shape(lambda: models.CausalLM(config, rngs=nnx.Rngs(0)))
  state = nnx.state(model, nnx.Param)
  shardings = parallel.state_shardings(state, mesh)
  # Place zeros with the rule-derived shardings, except the embedding, left replicated.
  def place(var, sharding):
    target = sharding.get_raw_value() if isinstance(sharding, nnx.Variable) else sharding
    return var.replace(jax.device_put(jnp.zeros(var.shape, var.dtype), target))
  values = jax.tree.map(place, state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
  parallel.check_sharded(values, mesh, min_size=4096)
  flat = dict(nnx.to_flat_state(values))
  flat[("model", "embed_tokens")].set_value(
      jax.device_put(jnp.zeros((512, 64)), NamedSharding(mesh, PartitionSpec())))
  with pytest.raises(parallel.ShardingError, match=r"model/embed_tokens \(512, 64\)"):
    parallel.check_sharded(values, mesh, min_size=4096)
