"""A bash-only agent loop compatible with mini-swe-agent's protocol.

One turn: ask the model (through an OpenAI-compatible base URL), find exactly one bash block in
its reply, run it in the sandbox, and answer with the observation. The loop ends with

  Submitted            a command's output starts with the submit sentinel (exit code 0);
                       the rest of that output is the submission (the patch)
  LimitsExceeded       `step_limit` model calls were made
  TimeExceeded         `wall_time_limit_s` passed
  RepeatedFormatError  `max_consecutive_format_errors` replies in a row had no single action
  ModelError           the model endpoint failed (the exception text is kept)

as mini-swe-agent's DefaultAgent does (agents/default.py there). Messages carry mini-swe-agent's
`extra` dicts, and the result is a `orchard_jax.data.Trajectory` that `data.miniswe` writes as a
`*.traj.json` file in mini-swe-agent's trajectory format.
"""
from __future__ import annotations

import dataclasses
import re
import time
import uuid
from typing import Protocol

from orchard_jax.harness import prompts
from orchard_jax.harness.errors import ModelCallError

EXIT_SUBMITTED = "Submitted"
EXIT_LIMITS = "LimitsExceeded"
EXIT_TIME = "TimeExceeded"
EXIT_FORMAT = "RepeatedFormatError"
EXIT_MODEL_ERROR = "ModelError"


class ShellSandbox(Protocol):
  """Where actions run (`orchard_jax.tasks.swe.testbed.Sandbox` has this shape)."""

  def run(self, command: str, *, timeout_s: float): ...


class ChatModelLike(Protocol):
  def complete(self, messages: list[dict]): ...


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Limits and templates of the bash agent (the defaults are mini-swe-agent's SWE-bench ones
  scaled to small models: at most 50 steps, commands cut at 60 s, output over 10000 characters
  cut to 5000 + 5000).

  Attributes:
    step_limit: most model calls (0 = no limit).
    wall_time_limit_s: most seconds for the whole run (0 = no limit).
    max_consecutive_format_errors: stop after this many malformed replies in a row.
    command_timeout_s: limit of one command, seconds.
    output_limit_chars: longer outputs are shown as head + tail of half this size each.
    workdir: the repository path, shown in the prompt.
    system_template, instance_template: the first two messages ({task}, {workdir},
      {submit_command}, {command_timeout_s} are filled in).
    action_regex: finds the bash block in a reply.
  """
  step_limit: int = 50
  wall_time_limit_s: float = 1800.0
  max_consecutive_format_errors: int = 3
  command_timeout_s: float = 60.0
  output_limit_chars: int = 10000
  workdir: str = "/testbed"
  system_template: str = prompts.SYSTEM_TEMPLATE
  instance_template: str = prompts.INSTANCE_TEMPLATE
  action_regex: str = prompts.ACTION_REGEX


@dataclasses.dataclass
class AgentResult:
  """How a run ended: exit status, the submission (a patch for SWE tasks), every message."""
  exit_status: str
  submission: str
  messages: list[dict]
  steps: int
  seconds: float
  config: AgentConfig

  def to_trajectory(self, *, task_id: str, trajectory_id: str | None = None, attempt: int = 0,
                    session_id: str | None = None, metadata: dict | None = None):
    """This run as an `orchard_jax.data.Trajectory` (mini-swe-agent-format when written)."""
    from orchard_jax.data.records import Trajectory
    info = {"harness": "orchard_jax.harness.bash_agent", "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "agent_config": {k: v for k, v in dataclasses.asdict(self.config).items()
                             if not k.endswith("template")}}
    return Trajectory(trajectory_id=trajectory_id or f"{task_id}-{uuid.uuid4().hex[:8]}",
                      task_id=task_id, attempt=attempt, session_id=session_id,
                      messages=self.messages, exit_status=self.exit_status,
                      submission=self.submission, metadata={**info, **(metadata or {})})


def format_observation(returncode: int, output: str, *, limit: int,
                       exception: str = "") -> str:
  """The observation text of one command, mini-swe-agent style (head and tail past `limit`)."""
  exception_text = f"<exception>{exception}</exception>\n" if exception else ""
  if len(output) <= limit:
    body = prompts.OUTPUT_TEMPLATE.format(output=output if output.endswith("\n") or not output
                                          else output + "\n")
  else:
    half = limit // 2
    body = prompts.LONG_OUTPUT_TEMPLATE.format(length=len(output), head=output[:half],
                                               tail=output[-half:], elided=len(output) - 2 * half)
  return prompts.OBSERVATION_TEMPLATE.format(returncode=returncode, exception=exception_text,
                                             body=body)


def parse_action(content: str, action_regex: str = prompts.ACTION_REGEX) -> list[str]:
  """The bash commands in a reply (a well-formed reply has exactly one); an empty block is not
  a command (it counts as a format error instead of reaching the sandbox, which refuses it)."""
  return [a.strip() for a in re.findall(action_regex, content, re.DOTALL) if a.strip()]


class BashAgent:
  """Runs the loop (see the module docstring) for one task in one sandbox.

  Args:
    model: has `complete(messages) -> response with .content and .finish_reason` (ChatModel).
    sandbox: has `run(command, timeout_s=) -> result with .exit_code, .output, .timed_out`.
    config: limits and templates.
  """

  def __init__(self, model: ChatModelLike, sandbox: ShellSandbox,
               config: AgentConfig = AgentConfig()):
    self.model = model
    self.sandbox = sandbox
    self.config = config
    self.messages: list[dict] = []
    self.steps = 0

  def _add(self, role: str, content: str, **extra) -> dict:
    message = {"role": role, "content": content, "extra": {"timestamp": time.time(), **extra}}
    self.messages.append(message)
    return message

  def run(self, task: str) -> AgentResult:
    """Runs until submit or a limit; never raises for model or command failures."""
    config = self.config
    start = time.monotonic()
    self.messages, self.steps = [], 0
    values = {"task": task, "workdir": config.workdir, "submit_command": prompts.SUBMIT_COMMAND,
              "command_timeout_s": int(config.command_timeout_s)}
    self._add("system", config.system_template.format(**values))
    self._add("user", config.instance_template.format(**values))
    format_errors = 0
    while True:
      if 0 < config.step_limit <= self.steps:
        return self._exit(EXIT_LIMITS, "", start)
      if 0 < config.wall_time_limit_s <= time.monotonic() - start:
        return self._exit(EXIT_TIME, "", start)
      self.steps += 1
      try:
        response = self.model.complete([{"role": m["role"], "content": m["content"]}
                                        for m in self.messages])
      except ModelCallError as e:
        return self._exit(EXIT_MODEL_ERROR, "", start, exception_str=str(e))
      self._add("assistant", response.content, finish_reason=response.finish_reason)
      actions = parse_action(response.content, config.action_regex)
      if len(actions) != 1:
        format_errors += 1
        if response.finish_reason == "length":
          text = prompts.TRUNCATED_RESPONSE_TEMPLATE.format(finish_reason=response.finish_reason)
        else:
          text = prompts.FORMAT_ERROR_TEMPLATE.format(
              error=f"expected exactly 1 bash block, found {len(actions)}.",
              submit_command=prompts.SUBMIT_COMMAND)
        self._add("user", text, interrupt_type="FormatError", n_actions=len(actions))
        if format_errors >= config.max_consecutive_format_errors > 0:
          return self._exit(EXIT_FORMAT, "", start)
        continue
      format_errors = 0
      self.messages[-1]["extra"]["actions"] = [{"command": actions[0]}]
      observation, submission = self._execute(actions[0])
      if submission is not None:
        return self._exit(EXIT_SUBMITTED, submission, start)
      self._add("user", observation["content"], **observation["extra"])

  def _execute(self, command: str):
    result = self.sandbox.run(command, timeout_s=self.config.command_timeout_s)
    output = result.output
    exception = ""
    returncode = result.exit_code
    if getattr(result, "timed_out", False):
      returncode = -1
      exception = (f"The command timed out after {self.config.command_timeout_s:.0f} seconds and "
                   f"was killed; run long jobs in the background or with a smaller input.")
    lines = output.lstrip().splitlines(keepends=True)
    if (not exception and returncode == 0 and lines
        and lines[0].strip() == prompts.SUBMIT_SENTINEL):
      return None, "".join(lines[1:])
    content = format_observation(returncode, output, limit=self.config.output_limit_chars,
                                 exception=exception)
    return {"content": content, "extra": {"returncode": returncode, "raw_output": output,
                                          "exception_info": exception}}, None

  def _exit(self, status: str, submission: str, start: float, **extra) -> AgentResult:
    self._add("exit", submission if status == EXIT_SUBMITTED else status,
              exit_status=status, submission=submission, **extra)
    return AgentResult(status, submission, self.messages, self.steps,
                       time.monotonic() - start, self.config)


def run_agent(model: ChatModelLike, sandbox: ShellSandbox, task: str,
              config: AgentConfig = AgentConfig()) -> AgentResult:
  """Convenience: `BashAgent(model, sandbox, config).run(task)`."""
  return BashAgent(model, sandbox, config).run(task)
