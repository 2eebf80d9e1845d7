"""Trainer.fit(stop_loss=...): early stopping on the training loss, kept across a resume."""
import jax
import numpy as np
from flax import nnx

from orchard_jax import models, train
from tests.train.conftest import mesh_of, packed_batch, small_config


def _trainer(workdir):
  opt = train.OptimizerConfig(learning_rate=1e-2, warmup_steps=0, schedule="constant")
  config = train.TrainerConfig(workdir=str(workdir), total_steps=50, optimizer=opt,
                               async_checkpoints=False, tensorboard=False, progress=False)
  return train.Trainer(models.CausalLM(small_config(), rngs=nnx.Rngs(0)),
                       train.SFTLoss(chunk_size=8), config, mesh=mesh_of(1))


def test_fit_stops_below_stop_loss_and_a_resume_trains_no_further(tmp_path):
  batch = packed_batch(5, rows=2)
  with _trainer(tmp_path) as trainer:
    first = trainer.train_step(batch)["loss"]
    # stop below a threshold the second step's loss meets (the loss falls on a fixed batch)
    last = trainer.fit(lambda step: batch, stop_loss=first)
    assert last["loss"] < first and last["stopped_at"] == trainer.step
    stopped_at = trainer.step
    assert stopped_at < 50
    params = jax.device_get(trainer.params)
  with _trainer(tmp_path) as again:
    assert again.restored_step == stopped_at and again.meta["stopped_at"] == stopped_at
    out = again.fit(lambda step: batch, stop_loss=first)
    assert again.step == stopped_at and out["stopped_at"] == stopped_at
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params,
                 jax.device_get(again.params))
