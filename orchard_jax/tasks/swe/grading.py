"""SWE-bench grading: from per-test statuses to resolved / partial / unresolved (docs/algorithms.md 7).

The test-by-test report and the resolution status come from SWE-bench's own grading functions
(`swebench.harness.grading.get_eval_tests_report` and `get_resolution_status`): a FAIL_TO_PASS
test must PASS (or XFAIL); an empty list counts as fully passing; resolved = all F2P and all P2P
pass; partial = some but not all F2P pass with every P2P passing; a test the run never names
counts as failing. One rule is stricter than SWE-bench's: a skipped test is not passing, in
either list. Recent SWE-bench counts a skipped PASS_TO_PASS test as maintained (and versions
before 5 counted a skipped FAIL_TO_PASS test as neither success nor failure, so all-skipped was
resolved), which lets a patch skip the tests it breaks; every PASS_TO_PASS test here passed,
not skipped, when the instance was made. Runs that never reach the tests are their own
outcomes: the model patch did not apply (`patch_failed`), the tests ran past their time limit
(`timed_out`), or the sandbox failed (`error`). A run the patch tampered with is `unresolved`
with the reason (evaluation.EvalResult.integrity).
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
  strict = {test: ("FAILED" if status == "SKIPPED" else status)
            for test, status in status_map.items()}  # a skipped test is not passing
  report = get_eval_tests_report(strict, {"FAIL_TO_PASS": list(fail_to_pass),
                                                    "PASS_TO_PASS": list(pass_to_pass)})
  return TestsReport(report["FAIL_TO_PASS"]["success"], report["FAIL_TO_PASS"]["failure"],
                     report["PASS_TO_PASS"]["success"], report["PASS_TO_PASS"]["failure"])


def resolution(report: TestsReport) -> str:
  """RESOLVED, PARTIAL or UNRESOLVED for a report, by `swebench`'s get_resolution_status."""
  from swebench.harness.grading import get_resolution_status
  status = get_resolution_status(report.to_dict())
  return {"RESOLVED_FULL": RESOLVED, "RESOLVED_PARTIAL": PARTIAL}.get(status, UNRESOLVED)
