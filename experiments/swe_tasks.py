"""Build the SWE task set, or build and validate your own SWE-bench dataset.

`python launch/run.py --config experiments/swe_tasks.py` builds (or loads from the cache) the
default set: real bugs in real PyPI packages, and prints how many candidate bugs were tried,
kept, and why the others were dropped (the leak scan's drops included).

Your own data (README "Bring your own dataset"):

  # an environment and an image per instance, from local mirrors (or tasks.url_template)
  python launch/run.py --config experiments/swe_tasks.py \
      --config.tasks.dataset=my.jsonl --config.tasks.mirrors=/srv/mirrors
  # the same, then the validation pass (gold twice, empty twice; flaky PASS_TO_PASS out)
  python launch/run.py --config experiments/swe_tasks.py:validate \
      --config.tasks.dataset=my.jsonl --config.tasks.mirrors=/srv/mirrors
  # instances from upstream fixing commits ([{"repo", "commit"}]), FAIL_TO_PASS derived
  python launch/run.py --config experiments/swe_tasks.py:validate --config.commits=fixes.json
"""
import ml_collections

from experiments import common


def get_config(preset="default"):
  if preset not in ("default", "validate") and preset not in common.SWE_PRESETS:
    raise ValueError(f"preset {preset!r} is not 'default', 'validate' or one of "
                     f"{common.SWE_PRESETS}")
  config = ml_collections.ConfigDict()
  config.job = "swe.build_tasks"
  config.tasks = common.swe_tasks()
  config.env = common.sandbox_env()   # sandboxes of the validation pass
  config.commits = ""                 # a JSON list of {"repo", "commit"}: collect instances
  config.validate = preset == "validate"
  config.progress = True
  return config
