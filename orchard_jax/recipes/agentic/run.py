"""What every stage of one run shares: the run folder, tokenizer, mesh, trajectory store, the
domain's tasks and their train / held-out split.

A training stage's run (`resumes=True`) first checks the folder's saved config against its own
and saves its config there (run_config.py: a folder holding another run stops it). The run
folder is removed again on close (or a failure here) when this run created it and it still
holds no file but that config: a run that failed before producing anything leaves no empty
folder (run_folder.py).
"""
from __future__ import annotations

import json
import logging
import os
import zlib
from typing import Any, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes.agentic import run_config
from orchard_jax.recipes.agentic import policy, run_folder
from orchard_jax.recipes.agentic.domain import Domain


# Harnesses that run their own agent loop in the sandbox (SWE's and Claw's `agent.harness`).
EXTERNAL_HARNESSES = ("mini_swe_agent", "codex", "claude_code")


def run_dir(config: ConfigDict) -> str:
  """The run folder: config.workdir, or runs/<name>_<preset>, followed by _<harness> when
  agent.harness is an external one (EXTERNAL_HARNESSES).

  A run resumes from what its folder holds (SFT and RL checkpoints, the store), so the same
  experiment run under another harness must not share the folder: `--config.agent.harness=
  codex` and then `claude_code` would otherwise resume the Codex run's finished checkpoint
  and end at once, having run nothing under Claude Code."""
  if config.workdir:
    return config.workdir
  agent = config.get("agent")
  harness = str(agent.get("harness", "")) if agent is not None else ""
  suffix = f"_{harness}" if harness in EXTERNAL_HARNESSES else ""
  return os.path.join("runs", f"{config.name}_{config.preset}{suffix}")


def split_tasks(tasks: Sequence[Any], heldout_fraction: float, task_id
                ) -> tuple[list[Any], list[Any]]:
  """(train, held-out): a task is held out when crc32(task_id(task)) falls in the fraction, so
  the split does not change when tasks are added or reordered."""
  cut = int(round(float(heldout_fraction) * 10_000))
  train_set, heldout = [], []
  for task in tasks:
    (heldout if zlib.crc32(task_id(task).encode()) % 10_000 < cut else train_set).append(task)
  return train_set, heldout


class RunContext:
  """The shared state of one run of `domain` (module docstring).

  Attributes:
    config, domain: what the run was given.
    dir: the run folder.
    tokenizer, mesh: the policy's tokenizer and the device mesh.
    tasks: every task of the domain's set; train_all / heldout: their split by
      tasks.heldout_fraction.
    store: the run's `data.TrajectoryStore` (store.path, or <dir>/store).
  Args:
    resumes: the run resumes from what its folder holds (SFT, RL): the folder's saved config
      is checked and this run's saved (run_config.check_resume, run_config.save_config).
  Raises:
    ConfigError: policy.init names no checkpoint, engine sizes the embedded engine refuses,
      the folder holds another run (run_config.RunFolderMismatch), or the domain's task set
      cannot be loaded (checked in that order, before anything is built).
  """

  def __init__(self, config: ConfigDict, domain: Domain, *, resumes: bool = False):
    from orchard_jax import data, parallel
    from orchard_jax.recipes.agentic.serving import engine_config
    self.config = config
    self.domain = domain
    if config.policy.init:                   # a typo fails now, not after the task set
      policy.check_checkpoint(config.policy.init, field="policy.init")
    if not str(config.engine.urls).strip():  # the embedded engine's sizes, likewise
      engine_config(config.engine)
    self.dir = run_dir(config)
    if resumes:
      run_config.check_resume(config, self.dir)
    self._created_dir = run_folder.create_run_folder(self.dir)
    try:
      if resumes:
        run_config.save_config(config, self.dir)
      for name in ("httpx", "httpcore"):   # one INFO line per sandbox and model call otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
      self.store_path = config.store.path or os.path.join(self.dir, "store")
      self.tokenizer = policy.load_tokenizer(config.policy)
      self.mesh = parallel.make_mesh(config.mesh)
      self.tasks = list(domain.load_tasks())
      # A domain whose tasks come as a training set and an evaluation set says so itself
      # (`split_tasks(tasks) -> (train, heldout)`); others are split by a hash of the id.
      own_split = getattr(domain, "split_tasks", None)
      self.train_all, self.heldout = (own_split(self.tasks) if own_split is not None else
                                      split_tasks(self.tasks, config.tasks.heldout_fraction,
                                                  domain.task_id))
      self.store = data.TrajectoryStore(self.store_path)
    except BaseException:
      self._remove_dir_if_empty()
      raise

  def close(self) -> None:
    self.store.close()
    self._remove_dir_if_empty()

  def __enter__(self) -> "RunContext":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _remove_dir_if_empty(self) -> None:
    if self._created_dir:
      run_folder.remove_if_empty(self.dir, ignore=(run_config.CONFIG_FILE,))

  def task_ids(self, tasks: Sequence[Any]) -> list[str]:
    return [self.domain.task_id(t) for t in tasks]

  def progress_factory(self):
    """(total, description) -> a tqdm bar, or None when config.progress is off."""
    if not self.config.progress:
      return None
    from tqdm.auto import tqdm
    return lambda total, desc: tqdm(total=total, desc=desc, unit="rollout", leave=False,
                                    dynamic_ncols=True)

  def save_split(self, train: Sequence[Any], heldout: Sequence[Any]) -> None:
    """Writes <dir>/tasks.json: {"train": [task ids], "heldout": [task ids]}."""
    with open(os.path.join(self.dir, "tasks.json"), "w") as f:
      json.dump({"train": self.task_ids(train), "heldout": self.task_ids(heldout)}, f, indent=1)

  @staticmethod
  def load_split(folder: str) -> Optional[dict]:
    """The tasks.json a run wrote in `folder`, or None."""
    path = os.path.join(folder, "tasks.json")
    if os.path.exists(path):
      with open(path) as f:
        return json.load(f)
    return None

  def eval_splits(self, train_tasks: Sequence[Any], split_record: Optional[dict] = None
                  ) -> dict[str, list]:
    """{"train": the training subset, "heldout": held-out tasks} for eval.splits, each cut to
    eval.max_instances (0: all); with `split_record` (a run's tasks.json), that run's split."""
    c = self.config
    heldout = self.heldout
    if split_record:
      by_id = {self.domain.task_id(t): t for t in self.tasks}
      train_tasks = [by_id[i] for i in split_record["train"] if i in by_id]
      heldout = [by_id[i] for i in split_record["heldout"] if i in by_id]
    limit = int(c.eval.max_instances)
    splits = {"train": list(train_tasks), "heldout": list(heldout)}
    return {name: (items[:limit] if limit else items) for name, items in splits.items()
            if name in tuple(c.eval.splits)}
