"""A generated turn's text, split while it streams into reasoning and content deltas.

The model writes one turn as `[<think> reasoning </think>] content [<tool_call> ... </tool_call>]*`
(the markup the data room's tool-call parsers read, `data.parse_assistant_text`). A harness
reading a stream wants the reasoning and the content as they are generated, and each tool call
whole. `TurnSplitter` is fed the cumulative text after each engine step and returns what became
certain since the last feed:

- reasoning text, once it is known to be reasoning (inside a think block, or before a
  `</think>` when the generation prompt opened the block: `reasoning_open`);
- content text before the turn's first tool-call block, with leading whitespace dropped and
  trailing whitespace held back until more text follows (the parsers strip the content), and
  any suffix that could be the start of a markup tag held back until it is decided;
- nothing from the first `<tool_call>` on: whether a block is a call or stays in the content
  (a block that does not parse, or calls a tool not offered, is reported and kept as text:
  `data.parse_assistant_text`) is known only once the turn is parsed, so calls are sent whole
  and the content after them comes with the parsed message (`remainder`).

So the streamed reasoning and content are prefixes of the parsed message's `reasoning_content`
and `content`; `remainder` gives what the parsed message adds (normally nothing). Two cases
differ, where the parser decides after the fact what earlier text was: a turn that writes
content and then a `</think>` without a `<think>` (and without `reasoning_open`) is parsed as
reasoning, and a turn without a leading `<think>` that opens a `<tool_call>` before its
`</think>` is parsed as content with that `</think>` inside the block (with `reasoning_open` the
reasoning streamed before the block cannot be taken back).
"""
from __future__ import annotations

from typing import Optional

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)


def _held_tag_prefix(text: str) -> int:
  """Length of the longest suffix of `text` that is a proper prefix of a markup tag."""
  best = 0
  for tag in _TAGS:
    for n in range(min(len(tag) - 1, len(text)), best, -1):
      if text.endswith(tag[:n]):
        best = n
        break
  return best


def _before_calls(text: str) -> str:
  """Text before the first tool-call block (all of it when there is none)."""
  start = text.find(CALL_OPEN)
  return text if start < 0 else text[:start]


class TurnSplitter:
  """Splits a turn's cumulative text into reasoning and content deltas (module docstring).

  Args:
    reasoning_open: the prompt's generation prompt opened a think block, so the turn starts
      as reasoning until `</think>`.
  """

  def __init__(self, reasoning_open: bool = False):
    self.reasoning_open = reasoning_open
    self.reasoning = ""   # reasoning text sent so far
    self.content = ""     # content text sent so far

  def _visible(self, text: str, final: bool) -> tuple[str, str]:
    """(reasoning, content) certain in `text` (all of it when final)."""
    if not final:
      text = text[:len(text) - _held_tag_prefix(text)]
    close = text.find(THINK_CLOSE)
    stripped = text.lstrip()
    opened = stripped.startswith(THINK_OPEN)
    if close >= 0:
      head = text[:close]
      start = head.find(THINK_OPEN)
      reasoning = (head[start + len(THINK_OPEN):] if start >= 0 else head).strip("\n")
      rest = text[close + len(THINK_CLOSE):]
    elif opened or self.reasoning_open:
      body = stripped[len(THINK_OPEN):] if opened else text
      return (body.strip("\n") if final else body.lstrip("\n").rstrip("\n")), ""
    elif not final and THINK_OPEN.startswith(stripped[:len(THINK_OPEN)]) and \
        len(stripped) < len(THINK_OPEN):
      return "", ""   # only whitespace or a tag's start so far
    else:
      reasoning, rest = "", text
    content = _before_calls(rest).strip() if final else _before_calls(rest).lstrip().rstrip()
    return reasoning, content

  def feed(self, text: str) -> tuple[str, str]:
    """The (reasoning, content) deltas made certain by the cumulative `text`."""
    reasoning, content = self._visible(text, final=False)
    return self._advance(reasoning, content)

  def finish(self, text: str) -> tuple[str, str]:
    """The last (reasoning, content) deltas, from the turn's whole text."""
    reasoning, content = self._visible(text, final=True)
    return self._advance(reasoning, content)

  def remainder(self, reasoning: Optional[str], content: Optional[str]) -> tuple[str, str]:
    """What the parsed message's reasoning and content add to the text sent so far ("" when
    they do not extend it)."""
    return _extension(self.reasoning, reasoning or ""), _extension(self.content, content or "")

  def _advance(self, reasoning: str, content: str) -> tuple[str, str]:
    r, c = _extension(self.reasoning, reasoning), _extension(self.content, content)
    self.reasoning += r
    self.content += c
    return r, c


def _extension(sent: str, now: str) -> str:
  return now[len(sent):] if now.startswith(sent) else ""
