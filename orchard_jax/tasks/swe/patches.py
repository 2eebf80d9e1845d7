"""Patch handling: cleaning model patches, listing the files they touch, applying them robustly.

Model patches arrive damaged in the ways SWE-bench harnesses have learnt to expect: prose or a
markdown fence around the diff, CRLF line endings from a JSON round trip, hunk headers whose
line counts are off, context lines whose trailing whitespace was stripped, a missing final
newline. Application follows SWE-bench's harness (`git apply`, then `patch --fuzz`), with more
fallbacks, every one atomic (a failed attempt leaves the tree as it was):

  for each of git apply -v;  git apply -v --recount;  git apply -v --recount --ignore-whitespace
    on each variant of the patch (as given; with CRLF turned into LF)
  for each variant: patch -p1 --fuzz=5 -l (checked with --dry-run first)

`git apply` handles new, deleted, renamed and binary files (`GIT binary patch`); `patch -l`
handles context whose whitespace differs. The script prints which attempt applied, and exits
non-zero when none did: a failed apply is its own evaluation outcome.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import tempfile

from orchard_jax.tasks.errors import PatchError

APPLIED_MARKER = "ORCHARD_PATCH_APPLIED"
FAILED_MARKER = "ORCHARD_PATCH_FAILED"

_DIFF_START = re.compile(r"^(diff --git |--- (a/|/dev/null)|Index: )", re.M)
_FENCE = re.compile(r"^```[\w-]*\s*$", re.M)
_GIT_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+?)$", re.M)
_PLUS_HEADER = re.compile(r"^\+\+\+ (?:b/)?(.+?)(?:\t.*)?$", re.M)
_MINUS_HEADER = re.compile(r"^--- (?:a/)?(.+?)(?:\t.*)?$", re.M)


def clean_patch(text: str) -> str:
  """Strips what surrounds a diff (prose, markdown fences) and ends it with a newline.

  Returns "" for an empty or whitespace-only patch. Leaves line endings alone (see
  `patch_variants`).
  """
  if not text or not text.strip():
    return ""
  match = _DIFF_START.search(text)
  if match is None:
    return text if text.endswith("\n") else text + "\n"  # let `git apply` name the problem
  text = text[match.start():]
  fence = _FENCE.search(text)
  if fence is not None:
    text = text[:fence.start()]
  return text if text.endswith("\n") else text + "\n"


def patch_variants(text: str) -> list[str]:
  """The cleaned patch, then (when it has CR characters) the same patch with CRLF as LF."""
  cleaned = clean_patch(text)
  variants = [cleaned]
  if "\r\n" in cleaned:
    variants.append(cleaned.replace("\r\n", "\n"))
  return variants


def patch_files(text: str) -> list[str]:
  """Paths (relative to the repository root) that a unified or git diff touches, in order.

  A rename lists both its old and new path; /dev/null is never listed.
  """
  files: list[str] = []
  def add(path: str):
    path = path.strip().rstrip("\r")
    if path and path != "/dev/null" and path not in files:
      files.append(path)
  headers = list(_GIT_HEADER.finditer(text))
  if headers:
    for match in headers:
      add(match.group(1))
      add(match.group(2))
    return files
  for match in _MINUS_HEADER.finditer(text):
    add(match.group(1))
  for match in _PLUS_HEADER.finditer(text):
    add(match.group(1))
  return files


def apply_script(variant_paths: list[str], *, workdir: str = ".") -> str:
  """A bash script that applies the first patch variant that applies, trying each method.

  Args:
    variant_paths: files holding the variants from `patch_variants`, in order.
    workdir: the repository root.

  Returns:
    Script text. It prints `ORCHARD_PATCH_APPLIED <method>` and exits 0 on success, prints
    `ORCHARD_PATCH_FAILED` and exits 1 when nothing applied.
  """
  quoted = " ".join(shlex.quote(p) for p in variant_paths)
  return f"""cd {shlex.quote(workdir)} || exit 2
for opts in "" "--recount" "--recount --ignore-whitespace"; do
  for p in {quoted}; do
    if git apply -v $opts "$p" 2>&1; then echo "{APPLIED_MARKER} git apply $opts"; exit 0; fi
  done
done
for p in {quoted}; do
  if patch --dry-run --batch --fuzz=5 -l -p1 -i "$p" >/dev/null 2>&1 && \\
     patch --batch --fuzz=5 -l -p1 --no-backup-if-mismatch -i "$p" 2>&1; then
    echo "{APPLIED_MARKER} patch --fuzz=5 -l"; exit 0
  fi
done
echo "{FAILED_MARKER}"; exit 1
"""


@dataclasses.dataclass
class ApplyResult:
  """What applying a patch did: `applied`, the `method` that worked, and the tool `log`."""
  applied: bool
  method: str
  log: str


def parse_apply_output(output: str, exit_code: int) -> ApplyResult:
  """Reads the output of `apply_script`."""
  for line in output.splitlines():
    if line.startswith(APPLIED_MARKER):
      return ApplyResult(exit_code == 0, line[len(APPLIED_MARKER):].strip(), output)
  return ApplyResult(False, "", output)


def apply_patch_locally(repo_dir: str, patch: str, *, timeout_s: float = 60.0) -> ApplyResult:
  """Applies `patch` to a git work tree on this machine with the same script a sandbox runs.

  Raises:
    PatchError: the patch is empty.
  """
  if not clean_patch(patch):
    raise PatchError("the patch is empty; expected a unified diff")
  with tempfile.TemporaryDirectory(prefix="orchard_patch_") as tmp:
    paths = []
    for i, variant in enumerate(patch_variants(patch)):
      path = os.path.join(tmp, f"variant{i}.diff")
      with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(variant)
      paths.append(path)
    proc = subprocess.run(["bash", "-c", apply_script(paths, workdir=repo_dir)],
                          capture_output=True, text=True, timeout=timeout_s)
  return parse_apply_output(proc.stdout + proc.stderr, proc.returncode)


def diff_script(base_commit: str = "HEAD", *, workdir: str = ".") -> str:
  """Bash that prints the work tree's full change against `base_commit` as a git diff.

  New files are included (`git add -A`), and binary changes are written as `GIT binary patch`.
  """
  return (f"cd {shlex.quote(workdir)} && git add -A >/dev/null 2>&1 && "
          f"git -c core.quotepath=false diff --cached --binary {shlex.quote(base_commit)}")
