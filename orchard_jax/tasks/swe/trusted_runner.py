"""Runs an instance's tests so that the code under test cannot decide its own grade.

The code under test runs inside the test runner's process, so anything that process prints or
writes can be forged by it: `PASSED path::test` lines from an atexit hook, a report file
rewritten at exit, an exit status from `os._exit(0)`. For a pytest test command the evaluator
therefore does not read the log. It copies two scripts into the sandbox (`sandbox_scripts`) and
runs

  python -I -S supervisor.py --key-file K --run-id R --timeout T --records -- \
      python [options] -s -S pytest_launcher.py --workdir W --mode module|script -- ARGS TESTS

- The supervisor takes a fresh random key from K (written by the evaluator just before, deleted
  by the supervisor before any code under test runs), runs the launcher in a session of its
  own, collects the recording plugin's JSON lines from a private pipe and prints one report
  line signed with HMAC-SHA256 under the key. `read_report` accepts only that line: the child
  cannot sign, so printed or injected report lines never verify.
- The launcher imports pytest from the image's environment with the workspace off sys.path and
  no workspace sitecustomize, then puts sys.path back as the command would have it (module
  docstring of pytest_launcher.py).
- `judge_records` turns the records into per-test statuses under rules that make every way of
  cutting the run short or of bending a result count against the patch: a session that did not
  finish (a crash, `os._exit`, a killed runner, a forked child left behind), records the
  recorder never writes, a canary test that passes or silently does not run, pytest's, pluggy's
  or unittest's functions or builtins replaced at run time, a plugin or a test function that
  comes from a file the patch changed, or an xfail raised from code under test.

Other test commands (django's runtests.py, sympy's bin/test) run as before, under `timeout`, and
their log is read with SWE-bench's parser (`report_source` "log"): those runners print their own
results, so printing can still forge them (README, "SWE tasks and evaluation", lists the gap).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import json
import os
import re
import secrets
import shlex
import zlib
from typing import Callable, Mapping, Sequence

from orchard_jax.tasks.swe import sandbox_scripts
from orchard_jax.tasks.swe.sandbox_scripts.supervisor import REPORT, START, sign

SCRIPTS_DIR = "/tmp/orchard_eval/grader"
# pytest's exit statuses (pytest.ExitCode) that mean the run itself went wrong.
_INTERRUPTED, _INTERNAL_ERROR, _USAGE_ERROR = 2, 3, 4
_SEVERITY = {"PASSED": 0, "XFAIL": 1, "SKIPPED": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?\Z")
_FLAG_OPTIONS = re.compile(r"^-[bBdEiOqRsSuvIP]+\Z")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclasses.dataclass(frozen=True)
class PytestInvocation:
  """A test command that is a plain pytest run, taken apart.

  Attributes:
    env: leading VAR=value assignments.
    python: the interpreter (`python`, `python3.9`, a path); "" for the `pytest` script: the
      environment's `python` (or `python3`) on PATH, which a venv's or conda env's bin folder
      holds beside its `pytest`.
    python_options: interpreter options before `-m pytest` (`-W error`, `-X dev`, `-B`).
    mode: "module" (`python -m pytest`) or "script" (`pytest` / `py.test`).
    args: pytest's arguments.
  """
  env: Mapping[str, str]
  python: str
  python_options: tuple[str, ...]
  mode: str
  args: tuple[str, ...]


def parse_test_command(test_cmd: str) -> PytestInvocation | None:
  """Takes a pytest command apart; None for anything else (another runner, a shell pipeline,
  variable expansion), which then runs as a shell command with its log parsed.

  >>> parse_test_command("PY_IGNORE=1 python -W ignore -m pytest -rA tests").args
  ('-rA', 'tests')
  """
  if "$" in test_cmd or "`" in test_cmd:
    return None
  lexer = shlex.shlex(test_cmd, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  try:
    tokens = list(lexer)
  except ValueError:
    return None
  if any(t and set(t) <= set("();<>|&") for t in tokens):
    return None
  env = {}
  while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
    name, _, value = tokens.pop(0).partition("=")
    env[name] = value
  if not tokens:
    return None
  head = os.path.basename(tokens[0])
  if head in ("pytest", "py.test"):
    return PytestInvocation(env, "", (), "script", tuple(tokens[1:]))
  if not _PYTHON.match(head):
    return None
  options: list[str] = []
  i = 1
  while i < len(tokens) and tokens[i] != "-m":
    token = tokens[i]
    if token in ("-W", "-X") and i + 1 < len(tokens):
      options += [token, tokens[i + 1]]
      i += 2
    elif _FLAG_OPTIONS.match(token) or token.startswith(("-W", "-X")):
      options.append(token)
      i += 1
    else:
      return None  # a script, -c code, or an option we do not know
  if i + 1 < len(tokens) and tokens[i + 1] in ("pytest", "py.test"):
    return PytestInvocation(env, tokens[0], tuple(options), "module", tuple(tokens[i + 2:]))
  return None


@dataclasses.dataclass
class PreparedRun:
  """A test run ready to start in a sandbox.

  Attributes:
    command: the bash command to run (from any folder).
    files: {absolute sandbox path: bytes} to write first (the scripts and the key file).
    structured: True when results come from the signed report, False when from the log.
    key: the run's HMAC key (never written anywhere but the key file).
    run_id: the run's id, inside the signed report.
  """
  command: str
  files: dict[str, bytes]
  structured: bool
  key: bytes = b""
  run_id: str = ""


def prepare(test_cmd: str, targets: Sequence[str], *, workdir: str, timeout_s: float,
            env: Mapping[str, str] | None = None, scripts_dir: str = SCRIPTS_DIR) -> PreparedRun:
  """The sandbox command that runs `targets` with `test_cmd` in `workdir`.

  Args:
    test_cmd: the instance's test command without targets.
    targets: test files or node ids.
    workdir: the repository root inside the sandbox.
    timeout_s: the test run's limit, in seconds (the supervisor enforces it; the caller should
      give the sandbox command a minute more).
    env: extra environment variables (TestSpec.env).
    scripts_dir: where the scripts and the key file go (a folder outside the workspace).
  """
  env = dict(env or {})
  quoted_targets = " ".join(shlex.quote(t) for t in targets)
  invocation = parse_test_command(test_cmd)
  if invocation is None:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (f"cd {shlex.quote(workdir)} && {prefix + ' ' if prefix else ''}timeout -k 5 "
               f"{max(1, int(timeout_s))} bash -c "
               f"{shlex.quote((test_cmd + ' ' + quoted_targets).strip())}")
    return PreparedRun(command, {}, structured=False)
  key = secrets.token_bytes(32)
  run_id = secrets.token_hex(8)
  key_file = f"{scripts_dir}/key-{run_id}"
  files = {f"{scripts_dir}/{name}": sandbox_scripts.read(name) for name in sandbox_scripts.SCRIPTS}
  files[key_file] = key.hex().encode("ascii")
  assignments = {**env, **invocation.env}
  prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in assignments.items())
  python = (shlex.quote(invocation.python) if invocation.python
            else '"$(command -v python || command -v python3 || echo python)"')
  scripts = shlex.quote(scripts_dir)
  supervisor = (f"{python} -I -S {scripts}/supervisor.py --key-file {shlex.quote(key_file)} "
                f"--run-id {run_id} --timeout {float(timeout_s):g} --records --")
  launcher = " ".join([python, *map(shlex.quote, invocation.python_options), "-s", "-S",
                       f"{scripts}/pytest_launcher.py", "--workdir", shlex.quote(workdir),
                       "--mode", invocation.mode, "--", *map(shlex.quote, invocation.args)])
  command = (f"cd {shlex.quote(workdir)} && {prefix + ' ' if prefix else ''}{supervisor} "
             f"{launcher} {quoted_targets}").rstrip()
  return PreparedRun(command, files, structured=True, key=key, run_id=run_id)


# ----------------------------------------------------------------------------- the report


@dataclasses.dataclass
class SignedReport:
  """What the supervisor signed (see supervisor.py).

  Attributes:
    exit_code: the launcher's exit status (negative: the signal that killed it).
    timed_out: the supervisor killed the run at its time limit.
    records: the recording plugin's records, in order, that parse as JSON objects.
    malformed: lines of the record stream that are not such a record.
    records_truncated: the stream passed the supervisor's cap.
    non_dumpable: the supervisor could make itself non-dumpable.
  """
  exit_code: int | None
  timed_out: bool
  records: list[dict]
  malformed: int = 0
  records_truncated: bool = False
  non_dumpable: bool = False


def started(output: str, run: PreparedRun) -> bool:
  """Whether the supervisor of `run` printed its signed start line (it ran, had the key)."""
  expected = sign(run.key, b"start", run.run_id.encode("ascii"))
  for line in output.splitlines():
    parts = line.strip().split(" ")
    if len(parts) == 3 and parts[0] == START and parts[1] == run.run_id and \
        hmac.compare_digest(parts[2], expected):
      return True
  return False


def read_report(output: str, run: PreparedRun) -> SignedReport | None:
  """The signed report of `run` in a command's output, or None when no line verifies.

  Lines that look like a report but do not verify under the run's key (printed by the code
  under test, or cut by an output cap) are ignored.
  """
  for line in output.splitlines():
    parts = line.strip().split(" ")
    if len(parts) != 3 or parts[0] != REPORT:
      continue
    payload, mac = parts[1].encode("ascii", "replace"), parts[2]
    if not hmac.compare_digest(sign(run.key, b"report", payload), mac):
      continue
    data = json.loads(base64.b64decode(payload))
    if data.get("run_id") != run.run_id:
      continue
    try:
      stream = zlib.decompress(base64.b64decode(data.get("records") or ""))
    except (zlib.error, binascii.Error):
      stream = b""
    records, malformed = [], 0
    for raw in stream.split(b"\n"):
      if not raw.strip():
        continue
      try:
        record = json.loads(raw)
      except ValueError:
        malformed += 1
        continue
      if isinstance(record, dict) and isinstance(record.get("e"), str):
        records.append(record)
      else:
        malformed += 1
    return SignedReport(data.get("exit_code"), bool(data.get("timed_out")), records, malformed,
                        bool(data.get("records_truncated")), bool(data.get("non_dumpable")))
  return None


def strip_report(output: str) -> str:
  """The output with the signed report's payload left out (for the human-readable log)."""
  return re.sub(rf"^{REPORT} (\S+) (\S+)$",
                lambda m: f"{REPORT} <{len(m.group(1))} bytes, signed>", output, flags=re.M)


@dataclasses.dataclass
class RecordVerdict:
  """Per-test statuses from a signed report, and what in it shows tampering.

  Attributes:
    statuses: {pytest node id: PASSED, FAILED, ERROR, SKIPPED, XFAIL or XPASS}.
    findings: reasons the run cannot be trusted (the patch is then graded unresolved).
    notes: per-test demotions that do not distrust the whole run.
  """
  statuses: dict[str, str]
  findings: list[str]
  notes: list[str]


def judge_records(report: SignedReport, *, is_test_path: Callable[[str], bool],
                  changed_files: Sequence[str] = ()) -> RecordVerdict:
  """Reads the recording plugin's records under the rules of the module docstring.

  Args:
    report: the verified report.
    is_test_path: whether a workspace path is test code (tests, conftest), from `screening`.
    changed_files: workspace paths the patch changed and that were not restored.

  Returns:
    The RecordVerdict. A test's status is the worst of its phases and repeats (a forged or
    colliding record can only make it worse): ERROR for a setup or teardown failure, FAILED for
    a call failure, XPASS, SKIPPED, XFAIL, PASSED.
  """
  findings: list[str] = []
  notes: list[str] = []
  if report.malformed:
    findings.append(f"the record stream holds {report.malformed} line(s) the recorder never "
                    "writes (something else wrote into its pipe)")
  if report.records_truncated:
    findings.append("the record stream passed the supervisor's size cap")
  events: dict[str, list[dict]] = {}
  for record in report.records:
    events.setdefault(record["e"], []).append(record)
  for event in ("start", "collected", "finish", "exit"):
    if len(events.get(event, [])) > 1:
      findings.append(f"{len(events[event])} '{event}' records where the recorder writes one")
  if report.records and report.records[-1].get("e") != "exit" and "exit" in events:
    findings.append("records arrived after the runner's exit record")
  finish = (events.get("finish") or [None])[0]
  if finish is None or "exit" not in events:
    findings.append(f"the test session did not finish (the runner exited with "
                    f"{report.exit_code} before its end: a crash, os._exit, a signal or a fork)")
  elif finish.get("exitstatus") == _INTERRUPTED:
    findings.append("the test session was interrupted (KeyboardInterrupt or pytest.exit)")
  elif finish.get("exitstatus") in (_INTERNAL_ERROR, _USAGE_ERROR):
    findings.append(f"pytest stopped with exit status {finish.get('exitstatus')} (internal or "
                    "usage error)")
  for record in events.get("framework", []):
    # Test code may patch the framework (a conftest, a test that rebinds a builtin and leaves
    # it); anything else may not. A builtin rebound to pytest's own XFailed comes from outside
    # the workspace (origin ""): only a change made from test code is let through.
    bent = [c for c in record.get("changed") or [] if isinstance(c, dict)
            and not (c.get("origin") and is_test_path(str(c["origin"])))]
    if bent:
      names = ", ".join(f"{c.get('name')} {c.get('change')}"
                        + (f" from {c['origin']}" if c.get("origin") else "") for c in bent[:5])
      findings.append(f"the test framework was changed at run time ({record.get('stage')}): "
                      f"{names}")
  changed = set(changed_files)
  for record in events.get("plugins", []):
    for path in record.get("files") or []:
      if path in changed and not is_test_path(path):
        findings.append(f"a pytest plugin was registered from {path}, a file the patch changed")
  canary = next((r.get("canary") for r in events.get("collected", []) if r.get("canary")), None)
  phases: dict[str, dict[str, list[dict]]] = {}
  for record in events.get("test", []):
    if not isinstance(record.get("id"), str) or record.get("outcome") == "rerun":
      continue
    phases.setdefault(record["id"], {}).setdefault(str(record.get("when")), []).append(record)
  if canary is not None:
    ran = phases.pop(canary, {})
    # It must fail when called (or, at the least, in its setup); anything else is tampering.
    deciding = ran.get("call") or [r for r in ran.get("setup", []) if r.get("outcome") != "passed"]
    outcomes = sorted({(str(r.get("outcome")), bool(r.get("xfail"))) for r in deciding})
    if outcomes and outcomes != [("failed", False)]:
      findings.append(f"the canary test {canary} (which must fail) was reported as "
                      f"{[o + (' (xfail)' if x else '') for o, x in outcomes]}: the runner's "
                      "results were altered")
    elif not outcomes and not (finish or {}).get("stopped"):
      findings.append(f"the canary test {canary} did not run: tests were dropped from the run")
  statuses: dict[str, str] = {}
  swapped: dict[str, list[str]] = {}      # file the patch changed -> tests whose function it is
  xfailed: dict[str, list[str]] = {}      # code under test -> tests it made xfail
  for test, by_phase in phases.items():
    status = "PASSED"
    for when, records in by_phase.items():
      for record in records:
        outcome, xfail = record.get("outcome"), bool(record.get("xfail"))
        if outcome == "failed":
          current = "FAILED" if when == "call" else "ERROR"
        elif outcome == "skipped":
          current = "XFAIL" if xfail else "SKIPPED"
        elif outcome == "passed":
          current = "XPASS" if (xfail and when == "call") else "PASSED"
        else:
          current = "ERROR"
        origin = record.get("xfail_from")
        if current == "XFAIL" and origin and not is_test_path(origin):
          xfailed.setdefault(origin, []).append(test)
          current = "FAILED"
        code = record.get("code") or ""
        if when == "call" and code in changed and not is_test_path(code):
          swapped.setdefault(code, []).append(test)
          current = "FAILED"
        if _SEVERITY[current] > _SEVERITY[status]:
          status = current
    if "call" not in by_phase and status == "PASSED":
      status = "ERROR"  # set up and torn down, never called
    statuses[test] = status
  for path, tests in swapped.items():
    findings.append(f"{len(tests)} test(s) ran a test function defined in {path}, a file the "
                    f"patch changed (e.g. {tests[0]})")
  for path, tests in xfailed.items():
    notes.append(f"{len(tests)} test(s) were marked xfail from {path} (code under test), which "
                 f"counts as failed (e.g. {tests[0]})")
  return RecordVerdict(statuses, findings, notes)
