"""Orchard-SWE: GRPO with Balanced Adaptive Rollout and the outcome reward only (R_bin = +-1;
docs/algorithms.md section 2). The ablation of swe_rpr.py without the judge.

    python launch/run.py --config experiments/swe_bar.py[:qwen3_5_35b_a3b|:cluster]
"""
from experiments import common


def get_config(preset="tiny"):
  config = common.swe_base(preset)
  config.job = "swe.rl"
  config.name = "swe_bar"
  config.rl.reward = "binary"
  return config
