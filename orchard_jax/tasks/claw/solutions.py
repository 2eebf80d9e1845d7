"""Scripted solutions played through a real harness, in place of a model.

A task's `solutions.reference` / `solutions.wrong` are lists of steps (tool calls, then a final
answer). `ScriptedModel` answers a harness's chat requests with those steps, one tool call per
reply, and recovers the way a careful agent would: after an injected error (429, 500, 503) it
repeats the same call, up to the step's `retries`. Played through `harness.ToolAgent` against
the task's services, the reference solution must pass and the wrong one must fail (the CI
test), and the reference trajectories are the SFT seed data (OpenAI messages with tool calls,
exactly what a model's run through the same harness would have produced).
"""
from __future__ import annotations

from typing import Optional, Sequence

from orchard_jax.harness.model_client import ChatResponse
from orchard_jax.tasks.claw.task import Step, Task

RETRIED_STATUSES = ("Error 429", "Error 500", "Error 503")


class ScriptedModel:
  """Plays `steps` (module docstring); one instance per episode.

  Attributes:
    calls: replies given so far.
  """

  def __init__(self, steps: Sequence[Step]):
    self.steps = list(steps)
    self.position = -1
    self.retries_left = 0
    self.calls = 0

  def _next(self, messages: list) -> Optional[Step]:
    last = messages[-1] if messages else {}
    if (self.position >= 0 and last.get("role") == "tool"
        and str(last.get("content", "")).startswith(RETRIED_STATUSES) and self.retries_left > 0):
      self.retries_left -= 1
      return self.steps[self.position]
    self.position += 1
    if self.position >= len(self.steps):
      return None
    self.retries_left = self.steps[self.position].retries
    return self.steps[self.position]

  def complete(self, messages: list, *, tools: Optional[list] = None) -> ChatResponse:
    self.calls += 1
    step = self._next(messages)
    if step is None or step.answer is not None:
      text = step.answer if step is not None else "Done."
      return ChatResponse.of_text(text)
    return ChatResponse.of_tool_call(step.tool, step.arguments)


def solution_steps(task: Task, which: str) -> tuple:
  """The task's "reference" or "wrong" steps.

  Raises:
    ValueError: another name, or the task has no such solution.
  """
  if which not in ("reference", "wrong"):
    raise ValueError(f"expected solution 'reference' or 'wrong', got {which!r}")
  steps = getattr(task, which)
  if not steps:
    raise ValueError(f"task {task.id!r} has no {which} solution")
  return steps
