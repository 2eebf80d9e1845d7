"""Dataset jobs on a trajectory store: statistics, export, import.

Jobs (configured by experiments/swe_distill.py; they work on any store, `--config.store=PATH`):
  swe_distill.stats    the table (trajectories per task, resolve rate, turns and tokens per
                       trajectory, exit statuses, SFT filter counts) and a per-task table are
                       printed; the histograms are written as PNG files
  swe_distill.export   store -> mini-swe-agent run folders and a Hugging Face datasets file
  swe_distill.import   mini-swe-agent trajectory folders (collected anywhere) -> store
The formats and the statistics themselves live in orchard_jax.data (miniswe.py,
hf_dataset.py, stats.py); these jobs wire them to the config.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import ConfigError, load_tokenizer


class DistillError(ConfigError):
  """A distillation or dataset setting is invalid (the message names the field, expected and
  seen)."""


def store_path(config: ConfigDict) -> str:
  """config.store (a folder, or a block with `path` as in the loop's configs), or workdir/store
  when empty."""
  store = config.store
  if isinstance(store, (dict, ConfigDict)):
    store = store.get("path", "")
  return store or os.path.join(config.workdir, "store")



def stats(config: ConfigDict) -> data.DatasetStats:
  """Job "swe_distill.stats": prints the dataset statistics of the store (experiment
  `config.experiment`, or every trajectory when it is empty), a per-task table, and writes the
  histograms as PNG files to stats.plots_dir (default workdir/stats).

  Tokens per trajectory come from the recorded ids; text-only trajectories are counted with
  stats.tokenizer (the student's), and their images with stats.preset's vision encoder when it
  is a vision-language preset. "too_long" flags trajectories over stats.max_tokens.
  """
  sc = config.stats
  path = _existing_store(config)
  tokenizer = load_tokenizer(sc.tokenizer, field="stats.tokenizer") if sc.tokenizer else None
  with data.TrajectoryStore(path) as store:
    trajectories = store.trajectories(experiment=config.experiment or None)
    result = data.dataset_stats(trajectories, store=store, tokenizer=tokenizer,
                                max_tokens=int(sc.max_tokens) or None,
                                image_tokens=student_image_tokens(config, store))
  plots_dir = sc.plots_dir or os.path.join(config.workdir, "stats")
  written = data.plot_histograms(result, plots_dir)
  which = f"experiment {config.experiment!r}" if config.experiment else "all experiments"
  print(f"store {path}, {which}:\n{result.table()}\n\n{per_task_table(result)}", flush=True)
  with open(os.path.join(plots_dir, "summary.json"), "w") as f:
    json.dump(result.summary(), f, indent=2, default=float)
  print(f"\nplots: {', '.join(str(p) for p in written)}", flush=True)
  return result


def student_image_tokens(config: ConfigDict, store):
  """digest -> an image's token count under the student's vision encoder (stats.preset, a
  vision-language preset), or None when the config names no such student."""
  preset = config.stats.get("preset", "") if "stats" in config else ""
  if not preset:
    return None
  from orchard_jax import models
  from orchard_jax.recipes.agentic.images import PolicyImages
  try:
    model_config = models.get_preset(preset)
  except (KeyError, ValueError) as e:
    raise DistillError(f"stats.preset: {e}") from None
  if getattr(model_config, "vision", None) is None:
    return None
  return PolicyImages(model_config, store).image_tokens


def _existing_store(config: ConfigDict) -> str:
  """The store path the config names; raises DistillError when there is none (opening a
  missing path would create an empty store)."""
  path = store_path(config)
  if not os.path.isdir(path):
    raise DistillError(f"no trajectory store at {path!r}; run the collect job first or set "
                       "--config.store=PATH")
  return path


def per_task_table(result: data.DatasetStats) -> str:
  """One line per task: trajectories, resolved, resolve rate (sorted by task id)."""
  if not result.per_task:
    return "(no trajectories)"
  width = max(len("task"), *(len(t) for t in result.per_task))
  lines = [f"{'task':<{width}}  trajectories  resolved  rate"]
  for task in sorted(result.per_task):
    n, r = result.per_task[task], result.resolved_per_task.get(task, 0)
    lines.append(f"{task:<{width}}  {n:>12}  {r:>8}  {r / n:>4.0%}")
  return "\n".join(lines)


def export(config: ConfigDict) -> dict[str, Any]:
  """Job "swe_distill.export": writes the experiment's trajectories (every one when
  config.experiment is empty) as mini-swe-agent run folders (export.miniswe_dir, default
  workdir/export/miniswe; attempt_<k>/<task>/<task>.traj.json + preds.json) and as a Hugging
  Face datasets file (export.hf_path, default workdir/export/trajectories.parquet; "none" skips
  either).

  Returns:
    {"trajectories": n, "miniswe_files": [...], "hf_path": str | None}.
  Raises:
    DistillError: there is no store, or it holds no such trajectory.
  """
  ec = config.export
  with data.TrajectoryStore(_existing_store(config)) as store:
    trajectories = store.trajectories(experiment=config.experiment or None)
  if not trajectories:
    raise DistillError(f"store {store_path(config)!r} holds no trajectories of experiment "
                       f"{config.experiment!r}; nothing to export")
  out = {"trajectories": len(trajectories), "miniswe_files": [], "hf_path": None}
  export_dir = os.path.join(config.workdir, "export")
  miniswe_dir = ec.miniswe_dir or os.path.join(export_dir, "miniswe")
  if miniswe_dir != "none":
    out["miniswe_files"] = [str(p) for p in data.export_miniswe(trajectories, miniswe_dir)]
    print(f"mini-swe-agent: {len(out['miniswe_files'])} trajectories under {miniswe_dir}")
  hf_path = ec.hf_path or os.path.join(export_dir, "trajectories.parquet")
  if hf_path != "none":
    data.export_hf_dataset(trajectories, hf_path)
    out["hf_path"] = hf_path
    print(f"Hugging Face datasets: {len(trajectories)} rows in {hf_path}")
  return out


def import_trajectories(config: ConfigDict) -> list[data.Trajectory]:
  """Job "swe_distill.import": reads every mini-swe-agent *.traj.json under
  config.import_from (a file, a run folder or a folder of run folders) into the store;
  trajectories that name no experiment get config.import_experiment.

  Raises:
    DistillError: import_from is empty or does not exist, a file is not a mini-swe-agent
      trajectory, or none was found (all read before the store is opened, so a failed import
      leaves no store or run folder behind).
  """
  if not config.import_from:
    raise DistillError("set --config.import_from=FOLDER (mini-swe-agent trajectory folders)")
  if not os.path.exists(config.import_from):
    raise DistillError(f"import_from: {config.import_from!r} does not exist; expected a "
                       "mini-swe-agent *.traj.json file, run folder or folder of run folders")
  try:
    trajectories = data.import_miniswe(config.import_from,
                                       experiment=config.import_experiment or None)
  except data.TrajectoryFormatError as e:
    raise DistillError(f"import_from: {e}") from e
  with data.TrajectoryStore(store_path(config)) as store:
    for trajectory in trajectories:
      store.append_trajectory(trajectory)
  tasks = len({t.task_id for t in trajectories})
  print(f"imported {len(trajectories)} trajectories of {tasks} tasks from {config.import_from} "
        f"into {store_path(config)}")
  return trajectories
