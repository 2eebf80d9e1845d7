"""SWE-bench grading: from per-test statuses to resolved / partial / unresolved (docs/algorithms.md 7).

The test-by-test report and the resolution status come from SWE-bench's own grading functions
(`swebench.harness.grading.get_eval_tests_report` and `get_resolution_status`), so the rules are
SWE-bench's exactly: a FAIL_TO_PASS test must PASS (or XFAIL); a PASS_TO_PASS test must pass or
be skipped; an empty list counts as fully passing; resolved = all F2P and all P2P pass;
partial = some but not all F2P pass with every P2P passing. Runs that never reach the tests are
their own outcomes: the model patch did not apply (`patch_failed`), the tests ran past their
time limit (`timed_out`), or the test run produced no results at all (`error`).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

RESOLVED = "resolved"
PARTIAL = "partial"
UNRESOLVED = "unresolved"
PATCH_FAILED = "patch_failed"
TIMED_OUT = "timed_out"
ERROR = "error"
OUTCOMES = (RESOLVED, PARTIAL, UNRESOLVED, PATCH_FAILED, TIMED_OUT, ERROR)


@dataclasses.dataclass
class TestsReport:
  """Which FAIL_TO_PASS / PASS_TO_PASS tests passed and failed in one evaluation run."""
  __test__ = False  # not a pytest test class
  fail_to_pass_success: list[str]
  fail_to_pass_failure: list[str]
  pass_to_pass_success: list[str]
  pass_to_pass_failure: list[str]

  def to_dict(self) -> dict:
    return {"FAIL_TO_PASS": {"success": self.fail_to_pass_success,
                             "failure": self.fail_to_pass_failure},
            "PASS_TO_PASS": {"success": self.pass_to_pass_success,
                             "failure": self.pass_to_pass_failure}}


def tests_report(status_map: Mapping[str, str], fail_to_pass: Sequence[str],
                 pass_to_pass: Sequence[str]) -> TestsReport:
  """Sorts the instance's tests into success / failure by SWE-bench's rules.

  Args:
    status_map: {test name: status} from `log_parsers.parse_test_log`.
    fail_to_pass, pass_to_pass: the instance's FAIL_TO_PASS and PASS_TO_PASS.
  """
  from swebench.harness.grading import get_eval_tests_report
  report = get_eval_tests_report(dict(status_map), {"FAIL_TO_PASS": list(fail_to_pass),
                                                    "PASS_TO_PASS": list(pass_to_pass)})
  return TestsReport(report["FAIL_TO_PASS"]["success"], report["FAIL_TO_PASS"]["failure"],
                     report["PASS_TO_PASS"]["success"], report["PASS_TO_PASS"]["failure"])


def resolution(report: TestsReport) -> str:
  """RESOLVED, PARTIAL or UNRESOLVED for a report, by `swebench`'s get_resolution_status."""
  from swebench.harness.grading import get_resolution_status
  status = get_resolution_status(report.to_dict())
  return {"RESOLVED_FULL": RESOLVED, "RESOLVED_PARTIAL": PARTIAL}.get(status, UNRESOLVED)
