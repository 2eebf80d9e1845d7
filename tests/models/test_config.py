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
  with pytest.raises(models.ConfigError, match="unknown fields \\['hiden_size'\\]"):
    models.ModelConfig.from_dict({"hiden_size": 3})
  with pytest.raises(models.ConfigError, match="num_attention_heads divisible"):
    dataclasses.replace(models.get_preset("tiny"), num_key_value_heads=3)
  with pytest.raises(models.ConfigError, match="4 layer_types"):
    dataclasses.replace(models.get_preset("tiny_qwen3_5"), layer_types=("full_attention",))
  with pytest.raises(models.ConfigError, match="moe_dispatch"):
    dataclasses.replace(models.get_preset("tiny"), moe_dispatch="magic")
  with pytest.raises(models.ConfigError, match="unknown model preset 'huge'"):
    models.get_preset("huge")
