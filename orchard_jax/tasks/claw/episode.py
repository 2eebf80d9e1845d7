"""One Claw episode: start the task's world, let an agent act in it, grade what it did.

`run_episode(task, env_client, agent)` starts the task's services in a fresh sandbox
(`ClawWorld`), keeps the state right after start when a check needs it, runs the agent, then
reads the audit log and final state and grades them (`grading.grade`). The agent is any
callable `agent(world, backend, instruction) -> run` whose result has `exit_status`, `answer`,
`messages` and `abort_reason` (the built-in `harness.ToolAgent` through the recording proxy,
a scripted solution, or an external harness running inside `world.box`), so every harness is
graded by the same code.

Exit statuses of the agent map onto outcomes: "aborted" (the environment died) and
"ModelError" give an `aborted` outcome with the reason; anything else is graded (a run that hit
its step or time limit is graded on what it did).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from orchard_jax.tasks.claw import grading
from orchard_jax.tasks.claw.errors import ServicesError
from orchard_jax.tasks.claw.task import Task
from orchard_jax.tasks.claw.world import ClawWorld, Evidence

ABORTING_EXITS = ("aborted", "ModelError")
PROMPT_TEMPLATE = (
    "You are {name}'s personal assistant, working with their {services} through the tools "
    "provided. {name}'s email address is {email}. It is now {now} ({timezone}). Act only as "
    "asked: do not send, delete or change anything the request does not call for. When the "
    "work is done, reply with a short final answer and no tool call.")


def system_prompt(task: Task) -> str:
  """The assistant's system prompt for `task`: who the user is, the date and time."""
  from orchard_jax.tasks.claw.services import timeutil
  tz = task.user.get("timezone") or "UTC"
  moment = timeutil.parse_datetime(task.now).astimezone(timeutil.time_zone(tz))
  services = ", ".join(task.services[:-1]) + (" and " if len(task.services) > 1 else "") + \
      task.services[-1]
  return PROMPT_TEMPLATE.format(name=task.user.get("name", "the user"), services=services,
                                email=task.user.get("email"), timezone=tz,
                                now=moment.strftime("%A %d %B %Y, %H:%M"))


@dataclasses.dataclass
class Episode:
  """A finished episode.

  Attributes:
    task_id: the task.
    run: what the agent returned (exit_status, answer, messages, abort_reason, ...).
    outcome: the grade (`grading.Outcome`).
    evidence: audit log and final state (None when the world never started).
    startup_s: seconds to bring the services up; seconds: the whole episode.
  """
  task_id: str
  run: Any
  outcome: grading.Outcome
  evidence: Optional[Evidence]
  startup_s: float
  seconds: float

  @property
  def exit_status(self) -> str:
    return getattr(self.run, "exit_status", "aborted") if self.run is not None else "aborted"


AgentFn = Callable[[ClawWorld, Any, str], Any]


def run_episode(task: Task, env_client, agent: AgentFn, *, seed: int = 0,
                rubric_grader: Any = None, world_options: Optional[dict] = None) -> Episode:
  """Runs and grades one episode (module docstring).

  Args:
    task: the task.
    env_client: an Orchard Env SandboxClient (the services run in a fresh sandbox), or None to
      run them in this process (`LocalWorld`: only for scripted agents, which cannot touch the
      host).
    agent: `agent(world, backend, instruction)` -> a run result.
    seed: the fault injector's seed (one per trial: trials meet different random faults).
    rubric_grader: passed to `grading.grade` (None: rubric items are not judged).
    world_options: extra `ClawWorld` arguments (image, cpu, memory, call_timeout_s...).
  Returns:
    The Episode; a world that did not start, or an agent that raised, is an aborted outcome
    with the reason (the caller never sees an exception for it).
  """
  t0 = time.perf_counter()
  startup = 0.0
  try:
    if env_client is None:
      from orchard_jax.tasks.claw.local_world import LocalWorld
      world_cm = LocalWorld(task.service_resets(seed))
    else:
      world_cm = ClawWorld(env_client, task.service_resets(seed), **(world_options or {}))
    with world_cm as world:
      startup = world.startup_s
      initial = ({s: world.state(s) for s in task.services}
                 if task.needs_initial_state else None)
      run = agent(world, world.backend(task.tools), task.instruction)
      evidence = world.evidence()
  except ServicesError as e:
    return Episode(task.id, None, grading.aborted(f"services: {e}"), None, startup,
                   time.perf_counter() - t0)
  status = getattr(run, "exit_status", "")
  if status in ABORTING_EXITS:
    outcome = grading.aborted(getattr(run, "abort_reason", None) or status)
  else:
    outcome = grading.grade(task, evidence, getattr(run, "answer", "") or "", initial=initial,
                            rubric_grader=rubric_grader,
                            transcript=getattr(run, "messages", []))
  return Episode(task.id, run, outcome, evidence, startup, time.perf_counter() - t0)

