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


@dataclasses.dataclass(frozen=True)
class FileChange:
  """One file a patch touches, named as `git apply` and `patch -p1` name it.

  Attributes:
    old_path: the path before the change (relative to the repository root), None for a new file.
    new_path: the path after it, None for a deleted file (equal to old_path for an edit).
    old_mode, new_mode: git file modes ("100644", "100755", "120000" for a symbolic link) when
      the patch states them, else "".
    binary: the change is a binary one (`GIT binary patch` or `Binary files ... differ`).
  """
  old_path: str | None
  new_path: str | None
  old_mode: str = ""
  new_mode: str = ""
  binary: bool = False

  @property
  def paths(self) -> tuple[str, ...]:
    """The old and new path (one when they are equal), never None."""
    out = tuple(p for p in (self.old_path, self.new_path) if p is not None)
    return out[:1] if len(out) == 2 and out[0] == out[1] else out

  @property
  def created(self) -> bool:
    return self.old_path is None

  @property
  def deleted(self) -> bool:
    return self.new_path is None

  @property
  def symlink(self) -> bool:
    """The change leaves a symbolic link (git mode 120000) at new_path."""
    return self.new_mode == "120000"


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(text: str) -> tuple[str, str]:
  """Reads one git C-quoted name from the start of `text`; returns (name, rest of text)."""
  out = bytearray()
  i = 1
  while i < len(text) and text[i] != '"':
    c = text[i]
    if c == "\\" and i + 1 < len(text):
      nxt = text[i + 1]
      if nxt in "0123" and re.match(r"[0-7]{3}", text[i + 1:i + 4]):
        out.append(int(text[i + 1:i + 4], 8))
        i += 4
        continue
      if nxt in _C_ESCAPES:
        out.append(_C_ESCAPES[nxt])
        i += 2
        continue
    out += c.encode("utf-8", "surrogateescape")
    i += 1
  return out.decode("utf-8", "replace"), text[i + 1:]


def _strip_p1(name: str) -> str | None:
  """The name `-p1` leaves: /dev/null is None; the first path component goes."""
  if name == "/dev/null":
    return None
  return name.split("/", 1)[1] if "/" in name else name


def _header_name(text: str) -> str | None:
  """The file name of a `--- name` / `+++ name` / `rename from name` line's argument."""
  text = text.rstrip("\r")
  if text.startswith('"'):
    return _unquote(text)[0]
  # git ends a name that holds a space with a tab (so does GNU diff, before its timestamp).
  return text.split("\t", 1)[0] if "\t" in text else text


def _git_line_names(rest: str) -> tuple[str | None, str | None]:
  """(a-name, b-name) of a `diff --git` line's argument, both still with their prefix."""
  rest = rest.rstrip("\r")
  if rest.startswith('"'):
    first, tail = _unquote(rest)
    tail = tail.lstrip(" ")
    second = _unquote(tail)[0] if tail.startswith('"') else tail
    return first, second
  if ' "' in rest:  # unquoted a-name, quoted b-name
    first, _, tail = rest.partition(' "')
    return first, _unquote('"' + tail)[0]
  # Unquoted names may hold spaces: split where both halves name the same path (git's rule).
  for i, c in enumerate(rest):
    if c == " " and _strip_p1(rest[:i]) == _strip_p1(rest[i + 1:]):
      return rest[:i], rest[i + 1:]
  first, sep, second = rest.rpartition(" b/")
  return (first, "b/" + second) if sep else (rest, rest)


def file_changes(text: str) -> list[FileChange]:
  """Every file a unified or git diff touches, read the way `git apply` / `patch -p1` read it.

  Tolerant of what model patches carry (prose around the diff, hunk counts that are off, CRLF
  line endings): a file's section starts at a `diff --git` line or at a `---`/`+++` pair outside
  a hunk's counted lines (inside one only when a hunk header follows the pair, i.e. the counts
  were wrong); git's extended header lines (`new file mode`, `rename from`, ...) refine it.
  Quoted names (git's C-style quoting of unusual characters) are decoded.
  """
  lines = text.replace("\r\n", "\n").split("\n")
  changes: list[FileChange] = []
  section: dict | None = None
  old_left = new_left = 0

  def close():
    if section is None:
      return
    old = None if section.get("created") else section.get("old")
    new = None if section.get("deleted") else section.get("new")
    if old is not None or new is not None:
      changes.append(FileChange(old, new, section.get("old_mode", ""),
                                section.get("new_mode", ""), section.get("binary", False)))

  i = 0
  while i < len(lines):
    line = lines[i]
    pair = (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "))
    if old_left > 0 or new_left > 0:
      header_follows = pair and i + 2 < len(lines) and _HUNK.match(lines[i + 2])
      if not header_follows and line[:1] in (" ", "", "-", "+", "\\"):
        if line[:1] in (" ", ""):
          old_left, new_left = old_left - 1, new_left - 1
        elif line[:1] == "-":
          old_left -= 1
        elif line[:1] == "+":
          new_left -= 1
        i += 1
        continue
      old_left = new_left = 0  # the counts were off: this line is not hunk content
    if line.startswith("diff --git "):
      close()
      a, b = _git_line_names(line[len("diff --git "):])
      section = {"old": _strip_p1(a), "new": _strip_p1(b), "git": True}
    elif pair:
      old = _strip_p1(_header_name(line[4:]))
      new = _strip_p1(_header_name(lines[i + 1][4:]))
      if section is None or not section.get("git") or section.get("paired"):
        close()
        section = {}
      section.update(old=old, new=new, paired=True)
      section["created"] = section.get("created", False) or old is None
      section["deleted"] = section.get("deleted", False) or new is None
      i += 2
      continue
    elif (match := _HUNK.match(line)) is not None:
      old_left = int(match.group(1)) if match.group(1) is not None else 1
      new_left = int(match.group(2)) if match.group(2) is not None else 1
    elif section is not None and section.get("git") and not section.get("paired"):
      for prefix, key in (("rename from ", "old"), ("copy from ", "old"),
                          ("rename to ", "new"), ("copy to ", "new")):
        if line.startswith(prefix):
          section[key] = _header_name(line[len(prefix):])
      if line.startswith("new file mode "):
        section["created"], section["new_mode"] = True, line.split()[-1]
      elif line.startswith("deleted file mode "):
        section["deleted"], section["old_mode"] = True, line.split()[-1]
      elif line.startswith("old mode "):
        section["old_mode"] = line.split()[-1]
      elif line.startswith("new mode "):
        section["new_mode"] = line.split()[-1]
    if section is not None and line.startswith(("GIT binary patch", "Binary files ")):
      section["binary"] = True
    i += 1
  close()
  return changes


def patch_files(text: str) -> list[str]:
  """Paths (relative to the repository root) that a unified or git diff touches, in order.

  A rename lists both its old and new path; /dev/null is never listed. See `file_changes`.
  """
  files: list[str] = []
  for change in file_changes(text):
    for path in change.paths:
      if path not in files:
        files.append(path)
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
