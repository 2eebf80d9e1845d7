"""Orchard-GUI tasks: browser agents on web pages in sandboxed Chromium (docs/algorithms.md 9).

Rooms of the domain:
  sandbox      BrowserSandbox: a rollout's Chromium (Playwright, Debian's headless shell) and
               its task pages inside one Orchard Env sandbox (local or Kubernetes), driven
               through the sandbox's one exposed control port; BrowserConfig (viewport, device
               scale, screenshot format, time limits, the sandbox)
  driver/      what runs in that sandbox: the page server (MiniWoB++ pages, the local sites
               shop.test, mail.test, booking.test with real state), the driver, its control API
  actions      the 13 browser tools (OpenAI function tools, 0-1000 coordinates) and their
               argument checks (a malformed call is a format error, never a crash)
  tools        BrowserTools: the harness backend (calls in, results and screenshots out)
  miniwob      MiniWoB++ tasks from the `miniwob` package, scored by their own pages
  sitetasks/   task families on the local sites, each with a checker of the final state
  task         GUITask, task sets and splits; open tasks from a file (judged)
  episode      run_episode: open the task, run any agent, grade (success / failure /
               format_failure / aborted / grader_error; +1 / 0 / -1)
  judge        WebJudge: an LLM/VLM judge behind an OpenAI-compatible endpoint
  expert, solutions
               scripted experts and wrong programs, played through the harness

Public API (re-exported): BrowserConfig, BrowserSandbox, Observation, Step, BrowserTools,
GUITask, load_tasks, miniwob_tasks, site_tasks, open_tasks, task_from_dict, run_episode,
grade, Episode, Outcome, aborted, sites_of, WebJudge, has_solution, scripted_agent,
openai_tools, parse_action, host_paths_for_sandbox, and the errors.
"""
from orchard_jax.tasks.gui.actions import ActionFormatError, openai_tools, parse_action
from orchard_jax.tasks.gui.episode import (Episode, Outcome, aborted, grade, run_episode,
                                           sites_of)
from orchard_jax.tasks.gui.errors import (BrowserAborted, BrowserSandboxError, GraderError,
                                          GUIError, TaskFormatError)
from orchard_jax.tasks.gui.judge import JudgeVerdict, WebJudge
from orchard_jax.tasks.gui.sandbox import (BrowserConfig, BrowserSandbox, Observation, Step,
                                           host_paths_for_sandbox)
from orchard_jax.tasks.gui.solutions import has_solution, scripted_agent
from orchard_jax.tasks.gui.task import (GUITask, load_tasks, miniwob_tasks, open_tasks,
                                        site_tasks, task_from_dict)
from orchard_jax.tasks.gui.tools import BrowserTools

__all__ = ["ActionFormatError", "BrowserAborted", "BrowserConfig", "BrowserSandbox",
           "BrowserSandboxError", "BrowserTools", "Episode", "GUIError", "GUITask", "GraderError",
           "JudgeVerdict", "Observation", "Outcome", "Step", "TaskFormatError", "WebJudge",
           "aborted", "grade", "has_solution", "host_paths_for_sandbox", "load_tasks",
           "miniwob_tasks", "open_tasks", "openai_tools", "parse_action", "run_episode",
           "scripted_agent", "site_tasks", "sites_of", "task_from_dict"]
