"""Checking `FIELD=VALUE` experiment overrides against an experiment's config before launch.

launch/run.py applies `--config.FIELD=VALUE` itself (a locked config refuses unknown fields);
launchers that only pass overrides on (sweep.py's points, fleet.py's `train --set`) check them
here first, so a misspelt field fails on the laptop, not minutes later in a cluster pod.
"""
import importlib.util
import os
import re

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
  return module.get_config(preset) if preset else module.get_config()


def check(config, pairs: list[tuple[str, str]], *, flag: str = "--config") -> None:
  """Applies each FIELD=VALUE to a copy of `config`, as launch/run.py would.

  Args:
    config: the experiment's ConfigDict (not changed).
    pairs: (dotted field, value text) pairs.
    flag: how the user wrote the override, for the error message ("--sweep", "--set").
  Raises:
    OverrideError: a field the config does not have, or a value its type cannot parse.
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
