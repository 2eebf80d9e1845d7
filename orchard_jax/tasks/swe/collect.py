"""SWE-bench instances from upstream fixing commits: the collection step of SWE-bench's pipeline.

Input: a commits file, JSON `[{"repo": "owner/name", "commit": "<fixing commit>",
"problem_statement": "..." (optional)}, ...]`. For each fixing commit, as SWE-bench derives an
instance from a merged pull request:
  base_commit  the commit's first parent (the repository just before the fix);
  patch        the diff base..fix of every non-test file (the gold patch);
  test_patch   the diff of the test files (paths with a `test`/`tests`/`testing` folder, or
               files named test_*.py / *_test.py / conftest.py);
  version      "MAJOR.MINOR" of the newest release tag that is an ancestor of the base ("0.0"
               without one), so instances of one release share an environment;
  created_at   the fixing commit's date; problem_statement: the given text, else the fixing
               commit's message (a fix's description, not an issue report).
FAIL_TO_PASS and PASS_TO_PASS are left empty: `validation.py` fills them from two runs with
and two without the gold patch (SWE-bench's validation step).
"""
from __future__ import annotations

import json
import re
import subprocess
from typing import Sequence

from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe.instance import SWEInstance

_TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$")


def is_test_path(path: str) -> bool:
  """Whether a repository path belongs to the tests (SWE-bench's split of a pull request)."""
  return bool(_TEST_PATH.search(path))


def load_commits(path: str) -> list[dict]:
  """Reads a commits file (see the module docstring).

  Raises:
    BuildError: not a JSON list of {"repo", "commit"} objects.
  """
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise BuildError(f"commits file {path!r}: {e}") from None
  if not isinstance(data, list) or not all(
      isinstance(d, dict) and isinstance(d.get("repo"), str) and isinstance(d.get("commit"), str)
      for d in data):
    raise BuildError(f"commits file {path!r} must be a JSON list of {{\"repo\", \"commit\"}} "
                     f"objects")
  return data


def _git(repo: str, *args: str) -> str:
  proc = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
  if proc.returncode != 0:
    raise BuildError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()[-300:]}")
  return proc.stdout


def instance_from_commit(bare: str, repo: str, commit: str, *,
                         problem_statement: str = "") -> SWEInstance:
  """One instance from a fixing commit in the clone `bare` (see the module docstring).

  Raises:
    BuildError: the commit is missing, is a root commit, or changes no source or no test file.
  """
  full = _git(bare, "rev-parse", "--verify", f"{commit}^{{commit}}").strip()
  parents = _git(bare, "rev-list", "--parents", "-n", "1", full).split()[1:]
  if not parents:
    raise BuildError(f"{repo} {commit}: a root commit has no base to fix")
  base = parents[0]
  files = [f for f in _git(bare, "diff", "--name-only", base, full).splitlines() if f]
  tests = [f for f in files if is_test_path(f)]
  sources = [f for f in files if not is_test_path(f)]
  if not tests or not sources:
    raise BuildError(f"{repo} {commit}: changes {len(sources)} source and {len(tests)} test "
                     f"file(s); an instance needs both")
  patch = _git(bare, "diff", "--binary", base, full, "--", *sources)
  test_patch = _git(bare, "diff", "--binary", base, full, "--", *tests)
  date = _git(bare, "show", "-s", "--format=%cI", full).strip()
  message = _git(bare, "show", "-s", "--format=%B", full).strip()
  owner, _, name = repo.partition("/")
  return SWEInstance(
      instance_id=f"{owner}__{name}-{full[:10]}", repo=repo, base_commit=base, patch=patch,
      test_patch=test_patch, problem_statement=problem_statement or message, created_at=date,
      version=_version(bare, base), environment_setup_commit="",
      extra={"fix_commit": full})


def _version(bare: str, base: str) -> str:
  proc = subprocess.run(["git", "-C", bare, "describe", "--tags", "--abbrev=0", base],
                        capture_output=True, text=True)
  found = re.search(r"(\d+)\.(\d+)", proc.stdout) if proc.returncode == 0 else None
  return f"{found.group(1)}.{found.group(2)}" if found else "0.0"


def collect(commits: Sequence[dict], source, *, skip_errors: bool = True
            ) -> tuple[list[SWEInstance], list[str]]:
  """Instances for a list of {"repo", "commit"} records, cloning through `source`
  (`repo_env.RepoSource`).

  Returns:
    (instances, problems): a record that cannot become an instance is named in `problems`
    (or raised, with skip_errors=False).
  """
  from orchard_jax.tasks.swe.repo_env import clone
  instances, problems = [], []
  for record in commits:
    try:
      bare = clone(record["repo"], source, [record["commit"]])
      instances.append(instance_from_commit(bare, record["repo"], record["commit"],
                                            problem_statement=record.get("problem_statement", "")))
    except BuildError as e:
      if not skip_errors:
        raise
      problems.append(str(e))
  return instances, problems
