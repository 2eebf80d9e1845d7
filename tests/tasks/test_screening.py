"""Which paths of a model patch are put back, which reject it, and which are the fix's own
(screening.py), checked kind by kind against the rule each kind states, on patches git made."""
import os
import subprocess

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from orchard_jax.tasks.swe import screening
from orchard_jax.tasks.swe.instance import SWEInstance, TestSpec

LAYOUT = screening.TestLayout(hidden_tests=("pkg/tests/test_core.py",),
                              test_directives=("pkg/tests", "test_top.py"),
                              runner_scripts=("scripts/run_tests.py",))


@pytest.mark.parametrize("path, flags, kind", [
    # restored
    ("pkg/tests/test_core.py", {}, "hidden_test"),
    ("pkg/tests/helpers.py", {}, "test_file"),
    ("pkg/tests/new_case.py", {"created": True}, "test_file"),
    ("docs/testing/example.py", {}, "test_file"),
    ("other/test_thing.py", {}, "test_file"),
    ("other/thing_test.py", {}, "test_file"),
    ("conftest.py", {"created": True}, "conftest"),
    ("pkg/sub/conftest.py", {}, "conftest"),
    ("pytest.ini", {"created": True}, "runner_config"),
    (".pytest.toml", {}, "runner_config"),
    ("setup.cfg", {}, "runner_config"),
    ("pkg/pyproject.toml", {}, "runner_config"),
    ("tox.ini", {"deleted": True}, "runner_config"),
    ("scripts/run_tests.py", {}, "runner_script"),
    ("__init__.py", {"created": True}, "package_layout"),
    ("pkg/tests/__init__.py", {"created": True}, "test_file"),
    # rejected
    ("pytest.py", {"created": True}, "runner_shadow"),
    ("pytest/__init__.py", {"created": True}, "runner_shadow"),
    ("deep/in/the/tree/_pytest/__init__.py", {"created": True}, "runner_shadow"),
    ("src/pluggy.py", {"created": True}, "runner_shadow"),
    ("unittest.py", {"created": True}, "runner_shadow"),
    ("src/json.py", {"created": True}, "runner_shadow"),
    ("sitecustomize.py", {}, "site_hook"),
    ("pkg/usercustomize.py", {"created": True}, "site_hook"),
    ("easy-install.pth", {"created": True}, "site_hook"),
    ("pkg.egg-info/entry_points.txt", {}, "package_metadata"),
    ("build/lib/x.dist-info/METADATA", {"created": True}, "package_metadata"),
    ("__editable___pkg_finder.py", {"created": True}, "package_metadata"),
    ("pkg/link.py", {"created": True, "symlink": True}, "symlink"),
    ("../outside.py", {}, "outside_workspace"),
    ("/etc/passwd", {}, "outside_workspace"),
    (".git/hooks/pre-commit", {}, "outside_workspace"),
    # the fix's own: a source change, a new module inside a package, an existing __init__.py
    ("pkg/core.py", {}, None),
    ("pkg/json.py", {"created": True}, None),
    ("pkg/coverage.py", {"created": True}, None),
    ("pkg/__init__.py", {}, None),
    ("pkg/sub/__init__.py", {"created": True}, None),
    ("pytest.py", {}, None),   # an existing module of that name is the repository's own (pytest's)
    ("README.rst", {}, None),
])
def test_each_kind(path, flags, kind):
  finding = screening.classify(path, LAYOUT, **flags)
  assert (finding.kind if finding else None) == kind
  if finding is not None:
    assert finding.reason and finding.path


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["tests", "test", "testing", "e2e", "pkg", "src", "a b", "x.y",
                                 ".hidden", "conftest.py", "setup.cfg", "mod.py", "__init__.py"]),
                min_size=1, max_size=5),
       st.booleans(), st.booleans())
def test_test_folders_and_runner_files_are_never_the_fixs_own(parts, created, deleted):
  path = "/".join(parts)
  finding = screening.classify(path, LAYOUT, created=created, deleted=deleted)
  if any(p in screening.TEST_FOLDERS for p in parts[:-1]) or parts[-1] in (
      "conftest.py", "setup.cfg"):
    assert finding is not None, path
  if finding is not None:
    assert finding.kind in screening.RESTORE_KINDS + screening.REJECT_KINDS


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_classify_takes_any_string(path):
  finding = screening.classify(path, LAYOUT)
  assert finding is None or finding.kind in screening.RESTORE_KINDS + screening.REJECT_KINDS


def _git(repo, *args, **kwargs):
  return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                        check=True, capture_output=True, **kwargs).stdout


@pytest.fixture
def repo(tmp_path):
  for path in ("pkg/core.py", "pkg/__init__.py", "pkg/tests/test_core.py", "setup.cfg",
               "README.rst"):
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text("x = 1\n")
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "add", "-A")
  _git(tmp_path, "commit", "-qm", "base")
  return tmp_path


def test_screen_of_a_patch_git_made(repo):
  (repo / "pkg/core.py").write_text("x = 2\n")
  (repo / "conftest.py").write_text("import pytest\n")
  (repo / "pkg/tests/test_core.py").write_text("def test(): pass\n")
  (repo / "setup.cfg").unlink()
  (repo / "pytest.py").write_text("raise SystemExit(0)\n")
  os.symlink("/etc/hostname", repo / "pkg/host.py")
  _git(repo, "mv", "README.rst", "pkg/tests/moved.rst")
  _git(repo, "add", "-A")
  patch = _git(repo, "diff", "--cached", "--binary", "-M", "HEAD").decode()
  screen = screening.screen_patch(patch, LAYOUT)
  assert sorted(screen.fix_files) == ["README.rst", "pkg/core.py"]
  assert {f.path: f.kind for f in screen.restored} == {
      "conftest.py": "conftest", "pkg/tests/test_core.py": "hidden_test",
      "setup.cfg": "runner_config", "pkg/tests/moved.rst": "test_file"}
  assert {f.path: f.kind for f in screen.rejected} == {"pytest.py": "runner_shadow",
                                                       "pkg/host.py": "symlink"}
  # Parents are restored before what is under them.
  order = screen.restored_paths
  assert order.index("conftest.py") < order.index("pkg/tests/test_core.py")


def test_workspace_status_joins_the_patchs_own_listing():
  # A path the patch headers hide (here: none named) but git status shows is screened too.
  status = "?? conftest.py\0 M pkg/core.py\0 D setup.cfg\0?? evil.pth\0"
  changes = screening.parse_git_status(status)
  assert [(c.path, c.created, c.deleted) for c in changes] == [
      ("conftest.py", True, False), ("pkg/core.py", False, False), ("setup.cfg", False, True),
      ("evil.pth", True, False)]
  screen = screening.screen_patch("", LAYOUT, changes)
  assert [f.path for f in screen.rejected] == ["evil.pth"]
  assert sorted(screen.restored_paths) == ["conftest.py", "setup.cfg"]
  assert screen.fix_files == ["pkg/core.py"]


def test_layout_of_an_instance():
  spec = TestSpec(image="x", test_cmd="./tests/runtests.py --verbosity 2 --parallel 1",
                  test_files=("tests/a/test_x.py::test_y", "tests/b"))
  test_patch = ("diff --git a/tests/a/test_x.py b/tests/a/test_x.py\n--- a/tests/a/test_x.py\n"
                "+++ b/tests/a/test_x.py\n@@ -1 +1 @@\n-a\n+b\n")
  instance = SWEInstance("i", "o/r", "abc", "p", test_patch=test_patch, test_spec=spec)
  layout = screening.TestLayout.of(instance)
  assert layout.hidden_tests == ("tests/a/test_x.py",)
  assert layout.test_directives == ("tests/a/test_x.py", "tests/b")
  assert layout.runner_scripts == ("tests/runtests.py",)
  assert layout.test_roots() == {"", "tests", "tests/a"}
  assert screening.runner_scripts("bin/test -C --verbose sympy/core") == ["bin/test",
                                                                          "sympy/core"]


def test_suspicious_code_names_runner_and_interpreter_tricks():
  patch = ("diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n"
           "@@ -1 +1,12 @@\n x = 1\n+import _pytest.python\n+import atexit\n+atexit.register(f)\n"
           "+sys.modules['tests.test_core'] = fake\n+print('PASSED tests/test_a.py::test_b')\n"
           "+class Anything:\n+    def __eq__(self, other):\n+        return True\n"
           "+def ok():\n+    return True\n+y = 2\n"
           "diff --git a/pkg/tests/test_core.py b/pkg/tests/test_core.py\n"
           "--- a/pkg/tests/test_core.py\n+++ b/pkg/tests/test_core.py\n@@ -1 +1,2 @@\n x = 1\n"
           "+import pytest\n")
  kinds = {f.kind for f in screening.suspicious_code(patch, LAYOUT)}
  assert kinds == {"runner_internals", "process_control", "interpreter_hooks", "report_forgery",
                   "always_equal"}
  assert all(f.path == "pkg/core.py" for f in screening.suspicious_code(patch, LAYOUT))
  clean = ("--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
  assert screening.suspicious_code(clean, LAYOUT) == []


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["pkg/core.py", "conftest.py", "pkg/tests/new.py",
                                           "pytest.py", "zz.pth", "pkg/extra.py",
                                           "setup.cfg", "pkg/tests/test_core.py"]),
                          st.sampled_from(["write", "delete"])), min_size=1, max_size=6))
def test_every_touched_path_is_screened_once(repo, operations):
  for path, operation in operations:
    target = repo / path
    if operation == "delete" and target.exists():
      target.unlink()
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text("y = 3\n")
  _git(repo, "add", "-A")
  patch = _git(repo, "diff", "--cached", "--binary", "--no-renames", "HEAD").decode()
  _git(repo, "reset", "-q", "--hard")
  _git(repo, "clean", "-qfd")
  screen = screening.screen_patch(patch, LAYOUT)
  listed = screen.fix_files + [f.path for f in screen.restored + screen.rejected]
  assert sorted(listed) == sorted(set(listed))
  touched = {line[len("+++ b/"):] for line in patch.splitlines() if line.startswith("+++ b/")}
  touched |= {line[len("--- a/"):] for line in patch.splitlines() if line.startswith("--- a/")}
  assert set(listed) == touched
  assert not {f.path for f in screen.rejected} & set(screen.restored_paths)


@pytest.mark.parametrize("filename, base, patched, differ", [
    ("setup.cfg", "[metadata]\nname = x\n[tool:pytest]\naddopts = -q\n",
     "[metadata]\nname = y\n[tool:pytest]\naddopts = -q\n", False),
    ("setup.cfg", "[tool:pytest]\naddopts = -q\n", "[tool:pytest]\naddopts = -q -p evil\n", True),
    ("setup.cfg", "[metadata]\nname = x\n", "[metadata]\nname = x\n[tool:pytest]\n"
     "python_files = none.py\n", True),
    ("tox.ini", "[tox]\nenvlist = py3\n", "[tox]\nenvlist = py3,py4\n", False),
    ("tox.ini", "[pytest]\nxfail_strict = true\n", "[pytest]\nxfail_strict = false\n", True),
    ("pyproject.toml", '[project]\nname = "x"\n', '[project]\nname = "y"\n', False),
    # a key after a nested array's line, which looks like a header to a line reader
    ("pyproject.toml", '[tool.pytest.ini_options]\nmarkers = [\n  ["a"],\n]\n',
     '[tool.pytest.ini_options]\nmarkers = [\n  ["a"],\n]\naddopts = "-p evil"\n', True),
    # a dotted key under [tool]
    ("pyproject.toml", '[tool]\nblack.line-length = 100\n',
     '[tool]\nblack.line-length = 100\npytest.ini_options.addopts = "-p evil"\n', True),
    ("pyproject.toml", '[project]\nname = "x"\n', 'not [ valid toml', True),
    ("setup.cfg", None, "[metadata]\nname = x\n", True),
])
def test_shared_config_edits_count_only_when_pytest_reads_them(filename, base, patched, differ):
  assert screening.runner_settings_differ(base, patched, filename) is differ


def test_review_of_a_patch_names_its_infrastructure_edits():
  spec = TestSpec(image="x", test_files=("pkg/tests",))
  instance = SWEInstance("i", "o/r", "abc", "p", test_spec=spec)
  patch = ("diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
           "+++ b/conftest.py\n@@ -0,0 +1 @@\n+import pytest\n"
           "diff --git a/pkg/tests/test_repro.py b/pkg/tests/test_repro.py\nnew file mode 100644\n"
           "--- /dev/null\n+++ b/pkg/tests/test_repro.py\n@@ -0,0 +1 @@\n+def test(): pass\n"
           "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n"
           "@@ -1 +1,2 @@\n x = 1\n+atexit.register(f)\n")
  review = screening.review_patch(patch, instance)
  assert not review.tampering
  assert [f.path for f in review.runner_edits] == ["conftest.py"]
  assert review.lines == [
      "restored conftest.py from the base (conftest: pytest loads it and runs its hooks)",
      "restored pkg/tests/test_repro.py from the base (test_file: tests come from the base "
      "and the test patch)",
      "suspicious code in pkg/core.py (process_control): atexit.register(f)"]
  shadow = screening.review_patch("--- /dev/null\n+++ b/pytest.py\n@@ -0,0 +1 @@\n+x\n",
                                  instance)
  assert shadow.tampering and shadow.lines[0].startswith("rejected pytest.py (runner_shadow")
  assert screening.review_patch("", instance).lines == []
