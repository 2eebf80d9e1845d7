"""Environments for any repository at any commit: SWE-bench-format instances in, graded images out.

For a dataset of SWE-bench instances (SWE-bench Verified, SWE-Gym, SWE-smith, your own file):
  1. each repository is cloned once (bare) into the cache, from a local mirror folder or a URL
     template (`RepoSource`), and fetched again only when a commit is missing;
  2. each (repository, version) gets one environment, as SWE-bench's environment images do: the
     repository at `environment_setup_commit` (the instance's `base_commit` when unset) is
     installed into a venv made from the Python its spec names (`repo_specs.py`: a specs file,
     else inferred), with the test requirements;
  3. each instance gets its image directory (`task_images.py`): the Debian root filesystem, the
     venv at /venv, the interpreter when not the default, and a workspace seed holding only
     `base_commit`; its `test_spec` names the test files its test patch touches, the spec's test
     command and SWE-bench's log parser for the repository;
  4. the leak scan (`leak_scan.py`) drops an instance whose fix its sandbox could read.
Environments are built in parallel, each once (a finished one is reused by the next run: the
build is resumable); instances whose image is complete are not written again. Each instance ends
`built`, `error` (with why: a missing commit, a failed install, a missing interpreter) or
`leak`; `DatasetBuild.summary()` counts them and `build_report.jsonl` lists them.

The venv is built on the host, where pip reaches the package index with the machine's own
settings, and then made relocatable: the source tree's host path becomes /testbed in what the
editable install wrote, and console scripts start with `#!/usr/bin/env python`. The
interpreter is bound at its own prefix, so the venv's `home` stays valid.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import subprocess
import threading
import time
from typing import Sequence

from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe import interpreters, leak_scan, repo_specs, rootfs, task_images
from orchard_jax.tasks.swe.environment import (SANDBOX_VENV, _relocatable_scripts, cache_dir,
                                               git, venv_sandbox_env)
from orchard_jax.tasks.swe.instance import SWEInstance, TestSpec, save_instances

DEFAULT_URL_TEMPLATE = "https://github.com/{repo}.git"
_ENV_FORMAT = 2
BUILT, ERROR, LEAK = "built", "error", "leak"


@dataclasses.dataclass(frozen=True)
class RepoSource:
  """Where repositories come from.

  Attributes:
    mirrors: a folder of local git repositories (bare or not), one per "owner/name", found as
      `<mirrors>/<owner>/<name>[.git]`, `<mirrors>/<owner>__<name>[.git]` or
      `<mirrors>/<owner>+<name>[/repo]`; "" to use `url_template` only.
    url_template: a git URL with `{repo}` (or `{owner}` and `{name}`); used when no mirror has
      the repository.
  """
  mirrors: str = ""
  url_template: str = DEFAULT_URL_TEMPLATE

  def locate(self, repo: str) -> str:
    """The mirror folder or URL to clone `repo` from."""
    owner, _, name = repo.partition("/")
    if self.mirrors:
      for candidate in (f"{owner}/{name}", f"{owner}/{name}.git", f"{owner}__{name}",
                        f"{owner}__{name}.git", f"{owner}+{name}/repo", f"{owner}+{name}"):
        path = os.path.join(self.mirrors, candidate)
        if os.path.isdir(path) and (os.path.exists(os.path.join(path, "HEAD"))
                                    or os.path.isdir(os.path.join(path, ".git"))):
          return os.path.abspath(path)
    if not self.url_template:
      raise BuildError(f"no mirror of {repo} under {self.mirrors!r} and no URL template")
    return self.url_template.format(repo=repo, owner=owner, name=name)


@dataclasses.dataclass(frozen=True)
class DatasetSettings:
  """Knobs of one dataset build (from the experiment config's `tasks` block).

  Attributes:
    source: where repositories come from.
    specs: a specs file (`repo_specs.py`), "" to infer every spec.
    workers: environments built at once.
    test_timeout_s: limit of one test run in the instances' test_spec, seconds.
    rootfs: the root filesystem folder ("" builds the Debian one).
    pip_timeout_s: limit of each install step, seconds.
  """
  source: RepoSource = RepoSource()
  specs: str = ""
  workers: int = 2
  test_timeout_s: float = 300.0
  rootfs: str = ""
  pip_timeout_s: float = 900.0


@dataclasses.dataclass
class InstanceReport:
  """What became of one instance: `status` built / error / leak, and why."""
  instance_id: str
  status: str
  environment: str = ""
  python: str = ""
  reason: str = ""
  seconds: float = 0.0


@dataclasses.dataclass
class DatasetBuild:
  """The instances with their test_spec filled (only `built` ones), and the per-instance report."""
  instances: list[SWEInstance]
  reports: list[InstanceReport]
  path: str = ""

  @property
  def counts(self) -> dict[str, int]:
    counts = collections.Counter(r.status for r in self.reports)
    return {s: counts.get(s, 0) for s in (BUILT, ERROR, LEAK)}

  def summary(self) -> str:
    """Counts, the environments and, for each instance not built, why."""
    counts = self.counts
    envs = collections.Counter((r.environment, r.python) for r in self.reports if r.environment)
    lines = [f"dataset build: {len(self.reports)} instances: built {counts[BUILT]}, error "
             f"{counts[ERROR]}, dropped by the leak scan {counts[LEAK]}"
             + (f" (instances in {self.path})" if self.path else "")]
    lines += [f"  environment {e} (Python {p}): {n} instance(s)" for (e, p), n in sorted(envs.items())]
    lines += [f"  {r.status:5s} {r.instance_id}: {r.reason}" for r in self.reports
              if r.status != BUILT]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- repositories

_locks: dict[str, threading.Lock] = collections.defaultdict(threading.Lock)


def clone(repo: str, source: RepoSource, commits: Sequence[str] = ()) -> str:
  """The cached bare clone of `repo`, fetched again if any of `commits` is missing.

  Raises:
    BuildError: cloning or fetching failed, or a commit is still missing afterwards.
  """
  dest = os.path.join(cache_dir(), "repos", repo.replace("/", "__") + ".git")
  with _locks[dest]:
    if not os.path.isdir(dest):
      origin = source.locate(repo)
      tmp = f"{dest}.tmp{os.getpid()}"
      shutil.rmtree(tmp, ignore_errors=True)
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      # --no-hardlinks: a clone of a local mirror would share its files' modes (some are 0600).
      proc = subprocess.run(["git", "clone", "-q", "--bare", "--no-hardlinks", origin, tmp],
                            capture_output=True, text=True)
      if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"could not clone {repo} from {origin}: {proc.stderr.strip()[-500:]}")
      os.rename(tmp, dest)
    missing = _missing(dest, commits)
    if missing:
      git(dest, "fetch", "-q", "origin", "+refs/*:refs/*", check=False)
      missing = _missing(dest, commits)
      if missing:
        raise BuildError(f"{repo}: commit(s) {missing[:3]} are not in {source.locate(repo)}")
  return dest


def _missing(repo: str, commits: Sequence[str]) -> list[str]:
  if not commits:
    return []
  proc = subprocess.run(["git", "-C", repo, "cat-file", "--batch-check"],
                        input="".join(f"{c}^{{commit}}\n" for c in commits),
                        capture_output=True, text=True)
  return [c for c, line in zip(commits, proc.stdout.splitlines()) if line.endswith("missing")]


# ----------------------------------------------------------------------------- environments


@dataclasses.dataclass(frozen=True)
class RepoEnvironment:
  """A built (repository, version) environment: venv, interpreter binds, untracked files."""
  repo: str
  version: str
  spec: repo_specs.EnvSpec
  root: str
  python: str            # the interpreter's executable (host path)
  untracked: tuple[tuple[str, str], ...] = ()

  @property
  def venv(self) -> str:
    return os.path.join(self.root, "venv")

  @property
  def name(self) -> str:
    return os.path.basename(self.root)

  def sandbox_env(self) -> dict[str, str]:
    return venv_sandbox_env(dict(self.spec.env))


def _interpreter_for(minor: str, default: str, needed_by: str) -> str:
  debian = f"/usr/bin/python{minor}"
  if minor == default and os.path.exists(debian):
    return debian            # the root filesystem's own python3: nothing to bind
  return interpreters.find(minor, needed_by=needed_by).executable


def build_repo_environment(repo: str, version: str, bare: str, setup_commit: str, *,
                           created_at: str = "", specs: dict | None = None,
                           default_python: str = "3.11", pip_timeout_s: float = 900.0
                           ) -> RepoEnvironment:
  """Builds (or reuses) the environment of `repo` at `version` (step 2 of the module docstring).

  Raises:
    BuildError: the interpreter is missing, or an install step failed (with its output).
  """
  tree = task_images.temporary_worktree(bare, setup_commit)
  try:
    available = sorted(interpreters.available()) + [default_python]
    spec = repo_specs.resolve(repo, version, tree, created_at=created_at, specs=specs,
                              available=available, default_python=default_python)
    python = _interpreter_for(spec.python, default_python, f"{repo} {version}")
    root = os.path.join(cache_dir(), "repo_envs", f"{repo.replace('/', '__')}-{version}-"
                        f"{setup_commit[:10]}-{spec.key()}")
    record_path = os.path.join(root, "env.json")
    if os.path.exists(record_path):
      with open(record_path) as f:
        record = json.load(f)
      if record.get("format") == _ENV_FORMAT:
        return RepoEnvironment(repo, version, spec, root, record["python"],
                               tuple(map(tuple, record["untracked"])))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    untracked = _install(spec, python, tree, os.path.join(root, "venv"), root, pip_timeout_s,
                         version)
    with open(record_path + ".tmp", "w") as f:
      json.dump({"format": _ENV_FORMAT, "repo": repo, "version": version, "python": python,
                 "setup_commit": setup_commit, "spec": dataclasses.asdict(spec),
                 "untracked": untracked}, f, indent=1)
    os.replace(record_path + ".tmp", record_path)
    return RepoEnvironment(repo, version, spec, root, python, tuple(map(tuple, untracked)))
  finally:
    shutil.rmtree(tree, ignore_errors=True)


def _install(spec: repo_specs.EnvSpec, python: str, tree: str, venv: str, root: str,
             timeout_s: float, version: str = "") -> list[list[str]]:
  found = re.match(r"\d+(\.\d+)*", version or "")
  pretend_version = found.group(0) if found else "0.0"
  def run(command, what, cwd=tree):
    env = dict(os.environ, VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{os.environ.get('PATH', '')}",
               # the tree is an archive without .git: setuptools-scm needs to be told a version
               SETUPTOOLS_SCM_PRETEND_VERSION=pretend_version)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    try:
      proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
      raise BuildError(f"{what} ran past {timeout_s:.0f} s") from None
    if proc.returncode != 0:
      tail = [l.strip() for l in (proc.stderr or proc.stdout).strip().splitlines() if l.strip()]
      raise BuildError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail[-4:])[-600:])

  before = _files(tree)
  run(f"{python} -m venv {venv}", f"creating a venv with {python}")
  run("python -m pip install -q -U pip setuptools wheel", "upgrading pip in the venv")
  for command in spec.pre_install:
    run(command, f"pre_install {command!r}")
  if spec.pip_packages:
    packages = " ".join(spec.pip_packages)
    run(f"python -m pip install -q {packages}", f"pip install {packages}")
  if spec.install:
    run(spec.install, f"install {spec.install!r}")
  run("python -m pip uninstall -q -y pip", "removing pip (no index is reachable in a sandbox)")
  _relocate(venv, tree, task_images.WORKDIR)
  _relocatable_scripts(venv)
  # What the install wrote into the source tree (egg-info metadata, a version file that
  # setuptools-scm or hatch-vcs generates) is needed at import time: seeds carry it, untracked.
  untracked = []
  for rel in sorted(_files(tree) - before):
    if rel.split("/")[0] in ("build", "dist", ".eggs") or "__pycache__" in rel.split("/"):
      continue
    kept = os.path.join(root, "untracked", rel)
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    shutil.copy2(os.path.join(tree, rel), kept)
    untracked.append([rel, kept])
  task_images._world_readable(root)
  return untracked


def _files(tree: str) -> set[str]:
  found = set()
  for parent, dirs, files in os.walk(tree):
    dirs[:] = [d for d in dirs if d != ".git"]
    found.update(os.path.relpath(os.path.join(parent, f), tree) for f in files)
  return found


def _relocate(venv: str, old: str, new: str) -> None:
  """Replaces the build-time source path with the sandbox's in every text file of the venv that
  names it (the editable install's .pth, finder module, egg-link, direct_url.json, RECORD)."""
  needle, repl = old.encode(), new.encode()
  for parent, _, files in os.walk(venv):
    for name in files:
      path = os.path.join(parent, name)
      if os.path.islink(path) or os.path.getsize(path) > (8 << 20):
        continue
      with open(path, "rb") as f:
        data = f.read()
      if needle in data and b"\0" not in data[:4096]:
        with open(path, "wb") as f:
          f.write(data.replace(needle, repl))


# ----------------------------------------------------------------------------- the dataset


def build_dataset(instances: Sequence[SWEInstance], settings: DatasetSettings = DatasetSettings(),
                  *, output_dir: str | None = None, progress: bool = True) -> DatasetBuild:
  """Builds every instance's image and test_spec (the module docstring's steps 1-4).

  Args:
    instances: SWE-bench instances (a test_spec they carry is replaced).
    settings: where repositories come from, specs, workers, limits.
    output_dir: if given, `instances.jsonl` (the built instances) and `build_report.jsonl`
      are written there.
    progress: show a progress bar.

  Returns:
    The DatasetBuild; an instance that could not be built is reported, never raised.

  Raises:
    BuildError: the specs file or the root filesystem cannot be had (before any instance).
  """
  from tqdm.auto import tqdm
  specs = repo_specs.load_specs(settings.specs) if settings.specs else None
  base = rootfs.build_rootfs() if not settings.rootfs else None
  rootfs_path = settings.rootfs or base.path
  default_python = base.python_version() if base else "3.11"
  groups: dict[tuple[str, str], list[SWEInstance]] = collections.defaultdict(list)
  for instance in instances:
    groups[(instance.repo, instance.version or "0")].append(instance)
  reports: dict[str, InstanceReport] = {}
  built: dict[str, SWEInstance] = {}
  bar = tqdm(total=len(instances), desc="build", unit="inst", disable=not progress)
  lock = threading.Lock()

  def one_group(key):
    repo, version = key
    members = groups[key]
    start = time.monotonic()
    setup = (members[0].environment_setup_commit or
             max(members, key=lambda i: i.created_at).base_commit)
    try:
      bare = clone(repo, settings.source, [setup] + [i.base_commit for i in members])
      env = build_repo_environment(repo, version, bare, setup,
                                   created_at=max(i.created_at for i in members), specs=specs,
                                   default_python=default_python,
                                   pip_timeout_s=settings.pip_timeout_s)
      binds = {env.venv: SANDBOX_VENV, **task_images.interpreter_binds(env.python)}
    except BuildError as e:
      with lock:
        for i in members:
          reports[i.instance_id] = InstanceReport(i.instance_id, ERROR, reason=str(e),
                                                  seconds=round(time.monotonic() - start, 1))
          bar.update(1)
      return
    python = env.spec.python
    made = []
    for instance in members:
      try:
        made.append(_instance_image(instance, env, bare, rootfs_path, binds,
                                    settings.test_timeout_s))
      except BuildError as e:
        with lock:
          reports[instance.instance_id] = InstanceReport(instance.instance_id, ERROR, env.name,
                                                         python, str(e))
          bar.update(1)
    fixes = {i.instance_id: leak_scan.fixed_sources(i.patch, repo=bare, base_commit=i.base_commit)
             for i in made}
    from orchard_jax.env.images import default_cache_dir
    leaks = leak_scan.scan_instances(made, fixes, allowed_roots=[default_cache_dir()])
    seconds = round(time.monotonic() - start, 1)
    with lock:
      for instance in made:
        found = leaks.get(instance.instance_id)
        if found:
          reports[instance.instance_id] = InstanceReport(
              instance.instance_id, LEAK, env.name, python,
              "its fix is readable in the sandbox: " + "; ".join(map(str, found[:3])), seconds)
        else:
          reports[instance.instance_id] = InstanceReport(instance.instance_id, BUILT, env.name,
                                                         python, env.spec.source, seconds)
          built[instance.instance_id] = instance
        bar.update(1)

  try:
    with concurrent.futures.ThreadPoolExecutor(max(1, settings.workers)) as pool:
      list(pool.map(one_group, list(groups)))
  finally:
    bar.close()
  result = DatasetBuild([built[i.instance_id] for i in instances if i.instance_id in built],
                        [reports[i.instance_id] for i in instances])
  if output_dir:
    os.makedirs(output_dir, exist_ok=True)
    result.path = save_instances(result.instances, os.path.join(output_dir, "instances.jsonl"))
    with open(os.path.join(output_dir, "build_report.jsonl"), "w") as f:
      for report in result.reports:
        f.write(json.dumps(dataclasses.asdict(report)) + "\n")
  return result


def _instance_image(instance: SWEInstance, env: RepoEnvironment, bare: str, rootfs_path: str,
                    binds: dict, test_timeout_s: float) -> SWEInstance:
  folder = task_images.instance_image_dir(instance.instance_id)
  record = os.path.join(folder, ".orchard_instance.json")
  wanted = {"base_commit": instance.base_commit, "environment": env.root, "binds": binds,
            "rootfs": rootfs_path, "untracked": [list(u) for u in env.untracked]}
  fresh = True
  if os.path.exists(record):
    with open(record) as f:
      fresh = json.load(f) != wanted
  if fresh:
    task_images.write_instance_image(folder, rootfs=rootfs_path, binds=binds,
                                     env=env.sandbox_env(), seed_source=bare,
                                     base_commit=instance.base_commit,
                                     untracked=dict(env.untracked))
    with open(record, "w") as f:
      json.dump(wanted, f)
  test_files = repo_specs.test_directives(instance.test_patch)
  if not test_files:
    raise BuildError("its test_patch touches no test file, so there is nothing to run")
  spec = TestSpec(image=folder, test_cmd=env.spec.test_cmd, test_files=test_files,
                  log_parser=env.spec.log_parser, timeout_s=test_timeout_s,
                  env=dict(env.spec.env), package=f"{instance.repo}@{instance.version or '0'}")
  return instance.replace(test_spec=spec)
