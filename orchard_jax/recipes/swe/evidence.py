"""What a bash-agent trajectory shows: the steps, their commands and results, and the evidence
the offline judge and annotator score (docs/algorithms.md sections 1 and 5).

A trajectory in mini-swe-agent's protocol alternates assistant turns (a THOUGHT and one bash
block) with observations (`<returncode>N</returncode>` and the output). `read_steps` turns it
into `Step`s; `gather_evidence` reads off what a reviewer would look for:

- which steps ran tests, and whether they passed (exit code 0 and no failure in the output);
- which steps edited source files, wrote a test of the agent's own (a reproduction) or reverted;
- a reproduction that failed before the first edit (the bug was reproduced) and a test that went
  from failing to passing after an edit (`fail_to_pass_steps`, the evidence that the fix works);
- whether existing tests ran after the last edit and passed (a regression guard);
- what the agent claimed in its thoughts ("fixed", "tests pass") against what the last test run
  showed, and whether it submitted while its own last test run was failing.

Everything here reads only the trajectory's messages, so it applies equally to the replay
expert's runs, model rollouts and trajectories imported from mini-swe-agent folders.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Optional, Sequence

from orchard_jax.harness.bash_agent import parse_action
from orchard_jax.harness.prompts import SUBMIT_SENTINEL

_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_TEST_RUN = re.compile(r"\b(pytest|py\.test|unittest|nosetests|tox)\b"
                       r"|python[0-9.]*\s+\S*test\S*\.py")
_FAILED_OUTPUT = re.compile(r"\b(\d+ failed|\d+ errors?\b|FAILED|FAILURES|Traceback \(most recent "
                            r"call last\)|AssertionError|Error:)", re.IGNORECASE)
_PASSED_OUTPUT = re.compile(r"\b\d+ passed\b|\bOK\b")
_REVERT = re.compile(r"\bgit\s+(checkout\s+--|checkout\s+\S+\s+--|restore|stash|reset\s+--hard)")
_SHELL_WRITE = re.compile(r"(?:>>?\s*|tee\s+(?:-a\s+)?)([\w./-]+\.py)\b"
                          r"|sed\s+-i[^|;&\n]*?\s([\w./-]+\.py)\b")
_PYTHON_WRITE = re.compile(r"Path\(\s*['\"]([\w./-]+\.py)['\"]\s*\)"
                           r"|open\(\s*['\"]([\w./-]+\.py)['\"]\s*,\s*['\"][wa]")
_APPLIES_PATCH = re.compile(r"\bpatch\s+-p|\bpatch\s+<|\bgit\s+apply\b")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
_CLAIM_FIXED = re.compile(r"\b(fixed|resolved|works now|now passes|tests? pass(?:es)?|all "
                          r"tests pass|the fix (?:works|is complete)|change is complete)\b",
                          re.IGNORECASE)
_TEST_NAME = re.compile(r"(^|/)(test_[\w-]*|[\w-]*_test)\.py$|(^|/)tests?/")


@dataclasses.dataclass
class Step:
  """One action of a trajectory and what it showed.

  Attributes:
    index: the action's position (0 = first assistant turn).
    thought: the reply's text outside the bash block.
    command: the bash command ("" when the reply had no single block).
    returncode: the observation's exit code, or None (no observation, e.g. the submit step).
    output: the observation's text (the command output, possibly cut by the harness).
    runs_tests: the command runs a test runner (pytest, unittest, a test_*.py script).
    written_files: .py files the command writes or edits.
    edits_source: it writes a non-test .py file (or applies a patch).
    writes_test: it writes a test file of its own (a reproduction).
    reverts: it undoes changes (git checkout --, git restore, git stash).
    submits: the submit command.
    format_error: the reply had no single bash block.
  """
  index: int
  thought: str
  command: str
  returncode: Optional[int]
  output: str
  runs_tests: bool = False
  written_files: tuple[str, ...] = ()
  edits_source: bool = False
  writes_test: bool = False
  reverts: bool = False
  submits: bool = False
  format_error: bool = False

  @property
  def tests_passed(self) -> Optional[bool]:
    """For a test run: exit 0 and no failure reported in the output; None for other steps."""
    if not self.runs_tests or self.returncode is None:
      return None
    failed = bool(_FAILED_OUTPUT.search(self.output)) and not _only_passing(self.output)
    return self.returncode == 0 and not failed


def _only_passing(output: str) -> bool:
  return bool(_PASSED_OUTPUT.search(output)) and not re.search(r"\d+ (failed|error)", output)


def _observation(message: Mapping[str, Any]) -> tuple[Optional[int], str]:
  extra = message.get("extra") or {}
  content = str(message.get("content") or "")
  code = extra.get("returncode")
  if code is None:
    match = _RETURNCODE.search(content)
    code = int(match.group(1)) if match else None
  output = extra.get("raw_output")
  return (None if code is None else int(code)), str(output if output is not None else content)


def _written_files(command: str) -> tuple[str, tuple[str, ...]]:
  """(the command with heredoc bodies removed, .py files it writes).

  Shell redirections, tee and sed -i count everywhere outside heredoc bodies; inside a heredoc
  fed to python, Path("x.py") and open("x.py", "w") count (the replay expert edits that way).
  """
  lines = command.split("\n")
  shell, written, i = [], [], 0
  while i < len(lines):
    line = lines[i]
    shell.append(line)
    i += 1
    for match in _HEREDOC.finditer(line):
      body = []
      while i < len(lines) and lines[i].strip() != match.group(2):
        body.append(lines[i])
        i += 1
      i += 1  # the terminator
      if re.search(r"\bpython", line[:match.start()]):
        written += [f for groups in _PYTHON_WRITE.findall("\n".join(body)) for f in groups if f]
  shell_text = "\n".join(shell)
  written = [f for groups in _SHELL_WRITE.findall(shell_text) for f in groups if f] + written
  return shell_text, tuple(dict.fromkeys(written))


def _shell_tool_calls(message: Mapping[str, Any]) -> list[str]:
  """The shell commands of an assistant message's tool calls, for external harnesses whose
  shell tool takes {"command": ...} (Claude Code's Bash, the bash tool) or {"cmd": ...}
  (Codex's exec_command; a list of words is joined)."""
  commands = []
  for call in message.get("tool_calls") or ():
    function = call.get("function", {}) if isinstance(call, Mapping) else {}
    try:
      arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
      continue
    value = arguments.get("command", arguments.get("cmd")) if isinstance(arguments, dict) else None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
      value = " ".join(value)
    if isinstance(value, str) and value.strip():
      commands.append(value)
  return commands


def read_steps(messages: Sequence[Mapping[str, Any]]) -> list[Step]:
  """The actions of a bash-agent trajectory with their observations (see module docstring).

  Args:
    messages: the harness messages (system, user task, then assistant / user observation
      pairs; a trailing "exit" message is ignored).
  Returns:
    One Step per assistant message, in order.
  """
  steps = []
  for i, message in enumerate(messages):
    if message.get("role") != "assistant":
      continue
    content = str(message.get("content") or "")
    actions = parse_action(content) or _shell_tool_calls(message)
    command = actions[0] if len(actions) == 1 else ""
    thought = re.sub(r"```.*?```", "", content, flags=re.DOTALL).strip()
    following = messages[i + 1] if i + 1 < len(messages) else None
    code, output = (None, "")
    if following is not None and following.get("role") in ("user", "tool"):
      code, output = _observation(following)
    shell, written = _written_files(command)
    tests_written = tuple(f for f in written if _TEST_NAME.search(f))
    step = Step(index=len(steps), thought=thought, command=command, returncode=code,
                output=output, runs_tests=bool(_TEST_RUN.search(command)) and SUBMIT_SENTINEL
                not in command, written_files=written,
                edits_source=bool(_APPLIES_PATCH.search(shell))
                or any(f not in tests_written for f in written),
                writes_test=bool(tests_written), reverts=bool(_REVERT.search(shell)),
                submits=SUBMIT_SENTINEL in command, format_error=len(actions) != 1)
    steps.append(step)
  return steps


@dataclasses.dataclass
class Evidence:
  """What a trajectory shows (see the module docstring). Step numbers index `steps`.

  Attributes:
    steps: the parsed steps.
    first_edit: the first step that edited source, or None.
    last_edit: the last one, or None.
    reproduction_steps: test runs of a test the agent wrote itself.
    reproduced_before_fix: a test run failed before the first source edit.
    fail_to_pass_steps: source edits after which a test that had failed passed.
    verified_after_fix: a test run after the last edit.
    last_test_passed: the result of the last test run (None when no test ran).
    existing_tests_after_fix: a test run after the last edit that ran existing tests (not only
      the agent's own test files).
    existing_tests_passed: that run passed.
    claims_success: the agent's thoughts claim the fix works or tests pass.
    unsupported_claims: steps claiming success while the latest test run had failed (or no
      test had run after the last edit).
    submitted: the trajectory ended with the submit command.
    submitted_with_failing_tests: it submitted while its own last test run failed.
    format_errors: replies without a single bash block.
    test_files_edited: the agent edited existing test files (not its own reproduction).
  """
  steps: list[Step]
  first_edit: Optional[int] = None
  last_edit: Optional[int] = None
  reproduction_steps: list[int] = dataclasses.field(default_factory=list)
  reproduced_before_fix: bool = False
  fail_to_pass_steps: list[int] = dataclasses.field(default_factory=list)
  verified_after_fix: bool = False
  last_test_passed: Optional[bool] = None
  existing_tests_after_fix: bool = False
  existing_tests_passed: bool = False
  claims_success: bool = False
  unsupported_claims: list[int] = dataclasses.field(default_factory=list)
  submitted: bool = False
  submitted_with_failing_tests: bool = False
  format_errors: int = 0
  test_files_edited: bool = False

  def summary(self) -> dict[str, Any]:
    """The evidence as a JSON-friendly dict (without the steps)."""
    out = dataclasses.asdict(self)
    out.pop("steps")
    out["num_steps"] = len(self.steps)
    out["test_runs"] = sum(s.runs_tests for s in self.steps)
    return out


def gather_evidence(messages: Sequence[Mapping[str, Any]]) -> Evidence:
  """Reads the evidence (module docstring) off a trajectory's messages."""
  steps = read_steps(messages)
  ev = Evidence(steps=steps)
  own_tests: set[str] = set()
  edits: list[int] = []            # source edits and reverts, in order
  last_failed_run: Optional[int] = None
  last_test: Optional[Step] = None
  for step in steps:
    if step.writes_test:
      own_tests.update(f for f in step.written_files if _TEST_NAME.search(f))
    if step.edits_source:
      if ev.first_edit is None:
        ev.first_edit = step.index
      edits.append(step.index)
    if step.reverts:
      edits.append(step.index)
    ev.last_edit = edits[-1] if edits else None
    if step.runs_tests and step.returncode is not None:
      passed = bool(step.tests_passed)
      if step.writes_test or any(f.split("/")[-1] in step.command for f in own_tests):
        ev.reproduction_steps.append(step.index)
      if not passed and ev.first_edit is None:
        ev.reproduced_before_fix = True
      if passed and last_failed_run is not None:
        between = [e for e in edits if last_failed_run < e < step.index]
        if between and between[-1] not in ev.fail_to_pass_steps:
          ev.fail_to_pass_steps.append(between[-1])
      if not passed:
        last_failed_run = step.index
      last_test = step
    if _CLAIM_FIXED.search(step.thought):
      ev.claims_success = True
      ran_after_edit = (last_test is not None and ev.last_edit is not None
                        and last_test.index > ev.last_edit)
      if (last_test is not None and last_test.tests_passed is False) or (
          ev.last_edit is not None and not ran_after_edit):
        ev.unsupported_claims.append(step.index)
    ev.format_errors += int(step.format_error)
    ev.test_files_edited |= any(_TEST_NAME.search(f) and f not in own_tests
                                for f in step.written_files if not step.writes_test)
    ev.submitted |= step.submits
  ev.last_test_passed = None if last_test is None else last_test.tests_passed
  if ev.last_edit is not None:
    after = [s for s in steps if s.index > ev.last_edit and s.runs_tests
             and s.returncode is not None]
    ev.verified_after_fix = bool(after)
    existing = [s for s in after
                if not any(f.split("/")[-1] in s.command for f in own_tests) or " tests" in
                s.command or "/tests" in s.command]
    ev.existing_tests_after_fix = bool(existing)
    ev.existing_tests_passed = bool(existing) and bool(existing[-1].tests_passed)
  ev.submitted_with_failing_tests = ev.submitted and ev.last_test_passed is False
  return ev


def compact_observation(text: str, limit: int) -> str:
  """`text` cut to at most `limit` characters, keeping its head and tail (judge prompts)."""
  if limit <= 0 or len(text) <= limit:
    return text
  half = max(limit // 2 - 20, 1)
  return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"


def render_trajectory(messages: Sequence[Mapping[str, Any]], *, observation_chars: int = 1200,
                      max_steps: int = 0) -> str:
  """The trajectory as numbered steps for an LLM judge or annotator: each action's thought,
  command, exit code and output (outputs compacted to `observation_chars`, head and tail).

  Args:
    messages: harness messages.
    observation_chars: per-observation character budget (1,200 in Orchard's judge).
    max_steps: keep only the last this many steps (0 = all).
  """
  steps = read_steps(messages)
  if max_steps and len(steps) > max_steps:
    steps = steps[-max_steps:]
  parts = []
  for step in steps:
    code = "none" if step.returncode is None else str(step.returncode)
    parts.append(f"### Step {step.index}\nTHOUGHT: {compact_observation(step.thought, 600)}\n"
                 f"COMMAND:\n{compact_observation(step.command, observation_chars)}\n"
                 f"EXIT CODE: {code}\nOUTPUT:\n"
                 f"{compact_observation(step.output, observation_chars)}")
  return "\n\n".join(parts)
