"""Checking `FIELD=VALUE` experiment overrides against an experiment's config before launch.

launch/run.py applies `--config.FIELD=VALUE` itself (a locked config refuses unknown fields);
launchers that only pass overrides on (sweep.py's points, fleet.py's `train --set`) check them
here first, so a misspelt field fails on the laptop, not minutes later in a cluster pod.
"""
import importlib.util
import os
import re
import sys
import traceback

from absl import app
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OverrideError(ValueError):
  """An override names a field the config does not have, or a value its type cannot parse."""


def load_experiment(spec: str):
  """The ConfigDict of `experiments/NAME.py[:preset]` (relative to the repository root or cwd).

  Raises:
    OverrideError: the file does not exist or has no get_config.
  """
  path, _, preset = spec.partition(":")
  candidates = [path, os.path.join(ROOT, path)]
  found = next((p for p in candidates if os.path.isfile(p)), None)
  if found is None:
    raise OverrideError(f"experiment file {path!r} not found (looked in {candidates})")
  module_spec = importlib.util.spec_from_file_location("_experiment", found)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise OverrideError(f"{found} defines no get_config(preset)")
  try:
    return module.get_config(preset) if preset else module.get_config()
  except (ValueError, KeyError) as e:      # an unknown preset
    raise OverrideError(f"experiment {spec}: {e}") from None


def cluster_experiment(spec: str, *, pinned_workdir: bool = False) -> str:
  """Checks `experiments/NAME.py[:preset]` for a training Job and returns it as the image sees
  it: a path relative to the repository root (the image's working directory), with ":preset".

  A Job writes its run folder to $ORCHARD_CHECKPOINT_DIR on the checkpoints volume; a config
  with a `workdir` field that does not read it (e.g. the tiny preset, whose run folder is
  runs/<name>_tiny inside the container) would lose its checkpoints with the pod.

  Args:
    spec: the experiment argument.
    pinned_workdir: the Job's overrides set `workdir` themselves (then it is not checked).
  Raises:
    OverrideError: the file is missing or outside the repository, the preset is unknown, or
      the run folder would not be on the checkpoints volume.
  """
  path, sep, preset = spec.partition(":")
  absolute = os.path.abspath(path if os.path.isfile(path) else os.path.join(ROOT, path))
  if os.path.commonpath([absolute, ROOT]) != ROOT:
    raise OverrideError(f"the experiment file {path!r} is outside the repository ({ROOT}); the "
                        "training image only has files from the repository")
  sentinel = "/orchard-checkpoint-dir-probe"
  saved = os.environ.get("ORCHARD_CHECKPOINT_DIR")
  os.environ["ORCHARD_CHECKPOINT_DIR"] = sentinel
  try:
    config = load_experiment(spec)
  finally:
    if saved is None:
      del os.environ["ORCHARD_CHECKPOINT_DIR"]
    else:
      os.environ["ORCHARD_CHECKPOINT_DIR"] = saved
  if not pinned_workdir and "workdir" in config and config.workdir != sentinel:
    raise OverrideError(
        f"experiment {spec}: its run folder (workdir {config.workdir!r}) does not follow "
        "$ORCHARD_CHECKPOINT_DIR, so a training Job would write checkpoints inside its pod and "
        "lose them; use the cluster preset (e.g. experiments/swe_rpr.py:cluster)")
  return os.path.relpath(absolute, ROOT) + sep + preset


def check(config, pairs: list[tuple[str, str]], *, flag: str = "--config") -> None:
  """Applies each FIELD=VALUE to a copy of `config`, as launch/run.py would.

  Args:
    config: the experiment's ConfigDict (not changed).
    pairs: (dotted field, value text) pairs.
    flag: how the user wrote the override, for the error message ("--sweep", "--set").
  Raises:
    OverrideError: a field the config does not have, a value its type cannot parse, or values
      launch/run.py would refuse before any work (recipes.check_values).
  """
  trial = config.copy_and_resolve_references()
  for field, text in pairs:
    try:
      current = config_path.get_value(field, trial)
    except (KeyError, AttributeError, IndexError) as e:
      raise OverrideError(f"{flag} {field}: the config has no such field"
                          + missing_field_hint(e)) from None
    try:
      config_path.set_value(field, trial, parse_like(current, text))
    except (TypeError, ValueError) as e:
      raise OverrideError(f"{flag} {field}={text}: {e}") from None
  from orchard_jax import recipes      # light: no recipe module is imported
  try:
    recipes.check_values(trial)        # a NaN, a sampling setting no engine takes
  except recipes.ConfigError as e:
    given = ", ".join(f"{field}={text}" for field, text in pairs)
    raise OverrideError(f"{flag} {given}: {e}") from None


def missing_field_hint(error: Exception) -> str:
  """ml_collections' "did you mean" suggestion from its KeyError/AttributeError, or ""."""
  message = str(error.args[0] if error.args else error)
  message = message.replace("\\n", "\n").replace("\\'", "'")
  hint = re.search(r"Did you mean [^\n]*\?", message)
  return f" ({hint.group(0)})" if hint else ""


def parse_like(current, text: str):
  """`text` parsed as the type of the field's current value (bool, int, float, str)."""
  if isinstance(current, bool):
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0"):
      raise ValueError(f"expected true or false for a bool field; saw {text!r}")
    return lowered in ("true", "1")
  if isinstance(current, int):
    return int(text)
  if isinstance(current, float):
    return float(text)
  if current is None or isinstance(current, str):
    return text
  raise TypeError(f"overriding a field of type {type(current).__name__} from the command line "
                  "is not supported")


def flags_parser(*file_flags: str):
  """An absl `flags_parser` for `app.run` that turns config mistakes into one-line errors.

  Checks that every config-file flag named in `file_flags` (e.g. "config", "fleet") names an
  existing file before absl loads it (ml_collections raises a long traceback otherwise, and only
  once the config is first read), then parses the flags, catching an override of a field the
  config lacks (`--config.rl.lrr=1`) or a value its type cannot parse. Each is written to stderr
  as `error: ...` and the process exits with status 2.

  Args:
    file_flags: names of the `config_flags.DEFINE_config_file` flags, without dashes.
  Returns:
    fn(argv) -> remaining argv, to pass as `app.run(main, flags_parser=...)`.
  """
  def parse(argv: list[str]) -> list[str]:
    for name in file_flags:
      problem = _missing_config_file(argv, name)
      if problem:
        sys.stderr.write(f"error: {problem}\n")
        sys.exit(2)
      _report_load_errors(name)
    try:
      return flags.FLAGS(argv)
    except ConfigFileError as e:               # not Python, no get_config, get_config raised
      sys.stderr.write(f"error: {e}\n")
      sys.exit(2)
    except (flags.Error, ValueError) as e:     # --config.rl.lr=abc; an unknown preset
      lines = [line for line in str(e).splitlines() if line.strip()]
      if "Error whilst parsing config file" in str(e):   # ml_collections embeds the traceback
        lines = [lines[0].rstrip(":"), lines[-1]]
      sys.stderr.write("error: " + "\n  ".join(lines) + "\n")
      sys.exit(2)
    except (AttributeError, KeyError) as e:
      _exit_unknown_field(e, argv, file_flags)
  return parse


class ConfigFileError(Exception):
  """A config file that exists but cannot be loaded: not Python, no get_config, or
  get_config raised. Not a ValueError, so absl's flag parsing lets it through unchanged."""


def _report_load_errors(name: str) -> None:
  """Makes the config-file flag `name` raise ConfigFileError (one line naming the file, the
  error and where it happened) for a file that does not load, instead of the traceback
  ml_collections lets through for anything but TypeError, ValueError and a missing file."""
  parser = flags.FLAGS[name].parser
  if getattr(parser, "_orchard_reports_load_errors", False):
    return
  load = parser.parse

  def parse(value):
    try:
      return load(value)
    except (TypeError, ValueError, OSError):   # absl reports these (see flags_parser)
      raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's file is reported
      raise ConfigFileError(f"--{name} {value}: {describe_load_error(e)}") from e

  parser.parse = parse
  parser._orchard_reports_load_errors = True


def describe_load_error(error: Exception) -> str:
  """Why a config file did not load, in one line: a file that is not Python (with the line),
  one without get_config, or what its code raised and where (file:line of the innermost
  frame)."""
  if isinstance(error, SyntaxError):
    return (f"not a Python config file: {error.msg} ({os.path.basename(error.filename or '')} "
            f"line {error.lineno}); expected experiments/NAME.py[:preset]")
  if isinstance(error, AttributeError) and getattr(error, "name", None) == "get_config":
    return ("the file defines no get_config(); an experiment file is a Python module whose "
            "get_config(preset) returns the config (see experiments/swe_rpr.py)")
  where = ""
  frames = traceback.extract_tb(error.__traceback__)
  if frames:
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
  message = str(error).splitlines()[0] if str(error) else ""
  return f"loading it raised {type(error).__name__}: {message}{where}"


def usage_errors_as_one_line(main):
  """Wraps an absl `main` so an `app.UsageError` (a missing --config, an unknown command) is
  written as one `error: ...` line with exit status 2, as flags_parser's errors are, instead of
  absl's usage text and flag list (40+ lines, the error last) with status 1."""
  def wrapped(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      sys.stderr.write(f"error: {e} (see --help)\n")
      sys.exit(2)
  return wrapped


def define_config_file(name: str, default: str | None, help_string: str):
  """`config_flags.DEFINE_config_file(name, default, help_string, lock_config=True)`, with an
  override of a field the default file lacks reported as `flags_parser` reports it.

  With a default file and no `--name` on the command line, ml_collections loads the default and
  resolves the `--name.FIELD` overrides of sys.argv while the flag is defined (at import),
  before `flags_parser` runs; a misspelt field would raise there, as a traceback.

  Returns:
    The flag holder, as DEFINE_config_file's.
  """
  try:
    return config_flags.DEFINE_config_file(name, default, help_string, lock_config=True)
  except (AttributeError, KeyError) as e:
    _exit_unknown_field(e, sys.argv, (name,))


def _exit_unknown_field(error: Exception, argv: list[str], file_flags) -> None:
  """Writes `error: unknown config field ...` (naming the override) to stderr; exits 2."""
  prefixes = tuple(f"--{name}." for name in file_flags)
  given = [a.split("=", 1)[0] for a in argv[1:] if a.startswith(prefixes)]
  message = str(error.args[0] if error.args else error).replace("\\n", "\n").replace("\\'", "'")
  names = re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", message)
  key = names[0] if names else message
  culprit = [o for o in given if o.split(".")[-1] == key] or given
  sys.stderr.write(f"error: unknown config field {key!r} in {', '.join(culprit)}: an "
                   "override must name a field the config file defines (the config is "
                   "locked)." + missing_field_hint(error) + "\n")
  sys.exit(2)


def _missing_config_file(argv: list[str], name: str) -> str | None:
  """Why the `--name PATH[:preset]` (or `--name=PATH[:preset]`) argument names no file, or None.
  """
  value = None
  for i, arg in enumerate(argv[1:], start=1):
    if arg == f"--{name}" and i + 1 < len(argv):
      value = argv[i + 1]
    elif arg.startswith(f"--{name}="):
      value = arg.split("=", 1)[1]
  if not value:
    return None
  path = value.partition(":")[0]
  if os.path.isfile(path):
    return None
  message = f"--{name} {value}: no such file {os.path.abspath(path)!r}"
  if not os.path.isabs(path) and os.path.isfile(os.path.join(ROOT, path)):
    message += (f"; relative paths are taken from the current directory ({os.getcwd()}): run "
                f"from the repository root ({ROOT}) or pass {os.path.join(ROOT, value)}")
  return message
