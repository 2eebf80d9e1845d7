"""Shared pieces of the model tests: very small configs of each architecture, batches with
padding and packed segments, and a jitted forward."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models

# Small enough to compile in seconds, with every feature of the architecture present
# (GQA, several experts, a dense layer in qwen3_moe, DeltaNet + attention in qwen3_5_moe).
_SHRINK = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
               num_experts_per_tok=2)


def tiny_config(arch: str, **overrides) -> models.ModelConfig:
  """A 2-layer config of `arch` ("qwen3_moe", "qwen3_5_moe", "qwen3"): qwen3_moe has one MoE
  and one dense layer, qwen3_5_moe one Gated DeltaNet and one gated attention layer."""
  if arch == "qwen3_moe":
    base = dataclasses.replace(models.get_preset("tiny"), **_SHRINK, num_hidden_layers=2,
                               mlp_only_layers=(1,))
  elif arch == "qwen3_5_moe":
    base = dataclasses.replace(models.get_preset("tiny_qwen3_5"), **_SHRINK, num_hidden_layers=2,
                               layer_types=("linear_attention", "full_attention"),
                               shared_expert_intermediate_size=48, linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_key_head_dim=16,
                               linear_value_head_dim=16)
  else:
    base = dataclasses.replace(models.get_preset("tiny_dense"), num_hidden_layers=2, **{
        k: v for k, v in _SHRINK.items() if not k.startswith(("moe", "num_experts"))})
  return dataclasses.replace(base, **overrides)


def tiny_vl_config(arch: str = "qwen3", **overrides) -> models.ModelConfig:
  """A 3-layer Qwen3-VL config on a dense ("qwen3") or MoE ("qwen3_moe") backbone: a 3-block
  vision encoder with a 4 x 4 learned position table (so every image grid resamples it) and
  DeepStack from blocks 0 and 2 into decoder layers 0 and 1. Vocabulary 256 with the vision
  tokens at 250..253; head_dim 32 so interleaved M-RoPE (4, 6, 6) splits 16 frequencies."""
  vision = models.VisionConfig(
      depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
      num_position_embeddings=16, deepstack_visual_indexes=(0, 2), image_token_id=250,
      video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)
  moe = arch == "qwen3_moe"
  base = models.get_preset("tiny" if moe else "tiny_dense")
  config = dataclasses.replace(
      base, vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, head_dim=32, intermediate_size=96, rope_theta=10000.0,
      moe_intermediate_size=24 if moe else 0, num_experts=4 if moe else 0,
      num_experts_per_tok=2 if moe else 0, mrope_section=(4, 6, 6), vision=vision)
  return dataclasses.replace(config, **overrides)


def padded_batch(seed: int, lengths, seq: int, vocab: int = 256, left: bool = False):
  """[batch, seq] ids / positions / segment ids, one sequence per row of the given lengths,
  right-padded (or left-padded)."""
  rng = np.random.default_rng(seed)
  b = len(lengths)
  ids = rng.integers(0, vocab, (b, seq)).astype(np.int32)
  seg = np.zeros((b, seq), np.int32)
  pos = np.zeros((b, seq), np.int32)
  for i, n in enumerate(lengths):
    cols = slice(seq - n, seq) if left else slice(0, n)
    seg[i, cols] = 1
    pos[i, cols] = np.arange(n)
  return ids, pos, seg


def forward(model, ids, pos, seg):
  """Jitted model call returning numpy logits and aux."""
  logits, aux = _jit_forward(model, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg))
  return np.asarray(logits), jax.tree.map(np.asarray, aux)


@nnx.jit
def _jit_forward(model, ids, pos, seg):
  return model(ids, pos, seg)


def with_config(model, config: models.ModelConfig):
  """The same parameters under another config (computation fields only)."""
  other = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
  nnx.update(other, nnx.state(model, nnx.Param))
  return other


def random_model(config: models.ModelConfig, seed: int = 0, cls=models.CausalLM):
  """A model of `config` with NumPy-random parameters (skips compiling the threefry init,
  which dominates test time on 2 cores). Norm scales near their neutral value, A_log in
  log(1..8), everything else N(0, 0.05)."""
  model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  for path, var in nnx.to_flat_state(state):
    names = [str(p) for p in path]
    shape = var.shape
    noise = rng.normal(size=shape)
    if names[-1] in ("weight", "norm") and len(shape) == 1:   # RMSNorm / LayerNorm scales
      zero_centered = config.zero_centered_norm and names[-1] == "weight"
      value = 0.1 * noise + (0.0 if zero_centered else 1.0)
    elif names[-1] == "A_log":
      value = np.log(rng.uniform(1.0, 8.0, size=shape))
    elif names[-1] == "dt_bias":
      value = 1.0 + 0.1 * noise
    elif names[-1].startswith("conv_"):
      value = 0.5 * noise
    else:
      value = 0.05 * noise
    var.set_value(jnp.asarray(value, var.dtype))
  nnx.update(model, state)
  return model


@pytest.fixture(scope="session")
def tiny_models():
  """One random CausalLM per architecture (session-wide; never mutated)."""
  return {arch: random_model(tiny_config(arch), seed=7)
          for arch in ("qwen3_moe", "qwen3_5_moe", "qwen3")}
