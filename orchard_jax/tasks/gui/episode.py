"""One GUI episode: open the task in a browser sandbox, let an agent act, grade the final state.

`run_episode(task, browser, agent)` re-seeds the task's site (a fresh browser context on its
start page; MiniWoB++'s seeded start), reads the instruction (MiniWoB++: the page's
utterance), runs the agent, and grades (`grade`). The agent is any callable
`agent(tools, instruction) -> run` whose result has `exit_status`, `answer`, `messages` and
`abort_reason` (`harness.BrowserAgent` through the recording proxy, a scripted expert, or
anything else driving `BrowserTools`), so every harness is graded by the same code.

Outcomes and rewards (docs/algorithms.md section 9): success +1; RepeatedFormatError -1
("format_failure"); anything else 0 ("failure"). Two outcomes carry no reward because they say
nothing about the policy: "aborted" (the browser crashed, a page hung, the model endpoint
failed, the sandbox did not start) and "grader_error" (the checker or judge could not decide),
each with its reason.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from orchard_jax.tasks.gui import miniwob, sitetasks
from orchard_jax.tasks.gui.errors import BrowserAborted, BrowserSandboxError, GraderError
from orchard_jax.tasks.gui.sandbox import BrowserSandbox
from orchard_jax.tasks.gui.task import GUITask
from orchard_jax.tasks.gui.tools import BrowserTools

ABORTING_EXITS = ("aborted", "ModelError")
FORMAT_EXIT = "RepeatedFormatError"
STATUSES = ("success", "failure", "format_failure", "aborted", "grader_error")


@dataclasses.dataclass
class Outcome:
  """The grade of one episode.

  Attributes:
    success: the task's own test passed (MiniWoB++ reward > 0, the site's checker).
    status: one of STATUSES.
    reward: +1 success, -1 format_failure, 0 failure; None for aborted and grader_error.
    reason: why (the checker's verdict, the abort reason, the grader's error).
    details: more: the MiniWoB++ raw reward, the grader used.
  """
  success: bool
  status: str
  reward: Optional[float]
  reason: str = ""
  details: dict = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def aborted(reason: str) -> Outcome:
  return Outcome(False, "aborted", None, reason)


def grader_error(reason: str, **details) -> Outcome:
  return Outcome(False, "grader_error", None, reason, details)


@dataclasses.dataclass
class Episode:
  """A finished episode.

  Attributes:
    task: the task; instruction: what the agent was asked.
    run: what the agent returned (exit_status, answer, messages, abort_reason, ...), or None
      when it never ran.
    outcome: the grade.
    step_seconds: wall time of each browser action (action, settle, observation).
    seconds: the whole episode (open, agent, grading).
    startup_s: how long the browser sandbox took to start (set by whoever started it).
  """
  task: GUITask
  instruction: str
  run: Any
  outcome: Outcome
  step_seconds: list
  seconds: float
  startup_s: float = 0.0

  @property
  def exit_status(self) -> str:
    return getattr(self.run, "exit_status", "aborted") if self.run is not None else "aborted"


Agent = Callable[[BrowserTools, str], Any]


def open_task(task: GUITask, browser: BrowserSandbox, *, episode_seconds: float
              = miniwob.DEFAULT_EPISODE_SECONDS) -> str:
  """Puts the browser on the task's start state; returns the instruction.

  Raises:
    BrowserAborted, BrowserSandboxError: the page could not be opened.
  """
  if task.kind == "miniwob":
    browser.open(task.start_url, probe=miniwob.PROBE,
                 setup=miniwob.setup_script(task.seed, episode_seconds))
    instruction = browser.evaluate("core.getUtterance()", tab=0)
    browser.observe()   # the page as the episode starts (after the seeded start)
    return str(instruction)
  for site in sorted(task.fixtures):
    browser.site_reset(site, task.fixtures[site])
  browser.open(task.start_url)
  return task.instruction


def sites_of(task: GUITask) -> list:
  """The local sites a task's browser sandbox serves."""
  return sorted(task.fixtures) if task.kind != "miniwob" else []


def run_episode(task: GUITask, browser: BrowserSandbox, agent: Agent, *,
                observation: str = "screenshot", judge: Any = None,
                episode_seconds: float = miniwob.DEFAULT_EPISODE_SECONDS,
                tool_names: Optional[tuple] = None) -> Episode:
  """Runs and grades one episode (module docstring); never raises for what the browser, the
  agent or the grader did (those are outcomes).

  Args:
    task: the task.
    browser: a running BrowserSandbox with the task's site (a fresh one per rollout in
      training; tests may reuse one: each episode starts on a fresh browser context and
      re-seeded sites).
    agent: `agent(tools, instruction)` -> run result.
    observation: BrowserTools' observation mode; tool_names: the tools offered (all 13 by
      default).
    judge: a `judge.WebJudge` for tasks without a checker (or to judge every task), or None.
  """
  t0 = time.perf_counter()
  try:
    instruction = open_task(task, browser, episode_seconds=episode_seconds)
  except (BrowserAborted, BrowserSandboxError) as e:
    return Episode(task, task.instruction, None, aborted(f"opening the task: {e}"), [],
                   time.perf_counter() - t0)
  is_over = (lambda obs: miniwob.is_over(obs.probe)) if task.kind == "miniwob" else None
  tools = BrowserTools(browser, is_over=is_over, observation=observation, tool_names=tool_names)
  run = agent(tools, instruction)
  outcome = grade(task, browser, run, instruction=instruction, judge=judge)
  return Episode(task, instruction, run, outcome, [s for _, s in tools.steps],
                 time.perf_counter() - t0)


def grade(task: GUITask, browser: BrowserSandbox, run: Any, *, instruction: str = "",
          judge: Any = None) -> Outcome:
  """Grades a finished run from the browser's final state (module docstring)."""
  status = getattr(run, "exit_status", "aborted")
  if status in ABORTING_EXITS:
    return aborted(getattr(run, "abort_reason", None) or status)
  if status == FORMAT_EXIT:
    return Outcome(False, "format_failure", -1.0, "the agent's replies failed the tool-call "
                   "format too many times in a row")
  answer = getattr(run, "answer", "") or ""
  try:
    if judge is not None and (task.kind == "open" or getattr(judge, "always", False)):
      verdict = judge.judge(instruction or task.instruction, run, browser)
      return _outcome(verdict.success, verdict.reason, grader="judge")
    if task.kind == "miniwob":
      probe = browser.evaluate(miniwob.PROBE, tab=0)
      raw = miniwob.reward(probe)
      if raw is None:
        return _outcome(False, "the task's page did not end the episode", grader="miniwob",
                        raw_reward=None)
      return _outcome(raw > 0, f"the page's reward is {raw:g}"
                      + (f" ({probe.get('reason')})" if probe.get("reason") else ""),
                      grader="miniwob", raw_reward=raw)
    if task.kind == "site":
      template = sitetasks.TEMPLATES[task.family]
      state = browser.site_state(task.site)
      verdict = template.check(task.params, state, answer)
      return _outcome(verdict.success, verdict.reason, grader="checker")
    raise GraderError(f"task {task.id!r} of kind {task.kind!r} has no checker and no judge is "
                      "configured")
  except BrowserAborted as e:
    return grader_error(f"the final state could not be read: {e}")
  except (BrowserSandboxError, GraderError) as e:
    return grader_error(str(e))
  except Exception as e:  # noqa: BLE001 - a checker's bug is a grader error, never a 0
    return grader_error(f"the grader raised {type(e).__name__}: {e}")


def _outcome(success: bool, reason: str, **details) -> Outcome:
  return Outcome(bool(success), "success" if success else "failure", 1.0 if success else 0.0,
                 reason, details)
