"""The repository stands on its own: every document it cites is in it.

A person who clones the repository has only its files. Docstrings, comments, README and docs
may cite a Markdown document only when the repository holds it, and never a folder beside the
checkout or an absolute path on a developer's machine.
"""
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_MD_CITATION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")
_OUTSIDE = re.compile(r"\.\./shared|/work/shared|/work/main\b|/work/wt/|/work/\.library")
_TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".sh", ".yaml", ".yml", ".json", ""}


def _tracked_files() -> list[pathlib.Path]:
  try:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout: the tracked files cannot be listed")
  return [ROOT / name for name in out if (ROOT / name).suffix in _TEXT_SUFFIXES]


def _text(path: pathlib.Path) -> str:
  try:
    return path.read_text(encoding="utf-8")
  except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
    return ""


def test_every_cited_markdown_document_is_in_the_repository():
  files = _tracked_files()
  markdown = {p.relative_to(ROOT).as_posix() for p in files if p.suffix == ".md"}
  names = {pathlib.PurePosixPath(m).name for m in markdown}
  missing = []
  for path in files:
    if path == pathlib.Path(__file__).resolve():
      continue
    for lineno, line in enumerate(_text(path).splitlines(), 1):
      for cited in _MD_CITATION.findall(line):
        resolved = (path.parent / cited).resolve()
        inside = resolved.is_relative_to(ROOT) and resolved.relative_to(ROOT).as_posix() in markdown
        if cited in markdown or inside or (("/" not in cited) and cited in names):
          continue
        missing.append(f"{path.relative_to(ROOT)}:{lineno}: {cited}")
  assert not missing, "documents cited but not in the repository:\n" + "\n".join(missing)


def test_nothing_points_outside_the_checkout():
  hits = []
  for path in _tracked_files():
    if path == pathlib.Path(__file__).resolve():
      continue
    for lineno, line in enumerate(_text(path).splitlines(), 1):
      if _OUTSIDE.search(line):
        hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:100]}")
  assert not hits, "references outside the repository:\n" + "\n".join(hits)


def test_the_check_finds_a_missing_document(tmp_path):
  line = "see NOTES_ELSEWHERE.md section 2 and docs/algorithms.md"
  assert _MD_CITATION.findall(line) == ["NOTES_ELSEWHERE.md", "docs/algorithms.md"]
  # Built from parts so that this test's own text is not a citation for the check to find.
  assert _OUTSIDE.search("as ../" + "shared/" + "ALGO" + "RITHMS.md says")


# A path written in backticks in README.md or docs/ that starts at a folder of the repository
# or of the package ("launch/run.py", "rollout/proxy.py"); run outputs ("runs/...",
# "build/build_report.jsonl", "WORKDIR/summary.json") start elsewhere and are not checked.
_CODE_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)(?::\w+)?`")


def _missing_code_paths(text: str) -> list[str]:
  """Backticked repository paths in `text` that name nothing in the checkout."""
  missing = []
  for match in _CODE_PATH.finditer(text):
    path = match.group(1).rstrip("/")
    first = path.split("/")[0]
    if first == "runs" or not any((base / first).is_dir() for base in (ROOT, ROOT / "orchard_jax")):
      continue
    if not ((ROOT / path).exists() or (ROOT / "orchard_jax" / path).exists()):
      missing.append(path)
  return missing


def test_every_path_the_readme_and_docs_name_exists():
  """A stale path sends a reader to nothing (docs/algorithms.md named a prompts folder that had
  moved into the SWE recipe)."""
  missing = []
  for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    for lineno, line in enumerate(_text(path).splitlines(), 1):
      missing += [f"{path.relative_to(ROOT)}:{lineno}: {p}" for p in _missing_code_paths(line)]
  assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)


def test_the_path_check_finds_a_moved_file():
  text = ("prompt in `orchard_jax/recipes/prompts/`, code in `rollout/proxy.py` and "
          "`experiments/swe_rpr.py:cluster`, output in `WORKDIR/summary.json`")
  assert _missing_code_paths(text) == ["orchard_jax/recipes/prompts"]
