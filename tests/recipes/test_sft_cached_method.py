"""fit_sft with sft.method "cached_last_layer": trains, checkpoints where the RL job and
policy.init read it, a rerun over the finished folder returns at once with those params, and
one asked for a wider margin trains on from there."""
import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from orchard_jax import data, models, train
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import policy
from orchard_jax.recipes.agentic import sft as sft_lib
from tests.train.conftest import mesh_of, small_config

CFG = small_config(num_hidden_layers=2, attention_block_size=8, num_experts=0)


def _sft_config(**changes):
  c = dict(epochs=300, lr=3e-2, end_lr=3e-3, warmup_steps=2, weight_decay=0.0,
           max_grad_norm=1.0, chunk_size=8, save_every=200, method="cached_last_layer",
           min_target_prob=0.8)
  return ml_collections.ConfigDict({**c, **changes})


def _sequence(seed=0, n=24):
  ids = np.random.default_rng(seed).integers(0, 512, n).astype(np.int32)
  weights = np.zeros(n, np.float32)
  weights[n // 2:] = 1.0
  return data.TrainingSequence(input_ids=ids, loss_weights=weights,
                               old_logprobs=np.zeros(n, np.float32),
                               action_ids=np.where(weights > 0, 0, -1).astype(np.int32))


def _params(model):
  return jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_cached_method_trains_checkpoints_and_resumes(tmp_path):
  sequences = [_sequence(0), _sequence(1)]
  model = models.CausalLM(CFG, rngs=nnx.Rngs(0))
  trained, metrics = sft_lib.fit_sft(model, sequences, _sft_config(), mesh=mesh_of(1),
                                     workdir=str(tmp_path), progress=False)
  assert metrics["min_target_prob"] >= 0.8 and metrics["stopped_at"] == metrics["steps"] < 300
  # policy.init reads the checkpoint into a fresh model: the same parameters.
  fresh = models.CausalLM(CFG, rngs=nnx.Rngs(7))
  policy.load_params(fresh, str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, _params(trained), _params(fresh))
  again, out = sft_lib.fit_sft(models.CausalLM(CFG, rngs=nnx.Rngs(0)), sequences, _sft_config(),
                               mesh=mesh_of(1), workdir=str(tmp_path), progress=False)
  assert out["steps"] == metrics["steps"] and out["stopped_at"] == metrics["stopped_at"]
  jax.tree.map(np.testing.assert_array_equal, _params(trained), _params(again))
  # Asked for a wider margin, it trains on from the checkpoint (params and Adam state).
  margin = (1.0 + metrics["min_target_prob"]) / 2
  _, wider = sft_lib.fit_sft(models.CausalLM(CFG, rngs=nnx.Rngs(0)), sequences,
                             _sft_config(min_target_prob=margin), mesh=mesh_of(1),
                             workdir=str(tmp_path), progress=False)
  assert wider["steps"] > metrics["steps"] and wider["min_target_prob"] >= margin


def test_unknown_method_is_refused(tmp_path):
  model = models.CausalLM(CFG, rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match="sft.method is 'readout'"):
    sft_lib.fit_sft(model, [_sequence()], _sft_config(method="readout"), mesh=mesh_of(1),
                    workdir=str(tmp_path), progress=False)
