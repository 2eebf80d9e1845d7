"""Evaluate predictions or a policy checkpoint on the SWE task set in fresh sandboxes.

Predictions (SWE-bench rules; writes a folder per instance with patch, logs and report.json,
results.jsonl and summary.json):

  python launch/run.py --config experiments/swe_eval.py --config.predictions=gold   # 100%
  python launch/run.py --config experiments/swe_eval.py --config.predictions=empty  # 0%
  python launch/run.py --config experiments/swe_eval.py --config.predictions=preds.jsonl
  # your own SWE-bench file: images are built for instances without test_spec (README
  # "Bring your own dataset"); a run with instances in `error` exits 1 saying how many
  python launch/run.py --config experiments/swe_eval.py --config.predictions=gold \
      --config.tasks.dataset=my.jsonl --config.tasks.mirrors=/srv/mirrors

A policy checkpoint (a run folder such as runs/swe_rpr_tiny, a trainer folder, or a Hugging Face
folder): the harness runs eval.k times on each instance of eval.splits ("train": the run's
training subset from its tasks.json, "heldout": instances never trained on) and the job reports
pass@1, pass@k and random@k, plus value-model best-of-k with `eval.value_checkpoint`:

  python launch/run.py --config experiments/swe_eval.py --config.checkpoint=runs/swe_rpr_tiny
  python launch/run.py --config experiments/swe_eval.py --config.checkpoint=runs/swe_rpr_tiny \
      --config.eval.value_checkpoint=runs/swe_value_tiny --config.eval.k=4
"""
from experiments import common


def get_config(preset="default"):
  config = common.swe_base("tiny" if preset in ("default", "tiny") else preset)
  config.job = "swe.evaluate"
  config.name = "swe_eval"
  config.predictions = "gold"       # "gold", "empty", or a SWE-bench predictions JSONL/JSON
  config.output_dir = "runs/swe_eval"  # predictions: results in <output_dir>/<run_id>, or in
                                    # <workdir>/<run_id> when workdir is set (sweep.py sets it)
  config.run_id = ""                # subfolder of output_dir; "" = the predictions' name
  config.checkpoint = ""            # a policy checkpoint: evaluate it instead of predictions
  return config
