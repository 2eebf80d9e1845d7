"""Scripted action sequences through the real harness in a real browser sandbox: each task's
expert program succeeds and its wrong program fails, as decided by the task's own reward
(MiniWoB++'s page) or checker (the local sites' final state). The programs act only through the
agent's tools (0-1000 coordinates, BrowserAgent, BrowserTools); they read the page to aim.

Every site family is played on one of its tasks (the families' instances differ only in their
keys); ORCHARD_GUI_ALL_SITE_TASKS=1 plays every instance of every family (58 tasks, ~5 minutes
on 2 cores)."""
import os

import pytest

from orchard_jax.tasks.gui import episode, miniwob, solutions
from orchard_jax.tasks.gui.task import miniwob_tasks, site_tasks

pytestmark = pytest.mark.slow
MINIWOB = miniwob_tasks(split="eval", seeds_per_task=1)
ALL_SITES = site_tasks()
SITES = (ALL_SITES if os.environ.get("ORCHARD_GUI_ALL_SITE_TASKS") == "1"
         else list({t.family: t for t in reversed(ALL_SITES)}.values()))


def test_at_least_twenty_miniwob_tasks_and_every_site_family_are_scripted():
  assert len(miniwob.EXPERTS) >= 20
  assert {t.family for t in SITES} == set(solutions.sitetasks.TEMPLATES)
  assert all(solutions.has_solution(t) for t in MINIWOB + ALL_SITES)


@pytest.mark.parametrize("task", MINIWOB, ids=lambda t: t.id)
def test_miniwob_expert_succeeds_and_wrong_fails_by_the_pages_reward(browser, task):
  good = episode.run_episode(task, browser, solutions.scripted_agent(task, "expert"))
  assert good.exit_status == "Submitted", good.outcome
  assert good.outcome.success and good.outcome.details["raw_reward"] > 0, good.outcome
  assert good.outcome.reward == 1.0 and good.instruction
  bad = episode.run_episode(task, browser, solutions.scripted_agent(task, "wrong"))
  assert bad.outcome.status == "failure", bad.outcome
  assert bad.outcome.reward == 0.0
  raw = bad.outcome.details["raw_reward"]
  assert raw is None or raw <= 0


@pytest.mark.parametrize("task", SITES, ids=lambda t: t.id)
def test_site_expert_succeeds_and_wrong_fails_by_the_checker(browser, task):
  good = episode.run_episode(task, browser, solutions.scripted_agent(task, "expert"))
  assert good.exit_status == "Submitted" and good.outcome.status == "success", good.outcome
  assert good.outcome.reward == 1.0 and good.outcome.details["grader"] == "checker"
  bad = episode.run_episode(task, browser, solutions.scripted_agent(task, "wrong"))
  assert bad.outcome.status == "failure" and bad.outcome.reward == 0.0, bad.outcome
