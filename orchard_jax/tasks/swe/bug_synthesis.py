"""Candidate bugs from procedural AST mutations, by SWE-smith's Python modifiers.

SWE-smith (arXiv 2504.21798, package `swesmith`) defines procedural modifiers that rewrite one
function or class at a time: invert an if/else, flip or change an operator, swap operands,
change a constant, break a chain of operations, remove a loop / conditional / assignment /
wrapper, shuffle lines, remove a base class or methods, shuffle methods. We use them as a
library on single files (no Docker, no repository mirror): extract the code entities of a
source file, ask each applicable modifier for a rewrite, and splice the rewrite back into the
file text. Most candidates change no test outcome; the builder runs the tests to keep only
real bugs.

Candidates come out in a seeded random order, so a build is reproducible and a time budget
samples evenly over modifiers and files instead of exhausting the first file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from typing import Iterator

from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe.packages import PackageProfile


@dataclasses.dataclass(frozen=True)
class CandidateBug:
  """One mutated source file.

  Attributes:
    file: path relative to the repository root.
    original: the file's text before the mutation.
    modified: the file's text with the bug.
    modifier: SWE-smith's modifier name (e.g. "func_pm_op_change").
    entity: the name of the function or class that was rewritten.
    explanation: the modifier's description of the change (never shown to the agent).
  """
  file: str
  original: str
  modified: str
  modifier: str
  entity: str
  explanation: str

  @property
  def key(self) -> str:
    """A stable id: hash of the file path and the mutated text."""
    return hashlib.sha256(f"{self.file}\0{self.modified}".encode()).hexdigest()[:12]


def source_files(repo_dir: str, profile: PackageProfile) -> list[str]:
  """The .py files (relative paths, sorted) under the profile's source paths, minus excludes."""
  files = []
  for source in profile.source_paths:
    top = os.path.join(repo_dir, source)
    if os.path.isfile(top):
      files.append(source)
      continue
    if not os.path.isdir(top):
      raise BuildError(f"{profile.key}: source path {source!r} is not in the sdist at {repo_dir}")
    for folder, _, names in os.walk(top):
      for name in names:
        if name.endswith(".py"):
          files.append(os.path.relpath(os.path.join(folder, name), repo_dir))
  excluded = tuple(e.rstrip("/") for e in profile.exclude)
  return sorted(f for f in files
                if not any(f == e or f.startswith(e + "/") for e in excluded)
                and "/tests/" not in f"/{f}" and not os.path.basename(f).startswith("test_"))


def _splice(text: str, entity, rewrite: str) -> str:
  # The rewrite is the entity's code without its indentation; put it back where it was.
  lines = text.splitlines(keepends=True)
  indent = " " * (entity.indent_level * entity.indent_size)
  new = [indent + line if line.strip() else line for line in rewrite.splitlines(keepends=True)]
  if not new:
    return text
  last = lines[entity.line_end - 1]
  ending = last[len(last.rstrip("\r\n")):] or "\n"
  new[-1] = new[-1].rstrip("\r\n") + ending
  return "".join(lines[:entity.line_start - 1] + new + lines[entity.line_end:])


def generate_candidates(repo_dir: str, profile: PackageProfile, *, seed: int = 0,
                        ) -> Iterator[CandidateBug]:
  """Yields distinct candidate bugs for a package, in a seeded random order.

  Every (code entity, applicable modifier) pair is tried once; a pair whose rewrite is
  unchanged, does not compile, or repeats an earlier candidate is skipped.

  Args:
    repo_dir: the unmodified repository.
    profile: which files may be mutated.
    seed: seeds both the order and SWE-smith's modifiers.

  Raises:
    BuildError: swesmith (or a grammar package it imports) is not installed.
  """
  try:
    from swesmith.bug_gen.adapters.python import get_entities_from_file_py
    from swesmith.bug_gen.procedural.python import MODIFIERS_PYTHON
  except ImportError as e:
    raise BuildError(f"bug synthesis needs SWE-smith's modifiers: pip install swesmith libcst "
                     f"astor python-dotenv tree-sitter and its grammar packages "
                     f"(requirements.txt lists them): {e}") from e
  rng = random.Random(seed)
  texts, pairs = {}, []
  for rel in source_files(repo_dir, profile):
    path = os.path.join(repo_dir, rel)
    with open(path, encoding="utf-8") as f:
      texts[rel] = f.read()
    entities = []
    get_entities_from_file_py(entities, path)
    for entity in entities:
      for index, modifier in enumerate(MODIFIERS_PYTHON):
        if modifier.can_change(entity):
          pairs.append((rel, entity, index))
  rng.shuffle(pairs)
  # Fresh modifier objects per call: their random state must not depend on earlier builds.
  modifiers = [type(m)(likelihood=m.likelihood, seed=seed) for m in MODIFIERS_PYTHON]
  seen = set()
  for rel, entity, index in pairs:
    modifier = modifiers[index]
    try:
      rewrite = modifier.modify(entity)
    except Exception:  # noqa: BLE001 - a modifier that trips on odd code yields no candidate
      continue
    if rewrite is None or not rewrite.rewrite.strip():
      continue
    modified = _splice(texts[rel], entity, rewrite.rewrite)
    if modified == texts[rel]:
      continue
    try:
      compile(modified, rel, "exec")
    except (SyntaxError, ValueError):
      continue
    candidate = CandidateBug(rel, texts[rel], modified, modifier.name, entity.name,
                             getattr(modifier, "explanation", ""))
    if candidate.key in seen:
      continue
    seen.add(candidate.key)
    yield candidate
