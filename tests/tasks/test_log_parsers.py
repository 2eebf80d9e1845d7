"""Test-log parsing on a real pytest log (passes, failures, errors, skips, xfails) and grading by
SWE-bench's rules (docs/algorithms.md section 7), with the expected values written out by hand."""
import subprocess
import sys
import textwrap

import pytest

from orchard_jax.tasks.swe import grading
from orchard_jax.tasks.swe.log_parsers import parse_test_log

_TESTS = textwrap.dedent('''
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture exploded")

    def test_pass():
        assert 1 + 1 == 2

    def test_fail():
        assert [1, 2] == [1, 3]

    def test_error(broken):
        pass

    @pytest.mark.skip(reason="not today")
    def test_skip():
        pass

    @pytest.mark.xfail(reason="known bug")
    def test_xfail():
        assert False

    @pytest.mark.xfail(reason="fixed already", strict=False)
    def test_xpass():
        assert True

    @pytest.mark.parametrize("n", [1, 2])
    def test_param(n):
        assert n == 1

    class TestGroup:
        def test_method(self):
            assert "a" in "abc"
''')


@pytest.fixture(scope="module")
def pytest_log(tmp_path_factory):
  folder = tmp_path_factory.mktemp("suite")
  (folder / "test_sample.py").write_text(_TESTS)
  proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "--tb=short", "-p",
                         "no:cacheprovider", "test_sample.py"], cwd=folder, capture_output=True,
                        text=True)
  return proc.stdout + proc.stderr


def test_statuses_from_a_real_pytest_log(pytest_log):
  status = parse_test_log(pytest_log)
  assert status["test_sample.py::test_pass"] == "PASSED"
  assert status["test_sample.py::test_fail"] == "FAILED"
  assert status["test_sample.py::test_error"] == "ERROR"
  assert status["test_sample.py::test_xfail"] == "XFAIL"
  assert status["test_sample.py::test_param[1]"] == "PASSED"
  assert status["test_sample.py::test_param[2]"] == "FAILED"
  assert status["test_sample.py::TestGroup::test_method"] == "PASSED"
  # XPASS is not a SWE-bench status: the test is absent, so it grades as failing.
  assert "test_sample.py::test_xpass" not in status
  # pytest reports skips as "SKIPPED [1] file:line: reason", with no node id.
  assert not any("test_skip" in name for name in status)


def test_crlf_log_parses_like_lf(pytest_log):
  assert parse_test_log(pytest_log.replace("\n", "\r\n")) == parse_test_log(pytest_log)


def test_grading_follows_swe_bench_rules(pytest_log):
  status = parse_test_log(pytest_log)
  ok, bad = "test_sample.py::test_pass", "test_sample.py::test_fail"
  xfail, err = "test_sample.py::test_xfail", "test_sample.py::test_error"
  missing = "test_sample.py::test_not_run"

  def outcome(f2p, p2p):
    return grading.resolution(grading.tests_report(status, f2p, p2p))

  assert outcome([ok, xfail], [ok]) == grading.RESOLVED          # XFAIL counts as passing
  assert outcome([ok], []) == grading.RESOLVED                   # empty P2P passes
  assert outcome([ok, bad], [ok]) == grading.PARTIAL             # some F2P pass, P2P intact
  assert outcome([ok, bad], [err]) == grading.UNRESOLVED         # partial F2P + broken P2P
  assert outcome([bad], [ok]) == grading.UNRESOLVED
  assert outcome([missing], [ok]) == grading.UNRESOLVED         # a test that never ran fails
  assert outcome([ok], [ok, missing]) == grading.UNRESOLVED
  report = grading.tests_report(status, [ok, err], [ok, bad])
  assert report.fail_to_pass_success == [ok] and report.fail_to_pass_failure == [err]
  assert report.pass_to_pass_success == [ok] and report.pass_to_pass_failure == [bad]


def test_a_skipped_test_is_not_passing_in_either_list():
  # Stricter than SWE-bench (which counts a skipped PASS_TO_PASS test as maintained): a patch
  # could otherwise skip the tests it breaks (grading.py's docstring).
  status = {"t.py::a": "PASSED", "t.py::s": "SKIPPED"}
  report = grading.tests_report(status, ["t.py::a"], ["t.py::s"])
  assert report.pass_to_pass_failure == ["t.py::s"]
  assert grading.resolution(report) == "unresolved"
  assert grading.resolution(grading.tests_report(status, ["t.py::s"], ["t.py::a"])) == "unresolved"
