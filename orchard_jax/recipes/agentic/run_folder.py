"""A run's folder, left behind only when the run put something in it.

A run that fails before producing anything (a task-set path that does not exist, a teacher that
cannot load) should not leave an empty `runs/<name>` folder that looks like a run. The folder
is removed only when this run created it and it still holds no file: at most empty folders the
run made itself (an unused trajectory store's `model_calls/` and `trajectories/`). A folder that
existed before the run, or that holds any file or link, is never touched; removal uses
`os.rmdir`, which cannot delete a file.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


def create_run_folder(path: str) -> bool:
  """Creates `path` (and its parents) if missing.

  Returns:
    True when this call created `path`; only then may `remove_if_empty` remove it later.
  """
  created = not os.path.lexists(path)
  os.makedirs(path, exist_ok=True)
  return created


def remove_if_empty(path: str) -> bool:
  """Removes `path` when it holds no file or link, only (possibly nested) empty folders.

  Returns:
    True when `path` was removed; False when it holds anything (nothing is removed then) or
    a folder in it could not be removed (e.g. a file appeared meanwhile).
  """
  if not os.path.isdir(path) or os.path.islink(path):
    return False
  folders = []
  for root, dirs, files in os.walk(path, topdown=False):
    if files or any(os.path.islink(os.path.join(root, d)) for d in dirs):
      return False
    folders.append(root)
  try:
    for folder in folders:                     # deepest first; rmdir refuses a non-empty one
      os.rmdir(folder)
  except OSError:
    return False
  return True


@contextlib.contextmanager
def run_folder(path: str) -> Iterator[str]:
  """Creates `path` for the body; when the body raises (an error or Ctrl-C) and this call
  created the folder, removes it if it still holds no file (module docstring)."""
  created = create_run_folder(path)
  try:
    yield path
  except BaseException:
    if created:
      remove_if_empty(path)
    raise
