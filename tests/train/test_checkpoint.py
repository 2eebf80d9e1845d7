"""Checkpoints: keep-last-K, a restore onto 4 and 1 devices of what 8 devices wrote, a clear
mismatch error, and a run killed inside a save resuming from the previous checkpoint with
exactly the losses of an uninterrupted run."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from orchard_jax import models, train
from tests.train.conftest import mesh_of, small_config

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_save_every_keep_last_and_forced_final(tmp_path):
  state = {"w": jnp.arange(6.0), "step": jnp.array(0)}
  with train.Checkpointer(str(tmp_path), save_every=2, keep=2) as checkpoints:
    started = [checkpoints.save(step, jax.tree.map(lambda x: x + step, state),
                                meta={"position": step}) for step in range(1, 8)]
    assert started == [False, True, False, True, False, True, False]
    assert checkpoints.save(7, state, force=True)
  with train.Checkpointer(str(tmp_path)) as checkpoints:
    assert checkpoints.all_steps() == [6, 7]
    restored, meta = checkpoints.restore(train.abstract_like(state), step=6)
  np.testing.assert_array_equal(restored["w"], np.arange(6.0) + 6)
  assert meta == {"position": 6}


def _trainer(workdir, cfg, mesh):
  model = models.CausalLM(cfg, rngs=nnx.Rngs(1))
  config = train.TrainerConfig(workdir=str(workdir), total_steps=1, progress=False,
                               tensorboard=False)
  return train.Trainer(model, train.SFTLoss(), config, mesh=mesh)


def test_restore_written_on_8_devices_onto_4_and_1(tmp_path):
  cfg = small_config()
  mesh8 = mesh_of(8, "fsdp")
  with _trainer(tmp_path, cfg, mesh8) as trainer:
    # FSDP: the "embed" dimension of every matrix is split over the 8 devices
    embed = trainer.state["params"]["model"]["embed_tokens"]
    assert embed.sharding.spec == PartitionSpec(None, "fsdp")
    assert len(embed.addressable_shards) == 8 and embed.addressable_shards[0].data.shape == (
        cfg.vocab_size, cfg.hidden_size // 8)
    trainer.state["params"] = jax.tree.map(lambda x: x + 0.5, trainer.state["params"])
    saved = jax.device_get(trainer.state)
    trainer.save()
  for devices in (4, 1):
    mesh = mesh_of(devices, "fsdp")
    with _trainer(tmp_path, cfg, mesh) as trainer:
      assert trainer.restored_step == 0
      restored = trainer.state
      leaf = restored["params"]["model"]["embed_tokens"]
      assert set(leaf.sharding.device_set) == set(mesh.devices.flat)
      assert len(leaf.addressable_shards) == devices
      jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), saved)


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path):
  with _trainer(tmp_path, small_config(), mesh_of(1)) as trainer:
    trainer.save()
  with pytest.raises(train.CheckpointMismatch, match="has shape .* in the checkpoint"):
    _trainer(tmp_path, small_config(hidden_size=96), mesh_of(1))


def _run_worker(workdir, cache_dir, *extra):
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8", PYTHONPATH=ROOT)
  result = subprocess.run([sys.executable, WORKER, str(workdir), *extra], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  return result, lines


@pytest.mark.slow
def test_killed_save_resumes_from_previous_checkpoint_with_identical_losses(tmp_path):
  cache = tmp_path / "jax_cache"
  straight, straight_lines = _run_worker(tmp_path / "straight", cache)
  assert straight.returncode == 0, straight.stderr[-3000:]
  expected = {r["step"]: r["loss"] for r in straight_lines if "step" in r}
  assert sorted(expected) == [1, 2, 3, 4, 5, 6]

  killed, killed_lines = _run_worker(tmp_path / "run", cache, "--kill-at-commit", "4")
  assert killed.returncode == -9, killed.stderr[-3000:]   # SIGKILL, inside the commit of step 4
  checkpoints_dir = tmp_path / "run" / "checkpoints"
  leftovers = [p for p in os.listdir(checkpoints_dir) if "tmp" in p]
  assert leftovers, os.listdir(checkpoints_dir)   # step 4 was fully written, never published
  with train.Checkpointer(str(checkpoints_dir)) as checkpoints:
    assert checkpoints.latest_step() == 2
  for record in killed_lines[1:]:
    assert record["loss"] == expected[record["step"]]

  resumed, resumed_lines = _run_worker(tmp_path / "run", cache)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert resumed_lines[0] == {"start": 2}
  got = {r["step"]: r["loss"] for r in resumed_lines[1:]}
  assert got == {step: expected[step] for step in (3, 4, 5, 6)}   # bit-identical
  assert not [p for p in os.listdir(checkpoints_dir) if "tmp" in p]
  assert train.read_metrics(str(tmp_path / "run"))[-1]["step"] == 6
