"""The browser's tools as a harness backend: checked tool calls in, results and observations out.

`BrowserTools` is what `harness.BrowserAgent` (or any ToolAgent) drives: `tools` are the 13
OpenAI function tools, `call(name, arguments_json)` checks the call (actions.parse_action),
converts its 0-1000 coordinates to the viewport's pixels and performs it in the rollout's
`BrowserSandbox`, and `observe()` gives the user message with the page after the last action
(its screenshot as an image part; the URL, title and tabs as text; the accessibility tree when
configured). Results carry what the agent loop needs:

  format_error  the call was malformed (the agent sees the message; counted toward the
                repeated-format-failure reward)
  final         the episode is over: `done` was called (its answer), or the task's page says
                it has ended (MiniWoB's episode end, answer "")
  abort         the browser crashed or the page stopped responding (the reason)
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from orchard_jax.tasks.gui import actions as _actions
from orchard_jax.tasks.gui.errors import BrowserAborted, BrowserSandboxError
from orchard_jax.tasks.gui.sandbox import BrowserSandbox, Observation

OBSERVATION_MODES = ("screenshot", "a11y", "both")


@dataclasses.dataclass
class BrowserResult:
  """One tool call's result (what ToolAgent reads).

  Attributes:
    tool: the tool's name.
    content: the text the agent sees.
    is_error: the call did not do what it asked.
    format_error: the call was malformed (never reached the browser).
    final: the episode's answer when the call ended it, else None.
    abort: why the episode must end as aborted, else None.
    status: 200 done, 400 malformed, 409 failed in the browser, 0 aborted.
    seconds: wall time of the call.
    action: the checked action (None when malformed).
  """
  tool: str
  content: str
  is_error: bool = False
  format_error: bool = False
  final: Optional[str] = None
  abort: Optional[str] = None
  status: int = 200
  seconds: float = 0.0
  action: Optional[_actions.Action] = None


class BrowserTools:
  """The harness backend over one browser sandbox (module docstring).

  Args:
    browser: the rollout's BrowserSandbox, with the task already open.
    is_over: observation -> whether the task's page says the episode ended (MiniWoB's done
      flag); None: only `done` ends it.
    observation: "screenshot", "a11y" (text-only policies; the sandbox must have a11y on) or
      "both".
    tool_names: the tools offered (default all 13; a small policy may be offered fewer). A call
      of a tool not offered is a format error.
  Attributes:
    steps: [(action or None, seconds)] of every call, for the step-time budget.
    format_errors: malformed calls so far.
  """

  def __init__(self, browser: BrowserSandbox, *, is_over: Optional[Callable[[Observation], bool]]
               = None, observation: str = "screenshot", tool_names: Optional[tuple] = None):
    if observation not in OBSERVATION_MODES:
      raise ValueError(f"observation: expected one of {OBSERVATION_MODES}, got {observation!r}")
    self.browser, self.is_over, self.mode = browser, is_over, observation
    self.offered = tuple(tool_names) if tool_names else _actions.TOOL_NAMES
    if _actions.DONE not in self.offered:
      raise ValueError(f"the tools offered must include {_actions.DONE!r}, got {self.offered}")
    self.tools = _actions.openai_tools(self.offered)
    self.steps: list = []
    self.format_errors = 0
    self.answer: Optional[str] = None

  def call(self, name: str, arguments: Any) -> BrowserResult:
    """One tool call (never raises: failures are results)."""
    t0 = time.perf_counter()
    try:
      if name in _actions.TOOL_SPECS and name not in self.offered:
        raise _actions.ActionFormatError(f"there is no tool named {name!r} here; the tools are "
                                         f"{', '.join(self.offered)}")
      action = _actions.parse_action(name, arguments)
    except _actions.ActionFormatError as e:
      self.format_errors += 1
      self.steps.append((None, time.perf_counter() - t0))
      return BrowserResult(str(name), f"Error: {e}", is_error=True, format_error=True,
                           status=400, seconds=time.perf_counter() - t0)
    if action.is_done:
      self.answer = action.args.get("answer", "")
      return BrowserResult(name, "The task is finished.", final=self.answer, action=action,
                           seconds=time.perf_counter() - t0)
    try:
      step = self.browser.act(_actions.to_pixels(action, self.browser.config.viewport))
    except BrowserAborted as e:
      return BrowserResult(name, f"Error: {e}", is_error=True, abort=str(e), status=0,
                           action=action, seconds=time.perf_counter() - t0)
    except BrowserSandboxError as e:
      return BrowserResult(name, f"Error: {e}", is_error=True, abort=str(e), status=0,
                           action=action, seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    self.steps.append((action, seconds))
    if step.error:
      return BrowserResult(name, f"Error: {step.error}", is_error=True, status=409,
                           action=action, seconds=seconds)
    result = BrowserResult(name, f"Done: {step.done}.", action=action, seconds=seconds)
    if self.is_over is not None and self.is_over(step.observation):
      result.final = ""
      result.content += " The task's page has ended the episode."
    return result

  def observe(self) -> dict:
    """The user message showing the page now (the last observation the browser returned)."""
    obs = self.browser.last
    if obs is None:
      obs = self.browser.observe()
    return observation_message(obs, self.mode)


def observation_message(obs: Observation, mode: str = "screenshot") -> dict:
  """A user message with an observation: the page's URL, title and tabs as text, then the
  screenshot as an image_url part (data URL) and/or the accessibility tree as text."""
  tabs = ""
  if len(obs.tabs) > 1:
    tabs = "\nTabs: " + "; ".join(
        f"[{t['index']}]{'*' if t.get('active') else ''} {t.get('title') or t.get('url')}"
        for t in obs.tabs)
  parts = [{"type": "text", "text": f"Page: {obs.title or '(untitled)'} ({obs.url}){tabs}"}]
  if mode in ("screenshot", "both") and obs.screenshot is not None:
    parts.append({"type": "image_url", "image_url": {"url": obs.data_url}})
  if mode in ("a11y", "both"):
    parts.append({"type": "text", "text": "Accessibility tree:\n" + (obs.a11y or "(none)")})
  return {"role": "user", "content": parts}
