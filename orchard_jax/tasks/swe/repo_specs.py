"""How to install and test a repository at a version: given in a specs file, else inferred.

SWE-bench describes each (repository, version) by a specification: the Python version, the
commands that install the repository and its test dependencies, and the test command; the log
parser is chosen per repository. `swebench` 5 ships the per-repository log parsers
(`swebench.harness.log_parsers.MAP_REPO_TO_PARSER_PY`) but no longer the install
specifications, so a user may give them in a specs file in SWE-bench's own key names
(JSON or YAML, `{repo: {version: spec}}`, "*" as a version matches any):

    {"owner/name": {"1.2": {"python": "3.9",
                            "pre_install": ["..."],          # shell, in the source tree
                            "install": "python -m pip install -e .",
                            "pip_packages": ["pytest<8", "hypothesis"],
                            "test_cmd": "pytest -rA --tb=short -p no:cacheprovider",
                            "env": {"TZ": "UTC"}}}}

Everything a spec leaves out is inferred from the repository at `environment_setup_commit`:
  python        the newest interpreter that the project's `Programming Language :: Python ::
                X.Y` classifiers name and `requires-python` allows; without classifiers, the
                root filesystem's own python3 if it was out a quarter before the instance was
                created, else the newest minor release that was (old code often fails on
                newer Pythons: removed modules, changed warnings).
  install       an editable install of the project when it has packaging metadata
                (pyproject.toml, setup.py or setup.cfg), with the test extras it declares.
  pip_packages  pytest, plus the first test requirements file found.
  test_cmd      pytest with SWE-bench's `-rA` summary, no cache, and the project's addopts
                dropped (coverage and similar plugins are not installed).
  log_parser    SWE-bench's parser for the repository, else "pytest".
"""
from __future__ import annotations

import configparser
import dataclasses
import datetime
import json
import os
import re
from typing import Any, Mapping, Sequence

from orchard_jax.tasks.errors import BuildError

# When each CPython minor release came out (python.org), for the era rule above.
PYTHON_RELEASES = {
    "2.7": "2010-07-03", "3.5": "2015-09-13", "3.6": "2016-12-23", "3.7": "2018-06-27",
    "3.8": "2019-10-14", "3.9": "2020-10-05", "3.10": "2021-10-04", "3.11": "2022-10-24",
    "3.12": "2023-10-02", "3.13": "2024-10-07",
}
_SETTLE_DAYS = 90
DEFAULT_TEST_CMD = "pytest -rA --tb=short -p no:cacheprovider -o addopts="
_TEST_EXTRAS = ("test", "tests", "testing")
_TEST_REQUIREMENTS = ("requirements-test.txt", "requirements_test.txt", "test-requirements.txt",
                      "test_requirements.txt", "requirements/test.txt", "requirements/tests.txt",
                      "requirements-tests.txt", "tests/requirements.txt")
_SPEC_KEYS = {"python", "pre_install", "install", "pip_packages", "test_cmd", "env",
              "log_parser", "packages", "eval_commands", "no_use_env"}


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """How one (repository, version) is installed and tested.

  Attributes:
    python: "MAJOR.MINOR" of the interpreter.
    pre_install: shell commands run in the source tree before the install.
    install: the command that installs the project into the venv ("" for none); it runs in
      the source tree with the venv's bin first on PATH.
    pip_packages: requirement strings installed into the venv first.
    test_cmd: the test command without targets; prints a log `log_parser` reads.
    log_parser: a parser name (`log_parsers.py`).
    env: environment variables of test runs.
    source: "specs file" or "inferred", with what the inference used.
  """
  python: str
  install: str = ""
  pre_install: tuple[str, ...] = ()
  pip_packages: tuple[str, ...] = ("pytest",)
  test_cmd: str = DEFAULT_TEST_CMD
  log_parser: str = "pytest"
  env: tuple[tuple[str, str], ...] = ()
  source: str = "inferred"

  def key(self) -> str:
    """A short hash of what determines the built environment."""
    import hashlib
    fields = dataclasses.asdict(self)
    fields.pop("source")
    fields.pop("test_cmd")
    fields.pop("log_parser")
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def load_specs(path: str) -> dict[str, dict[str, dict]]:
  """Reads a specs file (see the module docstring).

  Raises:
    BuildError: unreadable, not `{repo: {version: {...}}}`, or a spec has an unknown key.
  """
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise BuildError(f"specs file {path!r} cannot be read: {e}") from None
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    import yaml
    try:
      data = yaml.safe_load(text)
    except yaml.YAMLError as e:
      raise BuildError(f"specs file {path!r} is neither JSON nor YAML: {e}") from None
  if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
    raise BuildError(f"specs file {path!r} must map 'owner/name' to {{version: spec}}")
  for repo, versions in data.items():
    for version, spec in versions.items():
      if not isinstance(spec, dict):
        raise BuildError(f"specs file {path!r}: {repo} {version}: a spec must be an object")
      unknown = sorted(set(spec) - _SPEC_KEYS)
      if unknown:
        raise BuildError(f"specs file {path!r}: {repo} {version}: unknown keys {unknown}; "
                         f"expected some of {sorted(_SPEC_KEYS)}")
  return data


def resolve(repo: str, version: str, tree: str, *, created_at: str = "",
            specs: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
            available: Sequence[str] = (), default_python: str = "3.11") -> EnvSpec:
  """The EnvSpec of `repo` at `version`, from `specs` where given, the rest inferred.

  Args:
    repo: "owner/name".
    version: the instances' `version` field.
    tree: a folder holding the repository at `environment_setup_commit`.
    created_at: the instance's creation time (ISO 8601), for the era rule.
    specs: a loaded specs file, or None.
    available: "MAJOR.MINOR" of the interpreters installed here.
    default_python: the root filesystem's own python3 version.
  """
  given = dict((specs or {}).get(repo, {}).get(version) or (specs or {}).get(repo, {}).get("*")
               or {})
  metadata = _metadata(tree)
  python = str(given["python"]) if "python" in given else _infer_python(
      metadata, created_at, available, default_python)
  install = given.get("install")
  if install is None:
    install = _infer_install(tree, metadata)
  packages = given.get("pip_packages")
  if packages is None:
    packages = ["pytest"] + _test_requirements(tree)
  elif isinstance(packages, str):
    packages = packages.split()
  pre = given.get("pre_install") or ()
  if isinstance(pre, str):
    pre = (pre,)
  return EnvSpec(
      python=python, install=install, pre_install=tuple(pre), pip_packages=tuple(packages),
      test_cmd=given.get("test_cmd") or DEFAULT_TEST_CMD,
      log_parser=given.get("log_parser") or swebench_parser(repo),
      env=tuple(sorted((str(k), str(v)) for k, v in (given.get("env") or {}).items())),
      source="specs file" if given else "inferred")


def swebench_parser(repo: str) -> str:
  """The name of SWE-bench's log parser for `repo`, or "pytest" when it has none."""
  try:
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
  except ImportError:
    return "pytest"
  parser = MAP_REPO_TO_PARSER_PY.get(repo)
  return parser.__name__ if parser is not None else "pytest"


def _metadata(tree: str) -> dict:
  """requires-python, classifiers and optional-dependency names from the packaging files."""
  out = {"requires_python": "", "classifiers": [], "extras": [], "has_metadata": False}
  pyproject = os.path.join(tree, "pyproject.toml")
  if os.path.exists(pyproject):
    import tomllib
    try:
      with open(pyproject, "rb") as f:
        data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, OSError):
      data = {}
    project = data.get("project") or {}
    poetry = (data.get("tool") or {}).get("poetry") or {}
    out["requires_python"] = project.get("requires-python") or (
        poetry.get("dependencies") or {}).get("python", "")
    out["classifiers"] += project.get("classifiers") or poetry.get("classifiers") or []
    out["extras"] += list(project.get("optional-dependencies") or {})
    out["has_metadata"] = bool(data.get("build-system") or project)
  setup_cfg = os.path.join(tree, "setup.cfg")
  if os.path.exists(setup_cfg):
    parser = configparser.ConfigParser(interpolation=None)
    try:
      parser.read(setup_cfg, encoding="utf-8")
    except configparser.Error:
      pass
    if parser.has_section("metadata"):
      out["classifiers"] += parser.get("metadata", "classifiers", fallback="").split("\n")
      out["has_metadata"] = True
    if parser.has_section("options"):
      out["requires_python"] = out["requires_python"] or parser.get(
          "options", "python_requires", fallback="")
    if parser.has_section("options.extras_require"):
      out["extras"] += list(parser["options.extras_require"])
  setup_py = os.path.join(tree, "setup.py")
  if os.path.exists(setup_py):
    out["has_metadata"] = True
    with open(setup_py, encoding="utf-8", errors="replace") as f:
      text = f.read()
    out["classifiers"] += re.findall(r"Programming Language :: Python :: [\d.]+", text)
    found = re.search(r"python_requires\s*=\s*['\"]([^'\"]+)['\"]", text)
    if found and not out["requires_python"]:
      out["requires_python"] = found.group(1)
    block = re.search(r"extras_require\s*=\s*\{(.*?)\}", text, re.S)
    if block:
      out["extras"] += re.findall(r"['\"]([\w.-]+)['\"]\s*:", block.group(1))
  return out


def _minor_key(minor: str) -> tuple[int, int]:
  major, _, rest = minor.partition(".")
  return int(major), int(rest or 0)


def _infer_python(metadata: dict, created_at: str, available: Sequence[str],
                  default: str) -> str:
  from packaging.specifiers import InvalidSpecifier, SpecifierSet
  try:
    allowed = SpecifierSet(metadata["requires_python"] or "")
  except InvalidSpecifier:
    allowed = SpecifierSet("")
  known = sorted(PYTHON_RELEASES, key=_minor_key)
  ok = [m for m in known if allowed.contains(f"{m}.0", prereleases=True) or allowed.contains(
      f"{m}.99", prereleases=True)]
  named = sorted({m for c in metadata["classifiers"]
                  for m in re.findall(r"Programming Language :: Python :: (\d\.\d+)\s*$",
                                      c.strip())}, key=_minor_key)
  when = _date(created_at)
  era = [m for m in ok if when is None or
         datetime.date.fromisoformat(PYTHON_RELEASES[m]) + datetime.timedelta(_SETTLE_DAYS) <= when]
  if named:
    choice = [m for m in named if m in ok and m in era] or [m for m in named if m in ok] or named
    return choice[-1]
  if when is not None and era and default not in era:
    return era[-1]
  return default if default in ok or not ok else ok[-1]


def _date(created_at: str) -> datetime.date | None:
  try:
    return datetime.datetime.fromisoformat(created_at.replace("Z", "+00:00")).date()
  except (ValueError, AttributeError):
    return None


def _infer_install(tree: str, metadata: dict) -> str:
  if not metadata["has_metadata"]:
    return ""
  extras = [e for e in metadata["extras"] if e in _TEST_EXTRAS]
  target = f".[{extras[0]}]" if extras else "."
  return f"python -m pip install -e '{target}'"


def _test_requirements(tree: str) -> list[str]:
  for name in _TEST_REQUIREMENTS:
    path = os.path.join(tree, name)
    if os.path.isfile(path):
      return [f"-r {name}"]
  return []


def test_directives(test_patch: str) -> tuple[str, ...]:
  """The test files SWE-bench runs for an instance: the files its test patch touches, less the
  ones of non-test kinds (`swebench.harness.constants.NON_TEST_EXTS`) and deleted ones."""
  from orchard_jax.tasks.swe.patches import patch_files
  try:
    from swebench.harness.constants import NON_TEST_EXTS
  except ImportError:
    NON_TEST_EXTS = [".json", ".png", ".txt", ".md", ".yml", ".yaml", ".toml"]
  deleted = set(re.findall(r"^--- a/(\S+)\n\+\+\+ /dev/null", test_patch, re.M))
  return tuple(f for f in patch_files(test_patch)
               if not any(f.endswith(e) for e in NON_TEST_EXTS) and f not in deleted)
