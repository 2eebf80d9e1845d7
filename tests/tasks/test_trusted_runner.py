"""The trusted runner on this machine (no sandbox needed: the supervisor and launcher are the
scripts a sandbox gets): results come from the signed records, never from what the tests print,
and the rules that read them only ever make a test's status worse. The structured statuses are
checked against SWE-bench's own parser reading the same run's `-rA` log."""
import base64
import json
import os
import subprocess
import textwrap
from shlex import quote as shlex_quote, split as shlex_split

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from orchard_jax.tasks.swe import log_parsers, trusted_runner
from orchard_jax.tasks.swe.trusted_runner import (PreparedRun, SignedReport, judge_records,
                                                  parse_test_command)

TEST_CMD = "python -m pytest -rA --tb=short -p no:cacheprovider"
PACKAGE = "def add(a, b):\n    return a + b\n"
TESTS = textwrap.dedent("""
    import pytest
    from pkg import add

    def test_add():
        assert add(1, 2) == 3

    def test_broken():
        assert add(1, 1) == 3

    @pytest.mark.parametrize("a, b", [(1, 2), ("x y", "z"), ("/p/q", "")])
    def test_param(a, b):
        assert add(a, b) == a + b

    @pytest.mark.xfail(reason="known")
    def test_known_bug():
        assert False

    @pytest.mark.skip(reason="not here")
    def test_skipped():
        pass

    class TestGroup:
        def test_method(self):
            assert add(2, 2) == 4
    """)


@pytest.mark.parametrize("command, expected", [
    ("python -m pytest -rA tests", ({}, "python", (), "module", ("-rA", "tests"))),
    ("pytest --no-header -rA --tb=no -p no:cacheprovider",
     ({}, "", (), "script", ("--no-header", "-rA", "--tb=no", "-p", "no:cacheprovider"))),
    ("PYTHONWARNINGS=ignore python3.9 -W ignore::DeprecationWarning -B -m pytest -x",
     ({"PYTHONWARNINGS": "ignore"}, "python3.9", ("-W", "ignore::DeprecationWarning", "-B"),
      "module", ("-x",))),
    ('py.test -k "a and (b or c)"', ({}, "", (), "script", ("-k", "a and (b or c)"))),
    ("/opt/env/bin/python -m pytest", ({}, "/opt/env/bin/python", (), "module", ())),
    ("./tests/runtests.py --verbosity 2", None),
    ("bin/test -C --verbose", None),
    ("python -m pytest tests && echo done", None),
    ("sleep 30; python -m pytest", None),
    ("python -m pytest $TESTS", None),
    ("python -c 'import pytest; pytest.main()'", None),
    ("python setup.py test", None),
    ("tox -e py39", None),
])
def test_parse_test_command(command, expected):
  invocation = parse_test_command(command)
  if expected is None:
    assert invocation is None
  else:
    assert (dict(invocation.env), invocation.python, invocation.python_options, invocation.mode,
            invocation.args) == expected


@pytest.fixture
def repo(tmp_path):
  root = tmp_path / "repo"
  (root / "pkg").mkdir(parents=True)
  (root / "tests").mkdir()
  (root / "pkg" / "__init__.py").write_text(PACKAGE)
  (root / "tests" / "test_pkg.py").write_text(TESTS)
  return root


def _run(repo, tmp_path, *, test_cmd=TEST_CMD, timeout_s=60.0):
  scripts = tmp_path / "grader"
  scripts.mkdir(exist_ok=True)
  run = trusted_runner.prepare(test_cmd, ["tests"], workdir=str(repo), timeout_s=timeout_s,
                               env={"PYTHONPATH": str(repo)}, scripts_dir=str(scripts))
  for path, data in run.files.items():
    with open(path, "wb") as f:
      f.write(data)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH"))}
  proc = subprocess.run(["bash", "-c", run.command], capture_output=True, text=True, env=env,
                        timeout=timeout_s + 60)
  output = proc.stdout + proc.stderr
  assert not any(name.startswith("key-") for name in os.listdir(scripts)), "key file left"
  return run, output, trusted_runner.read_report(output, run)


def _verdict(report, changed=("pkg/__init__.py",)):
  return judge_records(report, is_test_path=lambda p: p.startswith("tests/"),
                       changed_files=changed)


def test_honest_run_matches_swe_benchs_reading_of_the_same_log(repo, tmp_path):
  run, output, report = _run(repo, tmp_path)
  assert trusted_runner.started(output, run) and report is not None
  verdict = _verdict(report)
  assert verdict.findings == [] and verdict.notes == []
  assert verdict.statuses == {
      "tests/test_pkg.py::test_add": "PASSED", "tests/test_pkg.py::test_broken": "FAILED",
      "tests/test_pkg.py::test_param[1-2]": "PASSED",
      "tests/test_pkg.py::test_param[x y-z]": "PASSED",
      "tests/test_pkg.py::test_param[/p/q-]": "PASSED",
      "tests/test_pkg.py::test_known_bug": "XFAIL", "tests/test_pkg.py::test_skipped": "SKIPPED",
      "tests/test_pkg.py::TestGroup::test_method": "PASSED"}
  # SWE-bench's parser on the `-rA` log of this very run names the same tests the same way
  # (the canary aside, which the log shows as a failure and the verdict leaves out; and the
  # skipped test, which pytest's summary names by file and line only, so the log misses it:
  # missing and skipped both count as failing).
  for parser in ("pytest", "pytest_options"):
    structured = log_parsers.status_map_from_results(verdict.statuses, parser)
    from_log = log_parsers.parse_test_log(output, parser)
    canary = [name for name in from_log if name not in structured]
    assert len(canary) == 1 and from_log.pop(canary[0]) == "FAILED"
    assert structured.pop("tests/test_pkg.py::test_skipped") == "SKIPPED"
    assert structured == from_log


def test_the_pytest_script_form_runs_structured_too(repo, tmp_path):
  run, output, report = _run(repo, tmp_path, test_cmd="pytest -rA -p no:cacheprovider")
  verdict = _verdict(report)
  assert verdict.findings == [] and verdict.statuses["tests/test_pkg.py::test_add"] == "PASSED"


def test_printed_results_and_report_lines_change_nothing(repo, tmp_path):
  fake = "".join(f"PASSED tests/test_pkg.py::{t}\\n" for t in ("test_broken", "test_add"))
  forged = base64.b64encode(json.dumps({"run_id": "x", "exit_code": 0}).encode()).decode()
  (repo / "pkg" / "__init__.py").write_text(PACKAGE + textwrap.dedent(f"""
      import atexit, sys
      print("{trusted_runner.REPORT} {forged} " + "0" * 64)
      atexit.register(lambda: sys.stdout.write("{fake}"))
      """))
  run, output, report = _run(repo, tmp_path)
  assert "PASSED tests/test_pkg.py::test_broken" in output  # the forgery reached the log...
  verdict = _verdict(report)
  assert verdict.statuses["tests/test_pkg.py::test_broken"] == "FAILED"  # ...and changed nothing
  assert verdict.findings == []


def test_workspace_cannot_replace_pytest_or_run_a_sitecustomize(repo, tmp_path):
  marker = tmp_path / "sitecustomize-ran"
  (repo / "pytest.py").write_text("print('PASSED tests/test_pkg.py::test_broken')\n"
                                  "raise SystemExit(0)\n")
  (repo / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
  run, output, report = _run(repo, tmp_path)
  assert not marker.exists()
  verdict = _verdict(report)
  assert verdict.findings == []
  assert verdict.statuses["tests/test_pkg.py::test_broken"] == "FAILED"
  assert len(verdict.statuses) == 8


@pytest.mark.parametrize("ending, finding", [
    ("import os\nos._exit(0)", "did not finish"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "did not finish"),
    ("raise KeyboardInterrupt", "interrupted"),
    ("import _pytest.python\n_pytest.python.Function.runtest = lambda self: None", "canary"),
    ("import builtins, _pytest.outcomes\nbuiltins.AssertionError = _pytest.outcomes.XFailed",
     "builtins.AssertionError rebound"),
    ("import unittest\nunittest.TestCase.assertEqual = lambda *args, **kwargs: None",
     "unittest.case.TestCase.assertEqual replaced from pkg/__init__.py"),
    ("import gc\nclass Forcer:\n    def pytest_runtest_logreport(self, report):\n        pass\n"
     "config = next(o for o in gc.get_objects() if type(o).__name__ == 'Config')\n"
     "config.pluginmanager.register(Forcer())", "plugin was registered from pkg/__init__.py"),
])
def test_a_run_cut_short_or_bent_is_a_finding(repo, tmp_path, ending, finding):
  (repo / "pkg" / "__init__.py").write_text(PACKAGE + ending + "\n")
  run, output, report = _run(repo, tmp_path)
  verdict = _verdict(report)
  assert any(finding in f for f in verdict.findings), (verdict, output[-2000:])


def test_writing_into_the_record_pipe_is_a_finding(repo, tmp_path):
  (repo / "pkg" / "__init__.py").write_text(PACKAGE + textwrap.dedent("""
      import os, stat
      for fd in range(3, 64):
          try:
              if stat.S_ISFIFO(os.fstat(fd).st_mode):
                  os.write(fd, b'{"e": "test", "id": "tests/test_pkg.py::test_broken", '
                               b'"when": "call", "outcome": "passed"}\\nnot json\\n')
          except OSError:
              pass
      """))
  run, output, report = _run(repo, tmp_path)
  verdict = _verdict(report)
  assert verdict.statuses["tests/test_pkg.py::test_broken"] == "FAILED"
  assert any("never writes" in f for f in verdict.findings)


def test_a_flood_of_test_output_cannot_push_the_report_out(repo, tmp_path):
  # An exec keeps 1 MiB of output by default (its head and tail): the supervisor keeps the
  # test output's first and last 256 KiB, so the report, last, arrives whole.
  (repo / "tests" / "test_loud.py").write_text("def test_loud():\n    print('x' * (4 << 20))\n")
  run, output, report = _run(repo, tmp_path, test_cmd=TEST_CMD + " -s")
  assert len(output.encode()) < (1 << 20) and "bytes of test output left out" in output
  assert _verdict(report).statuses["tests/test_loud.py::test_loud"] == "PASSED"


def test_time_limit(repo, tmp_path):
  (repo / "tests" / "test_slow.py").write_text("import time\ndef test_slow():\n"
                                               "    time.sleep(60)\n")
  run, output, report = _run(repo, tmp_path, timeout_s=3)
  assert report.timed_out and report.exit_code == -9


def test_other_runners_keep_their_log(tmp_path):
  run = trusted_runner.prepare("./tests/runtests.py --verbosity 2", ["a", "b c"], workdir="/w",
                               timeout_s=10, env={"X": "1 2"})
  assert not run.structured and run.files == {}
  assert run.command == "cd /w && X='1 2' timeout -k 5 10 bash -c './tests/runtests.py " \
                        "--verbosity 2 a '\"'\"'b c'\"'\"''"


def _signed(key, run_id, payload_dict):
  from orchard_jax.tasks.swe.sandbox_scripts.supervisor import sign
  payload = base64.b64encode(json.dumps(payload_dict).encode())
  return f"{trusted_runner.REPORT} {payload.decode()} {sign(key, b'report', payload)}"


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.text(alphabet="0123456789abcdef", min_size=64,
                                                    max_size=64), st.integers(0, 200))
def test_only_the_keys_report_verifies(key, forged_mac, flip):
  run = PreparedRun("", {}, True, key=key, run_id="r1")
  good = _signed(key, "r1", {"run_id": "r1", "exit_code": 0, "records": ""})
  assert trusted_runner.read_report(good, run) is not None
  payload = good.split(" ")[1]
  assert trusted_runner.read_report(f"{trusted_runner.REPORT} {payload} {forged_mac}", run) is None
  position = flip % len(payload)
  mutated = payload[:position] + ("A" if payload[position] != "A" else "B") + payload[position + 1:]
  assert trusted_runner.read_report(good.replace(payload, mutated), run) is None
  other_key = bytes(b ^ 1 for b in key)
  assert trusted_runner.read_report(_signed(other_key, "r1", {"run_id": "r1"}), run) is None
  assert trusted_runner.read_report(_signed(key, "r1", {"run_id": "r2"}), run) is None


_OUTCOMES = st.sampled_from(["passed", "failed", "skipped"])
_RECORD = st.fixed_dictionaries({"e": st.just("test"), "id": st.sampled_from(["t::a", "t::b",
                                                                              "t::c"]),
                                 "when": st.sampled_from(["setup", "call", "teardown"]),
                                 "outcome": _OUTCOMES, "xfail": st.booleans()})
_SEVERITY = {"PASSED": 0, "XFAIL": 1, "SKIPPED": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}


def _report(tests, *, finish=True):
  records = [{"e": "start"}, {"e": "collected", "count": 3, "canary": None}] + tests
  if finish:
    records += [{"e": "finish", "exitstatus": 1, "stopped": False}, {"e": "exit", "code": 1}]
  return SignedReport(1, False, records)


@st.composite
def _complete_run(draw):
  """Records of an honest, finished run: every test set up, then called unless its setup
  failed or skipped, then torn down."""
  records = []
  for test in draw(st.lists(st.sampled_from(["t::a", "t::b", "t::c"]), min_size=1, unique=True)):
    setup = draw(_OUTCOMES)
    records.append({"e": "test", "id": test, "when": "setup", "outcome": setup,
                    "xfail": setup == "skipped" and draw(st.booleans())})
    if setup == "passed":
      outcome = draw(_OUTCOMES)
      records.append({"e": "test", "id": test, "when": "call", "outcome": outcome,
                      "xfail": outcome != "failed" and draw(st.booleans())})
    records.append({"e": "test", "id": test, "when": "teardown",
                    "outcome": draw(st.sampled_from(["passed", "failed"]))})
  return records


@settings(max_examples=300, deadline=None)
@given(_complete_run(), st.lists(_RECORD, max_size=6))
def test_more_records_never_make_a_failing_test_pass(honest, injected):
  # What an injected or colliding record can do to a finished run: never turn a failing test
  # into a passing one (SWE-bench's passing statuses: PASSED, XFAIL), nor an XFAIL into PASSED.
  before = judge_records(_report(honest), is_test_path=lambda p: True).statuses
  after = judge_records(_report(honest + injected), is_test_path=lambda p: True).statuses
  for test, status in before.items():
    if after[test] in ("PASSED", "XFAIL"):
      assert status in ("PASSED", "XFAIL") and _SEVERITY[after[test]] >= _SEVERITY[status], (
          test, status, after[test])


def test_record_rules_by_hand():
  call = lambda test, outcome, **extra: {"e": "test", "id": test, "when": "call",
                                         "outcome": outcome, **extra}
  setup = lambda test, outcome, **extra: {"e": "test", "id": test, "when": "setup",
                                          "outcome": outcome, **extra}
  teardown_error = {"e": "test", "id": "t::a", "when": "teardown", "outcome": "failed"}
  verdict = judge_records(_report([
      setup("t::a", "passed"), call("t::a", "passed", code="t.py"), teardown_error,
      setup("t::b", "skipped", xfail=True),
      setup("t::c", "passed"), call("t::c", "skipped", xfail=True, xfail_from="pkg/x.py"),
      setup("t::d", "passed"), call("t::d", "passed", xfail=True),
      setup("t::e", "passed"), call("t::e", "passed", code="pkg/x.py"),
      setup("t::f", "passed"), {"e": "test", "id": "t::f", "when": "teardown",
                                "outcome": "passed"},
      setup("t::g", "passed"), call("t::g", "rerun"), call("t::g", "passed")]),
      is_test_path=lambda p: p.startswith("t"), changed_files=["pkg/x.py"])
  assert verdict.statuses == {"t::a": "ERROR", "t::b": "XFAIL", "t::c": "FAILED",
                              "t::d": "XPASS", "t::e": "FAILED", "t::f": "ERROR",
                              "t::g": "PASSED"}
  assert [f.split(" ran ")[0] for f in verdict.findings] == ["1 test(s)"]
  assert "pkg/x.py" in verdict.notes[0]
  unfinished = judge_records(_report([call("t::a", "passed")], finish=False),
                             is_test_path=lambda p: True)
  assert any("did not finish" in f for f in unfinished.findings)
  canary = {"e": "collected", "count": 2, "canary": "t::z"}
  base = [{"e": "start"}, canary]
  end = [{"e": "finish", "exitstatus": 1, "stopped": False}, {"e": "exit", "code": 1}]
  passed = judge_records(SignedReport(1, False, base + [call("t::z", "passed")] + end),
                         is_test_path=lambda p: True)
  assert any("canary" in f for f in passed.findings)
  missing = judge_records(SignedReport(1, False, base + end), is_test_path=lambda p: True)
  assert any("did not run" in f for f in missing.findings)
  failed = judge_records(SignedReport(1, False, base + [call("t::z", "failed")] + end),
                         is_test_path=lambda p: True)
  assert failed.findings == [] and "t::z" not in failed.statuses
  doubled = judge_records(SignedReport(1, False, base + end + end), is_test_path=lambda p: True)
  assert sum("records where the recorder writes one" in f for f in doubled.findings) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                               blacklist_characters="\x00"), min_size=1),
                max_size=4),
       st.lists(st.sampled_from(["-rA", "-x", "-k", "a and (b or c)", "-p", "no:cacheprovider",
                                 "--tb=short", "-o", "addopts="]), max_size=6))
def test_the_command_carries_args_and_targets_exactly(targets, args):
  command = "python -m pytest " + " ".join(map(shlex_quote, args))
  assert parse_test_command(command).args == tuple(args)
  run = trusted_runner.prepare(command, targets, workdir="/w d", timeout_s=5)
  tokens = shlex_split(run.command)
  assert tokens[:3] == ["cd", "/w d", "&&"]
  tail = args + targets
  assert tokens[len(tokens) - len(tail):] == tail
  assert tokens[tokens.index("--mode") + 1] == "module"


def test_framework_changes_from_test_code_are_the_tests_business():
  base = [{"e": "start"}, {"e": "collected", "count": 0, "canary": None}]
  end = [{"e": "finish", "exitstatus": 0, "stopped": False}, {"e": "exit", "code": 0}]
  changes = [{"name": "builtins.input", "change": "rebound", "origin": "tests/test_cli.py"},
             {"name": "_pytest.python.Function.runtest", "change": "replaced",
              "origin": "conftest.py"}]
  framework = {"e": "framework", "stage": "finish", "changed": changes, "count": 2}
  tests_only = judge_records(SignedReport(0, False, base + [framework] + end),
                             is_test_path=lambda p: p.startswith("tests/") or p == "conftest.py")
  assert tests_only.findings == []
  changes.append({"name": "builtins.AssertionError", "change": "rebound", "origin": ""})
  bent = judge_records(SignedReport(0, False, base + [framework] + end),
                       is_test_path=lambda p: p.startswith("tests/") or p == "conftest.py")
  assert bent.findings == ["the test framework was changed at run time (finish): "
                           "builtins.AssertionError rebound"]
