"""The leak scan: does anything a task sandbox can read hold a copy of the instance's fix?

A task is only a task while its answer is hidden. A released copy of the fixed file anywhere in
the image (a package's own site-packages, a vendored copy inside another package or a wheel,
the objects of a git repository that holds the fixing commit) lets an agent copy the answer,
and RL finds such shortcuts on its own. So before an instance is kept, the builders scan every
file its sandbox can read (the root filesystem, each read-only bind, the workspace seed) for the
fix, in three forms:

  text     a file of the same kind as a patched file (same suffix) that contains every hunk of
           the gold patch in its fixed form: the hunk's context and added lines, contiguous,
           compared line by line with trailing whitespace ignored. A hunk's fixed block with
           fewer than two non-blank lines is too generic to count, and one found within its own
           unfixed form (a whitespace-only change, lines deleted at a file's edge) proves
           nothing: both are left out; a patch with no countable block is not scanned as text.
  archive  the same test on the members of .whl / .zip / .egg archives.
  git      a git repository (a folder with HEAD and objects/) that has the fixed file's blob
           (the gold patch applied to `base_commit`, hashed as git does) as an object.

The result names each leak (instance, path as the sandbox sees it, form, patched file), so an
instance can be dropped or its image fixed, and the count goes into the build report.
"""
from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import tempfile
import zipfile
from typing import Iterable, Mapping, Sequence

from orchard_jax.env import images as env_images

_ARCHIVES = (".whl", ".zip", ".egg")
_MAX_BYTES = 4 << 20        # larger files are data, not source


@dataclasses.dataclass(frozen=True)
class FixedSource:
  """The fixed form of one file of a gold patch.

  Attributes:
    path: the file's path in the repository.
    blocks: each hunk's fixed block (context and added lines, trailing whitespace stripped),
      the countable ones only.
    blob: git's blob id of the whole fixed file, when the base was available; else "".
  """
  path: str
  blocks: tuple[tuple[str, ...], ...]
  blob: str = ""

  @property
  def suffix(self) -> str:
    return os.path.splitext(self.path)[1]


@dataclasses.dataclass(frozen=True)
class Leak:
  """One copy of a fix that a sandbox can read."""
  instance_id: str
  path: str          # as the sandbox sees it
  form: str          # "text", "archive" or "git"
  fixed_file: str    # the patched file it copies

  def __str__(self) -> str:
    return f"{self.path} ({self.form} copy of {self.fixed_file})"


def fixed_sources(patch: str, *, repo: str | None = None,
                  base_commit: str | None = None) -> list[FixedSource]:
  """The fixed forms of the files a gold patch changes (see the module docstring).

  Args:
    patch: the gold patch (unified diff, as `git diff` writes it).
    repo, base_commit: a git repository holding the base commit; with them each fixed file's
      blob id is computed as well (the patch applied to a temporary index).
  """
  files: dict[str, list[tuple[str, ...]]] = {}
  current, block, before, in_hunk = None, [], [], False

  def close():
    nonlocal block, before
    # A block found in its own unfixed form once trailing whitespace is ignored (a
    # whitespace-only hunk, lines deleted at a file's edge) is in the workspace already.
    if (current is not None and block and sum(1 for l in block if l.strip()) >= 2
        and "\n" + "\n".join(block) + "\n" not in "\n" + "\n".join(before) + "\n"):
      files.setdefault(current, []).append(tuple(block))
    block, before = [], []

  for line in patch.splitlines():
    if line.startswith("diff --git "):
      close()
      current, in_hunk = None, False
    elif line.startswith("+++ ") and not in_hunk:
      target = line[4:].strip().split("\t")[0]
      current = None if target == "/dev/null" else target.removeprefix("b/")
      if current is not None:
        files.setdefault(current, [])
    elif line.startswith("@@"):
      close()
      in_hunk = current is not None
    elif in_hunk and line[:1] in (" ", "+", "-"):
      if line[:1] != "-":
        block.append(line[1:].rstrip())
      if line[:1] != "+":
        before.append(line[1:].rstrip())
    elif in_hunk and line.startswith("\\"):
      continue
  close()
  blobs = _fixed_blobs(repo, base_commit, patch, list(files)) if repo and base_commit else {}
  return [FixedSource(path, tuple(blocks), blobs.get(path, ""))
          for path, blocks in files.items() if blocks or blobs.get(path)]


def _fixed_blobs(repo: str, base_commit: str, patch: str, paths: list[str]) -> dict[str, str]:
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "index"))
    def run(*args, data=None):
      return subprocess.run(["git", "-C", repo, *args], env=env, input=data,
                            capture_output=True, text=True)
    if run("read-tree", base_commit).returncode != 0:
      return {}
    if run("apply", "--cached", "-", data=patch).returncode != 0:
      return {}
    out = run("ls-files", "-s", "--", *paths).stdout
  blobs = {}
  for line in out.splitlines():
    meta, _, path = line.partition("\t")
    blobs[path] = meta.split()[1]
  return blobs


def _lines(text: str) -> str:
  return "\n" + "\n".join(l.rstrip() for l in text.splitlines()) + "\n"


def _copies(text: str, fix: FixedSource) -> bool:
  if not fix.blocks:
    return False
  longest = [max(b, key=len) for b in fix.blocks]
  if not all(l.strip() in text for l in longest):      # cheap test first
    return False
  lines = _lines(text)
  return all("\n" + "\n".join(b) + "\n" in lines for b in fix.blocks)


def scan_trees(trees: Sequence[tuple[str, str]], fixes: Mapping[str, Sequence[FixedSource]]
               ) -> list[Leak]:
  """Scans host folders for copies of many instances' fixes, reading each file once.

  Args:
    trees: (host folder, where the sandbox sees it) pairs.
    fixes: {instance_id: its FixedSources}.

  Returns:
    Every leak found, in walk order.
  """
  by_suffix: dict[str, list[tuple[str, FixedSource]]] = {}
  blobs: dict[str, list[tuple[str, FixedSource]]] = {}
  for instance_id, sources in fixes.items():
    for fix in sources:
      if fix.blocks:
        by_suffix.setdefault(fix.suffix, []).append((instance_id, fix))
      if fix.blob:
        blobs.setdefault(fix.blob, []).append((instance_id, fix))
  leaks: list[Leak] = []
  for host, shown in trees:
    for parent, dirs, files in os.walk(host):
      if parent == host and shown == "/":      # a root filesystem's device and kernel folders
        dirs[:] = [d for d in dirs if d not in ("dev", "proc", "sys")]
      where = os.path.join(shown, os.path.relpath(parent, host)).replace("/./", "/")
      if blobs and "HEAD" in files and "objects" in dirs:
        leaks += _git_leaks(parent, where, blobs)
      for name in files:
        suffix = os.path.splitext(name)[1]
        path = os.path.join(parent, name)
        if os.path.islink(path):
          continue
        if suffix in by_suffix:
          text = _read(path)
          if text is not None:
            leaks += [Leak(i, os.path.normpath(os.path.join(where, name)), "text", f.path)
                      for i, f in by_suffix[suffix] if _copies(text, f)]
        elif suffix in _ARCHIVES and by_suffix:
          leaks += _archive_leaks(path, os.path.normpath(os.path.join(where, name)), by_suffix)
  return leaks


def _read(path: str) -> str | None:
  try:
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:   # never /dev/zero
      return None
    with open(path, "rb") as f:
      return f.read().decode("utf-8", errors="replace")
  except OSError:
    return None


def _archive_leaks(path, shown, by_suffix) -> list[Leak]:
  found = []
  try:
    if not stat.S_ISREG(os.stat(path).st_mode):
      return found
    with zipfile.ZipFile(path) as archive:
      for member in archive.infolist():
        suffix = os.path.splitext(member.filename)[1]
        if suffix not in by_suffix or member.file_size > _MAX_BYTES:
          continue
        text = archive.read(member).decode("utf-8", errors="replace")
        found += [Leak(i, f"{shown}!{member.filename}", "archive", f.path)
                  for i, f in by_suffix[suffix] if _copies(text, f)]
  except (OSError, zipfile.BadZipFile):
    pass
  return found


def _git_leaks(git_dir, shown, blobs) -> list[Leak]:
  proc = subprocess.run(["git", "--git-dir", git_dir, "cat-file", "--batch-check"],
                        input="\n".join(blobs) + "\n", capture_output=True, text=True)
  present = {line.split()[0] for line in proc.stdout.splitlines()
             if line and not line.endswith("missing")}
  return [Leak(i, shown, "git", f.path) for blob in present for i, f in blobs.get(blob, ())]


def image_trees(image: str, allowed_roots: Iterable[str]) -> list[tuple[str, str]]:
  """What a sandbox of `image` can read: (host folder, path in the sandbox) pairs.

  For an image directory these are its root filesystem (or, for a layer over the host, the
  host's system folders), each bind, and the workspace seed (seen at the workspace).
  """
  spec = env_images.resolve_image(image, allowed_roots=list(allowed_roots))
  trees = []
  if spec.kind == "rootfs":
    trees.append((spec.root, "/"))
  elif spec.kind in ("host", "layer"):
    trees += [(d, d) for d in ("/usr", "/opt") if os.path.isdir(d)]
  trees += list(spec.binds)
  if spec.workspace_seed:
    trees.append((spec.workspace_seed, spec.workdir))
  return trees


def scan_instances(instances: Sequence, fixes: Mapping[str, Sequence[FixedSource]], *,
                   allowed_roots: Iterable[str]) -> dict[str, list[Leak]]:
  """Scans each instance's image for its own fix; shared folders are read once.

  Args:
    instances: SWEInstances with a test_spec whose image is an image directory.
    fixes: {instance_id: FixedSources} (from `fixed_sources`).
    allowed_roots: the image roots the sandbox service allows.

  Returns:
    {instance_id: leaks} for the instances with at least one leak.
  """
  roots = list(allowed_roots)
  groups: dict[tuple, dict[str, Sequence[FixedSource]]] = {}
  for instance in instances:
    if instance.test_spec is None or not instance.test_spec.image.startswith("/"):
      continue
    for tree in image_trees(instance.test_spec.image, roots):
      groups.setdefault(tree, {})[instance.instance_id] = fixes.get(instance.instance_id, ())
  found: dict[str, list[Leak]] = {}
  for tree, group in groups.items():
    for leak in scan_trees([tree], group):
      found.setdefault(leak.instance_id, []).append(leak)
  return found
