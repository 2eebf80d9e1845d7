"""What a local-site task template is: instances, instruction, fixtures, checker, expert, wrong.

A template (one family, e.g. "shop/cheapest") turns parameter sets into tasks. Its checker reads
the site's final state (`BrowserSandbox.site_state`) and the agent's `done` answer and returns a
`Verdict`; it never looks at the transcript, so every harness is graded alike. Its expert and
wrong programs (orchard_jax.tasks.gui.expert) act through the agent's own tools.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Iterator, List

from orchard_jax.tasks.gui.expert import Call, PageView


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A checker's decision: success and the reason (what matched or what did not)."""
  success: bool
  reason: str


def ok(reason: str) -> Verdict:
  return Verdict(True, reason)


def fail(reason: str) -> Verdict:
  return Verdict(False, reason)


def same_text(a, b) -> bool:
  """Equal after trimming, collapsing whitespace and ignoring case."""
  return " ".join(str(a).split()).lower() == " ".join(str(b).split()).lower()


class Template:
  """A site task family (module docstring). Subclasses set `family`, `site` and implement the
  methods; `params()` lists every parameter set, `split()` says which are held out."""
  family = ""
  site = ""
  steps = 15

  def params(self) -> List[dict]:
    raise NotImplementedError

  def instruction(self, p: dict) -> str:
    raise NotImplementedError

  def fixtures(self, p: dict) -> dict:
    return {}

  def check(self, p: dict, state: dict, answer: str) -> Verdict:
    raise NotImplementedError

  def expert(self, p: dict, view: PageView) -> Iterator[Call]:
    raise NotImplementedError

  def wrong(self, p: dict, view: PageView) -> Iterator[Call]:
    raise NotImplementedError

  def task_key(self, p: dict) -> str:
    """A stable short id of a parameter set."""
    return hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()[:8]
