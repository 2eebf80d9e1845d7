"""Named model sizes: CPU test/benchmark sizes and the published Qwen checkpoints.

`tiny`, `small` and `tiny_qwen3_5` follow the rows of docs/peers.md that transformers'
baseline was measured on; the real sizes follow the published config.json files (Qwen/Qwen3-
30B-A3B, Qwen/Qwen3.5-35B-A3B text model, Qwen/Qwen3-4B). Real sizes are never instantiated
in tests; their parameter counts are checked with jax.eval_shape (models.count_params).
"""
import dataclasses

from orchard_jax.models.config import ModelConfig
from orchard_jax.models.errors import ConfigError


def _hybrid_layers(num_layers: int, full_attention_interval: int = 4) -> tuple[str, ...]:
  """Qwen3.5's pattern: every `interval`-th layer is full attention, the rest Gated DeltaNet."""
  return tuple("full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
               for i in range(num_layers))


_TINY = ModelConfig(
    architecture="qwen3_moe", vocab_size=8192, hidden_size=256, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
    moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
    rope_theta=1_000_000.0, max_position_embeddings=4096)

_SMALL = dataclasses.replace(
    _TINY, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
    intermediate_size=1024, moe_intermediate_size=512, num_experts=16, num_experts_per_tok=4)

_TINY_QWEN3_5 = dataclasses.replace(
    _TINY, architecture="qwen3_5_moe", layer_types=_hybrid_layers(4),
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
    linear_value_head_dim=64, linear_conv_kernel_dim=4, shared_expert_intermediate_size=256,
    partial_rotary_factor=0.25, rope_theta=10_000_000.0)

_SMALL_QWEN3_5 = dataclasses.replace(
    _SMALL, architecture="qwen3_5_moe", layer_types=_hybrid_layers(8),
    linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64,
    linear_value_head_dim=64, linear_conv_kernel_dim=4, shared_expert_intermediate_size=512,
    partial_rotary_factor=0.25, rope_theta=10_000_000.0)

_TINY_DENSE = dataclasses.replace(
    _TINY, architecture="qwen3", num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
    intermediate_size=768)

# Qwen/Qwen3-30B-A3B config.json: 30.5B parameters, 3.3B activated.
_QWEN3_30B_A3B = ModelConfig(
    architecture="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
    moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=40960, dtype="bfloat16", param_dtype="bfloat16")

# Qwen/Qwen3.5-35B-A3B text model: 40 layers = 30 Gated DeltaNet + 10 gated attention.
_QWEN3_5_35B_A3B = ModelConfig(
    architecture="qwen3_5_moe", vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, intermediate_size=6144,
    moe_intermediate_size=512, num_experts=256, num_experts_per_tok=8, norm_topk_prob=True,
    shared_expert_intermediate_size=512, layer_types=_hybrid_layers(40),
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, rope_theta=10_000_000.0,
    partial_rotary_factor=0.25, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=262144, dtype="bfloat16", param_dtype="bfloat16")

# Qwen/Qwen3-4B: dense, tied embeddings; Orchard's value model size.
_QWEN3_4B = ModelConfig(
    architecture="qwen3", vocab_size=151936, hidden_size=2560, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=9728,
    moe_intermediate_size=0, num_experts=0, num_experts_per_tok=0, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960,
    dtype="bfloat16", param_dtype="bfloat16")

PRESETS: dict[str, ModelConfig] = {
    "tiny": _TINY,
    "small": _SMALL,
    "tiny_qwen3_5": _TINY_QWEN3_5,
    "small_qwen3_5": _SMALL_QWEN3_5,
    "tiny_dense": _TINY_DENSE,
    "qwen3_30b_a3b": _QWEN3_30B_A3B,
    "qwen3_5_35b_a3b": _QWEN3_5_35B_A3B,
    "qwen3_4b": _QWEN3_4B,
}


def get_preset(name: str) -> ModelConfig:
  """The ModelConfig called `name` (one of PRESETS).

  Raises:
    ConfigError: no preset has that name.
  """
  if name not in PRESETS:
    raise ConfigError(f"unknown model preset {name!r}; expected one of {sorted(PRESETS)}")
  return PRESETS[name]
