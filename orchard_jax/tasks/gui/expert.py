"""Scripted experts: programs that solve (or deliberately fail) a task, played through the harness.

An expert is a generator function `program(view)` yielding tool calls `(name, arguments)` in the
agent's own action space (0-1000 coordinates). It reads the page through a `PageView` (element
positions and texts from the live page, a privileged view no agent has) right before each call,
so positions are those of the page as the previous action left it. `ExpertModel` plays a
program as the model of a harness: each chat request gets the program's next call as an
OpenAI tool call, and the end of the program is a `done` call. Played through
`harness.BrowserAgent` in a browser sandbox, a task's expert must pass its checker and its wrong
program must fail (the CI tests); the expert's trajectories are the scripted demonstrations
that seed SFT, exactly what a model's run through the same harness would have produced.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterator, Optional

from orchard_jax.harness.model_client import ChatResponse
from orchard_jax.tasks.gui import actions as _actions
from orchard_jax.tasks.gui.errors import GUIError

Call = tuple  # (tool name, arguments dict)
Program = Callable[["PageView"], Iterator[Call]]

_FIND = """((css, text, contains, index) => {
  const matches = [...document.querySelectorAll(css)].filter(e => {
    const t = (e.innerText || e.textContent || e.value || '').replace(/\\s+/g, ' ').trim();
    return (text === null || t === text) && (contains === null || t.includes(contains));
  });
  const e = matches[index];
  if (!e) return null;
  const rects = [...e.getClientRects()].filter(r => r.width > 0 && r.height > 0);
  const r = rects.length > 1 ? rects[0] : e.getBoundingClientRect();   // a wrapped link: its first line
  return {x: r.left + r.width / 2, y: r.top + r.height / 2, width: r.width, height: r.height,
          top: r.top, bottom: r.bottom, vw: window.innerWidth, vh: window.innerHeight,
          count: matches.length};
})"""


class ExpertError(GUIError):
  """An expert program could not find what it needed on the page (a bug in the program or a
  page that changed): the scripted episode fails loudly instead of guessing."""


@dataclasses.dataclass(frozen=True)
class Box:
  """An element's box in CSS pixels, with the viewport's size."""
  x: float
  y: float
  width: float
  height: float
  top: float
  bottom: float
  vw: float
  vh: float

  @property
  def visible(self) -> bool:
    return self.top >= 0 and self.bottom <= self.vh and 0 <= self.x < self.vw

  @property
  def point(self) -> dict:
    """Its centre as the agent's 0-1000 coordinates."""
    return {"x": _actions.to_normalised(self.x, int(self.vw)),
            "y": _actions.to_normalised(self.y, int(self.vh))}


class PageView:
  """The expert's view of the live page (through the sandbox's privileged evaluate)."""

  def __init__(self, browser):
    self.browser = browser

  def js(self, expression: str) -> Any:
    """A JavaScript expression's value on the active tab."""
    return self.browser.evaluate(expression)

  def find(self, css: str, *, text: Optional[str] = None, contains: Optional[str] = None,
           index: int = 0) -> Optional[Box]:
    """The `index`-th element matching `css` (and whose visible text equals `text` or contains
    `contains`), or None."""
    found = self.js(f"{_FIND}({json.dumps(css)}, {json.dumps(text)}, {json.dumps(contains)}, "
                    f"{int(index)})")
    if not found:
      return None
    found.pop("count", None)
    return Box(**found)

  def box(self, css: str, **kwargs) -> Box:
    """Like `find`, but a missing element raises ExpertError."""
    found = self.find(css, **kwargs)
    if found is None:
      raise ExpertError(f"no element {css!r} {kwargs or ''} on {self.browser.last.url if self.browser.last else 'the page'}")
    return found

  def text(self, css: str) -> str:
    """The visible text of the first element matching `css` ("" when none)."""
    return self.js(f"(() => {{ const e = document.querySelector({json.dumps(css)}); "
                   f"return e ? (e.innerText || e.textContent || '').trim() : ''; }})()")

  def url(self) -> str:
    return self.js("location.href")


def click(view: PageView, css: str, **kwargs) -> Iterator[Call]:
  """Calls that bring the element into view (scrolls) and click its centre."""
  box = view.box(css, **kwargs)
  for _ in range(8):
    if box.visible:
      break
    direction = "down" if box.bottom > box.vh else "up"
    yield ("scroll", {"x": 500, "y": 500, "direction": direction, "amount": 600})
    box = view.box(css, **kwargs)
  yield ("click", box.point)


def fill(view: PageView, css: str, text: str, **kwargs) -> Iterator[Call]:
  """Click a field, then type `text` replacing what it held."""
  yield from click(view, css, **kwargs)
  yield ("write", {"text": text, "clear": True})


class ExpertModel:
  """Plays a program (module docstring) as a harness's model; one instance per episode.

  Args:
    program: the expert program.
    view: the PageView of the episode's browser.
    finish: call `done` when the program ends (its last value may be a done call of its own).
  Attributes:
    calls: replies given so far.
  """

  def __init__(self, program: Program, view: PageView):
    self.view = view
    self._steps = program(view)
    self.calls = 0
    self.finished = False

  def complete(self, messages: list, *, tools: Optional[list] = None) -> ChatResponse:
    self.calls += 1
    step = None
    if not self.finished:
      try:
        step = next(self._steps)
      except StopIteration:
        self.finished = True
    name, arguments = step if step is not None else (_actions.DONE, {})
    return ChatResponse.of_tool_call(name, arguments)
