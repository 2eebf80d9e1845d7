"""A ReAct tool-calling agent over OpenAI function calling, for any tool backend.

One turn: send the chat and the backend's tool schemas to the model (an OpenAI-compatible base
URL, normally the recording proxy's session URL), run every tool call of its reply through the
backend, and answer each with a `tool` message carrying the call's result. A reply without tool
calls is the final answer. The loop ends with

  Submitted            the model replied with text and no tool call: its text is the answer
  LimitsExceeded       `step_limit` model calls were made
  TimeExceeded         `wall_time_limit_s` passed (checked before each model call)
  RepeatedFormatError  `max_consecutive_format_errors` replies in a row had neither a tool call
                       nor text (or were cut off at the token limit)
  ModelError           the model endpoint failed (the exception text is kept)
  aborted              the backend reported that the environment died (`abort` on a result,
                       e.g. a service stopped answering); `abort_reason` says why

Tool errors are not the agent's end: a bad argument, a refused call or an injected 500 comes
back as the tool message's text, and the model may recover. Tool arguments are passed to the
backend as the JSON text the model produced, so the backend (the service) judges them.

Two more things a backend's result may say (the browser agent uses both): `format_error`
(the call itself was malformed: a reply whose calls all are counts toward
`max_consecutive_format_errors` like a reply without a call) and `final` (the call ended the
task, e.g. a `done` tool: the run ends Submitted with `final` as the answer). With
`text_reply_ends=False` a reply without a tool call is a format error instead of the answer.
A backend with an `observe()` method is asked after each turn's tool results for a message to
append (e.g. a user message with the page's new screenshot), and the agent's `context`
callable, when given, chooses what of the history is sent each call (e.g. only the last k
screenshots); the full history is kept in the result either way.

The backend is anything with `tools` (OpenAI schemas) and `call(name, arguments_text)`
returning an object with `content` (text, or a list of content parts for multimodal tools),
`is_error` and optionally `abort`; the assistant domain's `ServiceTools` and a browser's tool
set both fit. Messages are plain OpenAI chat messages (plus an `extra` dict on tool messages:
tool, is_error, status, seconds), so the trajectory trains SFT as written.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, Callable, Optional, Protocol

from orchard_jax.harness.errors import ModelCallError

EXIT_SUBMITTED = "Submitted"
EXIT_LIMITS = "LimitsExceeded"
EXIT_TIME = "TimeExceeded"
EXIT_FORMAT = "RepeatedFormatError"
EXIT_MODEL_ERROR = "ModelError"
EXIT_ABORTED = "aborted"

DEFAULT_SYSTEM_PROMPT = ("You are a helpful assistant that completes the user's request by "
                         "calling the tools provided. Call tools until the work is done, then "
                         "reply with a short final answer and no tool call.")
FORMAT_ERROR_MESSAGE = ("Your reply had neither a tool call nor an answer. Call one of the tools, "
                        "or, if the task is complete, reply with your final answer as text.")
NO_TOOL_CALL_MESSAGE = ("Your reply had no tool call. Reply with a tool call; when the task is "
                        "complete, call the tool that finishes it.")
TRUNCATED_MESSAGE = ("Your reply was cut off at the output token limit before it was complete. "
                     "Be brief: make one tool call at a time.")


class ToolBackend(Protocol):
  """Where tool calls run (module docstring)."""
  tools: list

  def call(self, name: str, arguments: str) -> Any: ...


class ToolChatModel(Protocol):
  """`harness.ChatModel` has this shape."""

  def complete(self, messages: list, *, tools: Optional[list] = None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class ToolAgentConfig:
  """Limits of the tool agent.

  Attributes:
    step_limit: most model calls (0 = no limit).
    wall_time_limit_s: most seconds for the whole run (0 = no limit).
    max_consecutive_format_errors: stop after this many unusable replies in a row.
    max_tool_calls_per_turn: calls beyond this in one reply are answered with an error
      instead of run.
    output_limit_chars: a longer tool result is cut to this many characters (text results).
    system_prompt: the first message.
    text_reply_ends: a reply with text and no tool call is the final answer (True), or a
      format error (False: the task ends through a tool, e.g. `done`).
  """
  step_limit: int = 30
  wall_time_limit_s: float = 600.0
  max_consecutive_format_errors: int = 3
  max_tool_calls_per_turn: int = 8
  output_limit_chars: int = 8000
  system_prompt: str = DEFAULT_SYSTEM_PROMPT
  text_reply_ends: bool = True


@dataclasses.dataclass
class ToolAgentResult:
  """How a run ended.

  Attributes:
    exit_status: see the module docstring.
    answer: the final answer ("" unless Submitted).
    messages: the whole chat (OpenAI format).
    tools: the tool schemas offered.
    steps: model calls made.
    tool_calls: tool calls run.
    tool_errors: tool calls whose result was an error.
    format_errors: replies that counted as format errors (no usable call, or only malformed
      calls).
    seconds: wall time.
    abort_reason: why the run was aborted or the model failed, else None.
    config: the limits used.
  """
  exit_status: str
  answer: str
  messages: list
  tools: list
  steps: int
  tool_calls: int
  tool_errors: int
  format_errors: int
  seconds: float
  abort_reason: Optional[str]
  config: ToolAgentConfig

  def to_trajectory(self, *, task_id: str, trajectory_id: Optional[str] = None, attempt: int = 0,
                    session_id: Optional[str] = None, metadata: Optional[dict] = None):
    """This run as an `orchard_jax.data.Trajectory` (submission = the final answer)."""
    from orchard_jax.data.records import Trajectory
    info = {"harness": "orchard_jax.harness.tool_agent", "steps": self.steps,
            "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
            "format_errors": self.format_errors,
            "seconds": round(self.seconds, 3), "abort_reason": self.abort_reason,
            "agent_config": {k: v for k, v in dataclasses.asdict(self.config).items()
                             if k != "system_prompt"}}
    return Trajectory(trajectory_id=trajectory_id or f"{task_id}-{uuid.uuid4().hex[:8]}",
                      task_id=task_id, attempt=attempt, session_id=session_id,
                      messages=self.messages, tools=self.tools, exit_status=self.exit_status,
                      submission=self.answer, metadata={**info, **(metadata or {})})


def _cut(content: Any, limit: int) -> Any:
  if not isinstance(content, str) or limit <= 0 or len(content) <= limit:
    return content
  return content[:limit] + f"\n[... {len(content) - limit} more characters cut]"


class ToolAgent:
  """Runs the loop (module docstring) for one task against one backend.

  Args:
    model: has `complete(messages, tools=...)` returning `.message` (the assistant message),
      `.tool_calls`, `.content` and `.finish_reason` (`ChatModel`).
    backend: the tools (`ToolBackend`).
    config: limits and the system prompt.
    context: messages -> the messages to send (the history policy); None sends them all.
  """

  def __init__(self, model: ToolChatModel, backend: ToolBackend,
               config: ToolAgentConfig = ToolAgentConfig(), *,
               context: Optional[Callable[[list], list]] = None):
    self.model, self.backend, self.config = model, backend, config
    self.context = context

  def run(self, instruction: Any) -> ToolAgentResult:
    """Runs until an answer or a limit; never raises for model, tool or backend failures.

    Args:
      instruction: the user message's content (text, or OpenAI content parts).
    """
    config = self.config
    start = time.monotonic()
    tools = list(self.backend.tools)
    messages: list[dict] = [{"role": "system", "content": config.system_prompt},
                            {"role": "user", "content": instruction}]
    steps = calls = errors = format_errors = total_format_errors = 0
    observe = getattr(self.backend, "observe", None)

    def finish(status: str, answer: str = "", reason: Optional[str] = None) -> ToolAgentResult:
      return ToolAgentResult(status, answer, messages, tools, steps, calls, errors,
                             total_format_errors, time.monotonic() - start, reason, config)

    while True:
      if 0 < config.step_limit <= steps:
        return finish(EXIT_LIMITS)
      if 0 < config.wall_time_limit_s <= time.monotonic() - start:
        return finish(EXIT_TIME)
      steps += 1
      try:
        sent = self.context(messages) if self.context is not None else messages
        response = self.model.complete(sent, tools=tools)
      except ModelCallError as e:
        return finish(EXIT_MODEL_ERROR, reason=str(e))
      message = dict(response.message or {"role": "assistant", "content": response.content})
      tool_calls = list(response.tool_calls or [])
      for call in tool_calls:
        call.setdefault("id", f"call_{uuid.uuid4().hex[:24]}")
        call.setdefault("type", "function")
      if tool_calls:
        message["tool_calls"] = tool_calls
      messages.append(message)
      if not tool_calls:
        text = (response.content or "").strip()
        if text and response.finish_reason != "length" and config.text_reply_ends:
          return finish(EXIT_SUBMITTED, text)
        format_errors += 1
        total_format_errors += 1
        note = (TRUNCATED_MESSAGE if response.finish_reason == "length" else
                FORMAT_ERROR_MESSAGE if config.text_reply_ends else NO_TOOL_CALL_MESSAGE)
        messages.append({"role": "user", "content": note})
        if format_errors >= config.max_consecutive_format_errors > 0:
          return finish(EXIT_FORMAT)
        continue
      malformed = 0
      final = None
      for n, call in enumerate(tool_calls):
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
          arguments = json.dumps(arguments if arguments is not None else {})
        t0 = time.monotonic()
        if n >= config.max_tool_calls_per_turn > 0:
          content, is_error, abort, status = (
              f"Error: at most {config.max_tool_calls_per_turn} tool calls per reply; this one "
              "was not run.", True, None, 0)
        else:
          result = self.backend.call(name, arguments)
          content, is_error = result.content, bool(result.is_error)
          abort, status = getattr(result, "abort", None), getattr(result, "status", None)
          malformed += bool(getattr(result, "format_error", False))
          if getattr(result, "final", None) is not None and final is None:
            final = str(result.final)
          calls += 1
        errors += int(is_error)
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": _cut(content, config.output_limit_chars),
                         "extra": {"tool": name, "is_error": is_error, "status": status,
                                   "seconds": round(time.monotonic() - t0, 4)}})
        if abort:
          return finish(EXIT_ABORTED, reason=abort)
        if final is not None:
          return finish(EXIT_SUBMITTED, final)
      if malformed == len(tool_calls):
        format_errors += 1
        total_format_errors += 1
        if format_errors >= config.max_consecutive_format_errors > 0:
          return finish(EXIT_FORMAT)
      else:
        format_errors = 0
      if observe is not None:
        try:
          observation = observe()
        except Exception as e:  # noqa: BLE001 - an environment that cannot be observed is gone
          return finish(EXIT_ABORTED, reason=f"observation failed: {type(e).__name__}: {e}")
        if observation is not None:
          messages.append(observation)
