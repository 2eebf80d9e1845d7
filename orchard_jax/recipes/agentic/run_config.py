"""A run folder's saved config and the identity check a run passes before resuming from it.

A training job resumes from whatever its run folder (`config.workdir`, or the job's default
folder) holds: checkpoints, the trajectory store, the task split. Each start writes the config
it runs with to `<folder>/config.yaml` (plain YAML: sequences are lists, no `!!python` tags; it
round-trips with `from_yaml`). A later start in the same folder compares its config with the
saved one: when a field of the run's *identity* differs, the run stops before any work, naming
the folder, each field with its old and new value, and the two ways out (another
`--config.workdir`, or `--config.resume=force`). Every other field may change on resume.

Identity (IDENTITY_FIELDS; what makes the checkpoints incompatible or the continued results
meaningless):
  what runs         job, name (the experiment), preset, seed
  the model         policy.preset / init / tokenizer / tool_call_parser / dtype; lm's preset and
                    model.param_dtype; value.preset / init_from_policy; which parameters train
                    (sft./rl.train_last_layers, sft./rl.frozen, sft.method): the optimizer
                    state's shape follows them
  the data          the task set (tasks.dataset, packages, seeds, sizes, heldout_fraction, the
                    training subset; Claw's and GUI's task sources), the SFT source and
                    variants, the value model's stores; lm's data.tokenizer, corpus, held-out
                    split and data.seed, train.seed
  distillation      the experiment label on the stored trajectories and the teacher (api,
                    model, checkpoint, preset, seed, tokenizer, tool-call parser)
  the agent         agent.harness; GUI's observation, tools and browser.viewport
  the algorithm     sft.enabled, sft.mode, rl.reward, opd.mode / teacher_init / teacher_preset /
                    divergence, the judges' and annotator's kind and model
Safe to change (everything else): iteration, epoch, step and attempt counts (rl.iterations,
sft.epochs, train.total_steps, distill.attempts_per_task: extending a run), tasks.limit (more
or fewer of the same task set's instances), learning rates and other optimiser settings, batch
sizes, microbatches and sequence lengths, evaluation (eval.*), logging, progress, checkpoint
frequency and retention, where and how it runs (workdir, store.path, env, engine, mesh,
sampling, agent limits, timeouts, a teacher endpoint's url), and `resume` itself.

A field only one of the two configs has (a field a code change added or removed) is not
compared. A folder holding files but no config.yaml (a run written before configs were saved)
cannot be checked: the run resumes it with a warning and records its config there, so the next
start is checked.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Mapping

import yaml
from ml_collections import ConfigDict

from orchard_jax.recipes import RESUME_MODES, ConfigError

CONFIG_FILE = "config.yaml"

IDENTITY_FIELDS = frozenset((
    # what runs
    "job", "name", "preset", "seed",
    # the model and what its checkpoints hold
    "policy.preset", "policy.init", "policy.tokenizer", "policy.tool_call_parser",
    "policy.dtype", "model.param_dtype", "value.preset", "value.init_from_policy",
    "sft.train_last_layers", "rl.train_last_layers", "sft.frozen", "rl.frozen", "sft.method",
    # the data: task sets (SWE, Claw, GUI), SFT sources, value stores, lm's corpus
    "tasks.dataset", "tasks.packages", "tasks.instances_per_package",
    "tasks.max_candidates_per_package", "tasks.seed", "tasks.heldout_fraction",
    "tasks.train_tasks", "tasks.selection", "tasks.per_package",
    "tasks.synth_count", "tasks.synth_seed", "tasks.train_file", "tasks.eval_dir",
    "tasks.distractor_tools", "tasks.miniwob", "tasks.miniwob_seeds",
    "tasks.miniwob_eval_seeds", "tasks.sites", "tasks.open_file",
    "sft.source", "sft.experiments", "sft.variants", "sft.harness_expert_steps",
    "value.stores", "value.experiments", "value.heldout_fraction", "value.every_position",
    "data.tokenizer", "data.max_chars_per_file", "data.heldout_fraction", "data.seed",
    "train.seed",
    # distillation: what labels the store's trajectories and the teacher that writes them
    "experiment", "teacher.api", "teacher.model", "teacher.checkpoint", "teacher.preset",
    "teacher.seed", "teacher.tokenizer", "teacher.tool_call_parser",
    # the agent
    "agent.harness", "agent.observation", "agent.tools", "browser.viewport",
    # the algorithm
    "sft.enabled", "sft.mode", "rl.reward", "opd.mode", "opd.teacher_init",
    "opd.teacher_preset", "opd.divergence", "judge.kind", "judge.model", "annotator.kind",
    "annotator.model", "rubric_judge.kind", "rubric_judge.model", "gui_judge.kind",
    "gui_judge.model",
))

_log = logging.getLogger(__name__)


class RunFolderMismatch(ConfigError):
  """The run folder holds a run whose identity fields differ from the new config's."""


# ----------------------------------------------------------------------------- plain YAML

def to_plain(config: ConfigDict | Mapping) -> dict:
  """`config` as nested dicts of plain values: blocks become dicts, tuples lists, field
  references their values (what `to_yaml` writes and `yaml.safe_load` reads back)."""
  if isinstance(config, ConfigDict):
    config = config.copy_and_resolve_references().to_dict()
  return _plain(config)


def _plain(value: Any) -> Any:
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (tuple, list)):
    return [_plain(v) for v in value]
  return value


def to_yaml(config: ConfigDict | Mapping) -> str:
  """`config` as plain YAML in the config's field order (sequences as lists, no `!!python`
  tags): what `--print_config` prints and `<run folder>/config.yaml` holds."""
  return yaml.dump(to_plain(config), Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                   width=100)


class _Dumper(yaml.SafeDumper):
  """Blocks one field a line; a list of plain values on one line (`splits: [train, heldout]`)."""


def _represent_list(dumper: yaml.SafeDumper, items: list):
  flat = all(not isinstance(item, (list, dict)) for item in items)
  return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)


_Dumper.add_representer(list, _represent_list)


def from_yaml(text: str) -> ConfigDict:
  """The ConfigDict `to_yaml` wrote: blocks become ConfigDicts and lists tuples, the type
  experiment configs use for sequences, so `from_yaml(to_yaml(c)) == c`.

  Raises:
    ConfigError: `text` is not YAML of a mapping.
  """
  try:
    loaded = yaml.safe_load(text)
  except yaml.YAMLError as e:
    raise ConfigError(f"the saved config is not YAML: {e}".replace("\n", " ")) from None
  if not isinstance(loaded, dict):
    raise ConfigError(f"the saved config is a {type(loaded).__name__}; expected a mapping")
  return ConfigDict(_structured(loaded))


def _structured(value: Any) -> Any:
  if isinstance(value, dict):
    return ConfigDict({k: _structured(v) for k, v in value.items()})
  if isinstance(value, list):
    return tuple(_structured(v) for v in value)
  return value


# ----------------------------------------------------------------------------- identity check

def _leaves(tree: Mapping, prefix: str = "") -> Iterator[tuple[str, Any]]:
  for key, value in tree.items():
    if isinstance(value, Mapping):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def identity_changes(saved: ConfigDict | Mapping, new: ConfigDict | Mapping
                     ) -> list[tuple[str, Any, Any]]:
  """(field, saved value, new value) for each identity field both configs have whose values
  differ, in the new config's field order (sequences compared as lists)."""
  old = dict(_leaves(to_plain(saved)))
  return [(field, old[field], value) for field, value in _leaves(to_plain(new))
          if field in old and field in IDENTITY_FIELDS and old[field] != value]


def saved_config(folder: str) -> ConfigDict | None:
  """The config a run saved in `folder` (its config.yaml), or None when there is none.

  Raises:
    ConfigError: config.yaml exists but is not a YAML mapping.
  """
  path = os.path.join(folder, CONFIG_FILE)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    try:
      return from_yaml(f.read())
    except ConfigError as e:
      raise ConfigError(f"{path}: {e}") from None


def check_resume(config: ConfigDict, folder: str) -> None:
  """Refuses to start `config` in `folder` when the run saved there has other identity fields.

  A missing or empty folder, or a saved config with the same identity, passes. With
  `config.resume == "force"` differing identity fields are logged and the run continues. A
  folder with files but no config.yaml passes with a warning (module docstring).

  Raises:
    RunFolderMismatch: one line naming the folder, each differing field as old -> new, and
      the ways out (`--config.workdir`, `--config.resume=force`).
    ConfigError: config.resume is not one of RESUME_MODES, or config.yaml is unreadable.
  """
  mode = str(config.get("resume", "auto"))
  if mode not in RESUME_MODES:
    raise ConfigError(f"resume is {mode!r}; expected one of {RESUME_MODES}")
  saved = saved_config(folder)
  if saved is None:
    if _holds_files(folder):
      _log.warning("run folder %s holds a run that saved no %s (written before run configs "
                   "were saved), so its identity cannot be checked; resuming it and saving this "
                   "run's config there", folder, CONFIG_FILE)
    return
  changes = identity_changes(saved, config)
  if not changes:
    return
  listed = "; ".join(f"{field} {old!r} -> {new!r}" for field, old, new in changes)
  if mode == "force":
    _log.warning("run folder %s: resuming a run with other identity fields (resume=force): %s",
                 folder, listed)
    return
  raise RunFolderMismatch(
      f"run folder {folder} holds another run ({listed}); choose another folder with "
      "--config.workdir=DIR, or continue that run anyway with --config.resume=force")


def save_config(config: ConfigDict, folder: str) -> str:
  """Writes `config` to `<folder>/config.yaml` (atomically; creates `folder`); returns the
  path. Each start rewrites it, so it holds the config the run last started with."""
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, CONFIG_FILE)
  partial = f"{path}.partial"
  with open(partial, "w", encoding="utf-8") as f:
    f.write(to_yaml(config))
  os.replace(partial, path)
  return path


def _holds_files(folder: str) -> bool:
  if not os.path.isdir(folder):
    return False
  return any(files or any(os.path.islink(os.path.join(root, d)) for d in dirs)
             for root, dirs, files in os.walk(folder))
