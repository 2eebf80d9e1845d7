"""Orchard-Claw tasks: personal-assistant work on real services, scored the Claw-Eval way.

Rooms of the domain (docs/algorithms.md section 8):
  services/    the mail, calendar, contacts, to-do, notes and file services (standard library,
               HTTP over in-memory SQLite, /reset, /audit, faults), run inside each rollout's
               sandbox; `services.client` is the in-sandbox `claw` command and MCP server
  tools        OpenAI function-calling schemas of every operation
  world        ClawWorld: a rollout's services in its own Orchard Env sandbox; LocalWorld
               (local_world) runs them in-process for scripted solutions
  task         tasks as data files, validated on load; eval_tasks(): the 46 hand-written ones
  checks, predicates, grading, scoring, rubric
               completion checks on final state and audit log, safety, robustness,
               task_score = safety * (0.8 completion + 0.2 robustness), pass@k / pass^k, the
               optional LLM rubric grader
  episode      run_episode: world + any agent + grading; aborted and grader_error outcomes
  solutions    scripted reference / wrong solutions played as a model through a harness
  synth        training tasks from templates (and a teacher), validated, never overlapping
               the evaluation set

Public API (re-exported): Task, load_tasks, eval_tasks, ClawWorld, LocalWorld, run_episode,
Episode, grade, Outcome, RubricGrader, synthesize, training_set, TOOLS.
"""
from orchard_jax.tasks.claw.episode import Episode, run_episode, system_prompt
from orchard_jax.tasks.claw.errors import (ClawError, GraderError, ServiceDied, ServicesError,
                                           TaskFormatError)
from orchard_jax.tasks.claw.grading import Outcome, grade
from orchard_jax.tasks.claw.local_world import LocalWorld
from orchard_jax.tasks.claw.rubric import RubricGrader
from orchard_jax.tasks.claw.synth import synthesize, teacher_tasks, training_set
from orchard_jax.tasks.claw.task import Task, eval_tasks, load_tasks, task_from_dict
from orchard_jax.tasks.claw.tools import TOOLS, openai_tools, select_tools
from orchard_jax.tasks.claw.world import ClawWorld, Evidence, ToolResult

__all__ = ["ClawError", "ClawWorld", "Episode", "Evidence", "GraderError", "LocalWorld", "Outcome",
           "RubricGrader", "ServiceDied", "ServicesError", "TOOLS", "Task", "TaskFormatError",
           "ToolResult", "eval_tasks", "grade", "load_tasks", "openai_tools", "run_episode",
           "select_tools", "synthesize", "system_prompt", "task_from_dict", "teacher_tasks",
           "training_set"]
