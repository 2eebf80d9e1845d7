"""Profiles of the real Python packages the task builder turns into SWE tasks.

A profile says where a package's source and tests are in its source distribution (sdist), what
its tests need, and how to run them. Facts checked on a 2-core CPU machine: the sdists
of these packages ship their tests; suites take 1-55 s; parse's pytest config asks for
pytest-cov (we run without its addopts); idna's property tests need hypothesis and, with its
UTS46 table test, take ~25 s, so the default profile runs the fast files; python-dateutil needs
pytest-cov, freezegun and attrs and has tests that fail on the machine's own timezone data
before any change (the builder's two baseline runs keep them out of PASS_TO_PASS);
more-itertools' suite runs ~21k subtests (~27 s), too slow for the default set.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json


@dataclasses.dataclass(frozen=True)
class PackageProfile:
  """How to build tasks from one package version.

  Attributes:
    name: the PyPI distribution name.
    version: the exact version whose sdist is used.
    repo: the upstream GitHub "owner/name" (SWE-bench's `repo` field).
    source_paths: files or folders (relative to the sdist root) where bugs are injected.
    exclude: path prefixes under source_paths that are never mutated (tests, data tables).
    test_files: test files or folders run for every candidate (SWE-bench's test directives).
    test_requirements: pip requirement strings installed into the package's venv.
    pytest_args: options added to every pytest run (e.g. `-o addopts=` to drop a config's
      coverage options).
    python_path: folder (relative to the repository root) that goes on PYTHONPATH: "" for a
      flat layout, "src" for a src layout.
    env: environment variables for test runs.
  """
  name: str
  version: str
  repo: str
  source_paths: tuple[str, ...]
  test_files: tuple[str, ...]
  exclude: tuple[str, ...] = ()
  test_requirements: tuple[str, ...] = ("pytest>=8",)
  pytest_args: str = "-o addopts="
  python_path: str = ""
  env: tuple[tuple[str, str], ...] = ()

  @property
  def key(self) -> str:
    """`name-version`, the name of the package's environment (image directory)."""
    return f"{self.name}-{self.version}"

  def fingerprint(self) -> str:
    """A short hash of every field: a changed profile rebuilds its cached environment."""
    blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


PROFILES: dict[str, PackageProfile] = {p.name: p for p in [
    PackageProfile(
        name="toolz", version="1.2.0", repo="pytoolz/toolz",
        source_paths=("toolz",), exclude=("toolz/tests", "toolz/sandbox", "toolz/curried"),
        test_files=("toolz/tests",)),
    PackageProfile(
        name="inflection", version="0.5.1", repo="jpvanhal/inflection",
        source_paths=("inflection",), test_files=("test_inflection.py",)),
    PackageProfile(
        name="parse", version="1.22.4", repo="r1chardj0n3s/parse",
        source_paths=("parse",), test_files=("tests",)),
    PackageProfile(
        name="boltons", version="26.2.0", repo="mahmoud/boltons",
        source_paths=("boltons",), test_files=("tests",)),
    PackageProfile(
        name="idna", version="3.20", repo="kjd/idna",
        source_paths=("idna",), exclude=("idna/idnadata.py", "idna/uts46data.py"),
        test_files=("tests/test_idna.py", "tests/test_idna_codec.py",
                    "tests/test_idna_compat.py", "tests/test_intranges.py",
                    "tests/test_idna_errors.py"),
        test_requirements=("pytest>=8", "hypothesis>=6")),
    PackageProfile(
        name="more-itertools", version="11.2.1", repo="more-itertools/more-itertools",
        source_paths=("more_itertools",), test_files=("tests",)),
    PackageProfile(
        name="python-dateutil", version="4.0.0", repo="dateutil/dateutil",
        source_paths=("src/dateutil",), exclude=("src/dateutil/zoneinfo",),
        test_files=("tests",), python_path="src",
        test_requirements=("pytest>=8", "pytest-cov", "freezegun", "attrs", "hypothesis")),
]}

# The default task set: five packages whose chosen suites run in a few seconds each.
DEFAULT_PACKAGES = ("toolz", "inflection", "parse", "boltons", "idna")
