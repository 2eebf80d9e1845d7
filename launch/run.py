"""Runs one experiment: `python launch/run.py --config experiments/NAME.py[:preset]`.

Any config field can be overridden from the command line, e.g.
`--config.rl.lr=3e-6`; a field the config does not have is an error (the config is locked).
`--print_config` prints the config with the overrides applied, as plain YAML (the form a
training run saves in its run folder as config.yaml), and exits. The config's `job` field names
the recipe to run (see orchard_jax.recipes.JOBS).

A training job resumes from what its run folder holds only when the folder's saved config has
the same identity fields (model, tokenizer, task set, harness, algorithm, seed...); otherwise it
stops before any work, naming the fields (orchard_jax/recipes/agentic/run_config.py;
README "Run folders and resuming").
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import overrides  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file: experiments/NAME.py[:preset].", lock_config=True)
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Print the config, with the overrides applied, and exit without "
    "running the job: every field it lists can be overridden with --config.FIELD=VALUE.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}; override fields with --config.FIELD=VALUE")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/swe_rpr.py")
  from orchard_jax import recipes      # light: recipe modules load only when their job runs
  from orchard_jax.recipes.agentic import run_config
  try:
    recipes.check_job(config)          # a typo: one line, before any work
    recipes.check_values(config)       # a NaN, a sampling setting no engine takes
  except recipes.ConfigError as e:
    sys.stderr.write(f"error: {e}\n")
    sys.exit(2)
  if _PRINT_CONFIG.value:
    sys.stdout.write(run_config.to_yaml(config))
    return
  # Compiled programs are reused from disk by later processes and by a second engine of the
  # same shapes in this one (ORCHARD_JAX_COMPILATION_CACHE=0 turns it off; compile_cache.py).
  from launch import compile_cache
  logging.info("JAX compilation cache: %s", compile_cache.enable() or "off")
  # XLA:CPU's memory-minimising op schedule (ORCHARD_JAX_CPU_SCHEDULER; launch/xla_env.py).
  from launch import xla_env
  logging.info("XLA:CPU scheduler: %s", xla_env.configure())
  # Large host buffers mmapped and returned on free (ORCHARD_JAX_MALLOC; launch/host_malloc.py).
  from launch import host_malloc
  logging.info("malloc: %s", host_malloc.configure())
  # On a multi-host Job (launch/k8s/training.py) join the other hosts before any device use.
  from orchard_jax.parallel import distributed
  if distributed.initialize_from_env():
    import jax
    logging.info("process %d of %d joined the multi-host run", jax.process_index(),
                 jax.process_count())
  logging.info("job %s with config:\n%s", config.get("job"), run_config.to_yaml(config))
  try:
    result = recipes.run_job(config)
  except recipes.ConfigError as e:     # a missing checkpoint, predictions file, tokenizer...
    sys.stderr.write(f"error: {e}\n")
    sys.exit(2)
  except KeyboardInterrupt:            # Ctrl-C outside a recipe's own handling: no traceback
    sys.stderr.write("interrupted (Ctrl-C): files written so far are kept; the same command "
                     "resumes from the run's last checkpoint where its job writes them\n")
    sys.exit(130)
  if getattr(result, "stopped_by", None) == "interrupted":   # a Ctrl-C the recipe handled
    sys.exit(130)                                            # (its work is stored) still fails
  failure = getattr(result, "failure", "")      # a job that ran but could not do its work
  if failure:                                   # (instances in error): one line, exit 1
    sys.stderr.write(f"error: {failure}\n")
    sys.exit(1)


if __name__ == "__main__":
  app.run(overrides.usage_errors_as_one_line(main),
          flags_parser=overrides.flags_parser("config"))
