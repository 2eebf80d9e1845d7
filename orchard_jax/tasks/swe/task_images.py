"""Per-instance task images: a shared root filesystem, shared read-only binds, and a workspace
seed that holds the instance's base commit and nothing else.

SWE-bench gives each instance its own image (an environment image per repository version, and
an instance layer on top with the repository at `base_commit`). The same here, as image
directories (docs/contracts.md "Env images"):

  <cache>/swe/instances/<instance_id>/
    image.json   base "rootfs" (the Debian root filesystem, `rootfs.py`), read-only binds of
                 the environment's venv at /venv and, for a non-default Python, of the
                 interpreter's copy at its own prefix; workspace seed "seed"
    seed/        a git repository with exactly one commit, `base_commit` itself (a shallow
                 fetch: the commit's real hash, its tree, no parent objects, no other ref), so
                 `git rev-parse HEAD` proves the commit and `git log --all` shows no fix

Everything a sandbox can read is therefore the root filesystem, the binds and the seed; the
leak scan (`leak_scan.py`) checks exactly these before an instance is kept.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Mapping

from orchard_jax.env.images import write_image_manifest
from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe.environment import IGNORED, cache_dir, git

WORKDIR = "/testbed"


def instances_dir() -> str:
  """`<cache>/swe/instances`: one image directory per instance."""
  return os.path.join(cache_dir(), "instances")


def instance_image_dir(instance_id: str, root: str | None = None) -> str:
  """The image directory of one instance (the id made safe as a folder name)."""
  safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in instance_id)
  return os.path.join(root or instances_dir(), safe)


def make_seed(source_repo: str, commit: str, dest: str, *,
              untracked: Mapping[str, str] | None = None) -> None:
  """Writes `dest`, a repository holding only `commit`, checked out on branch main.

  Args:
    source_repo: a git repository (bare or not) that has `commit`.
    commit: the full hash of the commit to seed.
    dest: the seed folder (replaced if it exists).
    untracked: {path in dest: host file or folder} copied into the work tree and listed in
      .git/info/exclude (build products an editable install left in the source tree, such as
      `pkg.egg-info`), so they never show up in a patch.

  Raises:
    BuildError: the commit is not in `source_repo`, or git failed.
  """
  tmp = f"{dest}.tmp{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  git(tmp, "init", "-q")
  proc = subprocess.run(["git", "-C", tmp, "fetch", "-q", "--depth=1", "--no-tags",
                         "file://" + os.path.abspath(source_repo), commit],
                        capture_output=True, text=True)
  if proc.returncode != 0:
    shutil.rmtree(tmp, ignore_errors=True)
    raise BuildError(f"commit {commit} is not in {source_repo}: {proc.stderr.strip()[-500:]}")
  git(tmp, "update-ref", "refs/heads/main", commit)
  git(tmp, "symbolic-ref", "HEAD", "refs/heads/main")
  git(tmp, "checkout", "-q", "-f", "main")
  for leftover in ("FETCH_HEAD", "ORIG_HEAD", "logs", "hooks", "description"):
    path = os.path.join(tmp, ".git", leftover)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)
  git(tmp, "config", "--unset-all", "remote.origin.url", check=False)
  excludes = list(IGNORED)
  for rel, src in (untracked or {}).items():
    target = os.path.join(tmp, rel)
    if os.path.lexists(target):     # tracked at this commit: the commit's own file wins
      continue
    if os.path.isdir(src):
      shutil.copytree(src, target, dirs_exist_ok=True)
    else:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copy2(src, target)
    excludes.append("/" + rel.strip("/"))   # per file: a generated file beside tracked ones
  with open(os.path.join(tmp, ".git", "info", "exclude"), "a") as f:
    f.write("\n".join(excludes) + "\n")
  _world_readable(tmp)
  shutil.rmtree(dest, ignore_errors=True)
  os.rename(tmp, dest)


def _world_readable(folder: str) -> None:
  # The sandbox user is not the builder (uid 65534 under a root service): everything the image
  # shows must be readable by all, or the workspace copy fails and no sandbox starts.
  for parent, dirs, files in os.walk(folder):
    for name in dirs:
      path = os.path.join(parent, name)
      if not os.path.islink(path):
        os.chmod(path, os.stat(path).st_mode | 0o755)
    for name in files:
      path = os.path.join(parent, name)
      if not os.path.islink(path):
        mode = os.stat(path).st_mode
        os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))


def write_instance_image(folder: str, *, rootfs: str, binds: Mapping[str, str],
                         env: Mapping[str, str], seed_source: str, base_commit: str,
                         untracked: Mapping[str, str] | None = None) -> str:
  """Writes one instance's image directory (see the module docstring) and returns its path.

  Args:
    folder: the image directory.
    rootfs: the root filesystem folder (absolute, under the image roots).
    binds: {absolute host folder: mount point}, read-only (venv, interpreter copy).
    env: environment variables of every command.
    seed_source: the repository that has `base_commit`.
    base_commit: the instance's base commit.
    untracked: see `make_seed`.
  """
  os.makedirs(folder, exist_ok=True)
  make_seed(seed_source, base_commit, os.path.join(folder, "seed"), untracked=untracked)
  write_image_manifest(folder, base="rootfs", rootfs=rootfs, binds=dict(binds), workdir=WORKDIR,
                       env=dict(env), workspace_seed="seed")
  os.chmod(folder, 0o755)
  return folder


def temporary_worktree(repo: str, commit: str) -> str:
  """A plain folder holding `commit`'s tree (git archive), for installs and host test runs."""
  tree = tempfile.mkdtemp(prefix="orchard_tree_")
  archive = subprocess.run(["git", "-C", repo, "archive", commit], capture_output=True)
  if archive.returncode != 0:
    shutil.rmtree(tree, ignore_errors=True)
    raise BuildError(f"git archive {commit} failed in {repo}: {archive.stderr.decode()[-500:]}")
  subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
  return tree


def interpreter_binds(executable: str) -> dict[str, str]:
  """Read-only binds that make the interpreter `executable` run in a task sandbox.

  Debian's interpreters under /usr/bin are part of the root filesystem (nothing to bind); any
  other (pyenv's) is bound as a copy of its prefix without site-packages, at its own prefix
  (`interpreters.sandbox_copy`).

  Raises:
    BuildError: the interpreter cannot be used (see `interpreters.sandbox_copy`).
  """
  real = os.path.realpath(executable)
  if real.startswith("/usr/bin/"):
    return {}
  from orchard_jax.tasks.swe import interpreters
  out = subprocess.run([executable, "-c", "import sys; print(sys.base_prefix); "
                        "print('%d.%d.%d' % sys.version_info[:3])"],
                       capture_output=True, text=True)
  if out.returncode != 0:
    raise BuildError(f"{executable} does not run: {out.stderr.strip()[-300:]}")
  prefix, version = out.stdout.split()
  copy = interpreters.sandbox_copy(interpreters.Interpreter(version, executable, prefix),
                                   os.path.join(cache_dir(), "pythons"))
  return {copy: os.path.realpath(prefix)}
