"""Runs one experiment: `python launch/run.py --config experiments/NAME.py[:preset]`.

Any config field can be overridden from the command line, e.g.
`--config.rl.lr=3e-6`; a field the config does not have is an error (the config is locked).
The config's `job` field names the recipe to run (see orchard_jax.recipes.JOBS).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import overrides  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file: experiments/NAME.py[:preset].", lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}; override fields with --config.FIELD=VALUE")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/swe_rpr.py")
  # Compiled programs are reused from disk by later processes and by a second engine of the
  # same shapes in this one (ORCHARD_JAX_COMPILATION_CACHE=0 turns it off; compile_cache.py).
  from launch import compile_cache
  logging.info("JAX compilation cache: %s", compile_cache.enable() or "off")
  # On a multi-host Job (launch/k8s/training.py) join the other hosts before any device use.
  from orchard_jax.parallel import distributed
  if distributed.initialize_from_env():
    import jax
    logging.info("process %d of %d joined the multi-host run", jax.process_index(),
                 jax.process_count())
  from orchard_jax import recipes
  logging.info("job %s with config:\n%s", config.get("job"), config)
  recipes.run_job(config)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a clear error for a --config.FIELD override the config lacks.

  ml_collections raises a bare AttributeError/KeyError naming only the missing key while the
  flags are parsed; this turns it into a usage error that names the override and the fix.
  """
  try:
    return flags.FLAGS(argv)
  except (flags.Error, ValueError) as e:     # --config.rl.lr=abc; an unknown preset
    lines = [line for line in str(e).splitlines() if line.strip()]
    if "Error whilst parsing config file" in str(e):   # ml_collections embeds the traceback
      lines = [lines[0].rstrip(":"), lines[-1]]
    sys.stderr.write("error: " + "\n  ".join(lines) + "\n")
    sys.exit(2)
  except (AttributeError, KeyError) as e:
    given = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    message = str(e.args[0] if e.args else e).replace("\\n", "\n").replace("\\'", "'")
    names = re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", message)
    key = names[0] if names else message
    culprit = [o for o in given if o.split(".")[-1] == key] or given
    sys.stderr.write(f"error: unknown config field {key!r} in {', '.join(culprit)}: an override "
                     "must name a field the config file defines (the config is locked)."
                     + overrides.missing_field_hint(e) + "\n")
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
