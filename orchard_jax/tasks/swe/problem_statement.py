"""Issue-style problem statements written from the evidence of the failing tests.

A synthetic bug has no issue. We write one the way a user reports a regression: what misbehaves
(the failing tests, named by what they exercise), the error each one shows (pytest's `E` lines
from the log), and what is expected. The statement never mentions the gold patch, the mutated
function's source or the kind of mutation, only what a user running the tests would see.
"""
from __future__ import annotations

import random
import re

_SECTION = re.compile(r"^_{3,} (.+?) _{3,}\Z")
_SUMMARY = re.compile(r"^={3,} .*(short test summary|passed|failed|error).*={3,}\Z", re.I)
_MAX_TESTS = 3
_MAX_ERROR_LINES = 8


def failure_evidence(log: str) -> dict[str, list[str]]:
  """Maps each failure section title in a pytest log ("TestX.test_y") to its `E` lines."""
  evidence: dict[str, list[str]] = {}
  current = None
  for line in log.replace("\r\n", "\n").split("\n"):
    match = _SECTION.match(line)
    if match:
      current = match.group(1).strip()
      evidence.setdefault(current, [])
      continue
    if _SUMMARY.match(line):
      current = None
      continue
    if current is not None and line.startswith("E ") and len(evidence[current]) < _MAX_ERROR_LINES:
      evidence[current].append(line[1:].strip())
  return evidence


def _section_for(node_id: str, evidence: dict[str, list[str]]) -> list[str]:
  parts = node_id.split("::")[1:]
  title = ".".join(parts)
  if title in evidence:
    return evidence[title]
  for key, lines in evidence.items():
    if key.endswith(parts[-1] if parts else node_id):
      return lines
  return []


def _subject(node_id: str) -> str:
  name = node_id.split("::")[-1]
  name = re.sub(r"\[.*\]$", "", name)
  name = re.sub(r"^test_?", "", name)
  return name.replace("_", " ").strip() or name


def write_problem_statement(*, package: str, module: str, fail_to_pass: list[str], log: str,
                            seed: int = 0) -> str:
  """Writes an issue for a bug from its failing tests.

  Args:
    package: the distribution name and version ("toolz 1.2.0").
    module: the import name users know ("toolz").
    fail_to_pass: the instance's FAIL_TO_PASS node ids.
    log: the pytest log of the run with the bug (`--tb=short` failure sections).
    seed: picks the phrasing, so statements vary across instances.

  Returns:
    Markdown text: a title line, the symptom, the error output, the expectation.
  """
  rng = random.Random(seed)
  evidence = failure_evidence(log)
  shown = fail_to_pass[:_MAX_TESTS]
  subjects = sorted({_subject(t) for t in shown})
  title = rng.choice([
      "Regression in `{m}`: {s} no longer works",
      "`{m}` gives wrong results for {s}",
      "Unexpected behaviour in `{m}` ({s})",
      "Bug: {s} is broken in `{m}`",
  ]).format(m=module, s=subjects[0] if subjects else "basic usage")
  opening = rng.choice([
      f"I'm using {package} and some behaviour looks wrong.",
      f"After installing {package} I ran into incorrect behaviour.",
      f"There seems to be a bug in {package}.",
  ])
  lines = [title, "", opening]
  if len(subjects) > 1:
    lines.append("It shows up in several places: " + ", ".join(f"*{s}*" for s in subjects) + ".")
  lines += ["", "These checks fail:", ""]
  for test in shown:
    lines.append(f"- `{test}`")
  if len(fail_to_pass) > len(shown):
    lines.append(f"- ... and {len(fail_to_pass) - len(shown)} more")
  for test in shown:
    errors = _section_for(test, evidence)
    if errors:
      lines += ["", f"`{test.split('::')[-1]}` fails with:", "", "```", *errors, "```"]
  lines += ["", rng.choice([
      "Expected: these calls behave as documented and the checks pass.",
      "I'd expect this to work as the documentation describes.",
      "The expected behaviour is what the documentation says; the current result is wrong.",
  ])]
  return "\n".join(lines) + "\n"
