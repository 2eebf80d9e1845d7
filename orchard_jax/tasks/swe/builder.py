"""The task builder: real SWE task instances from real Python packages, on any machine.

For each package (a `PackageProfile`):
  1. build (or reuse) its environment: sdist -> git repository, venv, image directory;
  2. run the unmodified suite twice; only tests that pass in both runs can ever be
     FAIL_TO_PASS or PASS_TO_PASS (flaky and environment-dependent tests never enter);
  3. draw candidate bugs from SWE-smith's procedural modifiers in seeded random order, run the
     suite on each (in parallel work trees), and keep a bug when at least one stable test goes
     from pass to fail (FAIL_TO_PASS) and at least one stays passing (PASS_TO_PASS); the
     FAIL_TO_PASS tests are run again by node id to confirm they fail every time;
  4. write the instance: the buggy tree with the FAIL_TO_PASS test files removed becomes a root
     commit (`base_commit`, so the history shows nothing), the gold `patch` restores the source,
     the `test_patch` restores the hidden test files, and the problem statement is written from
     the failing tests' evidence; its image directory (`task_images.py`) is the Debian root
     filesystem, the venv, and a workspace seed holding that one commit;
  5. scan what each instance's sandbox can read for a copy of its fix (`leak_scan.py`) and drop
     the instances where one is found.
Per package the work stops at a target count, a candidate count or a time budget, whichever
comes first. Every dropped candidate is counted with its reason.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Callable, Sequence

from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe import leak_scan, log_parsers, rootfs, task_images
from orchard_jax.tasks.swe.bug_synthesis import CandidateBug, generate_candidates
from orchard_jax.tasks.swe.environment import (ENV_FORMAT, SANDBOX_VENV, PackageEnvironment,
                                               build_environment, cache_dir, git)
from orchard_jax.tasks.swe.instance import SWEInstance, TestSpec, load_instances, save_instances
from orchard_jax.tasks.swe.packages import DEFAULT_PACKAGES, PROFILES, PackageProfile
from orchard_jax.tasks.swe.problem_statement import write_problem_statement

_log = logging.getLogger(__name__)
INSTANCE_REF_PREFIX = "refs/orchard/instances/"

# Why a tried candidate was dropped.
DROP_NO_TEST_CHANGED = "no test changed outcome"
DROP_NO_PASS_TO_PASS = "no test kept passing (import or collection broke)"
DROP_TIMEOUT = "test run timed out"
DROP_FLAKY = "FAIL_TO_PASS not reproducible on rerun"
DROP_ONLY_DOCTESTS = "only doctests in source files failed"
DROP_LEAK = "the fix is readable in the sandbox (leak scan)"


@dataclasses.dataclass(frozen=True)
class BuildSettings:
  """Knobs of one task-set build (all come from the experiment config).

  Attributes:
    packages: names of `PROFILES` to build from.
    instances_per_package: stop a package once this many instances are kept.
    max_candidates_per_package: stop after trying this many candidate bugs.
    seconds_per_package: stop drawing candidates after this much wall time (seconds).
    workers: candidates tested in parallel (one work tree each).
    test_timeout_s: limit of one test-suite run, seconds.
    seed: seeds the candidate order, SWE-smith's modifiers and the statement phrasing.
    python: base interpreter for the venvs ("" picks Debian's python3, which the task images'
      root filesystem has; another is bound into the images as a copy of its prefix).
    rootfs: the task images' root filesystem folder ("" builds the Debian one, `rootfs.py`).
  """
  packages: tuple[str, ...] = DEFAULT_PACKAGES
  instances_per_package: int = 14
  max_candidates_per_package: int = 60
  seconds_per_package: float = 120.0
  workers: int = 2
  test_timeout_s: float = 120.0
  seed: int = 0
  python: str = ""
  rootfs: str = ""

  def key(self) -> str:
    profiles = [PROFILES[p].fingerprint() for p in self.packages if p in PROFILES]
    blob = json.dumps([dataclasses.asdict(self), profiles, ENV_FORMAT], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


@dataclasses.dataclass
class PackageStats:
  """Counts of one package's build: candidates tried, kept, dropped by reason, seconds."""
  package: str
  tried: int = 0
  kept: int = 0
  dropped: dict = dataclasses.field(default_factory=lambda: collections.Counter())
  baseline_tests: int = 0
  unstable_tests: int = 0
  seconds: float = 0.0
  error: str = ""
  leaked: int = 0


@dataclasses.dataclass
class TaskSet:
  """A built task set: the instances, where they are stored, and the build statistics."""
  instances: list[SWEInstance]
  path: str
  stats: list[PackageStats]
  from_cache: bool = False

  def summary(self) -> str:
    """A human-readable table: per package tried / kept / dropped by reason."""
    lines = [f"task set {self.path}: {len(self.instances)} instances"
             + (" (from cache)" if self.from_cache else "")]
    total = collections.Counter()
    tried = kept = 0
    for s in self.stats:
      reasons = ", ".join(f"{n} {r}" for r, n in sorted(s.dropped.items(), key=lambda x: -x[1]))
      lines.append(f"  {s.package:24s} tried {s.tried:3d}  kept {s.kept:3d}  "
                   f"({s.seconds:.0f} s; {s.baseline_tests} stable tests, {s.unstable_tests} "
                   f"unstable)" + (f"  dropped: {reasons}" if reasons else "")
                   + (f"  ERROR: {s.error}" if s.error else ""))
      total.update(s.dropped)
      tried += s.tried
      kept += s.kept
    lines.append(f"  {'total':24s} tried {tried:3d}  kept {kept:3d}  dropped "
                 f"{sum(total.values())}: " + ", ".join(f"{n} {r}" for r, n in total.most_common()))
    lines.append(f"  leak scan: dropped {sum(s.leaked for s in self.stats)} instance(s) whose fix "
                 f"a sandbox could read")
    return "\n".join(lines)


def default_task_set_dir(settings: BuildSettings) -> str:
  return os.path.join(cache_dir(), "tasksets", f"default-{settings.key()}")


def build_task_set(settings: BuildSettings = BuildSettings(), *, output_dir: str | None = None,
                   rebuild: bool = False, progress: bool = True) -> TaskSet:
  """Builds the task set, or loads it when a finished build with the same settings exists.

  Args:
    settings: what to build.
    output_dir: where `instances.jsonl` and `build_report.json` go; default under the cache
      folder, named by a hash of the settings.
    rebuild: ignore a cached build.
    progress: show a progress bar per package.

  Returns:
    The TaskSet; `TaskSet.summary()` says what was tried, kept and dropped.

  Raises:
    BuildError: no instance could be built at all.
  """
  output_dir = output_dir or default_task_set_dir(settings)
  path = os.path.join(output_dir, "instances.jsonl")
  report_path = os.path.join(output_dir, "build_report.json")
  if not rebuild and os.path.exists(path) and os.path.exists(report_path):
    with open(report_path) as f:
      report = json.load(f)
    stats = [PackageStats(**{**s, "dropped": collections.Counter(s["dropped"])})
             for s in report["packages"]]   # a report without "leaked" predates the scan
    instances = load_instances(path)
    if all(os.path.isdir(i.test_spec.image) for i in instances if i.test_spec):
      return TaskSet(instances, path, stats, from_cache=True)
  instances, stats = [], []
  for name in settings.packages:
    if name not in PROFILES:
      raise BuildError(f"unknown package {name!r}; expected one of {sorted(PROFILES)}")
  base = settings.rootfs or rootfs.build_rootfs().path
  for name in settings.packages:
    package_instances, package_stats = build_package_tasks(PROFILES[name], settings,
                                                           progress=progress, rootfs_path=base)
    instances += package_instances
    stats.append(package_stats)
  if not instances:
    raise BuildError("no instance was built: " + "; ".join(
        f"{s.package}: {s.error or dict(s.dropped)}" for s in stats))
  save_instances(instances, path)
  with open(report_path, "w") as f:
    json.dump({"settings": dataclasses.asdict(settings),
               "packages": [dict(vars(s), dropped=dict(s.dropped)) for s in stats]}, f, indent=1)
  return TaskSet(instances, path, stats)


def build_package_tasks(profile: PackageProfile, settings: BuildSettings, *,
                        progress: bool = True, rootfs_path: str | None = None
                        ) -> tuple[list[SWEInstance], PackageStats]:
  """Builds the instances of one package (steps 1-5 of the module docstring).

  `rootfs_path` is the task images' root filesystem (default: build the Debian one).

  A package whose environment or baseline fails is reported in `PackageStats.error` and yields
  no instances; it does not stop the other packages.
  """
  stats = PackageStats(profile.key)
  start = time.monotonic()
  try:
    env = build_environment(profile, python=settings.python or None)
    stable, unstable = _baseline(env, settings)
  except BuildError as e:
    stats.error = str(e)[:500]
    stats.seconds = time.monotonic() - start
    _log.warning("skipping %s: %s", profile.key, e)
    return [], stats
  stats.baseline_tests, stats.unstable_tests = len(stable), len(unstable)
  kept: list[tuple[CandidateBug, list[str], list[str], str]] = []
  lock = threading.Lock()
  work_trees = _work_trees(env, settings.workers)
  free = list(work_trees)
  candidates = generate_candidates(env.repo, profile, seed=settings.seed)
  bar = _progress_bar(progress, profile.key, settings.max_candidates_per_package)

  def test_one(candidate: CandidateBug):
    with lock:
      tree = free.pop()
    try:
      return candidate, _try_candidate(env, tree, candidate, stable, settings)
    finally:
      with lock:
        free.append(tree)

  def done():
    return (len(kept) >= settings.instances_per_package
            or stats.tried >= settings.max_candidates_per_package
            or time.monotonic() - start > settings.seconds_per_package)

  try:
    with concurrent.futures.ThreadPoolExecutor(settings.workers) as pool:
      running = set()
      exhausted = False
      while True:
        while not exhausted and not done() and len(running) < settings.workers:
          candidate = next(candidates, None)
          if candidate is None:
            exhausted = True
            break
          stats.tried += 1
          running.add(pool.submit(test_one, candidate))
        if not running:
          break
        finished, running = concurrent.futures.wait(
            running, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in finished:
          candidate, (reason, f2p, p2p, log) = future.result()
          if reason is None and len(kept) < settings.instances_per_package:
            kept.append((candidate, f2p, p2p, log))
          else:
            stats.dropped[reason or "over the target count"] += 1
          bar.update(1)
          bar.set_postfix(kept=len(kept))
  finally:
    bar.close()
    for tree in work_trees:
      shutil.rmtree(tree, ignore_errors=True)
  try:
    image = {"rootfs": rootfs_path or rootfs.build_rootfs().path,
             "binds": {env.venv: SANDBOX_VENV, **task_images.interpreter_binds(env.python)}}
    instances = [_make_instance(env, candidate, f2p, p2p, log, settings, image)
                 for candidate, f2p, p2p, log in kept]
  except BuildError as e:
    stats.error = str(e)[:500]
    stats.seconds = time.monotonic() - start
    return [], stats
  instances = drop_leaking(instances, stats, repo=env.repo)
  stats.kept = len(instances)
  stats.seconds = time.monotonic() - start
  return instances, stats


def drop_leaking(instances: list[SWEInstance], stats: PackageStats, *, repo: str
                 ) -> list[SWEInstance]:
  """The instances whose sandbox cannot read their fix; the others are counted in `stats`
  (`leaked` and a DROP_LEAK reason) and logged with the copies found."""
  from orchard_jax.env.images import default_cache_dir
  fixes = {i.instance_id: leak_scan.fixed_sources(i.patch, repo=repo, base_commit=i.base_commit)
           for i in instances}
  leaks = leak_scan.scan_instances(instances, fixes, allowed_roots=[default_cache_dir()])
  for instance_id, found in leaks.items():
    _log.warning("dropping %s: its fix is readable in the sandbox: %s", instance_id,
                 "; ".join(map(str, found[:3])))
    stats.dropped[DROP_LEAK] += 1
    stats.leaked += 1
  return [i for i in instances if i.instance_id not in leaks]


def _progress_bar(enabled: bool, name: str, total: int):
  from tqdm.auto import tqdm
  return tqdm(total=total, desc=f"{name:24s}", unit="bug", disable=not enabled, leave=True)


def _work_trees(env: PackageEnvironment, count: int) -> list[str]:
  # Exactly the committed tree (what a sandbox's workspace holds), not the folder on disk.
  trees = []
  for _ in range(count):
    tree = tempfile.mkdtemp(prefix=f"orchard_{env.profile.name}_")
    archive = subprocess.run(["git", "archive", env.clean_commit], cwd=env.repo,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    trees.append(tree)
  return trees


def _status(env: PackageEnvironment, tree: str, targets: Sequence[str],
            timeout_s: float) -> tuple[dict[str, str], str, int]:
  log, code, _ = env.run_tests(tree, targets, timeout_s=timeout_s)
  return log_parsers.parse_test_log(log, "pytest"), log, code


def _baseline(env: PackageEnvironment, settings: BuildSettings) -> tuple[list[str], list[str]]:
  tree = _work_trees(env, 1)[0]
  try:
    runs = []
    for _ in range(2):
      status, log, code = _status(env, tree, env.profile.test_files, settings.test_timeout_s)
      if code == 124:
        raise BuildError(f"{env.profile.key}: the unmodified suite ran past "
                         f"{settings.test_timeout_s:.0f} s")
      runs.append(status)
  finally:
    shutil.rmtree(tree, ignore_errors=True)
  names = set(runs[0]) | set(runs[1])
  stable = sorted(t for t in names if all(log_parsers.passed(r, t) for r in runs)
                  and _selectable(t))
  unstable = sorted(t for t in names if any(log_parsers.passed(r, t) for r in runs)
                    and t not in stable)
  if not stable:
    raise BuildError(f"{env.profile.key}: no test passed twice on the unmodified sdist; last "
                     f"log ends with: {log[-1500:]}")
  return stable, unstable


def _selectable(test: str) -> bool:
  # A node id with whitespace is cut at the space by SWE-bench's pytest parser: it could not be
  # named reliably in FAIL_TO_PASS / PASS_TO_PASS.
  return "::" in test and not any(c.isspace() for c in test)


def _try_candidate(env, tree, candidate: CandidateBug, stable, settings):
  path = os.path.join(tree, candidate.file)
  with open(path, "w", encoding="utf-8") as f:
    f.write(candidate.modified)
  try:
    status, log, code = _status(env, tree, env.profile.test_files, settings.test_timeout_s)
    if code == 124:
      return DROP_TIMEOUT, [], [], ""
    f2p = [t for t in stable if not log_parsers.passed(status, t)]
    p2p = [t for t in stable if log_parsers.passed(status, t)]
    f2p_tests = [t for t in f2p if _is_test_file(env, t)]
    if not f2p:
      return DROP_NO_TEST_CHANGED, [], [], ""
    if not f2p_tests:
      return DROP_ONLY_DOCTESTS, [], [], ""
    if not p2p:
      return DROP_NO_PASS_TO_PASS, [], [], ""
    rerun, _, code = _status(env, tree, f2p, settings.test_timeout_s)
    if code == 124 or any(log_parsers.passed(rerun, t) for t in f2p):
      return DROP_FLAKY, [], [], ""
    return None, f2p, p2p, log
  finally:
    with open(path, "w", encoding="utf-8") as f:
      f.write(candidate.original)


def _is_test_file(env: PackageEnvironment, test: str) -> bool:
  file = test.split("::")[0]
  return any(file == d or file.startswith(d.rstrip("/") + "/") for d in env.profile.test_files)


def _make_instance(env: PackageEnvironment, candidate: CandidateBug, f2p: list[str],
                   p2p: list[str], log: str, settings: BuildSettings, image: dict) -> SWEInstance:
  profile = env.profile
  repo = env.repo
  hidden = sorted({t.split("::")[0] for t in f2p if _is_test_file(env, t)})
  index = os.path.join(repo, ".git", f"orchard_index_{candidate.key}")
  genv = {"GIT_INDEX_FILE": index}
  try:
    git(repo, "read-tree", env.clean_commit, env=genv)
    blob = git(repo, "hash-object", "-w", "--stdin", input=candidate.modified).strip()
    mode = git(repo, "ls-tree", env.clean_commit, "--", candidate.file).split()[0]
    git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{candidate.file}", env=genv)
    git(repo, "rm", "-q", "--cached", "--", *hidden, env=genv)
    tree = git(repo, "write-tree", env=genv).strip()
  finally:
    if os.path.exists(index):
      os.remove(index)
  base_commit = git(repo, "commit-tree", tree, "-m", "Initial commit").strip()
  owner, name = profile.repo.split("/")
  instance_id = f"{owner}__{name}.{env.clean_commit[:8]}.{candidate.modifier}__{candidate.key}"
  git(repo, "update-ref", INSTANCE_REF_PREFIX + instance_id, base_commit)
  patch = git(repo, "diff", "--binary", base_commit, env.clean_commit, "--", candidate.file)
  test_patch = git(repo, "diff", "--binary", base_commit, env.clean_commit, "--", *hidden)
  module = profile.source_paths[0].split("/")[-1].removesuffix(".py")
  statement = write_problem_statement(
      package=f"{profile.name} {profile.version}", module=module, fail_to_pass=f2p, log=log,
      seed=int(candidate.key, 16) ^ settings.seed)
  folder = task_images.write_instance_image(
      task_images.instance_image_dir(instance_id), rootfs=image["rootfs"], binds=image["binds"],
      env=env.sandbox_env(), seed_source=repo, base_commit=base_commit)
  spec = TestSpec(image=folder, test_cmd=env.test_command(), test_files=profile.test_files,
                  timeout_s=settings.test_timeout_s, package=profile.key)
  return SWEInstance(
      instance_id=instance_id, repo=profile.repo, base_commit=base_commit, patch=patch,
      test_patch=test_patch, problem_statement=statement, hints_text="",
      created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      version=profile.version, FAIL_TO_PASS=tuple(f2p), PASS_TO_PASS=tuple(p2p),
      environment_setup_commit=env.clean_commit, test_spec=spec,
      extra={"bug": {"file": candidate.file, "entity": candidate.entity,
                     "modifier": candidate.modifier}})
