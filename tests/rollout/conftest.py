"""Shared fixtures of the rollout tests: the tiny tokenizer, a small policy, a running engine.

The small policy is the tiny Qwen3-MoE preset cut to 2 layers, hidden 64 and 4 experts (same
vocabulary as the tiny tokenizer), so the engine's programs compile in seconds. The engine uses
one bucket per dimension, so the whole suite compiles each program once.
"""
import dataclasses
import os
import sys

import pytest
from flax import nnx

from orchard_jax.data import tiny_tokenizer
from orchard_jax.models import CausalLM, get_preset
from orchard_jax.rollout import Engine, EngineConfig

sys.path.insert(0, os.path.dirname(__file__))  # test helpers (agent_fixture) import by name

SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
             num_experts_per_tok=2)
ENGINE_CONFIG = EngineConfig(max_batch_size=4, batch_buckets=(4,), max_seq_len=1024,
                             cache_len_buckets=(1024,), prefill_chunk_buckets=(128,),
                             decode_steps=8, seed=0)


@pytest.fixture(scope="session")
def tokenizer():
  return tiny_tokenizer()


@pytest.fixture(scope="session")
def small_config():
  return dataclasses.replace(get_preset("tiny"), **SMALL)


@pytest.fixture(scope="session")
def small_model(small_config):
  return CausalLM(small_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def engine(small_model, tokenizer):
  with Engine(small_model, tokenizer, config=ENGINE_CONFIG, model_path="small-test") as running:
    yield running


@pytest.fixture(scope="session")
def agent_params(small_config, tokenizer):
  """Parameters of the small policy trained to act as the bash agent (agent_fixture.py)."""
  from agent_fixture import train_agent

  model = CausalLM(small_config, rngs=nnx.Rngs(0))
  loss = train_agent(model, tokenizer, steps=300, learning_rate=1e-2, stop_loss=0.02)
  assert loss < 0.05, f"the agent fixture did not learn its conversation (loss {loss:.3f})"
  return nnx.state(model, nnx.Param)


@pytest.fixture
def agent_engine(engine, agent_params, small_model):
  """The shared engine serving the trained agent weights for one test (restored after)."""
  original = nnx.state(small_model, nnx.Param)
  version = engine.weight_version
  engine.update_params(agent_params, weight_version="agent")
  try:
    yield engine
  finally:
    engine.update_params(original, weight_version=version)
