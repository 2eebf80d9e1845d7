"""Per-test results from a test log, by SWE-bench's own log parsers.

SWE-bench grades an instance from the status of each named test in the evaluation log
(`swebench.harness.log_parsers`). We call those parsers rather than re-implementing them, so a
log is read exactly as SWE-bench reads it: for pytest, the `-rA` short summary lines
`PASSED path::test`, `FAILED path::test - message`, `ERROR path::test`, `SKIPPED ...`,
`XFAIL path::test`; XPASS lines are not a SWE-bench status and are left out (they then count
as failing, as in SWE-bench).

`swebench` is imported on first use (about 1.5 s, as its harness package pulls in its
container tooling).
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping

from orchard_jax.tasks.errors import TaskError

# Statuses as SWE-bench spells them (swebench.harness.constants.TestStatus).
PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"

# Our parser name -> the SWE-bench parser function name in swebench.harness.log_parsers.
LOG_PARSERS = {
    "pytest": "parse_log_pytest",
    "pytest_options": "parse_log_pytest_options",
    "pytest_v2": "parse_log_pytest_v2",
    "django": "parse_log_django",
    "sympy": "parse_log_sympy",
    "matplotlib": "parse_log_matplotlib",
    "seaborn": "parse_log_seaborn",
}


@functools.cache
def _parser(name: str) -> Callable[[str, object], dict[str, str]]:
  try:
    from swebench.harness import log_parsers
  except ImportError as e:
    raise TaskError(f"SWE-bench's log parsers are needed to read test logs: pip install swebench "
                    f"({e})") from e
  registry = getattr(log_parsers, "PARSER_REGISTRY", {})
  if name in registry and name not in LOG_PARSERS:   # SWE-bench's own name, e.g. a repository's
    return registry[name]                            # parser from MAP_REPO_TO_PARSER_PY
  if name not in LOG_PARSERS:
    raise TaskError(f"unknown log parser {name!r}; expected one of {sorted(LOG_PARSERS)} or a "
                    f"SWE-bench parser name ({', '.join(sorted(registry)[:6])}, ...)")
  return getattr(log_parsers, LOG_PARSERS[name])


def parse_test_log(log: str, parser: str = "pytest") -> dict[str, str]:
  """Maps each test named in `log` to its status (PASSED/FAILED/SKIPPED/ERROR/XFAIL).

  Args:
    log: the text the test command printed (stdout and stderr together).
    parser: a key of LOG_PARSERS.

  Returns:
    {test name: status}; a test that appears twice keeps its last status. Tests the log never
    names are absent (SWE-bench then counts them as failing).

  Raises:
    TaskError: the parser name is unknown or swebench is not installed.
  """
  # The parsers split on "\n"; a CRLF log would leave "\r" on every test name.
  return _parser(parser)(log.replace("\r\n", "\n"), None)


# A status's weight when one test is named more than once: the worst one stands.
_WORST = {PASSED: 0, XFAIL: 1, SKIPPED: 2, FAILED: 3, ERROR: 4}


def status_map_from_results(results: Mapping[str, str], parser: str = "pytest"
                            ) -> dict[str, str]:
  """Names structured per-test results the way `parser` names them in a log.

  SWE-bench's FAIL_TO_PASS / PASS_TO_PASS names are what its parser reads off `-rA` summary
  lines (a node id cut at its first space, `pytest_options`' rewritten parameters, ...). Each
  result is written as the summary line pytest would print (`PASSED path::test`) and read back
  through the same parser, one line at a time, so a name is spelled exactly as in a real log.
  Where two node ids read back as one name (SWE-bench cuts ids at whitespace), the worst status
  stands. A line the parser does not read (a non-pytest parser) keeps the node id as its name.

  Args:
    results: {pytest node id: PASSED, FAILED, ERROR, SKIPPED, XFAIL or XPASS}; XPASS is not
      a SWE-bench status and is written as FAILED (a log's XPASS line names no status).
    parser: a key of LOG_PARSERS.
  """
  read = _parser(parser)
  out: dict[str, str] = {}
  for test, status in results.items():
    status = FAILED if status == "XPASS" else status
    try:
      named = read(f"{status} {test}", None)
    except Exception:  # noqa: BLE001 - a parser that cannot read the line: keep the node id
      named = {}
    if len(named) != 1:
      named = {test: status}
    for name, value in named.items():
      if name not in out or _WORST.get(value, 4) > _WORST.get(out[name], 4):
        out[name] = value
  return out


def passed(status_map: dict[str, str], test: str) -> bool:
  """SWE-bench's rule: a test passes when its status is PASSED or XFAIL."""
  return status_map.get(test) in (PASSED, XFAIL)
