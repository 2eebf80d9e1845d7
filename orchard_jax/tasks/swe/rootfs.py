"""The base of every SWE task image: a minimal Debian root filesystem, built once and cached.

A task sandbox must show only its own image: its root filesystem, its interpreter, its venv and
its workspace, never the host's /usr or /opt, where any package the host happens to carry
(a vendored copy under a cloud SDK, the trainer's own site-packages) can hold a released copy
of the very fix an instance asks for (docs/cases.md lists such leaks). So task images start from
a root filesystem built from Debian packages with `mmdebstrap` (the minbase variant plus the
tools the evaluator and the agent use: bash, git, patch, coreutils; Debian's python3 as the
default interpreter; and the shared libraries that other CPython builds link against).

The root filesystem lives under the cache folder, in a folder named by a hash of the package
list and the Debian suite, `~/.cache/orchard_jax/rootfs/<suite>-<hash>/root`, with a
`rootfs.json` record beside it. It is built into a temporary folder and renamed when complete,
under a file lock, so concurrent builders share one build and a reader never sees half a tree.
Packages come from the host's own apt sources (the package client's configured mirror).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time

from orchard_jax.tasks.errors import BuildError

# minbase has dpkg, apt, coreutils, bash, grep, sed, findutils, diffutils, tar, gzip.
DEBIAN_PACKAGES = (
    "bash", "coreutils", "git", "patch", "procps", "ca-certificates",
    "python3", "python3-venv",
    # What other CPython builds (pyenv's 2.7 ... 3.13) link their extension modules against.
    "libbz2-1.0", "libexpat1", "liblzma5", "libncursesw6", "libreadline8", "libtirpc3",
    "zlib1g", "libcrypt1", "libkeyutils1", "libffi8", "libsqlite3-0", "libssl3", "libuuid1",
    "libgdbm6",
)
# Documentation and translations are of no use to a task and a third of the size.
_DPKG_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*",
                  "/usr/share/info/*")
_ROOTFS_FORMAT = 1
_INSTALL_HINT = ("install it with `apt-get install mmdebstrap` (launch/install.sh does), or "
                 "point tasks.rootfs at an existing root filesystem folder")


@dataclasses.dataclass(frozen=True)
class RootFS:
  """A built root filesystem.

  Attributes:
    path: the folder that is `/` in a sandbox (absolute).
    suite: the Debian suite it was built from ("bookworm").
    packages: the packages asked for (their dependencies come too).
  """
  path: str
  suite: str
  packages: tuple[str, ...]

  @property
  def python(self) -> str:
    """The default interpreter inside it (Debian's python3), as a path inside the sandbox."""
    return "/usr/bin/python3"

  def python_version(self) -> str:
    """"MAJOR.MINOR" of the default interpreter (read from the files, nothing is run)."""
    target = os.readlink(os.path.join(self.path, "usr/bin/python3"))
    return target.removeprefix("python")


def rootfs_cache_dir() -> str:
  """`$XDG_CACHE_HOME/orchard_jax/rootfs` (or `~/.cache/orchard_jax/rootfs`)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "orchard_jax", "rootfs")


def host_suite() -> str:
  """The host's Debian (or Ubuntu) suite from /etc/os-release ("bookworm").

  Raises:
    BuildError: the host is not Debian-based (no VERSION_CODENAME).
  """
  fields = {}
  with contextlib.suppress(OSError), open("/etc/os-release") as f:
    for line in f:
      key, _, value = line.strip().partition("=")
      fields[key] = value.strip('"')
  suite = fields.get("VERSION_CODENAME")
  if not suite:
    raise BuildError("the task images' root filesystem is built from Debian packages and this "
                     "host has no VERSION_CODENAME in /etc/os-release; point tasks.rootfs at a "
                     "root filesystem folder instead")
  return suite


def _apt_sources() -> str:
  # The host's configured sources, so no mirror is named here: deb822 first, then one-line.
  for folder in ("/etc/apt/sources.list.d",):
    if os.path.isdir(folder):
      found = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                     if f.endswith((".sources", ".list")))
      if found:
        return found[0]
  if os.path.exists("/etc/apt/sources.list"):
    return "/etc/apt/sources.list"
  raise BuildError("no apt sources on this host (/etc/apt/sources.list[.d]); mmdebstrap needs "
                   "one to know where Debian's packages come from")


def build_rootfs(packages: tuple[str, ...] = DEBIAN_PACKAGES, *, suite: str | None = None,
                 cache: str | None = None, timeout_s: float = 1800) -> RootFS:
  """Builds (or reuses) the root filesystem of `packages` on Debian `suite`.

  Args:
    packages: Debian packages installed on top of the minbase variant.
    suite: Debian suite; default the host's own, so interpreters built on the host find the
      shared libraries they were linked against.
    cache: parent folder; default `rootfs_cache_dir()`.
    timeout_s: limit of the mmdebstrap run, seconds.

  Returns:
    The RootFS (about 220 MB, 60-120 s to build the first time).

  Raises:
    BuildError: mmdebstrap is missing (with the install command) or failed (with its output).
  """
  suite = suite or host_suite()
  packages = tuple(sorted(set(packages)))
  key = hashlib.sha256(json.dumps([suite, packages, _DPKG_EXCLUDES, _ROOTFS_FORMAT]).encode()
                       ).hexdigest()[:12]
  folder = os.path.join(cache or rootfs_cache_dir(), f"{suite}-{key}")
  root, record = os.path.join(folder, "root"), os.path.join(folder, "rootfs.json")
  if os.path.exists(record):
    return RootFS(root, suite, packages)
  os.makedirs(folder, exist_ok=True)
  with _lock(os.path.join(folder, ".lock")):
    if os.path.exists(record):            # built by another process while we waited
      return RootFS(root, suite, packages)
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
      raise BuildError(f"the task images' root filesystem needs mmdebstrap, which is not "
                       f"installed: {_INSTALL_HINT}")
    tmp = os.path.join(folder, f"root.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    argv = [mmdebstrap, "--variant=minbase", "--quiet",
            "--mode=" + ("root" if os.geteuid() == 0 else "unshare"),
            "--include=" + ",".join(packages),
            *[f"--dpkgopt=path-exclude={p}" for p in _DPKG_EXCLUDES],
            suite, tmp, _apt_sources()]
    start = time.monotonic()
    try:
      proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
      shutil.rmtree(tmp, ignore_errors=True)
      raise BuildError(f"mmdebstrap ran past {timeout_s:.0f} s building {folder}") from None
    if proc.returncode != 0:
      shutil.rmtree(tmp, ignore_errors=True)
      raise BuildError(f"mmdebstrap failed (exit {proc.returncode}) building {folder}: "
                       f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    os.chmod(tmp, 0o755)
    os.rename(tmp, root)
    with open(record + ".tmp", "w") as f:
      json.dump({"suite": suite, "packages": packages, "format": _ROOTFS_FORMAT,
                 "seconds": round(time.monotonic() - start, 1)}, f, indent=1)
    os.replace(record + ".tmp", record)
  return RootFS(root, suite, packages)


@contextlib.contextmanager
def _lock(path: str):
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
