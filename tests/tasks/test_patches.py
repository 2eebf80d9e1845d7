"""Robust patch application against real git work trees: each case's expected file content is
what a person reading the patch would write down."""
import os
import subprocess

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from orchard_jax.tasks.swe.patches import (apply_patch_locally, clean_patch, diff_script,
                                           file_changes, patch_files)


def _git(repo, *args):
  return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True).stdout


@pytest.fixture
def repo(tmp_path):
  (tmp_path / "lf.txt").write_bytes(b"one\ntwo\nthree\n")
  (tmp_path / "crlf.txt").write_bytes(b"alpha\r\nbeta\r\ngamma\r\n")
  (tmp_path / "spaces.txt").write_bytes(b"x\ny   \nz\n")
  (tmp_path / "old_name.py").write_bytes(b"def f():\n    return 1\n")
  (tmp_path / "gone.txt").write_bytes(b"bye\n")
  (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "add", "-A")
  _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
  return tmp_path


def _status(repo):
  return _git(repo, "status", "--porcelain").decode()


def test_plain_patch_with_prose_and_fence(repo):
  patch = ("Here is my fix:\n```diff\n--- a/lf.txt\n+++ b/lf.txt\n@@ -1,3 +1,3 @@\n one\n-two\n"
           "+TWO\n three\n```\nThanks!")
  result = apply_patch_locally(str(repo), patch)
  assert result.applied and result.method.startswith("git apply")
  assert (repo / "lf.txt").read_bytes() == b"one\nTWO\nthree\n"


def test_crlf_patch_on_lf_file(repo):
  patch = "--- a/lf.txt\r\n+++ b/lf.txt\r\n@@ -1,3 +1,3 @@\r\n one\r\n-two\r\n+2\r\n three\r\n"
  assert apply_patch_locally(str(repo), patch).applied
  assert (repo / "lf.txt").read_bytes() == b"one\n2\nthree\n"


def test_lf_patch_on_crlf_file(repo):
  patch = "--- a/crlf.txt\n+++ b/crlf.txt\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n"
  assert apply_patch_locally(str(repo), patch).applied
  content = (repo / "crlf.txt").read_bytes()
  assert content.startswith(b"alpha\r\n") and b"BETA" in content and b"beta" not in content


def test_context_whose_trailing_whitespace_was_stripped(repo):
  patch = "--- a/spaces.txt\n+++ b/spaces.txt\n@@ -1,3 +1,3 @@\n x\n y\n-z\n+Z\n"
  result = apply_patch_locally(str(repo), patch)
  assert result.applied and "patch" in result.method
  assert (repo / "spaces.txt").read_bytes() == b"x\ny   \nZ\n"


def test_wrong_hunk_line_counts_and_missing_final_newline(repo):
  patch = "--- a/lf.txt\n+++ b/lf.txt\n@@ -1,7 +1,9 @@\n one\n-two\n+deux\n three"
  assert apply_patch_locally(str(repo), patch).applied
  assert (repo / "lf.txt").read_bytes() == b"one\ndeux\nthree\n"


def test_new_deleted_renamed_and_binary_files(repo, tmp_path_factory):
  # Make the changes for real, take git's diff, and apply it to a fresh clone.
  (repo / "new_dir").mkdir()
  (repo / "new_dir" / "added.py").write_bytes(b"print('new')\n")
  (repo / "gone.txt").unlink()
  _git(repo, "mv", "old_name.py", "new_name.py")
  (repo / "blob.bin").write_bytes(bytes(reversed(range(256))))
  _git(repo, "add", "-A")
  patch = _git(repo, "diff", "--cached", "--binary", "-M", "HEAD").decode()
  assert "rename from old_name.py" in patch and "GIT binary patch" in patch
  clone = tmp_path_factory.mktemp("clone")
  _git(clone, "clone", "-q", str(repo), ".")
  assert apply_patch_locally(str(clone), patch).applied
  assert (clone / "new_dir" / "added.py").read_bytes() == b"print('new')\n"
  assert not (clone / "gone.txt").exists()
  assert not (clone / "old_name.py").exists()
  assert (clone / "new_name.py").read_bytes() == b"def f():\n    return 1\n"
  assert (clone / "blob.bin").read_bytes() == bytes(reversed(range(256)))
  assert sorted(patch_files(patch)) == sorted(
      ["blob.bin", "gone.txt", "new_dir/added.py", "new_name.py", "old_name.py"])


@pytest.mark.parametrize("patch", [
    "this is not a diff at all\n",
    "--- a/lf.txt\n+++ b/lf.txt\n@@ -1,3 +1,3 @@\n one\n-deux\n+2\n three\n",  # wrong content
    "--- a/missing.txt\n+++ b/missing.txt\n@@ -1 +1 @@\n-a\n+b\n",
])
def test_patch_that_cannot_apply_fails_and_leaves_tree_unchanged(repo, patch):
  result = apply_patch_locally(str(repo), patch)
  assert not result.applied
  assert _status(repo) == ""


def test_half_applicable_patch_is_atomic(repo):
  patch = ("--- a/lf.txt\n+++ b/lf.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
           "--- a/spaces.txt\n+++ b/spaces.txt\n@@ -1,3 +1,3 @@\n x\n-nothing like this\n+q\n z\n")
  assert not apply_patch_locally(str(repo), patch).applied
  assert _status(repo) == ""


def test_clean_patch_and_diff_script(repo):
  assert clean_patch("   \n") == ""
  (repo / "lf.txt").write_bytes(b"one\n")
  (repo / "brand_new.txt").write_bytes(b"hi\n")
  out = subprocess.run(["bash", "-c", diff_script("HEAD", workdir=str(repo))],
                       capture_output=True, text=True, check=True).stdout
  assert patch_files(out) == ["brand_new.txt", "lf.txt"]


# File names git writes plainly, quotes C-style, or splits ambiguously on the `diff --git` line.
_NAME = st.lists(st.sampled_from(list("abz_.-") + [" ", '"', "\\", "\t", "é", "ü", "b/", " b/"]),
                 min_size=1, max_size=8).map("".join).filter(
                     lambda n: n.strip(". ") and "/." not in n and not n.endswith("/")
                     and not n.startswith("/") and "//" not in n and not n.startswith("."))


@settings(max_examples=40, deadline=None)
@given(st.lists(_NAME, min_size=3, max_size=3, unique=True), st.data())
def test_file_changes_names_what_git_names(tmp_path_factory, names, data):
  # The reference is git itself: `git diff --name-status -z` on the change that made the patch.
  repo = tmp_path_factory.mktemp("names")
  _git(repo, "init", "-q")
  paths = [f"d{i}/{name}" for i, name in enumerate(names)]
  for path in paths:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_bytes(b"one\ntwo\n")
  (repo / "keep.txt").write_bytes(b"k\n")
  _git(repo, "add", "-A")
  _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
  modified, deleted, renamed = paths
  (repo / modified).write_bytes(b"one\nTWO\n")
  (repo / deleted).unlink()
  _git(repo, "mv", renamed, renamed + " moved")
  link = data.draw(st.sampled_from(["new link", 'li"nk', "plain"]))
  os.symlink("/etc/hostname", repo / link)
  (repo / "keep.txt").chmod(0o755)
  _git(repo, "add", "-A")
  patch = _git(repo, "diff", "--cached", "--binary", "-M", "HEAD").decode()
  status = _git(repo, "diff", "--cached", "--name-status", "-z", "-M", "HEAD").decode()
  fields, expected = status.split("\0"), {}
  i = 0
  while i < len(fields) - 1:
    code = fields[i]
    if code.startswith("R"):
      expected[(fields[i + 1], fields[i + 2])] = "R"
      i += 3
    else:
      expected[(fields[i + 1], fields[i + 1])] = code
      i += 2
  changes = file_changes(patch)
  seen = {}
  for change in changes:
    key = (change.old_path or change.new_path, change.new_path or change.old_path)
    seen[key] = ("A" if change.created else "D" if change.deleted
                 else "R" if change.old_path != change.new_path else "M")
  assert seen == expected
  assert [c.new_path for c in changes if c.symlink] == [link]
  assert next(c for c in changes if c.new_path == "keep.txt").new_mode == "100755"


def test_file_changes_tolerates_what_model_patches_carry():
  patch = ("Sure, here it is:\n```diff\n--- a/x.py\t2024-01-01 00:00\n+++ b/x.py\n"
           "@@ -1,3 +1,3 @@\n a\n--- not a header: a removed line that starts with two dashes\n"
           "+++ not a header either\n c\n```\n")
  assert [(c.old_path, c.new_path) for c in file_changes(patch)] == [("x.py", "x.py")]
  # Hunk counts that are off still find the next file.
  off = ("--- a/x.py\n+++ b/x.py\n@@ -1,9 +1,9 @@\n-a\n+b\n"
         "--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n")
  assert patch_files(off) == ["x.py", "y.py"]
  assert file_changes("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n")[0].created
