"""ModelConfig, presets and parameter counts (published totals of the real checkpoints)."""
import dataclasses

import ml_collections
import pytest

from orchard_jax import models
from orchard_jax.models.params import count_params


def test_tiny_presets_follow_the_peer_baseline_rows():
  tiny = models.get_preset("tiny")
  assert (tiny.architecture, tiny.vocab_size, tiny.hidden_size, tiny.num_hidden_layers) == (
      "qwen3_moe", 8192, 256, 4)
  assert (tiny.num_attention_heads, tiny.num_key_value_heads, tiny.head_dim) == (4, 2, 64)
  assert (tiny.moe_intermediate_size, tiny.num_experts, tiny.num_experts_per_tok) == (256, 8, 2)
  assert tiny.norm_topk_prob
  small = models.get_preset("small")
  assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads,
          small.num_key_value_heads, small.moe_intermediate_size, small.num_experts,
          small.num_experts_per_tok, small.vocab_size) == (512, 8, 8, 4, 512, 16, 4, 8192)
  hybrid = models.get_preset("tiny_qwen3_5")
  assert hybrid.layer_types == ("linear_attention",) * 3 + ("full_attention",)
  assert (hybrid.linear_num_key_heads, hybrid.linear_num_value_heads,
          hybrid.linear_key_head_dim, hybrid.linear_value_head_dim,
          hybrid.linear_conv_kernel_dim, hybrid.shared_expert_intermediate_size) == (
              4, 8, 64, 64, 4, 256)
  assert models.get_preset("tiny_dense").num_experts == 0
  assert models.get_preset("small_qwen3_5").layer_types.count("full_attention") == 2


@pytest.mark.parametrize("name, total, active, rel", [
    ("qwen3_30b_a3b", 30.5e9, 3.3e9, 0.02),      # Qwen3-30B-A3B model card
    ("qwen3_5_35b_a3b", 35e9, 3.0e9, 0.16),      # text model; the card's 35B adds the vision tower
    ("qwen3_4b", 4.0e9, 4.0e9, 0.02),            # Qwen3-4B (dense, tied embeddings)
])
def test_real_presets_have_the_published_parameter_counts(name, total, active, rel):
  count = count_params(models.get_preset(name))
  assert count.total == pytest.approx(total, rel=0.02)
  assert count.active == pytest.approx(active, rel=rel)


def test_parameter_count_by_hand_for_the_tiny_preset():
  c = models.get_preset("tiny")
  d, h, kv, hd, f, e = 256, 4, 2, 64, 256, 8
  attention = d * h * hd * 2 + d * kv * hd * 2 + 2 * hd
  moe = d * e + 3 * e * d * f
  per_layer = attention + moe + 2 * d
  expected = 4 * per_layer + 2 * 8192 * d + d
  count = count_params(c)
  assert count.total == expected
  assert count.active == expected - 4 * (e - 2) * 3 * d * f


def test_dict_round_trip_and_ml_collections():
  config = dataclasses.replace(models.get_preset("tiny_qwen3_5"), moe_capacity_factor=None)
  assert models.ModelConfig.from_dict(config.to_dict()) == config
  cd = ml_collections.ConfigDict(config.to_dict())
  assert models.ModelConfig.from_dict(cd) == config
  assert models.ModelConfig.from_dict({"preset": "small", "num_hidden_layers": 2}) == (
      dataclasses.replace(models.get_preset("small"), num_hidden_layers=2))
  hash(config)   # usable as a static jit argument


def test_bad_configs_name_what_was_expected():
  with pytest.raises(models.ModelConfigError, match="unknown fields \\['hiden_size'\\]"):
    models.ModelConfig.from_dict({"hiden_size": 3})
  with pytest.raises(models.ModelConfigError, match="num_attention_heads divisible"):
    dataclasses.replace(models.get_preset("tiny"), num_key_value_heads=3)
  with pytest.raises(models.ModelConfigError, match="4 layer_types"):
    dataclasses.replace(models.get_preset("tiny_qwen3_5"), layer_types=("full_attention",))
  with pytest.raises(models.ModelConfigError, match="moe_dispatch"):
    dataclasses.replace(models.get_preset("tiny"), moe_dispatch="magic")
  with pytest.raises(models.ModelConfigError, match="unknown model preset 'huge'"):
    models.get_preset("huge")


@pytest.mark.slow      # jax.eval_shape of a 4B / 31B model with its vision tower: 30-60 s
@pytest.mark.parametrize("name, total, decimals", [
    ("qwen3_vl_4b", 4.44e9, 2),          # Qwen3-VL-4B-Instruct model card: 4.44B params
    ("qwen3_vl_30b_a3b", 31.1e9, 1),     # Qwen3-VL-30B-A3B-Instruct model card: 31.1B params
])
def test_vision_language_presets_have_the_published_parameter_counts(name, total, decimals):
  config = models.get_preset(name)
  count = count_params(config)
  assert round(count.total / 1e9, decimals) == round(total / 1e9, decimals)
  # The text backbone alone is the text release (Qwen3-4B / Qwen3-30B-A3B): the vision tower
  # adds 0.4-0.6B (encoder blocks, merger, DeepStack mergers, patch and position tables).
  assert 0.4e9 < count.vision < 0.6e9
  text = {"qwen3_vl_4b": 4.02e9, "qwen3_vl_30b_a3b": 30.5e9}[name]   # Qwen3-4B, Qwen3-30B-A3B
  assert count.total - count.vision == pytest.approx(text, rel=0.01)


def test_vision_parameter_count_by_hand_for_tiny_vl():
  c = models.get_preset("tiny_vl")
  v = c.vision
  d, f, wide = v.hidden_size, v.intermediate_size, v.hidden_size * 4
  block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
  merger = 2 * d + (wide * wide + wide) + (wide * c.hidden_size + c.hidden_size)
  deepstack = 2 * wide + (wide * wide + wide) + (wide * c.hidden_size + c.hidden_size)
  vision = (v.patch_dim * d + d + v.num_position_embeddings * d + v.depth * block + merger
            + len(v.deepstack_visual_indexes) * deepstack)
  count = count_params(c)
  assert count.vision == vision
  assert count.total == count_params(dataclasses.replace(c, vision=None)).total + vision


def test_vision_config_round_trips_and_validates():
  config = models.get_preset("tiny_vl")
  assert models.ModelConfig.from_dict(config.to_dict()) == config
  assert models.ModelConfig.from_dict(ml_collections.ConfigDict(config.to_dict())) == config
  deeper = models.ModelConfig.from_dict({"preset": "tiny_vl", "vision": {"depth": 6}})
  assert deeper.vision.depth == 6 and deeper.vision.hidden_size == config.vision.hidden_size
  hash(config)
  with pytest.raises(models.ModelConfigError, match="out_hidden_size == hidden_size"):
    dataclasses.replace(config, hidden_size=128)
  with pytest.raises(models.ModelConfigError, match="mrope_section with vision"):
    dataclasses.replace(config, mrope_section=())
  with pytest.raises(models.ModelConfigError, match="qwen3 or qwen3_moe backbone"):
    dataclasses.replace(models.get_preset("tiny_qwen3_5"), vision=config.vision,
                        mrope_section=(4, 6, 6))
  with pytest.raises(models.ModelConfigError, match="image_token_id within the vocabulary"):
    dataclasses.replace(config, vocab_size=8192)
  with pytest.raises(models.ModelConfigError, match="deepstack_visual_indexes within 0..3"):
    dataclasses.replace(config.vision, deepstack_visual_indexes=(1, 4))
  with pytest.raises(models.ModelConfigError, match="square num_position_embeddings"):
    dataclasses.replace(config.vision, num_position_embeddings=2000)
  with pytest.raises(models.ModelConfigError, match="unknown fields \\['dpeth'\\]"):
    models.ModelConfig.from_dict({"preset": "tiny_vl", "vision": {"dpeth": 2}})
