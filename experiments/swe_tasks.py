"""Build the default SWE task set: real bugs in real PyPI packages, validated by their tests.

`python launch/run.py --config experiments/swe_tasks.py` builds (or loads from the cache) the
set and prints how many candidate bugs were tried, kept, and why the others were dropped.
"""
import ml_collections

from experiments import common


def get_config(preset="default"):
  if preset != "default" and preset not in common.SWE_PRESETS:   # one task set for every preset
    raise ValueError(f"preset {preset!r} is not 'default' or one of {common.SWE_PRESETS}")
  config = ml_collections.ConfigDict()
  config.job = "swe.build_tasks"
  config.tasks = common.swe_tasks()
  config.progress = True
  return config
