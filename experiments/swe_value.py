"""Orchard-SWE: historical experience distillation into a value model (docs/algorithms.md section 6).

Trains the value model (`value.preset`, tiny_dense here; or a policy backbone via
`value.init_from_policy`) on every evaluated trajectory in the trajectory stores of earlier
experiments (`value.stores`, default runs/*/store), and reports held-out ROC AUC, expected
calibration error, and best-of-k next to pass@k and random@k. Use the result for reranking with
`experiments/swe_eval.py --config.checkpoint=...
--config.eval.value_checkpoint=runs/swe_value_tiny`.
"""
from experiments import common


def get_config(preset="tiny"):
  config = common.swe_base(preset)
  config.job = "swe.value"
  config.name = "swe_value"
  return config
