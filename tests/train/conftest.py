"""Shared pieces of the trainer tests: a small real CausalLM and packed batches."""
import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from orchard_jax import models

# The tiny preset's architecture (qwen3_moe, norm_topk_prob) shrunk so a step compiles fast.
SMALL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, intermediate_size=128, moe_intermediate_size=64,
             num_experts=4, num_experts_per_tok=2)


def small_config(**overrides) -> models.ModelConfig:
  return dataclasses.replace(models.get_preset("tiny"), **{**SMALL, **overrides})


def packed_batch(seed: int, rows: int = 8, seq: int = 32, vocab: int = 512,
                 extra: bool = False) -> dict:
  """Random packed rows: two segments per row (the second shorter), then padding; weight 0 on
  each segment's first token; a learnable pattern (odd tokens follow their left neighbour)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (rows, seq)).astype(np.int32)
  ids[:, 1::2] = (ids[:, 0::2] + 1) % vocab
  seg = np.zeros((rows, seq), np.int32)
  pos = np.zeros((rows, seq), np.int32)
  cut, end = seq // 2, seq - seq // 8
  seg[:, :cut], seg[:, cut:end] = 1, 2
  pos[:, :cut], pos[:, cut:end] = np.arange(cut), np.arange(end - cut)
  weights = (seg > 0).astype(np.float32)
  weights[:, 0] = weights[:, cut] = 0.0
  batch = dict(input_ids=ids, positions=pos, segment_ids=seg, loss_weights=weights)
  if extra:
    batch["old_logprobs"] = np.where(weights > 0, rng.normal(-6.0, 0.3, (rows, seq)),
                                     0).astype(np.float32)
    batch["advantages"] = np.repeat(rng.normal(size=(rows, 1)), seq, 1).astype(np.float32)
  return batch


def mesh_of(n: int, axis: str = "data") -> Mesh:
  return Mesh(np.asarray(jax.devices()[:n]), (axis,))


@pytest.fixture(scope="session")
def small_cfg():
  return small_config()
