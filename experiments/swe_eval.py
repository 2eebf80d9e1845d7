"""Evaluate predictions on the SWE task set in fresh sandboxes (SWE-bench rules).

  python launch/run.py --config experiments/swe_eval.py --config.predictions=gold   # 100%
  python launch/run.py --config experiments/swe_eval.py --config.predictions=empty  # 0%
  python launch/run.py --config experiments/swe_eval.py --config.predictions=preds.jsonl

Writes a folder per instance (patch, logs, report.json), results.jsonl and summary.json.
"""
import ml_collections

from experiments import common


def get_config(preset="default"):
  del preset
  config = ml_collections.ConfigDict()
  config.job = "swe.evaluate"
  config.tasks = common.swe_tasks()
  config.env = common.swe_env()
  config.predictions = "gold"       # "gold", "empty", or a SWE-bench predictions JSONL/JSON
  config.output_dir = "runs/swe_eval"
  config.run_id = ""                # subfolder of output_dir; "" = the predictions' name
  config.progress = True
  return config
