"""Settings that several experiment configs share. Each function returns a fresh ConfigDict."""
import ml_collections


def swe_tasks():
  """The SWE task set (orchard_jax.tasks.swe.BuildSettings, plus where to read one from).

  `dataset` empty: build (or reuse from ~/.cache/orchard_jax/swe/tasksets) the default set of
  real tasks from PyPI packages; otherwise a SWE-bench-format JSONL/parquet/datasets path.
  """
  return ml_collections.ConfigDict(dict(
      dataset="",                 # path of instances to use instead of building
      packages=("toolz", "inflection", "parse", "boltons", "idna"),
      instances_per_package=14,   # stop a package once this many instances are kept
      max_candidates_per_package=60,
      seconds_per_package=120.0,  # wall-time budget per package while drawing candidates
      workers=2,                  # candidate bugs tested in parallel
      test_timeout_s=120.0,       # one test-suite run
      seed=0,
      python="",                  # base interpreter of the package venvs ("" = auto)
      output_dir="",              # "" = the cache folder, named by a hash of these settings
      rebuild=False,
      limit=0,                    # use only the first N instances (0 = all)
  ))


def swe_env():
  """Where sandboxes come from: "" starts an in-process Orchard Env with the local backend."""
  return ml_collections.ConfigDict(dict(url="", api_key="", max_parallel=2))


def swe_agent():
  """Limits of the bash agent (orchard_jax.harness.AgentConfig)."""
  return ml_collections.ConfigDict(dict(
      step_limit=30, wall_time_limit_s=900.0, max_consecutive_format_errors=3,
      command_timeout_s=60.0, output_limit_chars=10000))
