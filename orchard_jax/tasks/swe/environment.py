"""One package environment: the sdist's repository, a venv with its test dependencies, and the
image directory (docs/contracts.md "Env images") that sandboxes start from.

Layout under the cache folder (`~/.cache/orchard_jax/swe/envs/<name>-<version>/`):

  venv/        a venv made from Debian's python3 (the one the task images' root filesystem
               has, `rootfs.py`) or another interpreter bound into the images, holding
               the test requirements only; the package itself is imported from the work tree
               through PYTHONPATH, so an edit in /testbed is what the tests see
  repo/        a git repository: the sdist as a root commit ("environment_setup_commit"), plus
               one root commit per task instance under refs/orchard/instances/*
  env.json     what was built (profile fingerprint, clean commit, python) to reuse the cache

The environment is not an image itself: each instance gets its own image directory
(`task_images.py`) whose workspace seed holds that instance's commit alone (this repository
also holds the clean sdist, the fix of every instance) and which binds this venv at /venv.

The same venv runs the tests on the host while tasks are built (with the host's paths), and in
sandboxes (at /venv, /testbed); its console scripts are rewritten to `#!/usr/bin/env python`
so both work.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe.packages import PackageProfile

# A top-level mount point: bubblewrap cannot create one inside the read-only host /opt.
SANDBOX_VENV = "/venv"
WORKDIR = "/testbed"
# Fixed identity and date: a commit made from the same tree always has the same hash.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "orchard", "GIT_AUTHOR_EMAIL": "orchard@localhost",
    "GIT_COMMITTER_NAME": "orchard", "GIT_COMMITTER_EMAIL": "orchard@localhost",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}
COMMIT_MESSAGE = "Initial commit"
# Files the tests or the agent create that never belong in a patch.
IGNORED = ("__pycache__/", "*.pyc", ".pytest_cache/", ".hypothesis/", ".coverage")
# Bumped whenever the environment layout changes, so cached environments are rebuilt.
ENV_FORMAT = 3
_SANDBOX_VISIBLE = ("/usr/", "/opt/")  # the local backend's "host" view shows these


def cache_dir() -> str:
  """The SWE tasks cache folder: $XDG_CACHE_HOME/orchard_jax/swe or ~/.cache/orchard_jax/swe."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "orchard_jax", "swe")


def git(repo: str, *args: str, env: dict | None = None, input: str | None = None,
        check: bool = True) -> str:
  """Runs git in `repo` with a fixed identity; returns stdout.

  Raises:
    BuildError: git exits non-zero and `check` (the message has git's stderr).
  """
  full_env = dict(os.environ, **GIT_IDENTITY, **(env or {}))
  proc = subprocess.run(["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false",
                         "-c", "init.defaultBranch=main", *args], cwd=repo, env=full_env,
                        input=input, capture_output=True, text=True)
  if check and proc.returncode != 0:
    raise BuildError(f"git {' '.join(args)} failed in {repo} (exit {proc.returncode}): "
                     f"{proc.stderr.strip()[:2000]}")
  return proc.stdout


def sandbox_python(preferred: str | None = None) -> str:
  """A Python interpreter that a local sandbox can run: the running one if it lives under /usr
  or /opt, else /usr/bin/python3 or /usr/local/bin/python3.

  Raises:
    BuildError: none is found (the message says what to install).
  """
  candidates = [preferred] if preferred else []
  candidates += [os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}."
                              f"{sys.version_info[1]}"), "/usr/bin/python3", "/usr/local/bin/python3"]
  for candidate in candidates:
    if candidate and os.path.exists(candidate) and (
        preferred or os.path.realpath(candidate).startswith(_SANDBOX_VISIBLE)):
      return candidate
  raise BuildError(f"no Python interpreter under {_SANDBOX_VISIBLE} for the sandboxed venv (tried "
                   f"{candidates}); install one, e.g. `apt-get install python3`")


def venv_sandbox_env(extra: dict | None = None) -> dict[str, str]:
  """The environment of every command in a task sandbox whose venv is at SANDBOX_VENV."""
  return {"PATH": f"{SANDBOX_VENV}/bin:/usr/local/bin:/usr/bin:/bin",
          "VIRTUAL_ENV": SANDBOX_VENV, "PYTHONDONTWRITEBYTECODE": "1",
          "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PAGER": "cat", "LC_ALL": "C.UTF-8",
          # The workspace may belong to another uid than the sandbox user: let git use it.
          "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
          "GIT_CONFIG_VALUE_0": "*", **(extra or {})}


@dataclasses.dataclass
class PackageEnvironment:
  """A built package environment (see the module docstring for the layout).

  Attributes:
    profile: the package profile it was built from.
    root: the image directory (absolute).
    clean_commit: the repository's root commit holding the unmodified sdist.
  """
  profile: PackageProfile
  root: str
  clean_commit: str

  @property
  def repo(self) -> str:
    return os.path.join(self.root, "repo")

  @property
  def venv(self) -> str:
    return os.path.join(self.root, "venv")

  @property
  def python(self) -> str:
    """The base interpreter the venv was made from (an absolute host path)."""
    return os.path.realpath(os.path.join(self.venv, "bin", "python"))

  def test_command(self, python: str = "python") -> str:
    """The pytest command (without targets) that prints SWE-bench-parsable `-rA` summaries."""
    return (f"{python} -m pytest -rA --tb=short -p no:cacheprovider {self.profile.pytest_args}"
            .strip())

  def sandbox_env(self) -> dict[str, str]:
    path_entry = WORKDIR + ("/" + self.profile.python_path if self.profile.python_path else "")
    return venv_sandbox_env({"PYTHONPATH": path_entry, **dict(self.profile.env)})

  def run_tests(self, workdir: str, targets, *, timeout_s: float) -> tuple[str, int, float]:
    """Runs the test command on the host in `workdir` (a copy of the repository).

    Returns:
      (log, exit code, seconds); exit code 124 means the run was killed at `timeout_s`.
    """
    python = os.path.join(self.venv, "bin", "python")
    env = dict(os.environ, **self.sandbox_env())
    env["PATH"] = f"{os.path.join(self.venv, 'bin')}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env["VIRTUAL_ENV"] = self.venv
    env["PYTHONPATH"] = os.path.join(workdir, self.profile.python_path)
    env.pop("PYTEST_ADDOPTS", None)
    command = f"{self.test_command(shlex.quote(python))} " + " ".join(shlex.quote(t) for t in targets)
    start = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command], cwd=workdir, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, errors="replace")
    try:
      out, _ = proc.communicate(timeout=timeout_s)
      code = proc.returncode
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, 9)
      out, _ = proc.communicate()
      code = 124
    return out, code, time.monotonic() - start


def build_environment(profile: PackageProfile, *, root: str | None = None,
                      python: str | None = None, pip_timeout_s: float = 600) -> PackageEnvironment:
  """Builds (or reuses from the cache) the environment of one package.

  Downloads the sdist with pip, unpacks it into a git repository, makes the venv and installs
  the test requirements into it, and writes image.json. A finished environment whose profile
  fingerprint matches is reused as it is.

  Args:
    profile: the package to build.
    root: the image directory; default `cache_dir()/envs/<name>-<version>`.
    python: base interpreter for the venv; default `sandbox_python()`.
    pip_timeout_s: limit for each pip call, in seconds.

  Raises:
    BuildError: a download, unpack, venv or install step failed (with the tool's output).
  """
  root = os.path.abspath(root or os.path.join(cache_dir(), "envs", profile.key))
  record_path = os.path.join(root, "env.json")
  if os.path.exists(record_path):
    with open(record_path) as f:
      record = json.load(f)
    if record.get("fingerprint") == profile.fingerprint() and record.get(
        "format") == ENV_FORMAT and os.path.isdir(
        os.path.join(root, "repo", ".git")):
      return PackageEnvironment(profile, root, record["clean_commit"])
  if os.path.exists(root):
    shutil.rmtree(root)
  os.makedirs(root)
  sdist = _download_sdist(profile, pip_timeout_s)
  repo = os.path.join(root, "repo")
  _unpack(sdist, repo)
  git(repo, "init", "-q")
  _write_excludes(repo)
  git(repo, "add", "-A")
  git(repo, "commit", "-q", "-m", COMMIT_MESSAGE)
  clean_commit = git(repo, "rev-parse", "HEAD").strip()
  git(repo, "update-ref", "refs/orchard/clean", clean_commit)
  base_python = sandbox_python(python)
  venv = os.path.join(root, "venv")
  _run([base_python, "-m", "venv", "--without-pip", venv], "create the venv", 120)
  _run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install",
        "-q", "--disable-pip-version-check", *profile.test_requirements],
       f"install {list(profile.test_requirements)} into {venv}", pip_timeout_s)
  _relocatable_scripts(venv)
  environment = PackageEnvironment(profile, root, clean_commit)
  with open(record_path, "w") as f:
    json.dump({"fingerprint": profile.fingerprint(), "format": ENV_FORMAT,
               "clean_commit": clean_commit,
               "python": base_python, "profile": dataclasses.asdict(profile)}, f, indent=1)
  return environment


def _write_excludes(repo: str):
  with open(os.path.join(repo, ".git", "info", "exclude"), "a") as f:
    f.write("\n".join(IGNORED) + "\n")


def _run(argv: list[str], what: str, timeout_s: float):
  try:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    raise BuildError(f"could not {what}: timed out after {timeout_s:.0f} s") from None
  if proc.returncode != 0:
    raise BuildError(f"could not {what} (exit {proc.returncode}): "
                     f"{(proc.stderr or proc.stdout).strip()[-3000:]}")
  return proc.stdout


def _download_sdist(profile: PackageProfile, timeout_s: float) -> str:
  folder = os.path.join(cache_dir(), "sdists")
  os.makedirs(folder, exist_ok=True)
  def find():
    stem = profile.name.replace("-", "_").lower()
    for path in glob.glob(os.path.join(folder, "*")):
      base = os.path.basename(path).lower().replace("-", "_")
      if base.startswith(f"{stem}_{profile.version}.") and base.endswith((".tar.gz", ".zip")):
        return path
    return None
  if (path := find()) is None:
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
          "--disable-pip-version-check", "-d", folder, f"{profile.name}=={profile.version}"],
         f"download the sdist of {profile.key}", timeout_s)
    if (path := find()) is None:
      raise BuildError(f"pip downloaded no sdist of {profile.key} into {folder}; found "
                       f"{sorted(os.listdir(folder))}")
  return path


def _unpack(archive: str, dest: str):
  tmp = dest + ".unpack"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  if archive.endswith(".zip"):
    with zipfile.ZipFile(archive) as z:
      z.extractall(tmp)
  else:
    with tarfile.open(archive) as t:
      t.extractall(tmp, filter="data")
  entries = os.listdir(tmp)
  if len(entries) != 1 or not os.path.isdir(os.path.join(tmp, entries[0])):
    raise BuildError(f"{archive}: expected one top-level folder, found {entries}")
  os.rename(os.path.join(tmp, entries[0]), dest)
  os.rmdir(tmp)


def _relocatable_scripts(venv: str):
  bin_dir = os.path.join(venv, "bin")
  for name in os.listdir(bin_dir):
    path = os.path.join(bin_dir, name)
    if os.path.islink(path) or not os.path.isfile(path):
      continue
    with open(path, "rb") as f:
      head = f.readline()
      rest = f.read()
    if head.startswith(b"#!") and b"python" in head:
      with open(path, "wb") as f:
        f.write(b"#!/usr/bin/env python\n" + rest)
