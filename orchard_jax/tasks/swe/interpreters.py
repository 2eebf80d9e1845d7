"""Python interpreters for task environments: find one by version, copy what a sandbox may see.

An instance's environment needs a given CPython "MAJOR.MINOR". The default is the root
filesystem's own Debian python3; any other version comes from this machine (pyenv's
`$PYENV_ROOT/versions/X.Y.Z`, or a `pythonX.Y` under /usr/local/bin or /usr/bin). Such an
interpreter enters a task image as a read-only bind of a *copy of its prefix*, not the host's
folder itself: the copy leaves out site-packages (the host's installed packages, where a released
copy of a fix may sit), the standard library's own test suite, and the bundled pip/setuptools
wheels. The copy is mounted at the prefix's own path, so the interpreter, its shared library
(found through an absolute rpath) and venvs made from it work unchanged. Files are hard-linked
when the cache is on the same filesystem, so a copy costs no space.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess

from orchard_jax.tasks.errors import BuildError

# Left out of an interpreter copy: installed packages (leaks), and large parts no test needs.
_EXCLUDED = ("site-packages", "dist-packages", "test", "tests", "idlelib", "turtledemo",
             "ensurepip/_bundled", "lib2to3/tests", "tkinter", "__pycache__")
_COPY_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Interpreter:
  """A CPython interpreter on this machine.

  Attributes:
    version: "MAJOR.MINOR.MICRO" as the interpreter reports it.
    executable: absolute path of `pythonX.Y` on the host.
    prefix: its installation prefix (sys.base_prefix); "" for the root filesystem's own.
  """
  version: str
  executable: str
  prefix: str

  @property
  def minor(self) -> str:
    return ".".join(self.version.split(".")[:2])


def _pyenv_root() -> str:
  return os.environ.get("PYENV_ROOT") or os.path.join(os.path.expanduser("~"), ".pyenv")


def _version_key(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def available() -> dict[str, Interpreter]:
  """The CPython interpreters found here, newest micro release per "MAJOR.MINOR"."""
  found: dict[str, Interpreter] = {}
  candidates = []
  for folder in glob.glob(os.path.join(_pyenv_root(), "versions", "*")):
    name = os.path.basename(folder)
    if re.fullmatch(r"\d+\.\d+\.\d+", name):   # plain CPython builds, not envs or pypy
      minor = ".".join(name.split(".")[:2])
      exe = os.path.join(folder, "bin", f"python{minor}")
      if os.path.exists(exe):
        candidates.append((name, exe, folder))
  for folder in ("/usr/local/bin", "/usr/bin"):
    for exe in glob.glob(os.path.join(folder, "python[23].*")):
      if re.fullmatch(r"python\d\.\d+", os.path.basename(exe)):
        candidates.append((None, exe, os.path.dirname(folder)))
  for version, exe, prefix in candidates:
    version = version or _query_version(exe)
    if version is None:
      continue
    minor = ".".join(version.split(".")[:2])
    if minor not in found or _version_key(version) > _version_key(found[minor].version):
      found[minor] = Interpreter(version, exe, prefix)
  return found


def _query_version(exe: str) -> str | None:
  try:
    out = subprocess.run([exe, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                         capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def find(minor: str, *, needed_by: str = "") -> Interpreter:
  """The interpreter for "MAJOR.MINOR".

  Raises:
    BuildError: none is installed; one line naming the version, who needs it, and how to
      install it.
  """
  found = available()
  if minor in found:
    return found[minor]
  who = f" (needed by {needed_by})" if needed_by else ""
  have = ", ".join(sorted(found, key=_version_key)) or "none"
  raise BuildError(f"Python {minor} is not installed here{who}; found {have}. Install it with "
                   f"`pyenv install {minor}` (or `apt-get install python{minor}` where Debian "
                   f"has it) and build again")


def sandbox_copy(interpreter: Interpreter, cache: str) -> str:
  """A copy of the interpreter's prefix for task images (see the module docstring).

  Args:
    interpreter: a pyenv-style interpreter with its own prefix (not /usr: the root filesystem
      already has its own interpreter there).
    cache: folder under the image roots that holds the copies.

  Returns:
    The copy's absolute path; bind it read-only at `interpreter.prefix`.

  Raises:
    BuildError: the prefix is /usr or /usr/local (those are not copied: use the root
      filesystem's interpreter), or copying failed.
  """
  prefix = os.path.realpath(interpreter.prefix)
  if prefix in ("/usr", "/usr/local", "/"):
    raise BuildError(f"{interpreter.executable} lives in {prefix}, which a task image does not "
                     f"copy; install Python {interpreter.minor} with pyenv instead")
  dest = os.path.join(cache, f"cpython-{interpreter.version}")
  record = os.path.join(dest, ".orchard_copy.json")
  if os.path.exists(record):
    return dest
  tmp = f"{dest}.tmp{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)

  def ignore(folder, names):
    rel = os.path.relpath(folder, prefix)
    skipped = set()
    for name in names:
      path = os.path.normpath(os.path.join(rel, name))
      if name in _EXCLUDED and rel.startswith("lib") or any(
          path.endswith("/" + e) for e in _EXCLUDED if "/" in e):
        skipped.add(name)
    return skipped

  def link_or_copy(src, dst):
    try:
      os.link(src, dst)
    except OSError:
      shutil.copy2(src, dst)

  try:
    shutil.copytree(prefix, tmp, symlinks=True, ignore=ignore, copy_function=link_or_copy)
    for sub in glob.glob(os.path.join(tmp, "lib", "python*")):   # empty site-packages: venvs
      os.makedirs(os.path.join(sub, "site-packages"), exist_ok=True)   # and site.py expect it
  except OSError as e:
    shutil.rmtree(tmp, ignore_errors=True)
    raise BuildError(f"could not copy the Python {interpreter.version} prefix {prefix}: {e}") from e
  with open(os.path.join(tmp, ".orchard_copy.json"), "w") as f:
    json.dump({"version": interpreter.version, "prefix": prefix, "format": _COPY_FORMAT}, f)
  try:
    os.rename(tmp, dest)
  except OSError:            # another builder finished first
    shutil.rmtree(tmp, ignore_errors=True)
  return dest
