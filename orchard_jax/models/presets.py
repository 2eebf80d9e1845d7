"""Named model sizes: CPU test/benchmark sizes and the published Qwen checkpoints.

`tiny`, `small` and `tiny_qwen3_5` follow the rows of docs/peers.md that transformers'
baseline was measured on; the real sizes follow the published config.json files (Qwen/Qwen3-
30B-A3B, Qwen/Qwen3.5-35B-A3B text model, Qwen/Qwen3-4B, Qwen/Qwen3-VL-4B-Instruct,
Qwen/Qwen3-VL-30B-A3B-Instruct). Real sizes are never instantiated in tests; their parameter
counts are checked with jax.eval_shape (models.count_params).

Vision-language presets (ModelConfig.vision): `tiny_vl` is a dense Qwen3-VL small enough to
serve a GUI agent's screenshots on 2 CPU cores (the published patch 16 and 2x2 merge, so the
same image processor settings apply; a 1280x1000 screenshot is 4,960 patches, 1,240 tokens),
with the tiny tokenizer's vocabulary plus Qwen3-VL's five vision tokens
(data.tokenizer "tiny_vl": ids 8192..8196, in Qwen's order); `small_vl` is its MoE sibling
at the `small` text sizes.
"""
import dataclasses

from orchard_jax.models.config import ModelConfig, VisionConfig
from orchard_jax.models.errors import ModelConfigError


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

# Tiny vocabulary (8192) + <|vision_start|>, <|vision_end|>, <|vision_pad|>, <|image_pad|>,
# <|video_pad|>, padded to a multiple of 64.
_TINY_VL_VOCAB = 8256
_TINY_VISION = VisionConfig(
    depth=4, hidden_size=128, intermediate_size=256, num_heads=2, patch_size=16,
    temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=256,
    num_position_embeddings=2304, deepstack_visual_indexes=(1, 2, 3),
    image_token_id=8195, video_token_id=8196, vision_start_token_id=8192,
    vision_end_token_id=8193)

_TINY_VL = dataclasses.replace(
    _TINY_DENSE, vocab_size=_TINY_VL_VOCAB, vision=_TINY_VISION, mrope_section=(12, 10, 10),
    rope_theta=5_000_000.0)

_SMALL_VL = dataclasses.replace(
    _SMALL, vocab_size=_TINY_VL_VOCAB, mrope_section=(12, 10, 10), rope_theta=5_000_000.0,
    vision=dataclasses.replace(_TINY_VISION, hidden_size=256, intermediate_size=512,
                               num_heads=4, out_hidden_size=512))

# Qwen/Qwen3-VL-4B-Instruct config.json: the Qwen3-4B text model (tied embeddings, RoPE base
# 5e6, interleaved M-RoPE [24, 20, 20]) and a 24-block vision encoder; 4.44B parameters.
_QWEN3_VL_4B = dataclasses.replace(
    _QWEN3_4B, rope_theta=5_000_000.0, max_position_embeddings=262144,
    mrope_section=(24, 20, 20),
    vision=VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                        out_hidden_size=2560, num_position_embeddings=2304,
                        deepstack_visual_indexes=(5, 11, 17)))

# Qwen/Qwen3-VL-30B-A3B-Instruct: the Qwen3-30B-A3B text model and a 27-block vision encoder;
# 31.1B parameters.
_QWEN3_VL_30B_A3B = dataclasses.replace(
    _QWEN3_30B_A3B, rope_theta=5_000_000.0, max_position_embeddings=262144,
    mrope_section=(24, 20, 20),
    vision=VisionConfig(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                        out_hidden_size=2048, num_position_embeddings=2304,
                        deepstack_visual_indexes=(8, 16, 24)))

PRESETS: dict[str, ModelConfig] = {
    "tiny": _TINY,
    "small": _SMALL,
    "tiny_qwen3_5": _TINY_QWEN3_5,
    "small_qwen3_5": _SMALL_QWEN3_5,
    "tiny_dense": _TINY_DENSE,
    "qwen3_30b_a3b": _QWEN3_30B_A3B,
    "qwen3_5_35b_a3b": _QWEN3_5_35B_A3B,
    "qwen3_4b": _QWEN3_4B,
    "tiny_vl": _TINY_VL,
    "small_vl": _SMALL_VL,
    "qwen3_vl_4b": _QWEN3_VL_4B,
    "qwen3_vl_30b_a3b": _QWEN3_VL_30B_A3B,
}


def get_preset(name: str) -> ModelConfig:
  """The ModelConfig called `name` (one of PRESETS).

  Raises:
    ModelConfigError: no preset has that name.
  """
  if name not in PRESETS:
    raise ModelConfigError(f"unknown model preset {name!r}; expected one of {sorted(PRESETS)}")
  return PRESETS[name]
