"""A run's folder, left behind only when the run put something in it.

A run that fails before producing anything (a task-set path that does not exist, a teacher that
cannot load) should not leave an empty `runs/<name>` folder that looks like a run. The folder
is removed only when this run created it and it still holds no file: at most empty folders the
run made itself (an unused trajectory store's `model_calls/` and `trajectories/`). A folder that
existed before the run, or that holds any file or link, is never touched; removal uses
`os.rmdir`, which cannot delete a file. A training run's own saved config (config.yaml, written
first; run_config.py) is the one file that does not count as something it produced.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from ml_collections import ConfigDict

from orchard_jax.recipes.agentic import run_config


def create_run_folder(path: str) -> bool:
  """Creates `path` (and its parents) if missing.

  Returns:
    True when this call created `path`; only then may `remove_if_empty` remove it later.
  """
  created = not os.path.lexists(path)
  os.makedirs(path, exist_ok=True)
  return created


def remove_if_empty(path: str, ignore: tuple[str, ...] = ()) -> bool:
  """Removes `path` when it holds no file or link, only (possibly nested) empty folders.

  Args:
    ignore: names of files directly in `path` that do not count (the run's own saved config):
      removed with the folder.
  Returns:
    True when `path` was removed; False when it holds anything (nothing is removed then) or
    a folder in it could not be removed (e.g. a file appeared meanwhile).
  """
  if not os.path.isdir(path) or os.path.islink(path):
    return False
  folders, own = [], []
  for root, dirs, files in os.walk(path, topdown=False):
    if root == path:
      own = [f for f in files if f in ignore and not os.path.islink(os.path.join(root, f))]
    if len(files) > len(own if root == path else ()) or any(
        os.path.islink(os.path.join(root, d)) for d in dirs):
      return False
    folders.append(root)
  try:
    for name in own:
      os.remove(os.path.join(path, name))
    for folder in folders:                     # deepest first; rmdir refuses a non-empty one
      os.rmdir(folder)
  except OSError:
    return False
  return True


@contextlib.contextmanager
def run_folder(path: str, config: Optional[ConfigDict] = None) -> Iterator[str]:
  """Creates `path` for the body; when the body raises (an error or Ctrl-C) and this call
  created the folder, removes it if it still holds no file (module docstring).

  With `config` (a run that resumes from the folder), first refuses a folder holding another
  run (run_config.check_resume, raising RunFolderMismatch) and saves `config` there; that
  saved config alone does not keep the folder."""
  if config is not None:
    run_config.check_resume(config, path)
  created = create_run_folder(path)
  try:
    if config is not None:
      run_config.save_config(config, path)
    yield path
  except BaseException:
    if created:
      remove_if_empty(path, ignore=(run_config.CONFIG_FILE,))
    raise
