"""Scripted solutions of every task with one: the expert and the wrong program, as agents.

`program(task, "expert" | "wrong")` is the task's program (miniwob.EXPERTS, or the site
template's), and `scripted_agent(task, which)` plays it through `harness.BrowserAgent` as its
model (expert.ExpertModel), so a scripted episode goes through the same harness, tools, format
checks and grading as a model's.
"""
from __future__ import annotations

import functools
from typing import Optional

from orchard_jax.tasks.gui import miniwob, sitetasks
from orchard_jax.tasks.gui.expert import ExpertModel, PageView, Program
from orchard_jax.tasks.gui.task import GUITask

WHICH = ("expert", "wrong")


def has_solution(task: GUITask) -> bool:
  """Whether the task has scripted programs."""
  if task.kind == "miniwob":
    return task.params.get("task") in miniwob.EXPERTS
  return task.kind == "site" and task.family in sitetasks.TEMPLATES


def program(task: GUITask, which: str = "expert") -> Program:
  """The task's program.

  Raises:
    ValueError: `which` is not expert or wrong, or the task has no scripted solution.
  """
  if which not in WHICH:
    raise ValueError(f"expected 'expert' or 'wrong', got {which!r}")
  if not has_solution(task):
    raise ValueError(f"task {task.id!r} has no scripted solution")
  if task.kind == "miniwob":
    return miniwob.EXPERTS[task.params["task"]][WHICH.index(which)]
  template = sitetasks.TEMPLATES[task.family]
  method = template.expert if which == "expert" else template.wrong
  return functools.partial(method, task.params)


def scripted_agent(task: GUITask, which: str = "expert", config: Optional[object] = None):
  """An episode agent (episode.Agent) that plays the task's program through BrowserAgent."""
  from orchard_jax.harness.browser_agent import BrowserAgent, BrowserAgentConfig
  chosen = program(task, which)
  config = config or BrowserAgentConfig(step_limit=max(task.max_steps, 30))

  def agent(tools, instruction):
    model = ExpertModel(chosen, PageView(tools.browser))
    return BrowserAgent(model, tools, config).run(instruction)
  return agent
