"""The browser agent: the ReAct tool agent over a browser's tools, seeing the page as screenshots.

Orchard-GUI's harness (docs/algorithms.md section 9): the model sees the task and a screenshot,
replies with one function call of the browser's tools (coordinates 0-1000), sees the call's
result and the page's new screenshot, and so on until it calls `done`, runs out of steps, or
fails the format too often. Only the last k screenshots stay in the context sent to the model
(k = 1 by default); earlier ones are replaced by a short text, so a prompt's size does not grow
with the episode and each turn is its own training sample. A text-only policy can be given the
page's accessibility tree as text instead of (or beside) the screenshot.

This is `ToolAgent` configured for a browser: one call per reply, a reply without a call is a
format error (the task ends through `done`), a malformed call (bad coordinates, an unknown key,
a missing field) is a format error the agent sees, and `max_consecutive_format_errors` of them
in a row end the run as RepeatedFormatError (reward -1). The backend is any object with
`tools`, `call(name, arguments)` (results may carry `format_error`, `final`, `abort`) and
`observe()` -> the observation message (orchard_jax.tasks.gui.tools.BrowserTools).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

from orchard_jax.harness.tool_agent import ToolAgent, ToolAgentConfig, ToolAgentResult

OMITTED_SCREENSHOT = "[an earlier screenshot, omitted]"
SYSTEM_PROMPT = (
    "You are a web browsing agent. You complete the user's task in a web browser by calling "
    "one of the tools in each reply. After each call you see the result and a new screenshot "
    "of the page. Positions on the page are given as x and y from 0 to 1000: (0, 0) is the "
    "top-left corner of the page and (1000, 1000) its bottom-right corner. To type into a "
    "field, click it first, then write. Make exactly one tool call per reply. When the task is "
    "complete, call done (with the answer if the task asks a question).")


@dataclasses.dataclass(frozen=True)
class BrowserAgentConfig:
  """The browser agent's settings.

  Attributes:
    step_limit: most model calls (Orchard-GUI's curriculum: 15, then 30).
    screenshots_in_context: k of the last-k-screenshots policy (1 = only the latest).
    max_consecutive_format_errors: malformed replies in a row that end the run.
    wall_time_limit_s: most seconds for the whole run (0 = no limit).
    system_prompt: the first message.
  """
  step_limit: int = 15
  screenshots_in_context: int = 1
  max_consecutive_format_errors: int = 3
  wall_time_limit_s: float = 900.0
  system_prompt: str = SYSTEM_PROMPT

  def __post_init__(self):
    if self.screenshots_in_context < 0:
      raise ValueError(f"screenshots_in_context: expected k >= 0, got "
                       f"{self.screenshots_in_context}")

  def tool_agent_config(self) -> ToolAgentConfig:
    return ToolAgentConfig(step_limit=self.step_limit, wall_time_limit_s=self.wall_time_limit_s,
                           max_consecutive_format_errors=self.max_consecutive_format_errors,
                           max_tool_calls_per_turn=1, system_prompt=self.system_prompt,
                           text_reply_ends=False, output_limit_chars=4000)


def _is_image(part: Any) -> bool:
  return isinstance(part, dict) and part.get("type") in ("image_url", "image")


def last_k_images(messages: list, k: int) -> list:
  """The context policy: `messages` with only the image parts of the last `k` messages that
  have images kept; every earlier image part becomes the text OMITTED_SCREENSHOT. The input is
  not changed. k = 0 drops every image.

  Args:
    messages: OpenAI chat messages (content a string or a list of parts).
    k: how many image-bearing messages keep their images (counted from the end).
  Returns:
    A new list; messages without images are the same objects.
  """
  if k < 0:
    raise ValueError(f"k must be >= 0, got {k}")
  with_images = [i for i, m in enumerate(messages)
                 if isinstance(m.get("content"), list) and any(map(_is_image, m["content"]))]
  drop = set(with_images[:max(len(with_images) - k, 0)])
  if not drop:
    return list(messages)
  out = []
  for i, message in enumerate(messages):
    if i in drop:
      message = dict(message)
      message["content"] = [{"type": "text", "text": OMITTED_SCREENSHOT} if _is_image(p)
                            else copy.copy(p) for p in message["content"]]
    out.append(message)
  return out


def first_message(instruction: str, observation: Optional[dict]) -> Any:
  """The first user message's content: the task, then the first observation's parts."""
  parts = [{"type": "text", "text": f"Task: {instruction}"}]
  if observation is not None:
    content = observation.get("content")
    parts += content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
  return parts


class BrowserAgent:
  """Runs the browser agent (module docstring) for one task.

  Args:
    model: has `complete(messages, tools=...)` (`harness.ChatModel`, or a scripted model).
    backend: the browser's tools with `observe()`.
    config: BrowserAgentConfig.
  """

  def __init__(self, model: Any, backend: Any, config: BrowserAgentConfig = BrowserAgentConfig()):
    self.model, self.backend, self.config = model, backend, config

  def run(self, instruction: str) -> ToolAgentResult:
    """Runs until done, a limit, repeated format errors or an abort; never raises for model,
    tool or browser failures."""
    k = self.config.screenshots_in_context
    agent = ToolAgent(self.model, self.backend, self.config.tool_agent_config(),
                      context=lambda messages: last_k_images(messages, k))
    try:
      observation = self.backend.observe()
    except Exception as e:  # noqa: BLE001 - a browser that cannot be observed is gone
      return agent_aborted(self.config, instruction, f"first observation failed: "
                           f"{type(e).__name__}: {e}")
    return agent.run(first_message(instruction, observation))


def agent_aborted(config: BrowserAgentConfig, instruction: str, reason: str) -> ToolAgentResult:
  """The result of a run that could not start (the browser was gone before the first call)."""
  from orchard_jax.harness.tool_agent import EXIT_ABORTED
  messages = [{"role": "system", "content": config.system_prompt},
              {"role": "user", "content": f"Task: {instruction}"}]
  return ToolAgentResult(EXIT_ABORTED, "", messages, [], 0, 0, 0, 0, 0.0, reason,
                         config.tool_agent_config())
