"""Data distillation for any domain: a teacher model runs the domain's episodes, k attempts per
task, and every trajectory with its outcome lands in the trajectory store (the paper's SFT
data: agent interactions distilled from open-weight teachers in the deployment harness).

The attempts run through the loop's one `RolloutRunner` (the same episodes, proxy records and
grading as RL), with the teacher behind the one engine stack (`teachers.distillation_teacher`):
the embedded engine serving a checkpoint (token ids and log-probs recorded), SGLang servers
(token ids recorded) or any OpenAI-compatible endpoint (messages recorded, marked text-only:
SFT data, never RL data).

Resuming. Trajectory ids are "{experiment}/{task_id}/{attempt}". A run skips every (task,
attempt) pair whose trajectory the store already holds for the experiment. An attempt whose
episode or grading raised (a sandbox that died, an evaluation that crashed, the run interrupted,
a teacher endpoint that stayed unreachable or answered 429/5xx after the retries) is stored with
exit_status "aborted", its partial messages and the error; the next run tries it again (its new
record supersedes the aborted one) unless distill.retry_aborted is False. Whatever the teacher
itself did (submitted, ran out of steps or time, had a request refused) is its behaviour, kept
as data. Each try talks through its own proxy session, so the calls of an aborted try never mix
with its retry's. A process killed outright (SIGKILL) stores nothing for its running attempts:
they are run again.

Budgets (distill.max_attempts, max_wall_time_s, max_tokens; 0 = no limit) are per run: when one
is reached no new attempt starts, and the attempts already running finish within the harness's
own limits. Tokens are prompt + completion tokens of every model call as the endpoint reports
them (what a hosted API bills).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Sequence

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import load_tokenizer
from orchard_jax.recipes.agentic import run_folder
from orchard_jax.recipes.agentic.domain import ABORTED, Domain, StatusRules
from orchard_jax.recipes.agentic.rollouts import RolloutRequest, RolloutRunner
from orchard_jax.recipes.agentic.teachers import distillation_teacher
from orchard_jax.recipes.agentic.trajectory_data import (DistillError, store_path,
                                                         student_image_tokens)


@dataclasses.dataclass(frozen=True)
class Budget:
  """Per-run limits (0 = no limit); see the module docstring for what they stop.

  Attributes:
    max_attempts: attempts started by this run.
    max_wall_time_s: seconds since the run started.
    max_tokens: prompt + completion tokens of this run's model calls.
  """
  max_attempts: int = 0
  max_wall_time_s: float = 0.0
  max_tokens: int = 0

  def reached(self, *, attempts: int, seconds: float, tokens: int) -> str | None:
    """The name of the first limit reached, or None."""
    if 0 < self.max_attempts <= attempts:
      return "max_attempts"
    if 0 < self.max_wall_time_s <= seconds:
      return "max_wall_time_s"
    if 0 < self.max_tokens <= tokens:
      return "max_tokens"
    return None


@dataclasses.dataclass
class CollectionSummary:
  """What one collection run did.

  Attributes:
    planned: (task, attempt) pairs of the task set x attempts_per_task.
    skipped: pairs already stored (resumed), not run again.
    started, completed, aborted: attempts this run started, finished, and stored as aborted.
    evaluated, resolved: of the completed ones, graded and resolved.
    prompt_tokens, completion_tokens: usage of this run's model calls.
    wall_time_s: seconds of the run.
    stopped_by: the budget that stopped it ("max_attempts", ...), "interrupted", or None.
    remaining: pairs left for a later run.
  """
  planned: int = 0
  skipped: int = 0
  started: int = 0
  completed: int = 0
  aborted: int = 0
  evaluated: int = 0
  resolved: int = 0
  prompt_tokens: int = 0
  completion_tokens: int = 0
  wall_time_s: float = 0.0
  stopped_by: str | None = None
  remaining: int = 0

  @property
  def tokens(self) -> int:
    return self.prompt_tokens + self.completion_tokens

  def table(self) -> str:
    rate = f"{100 * self.resolved / self.evaluated:.1f}%" if self.evaluated else "n/a"
    rows = [("pairs planned", self.planned), ("already stored (skipped)", self.skipped),
            ("attempts run", f"{self.started} ({self.completed} completed, {self.aborted} "
                             "aborted)"),
            ("resolved / evaluated", f"{self.resolved} / {self.evaluated} ({rate})"),
            ("tokens", f"{self.tokens} ({self.prompt_tokens} prompt + "
                       f"{self.completion_tokens} completion)"),
            ("wall time", f"{self.wall_time_s:.1f} s"),
            ("stopped by", self.stopped_by or "-"), ("pairs left", self.remaining)]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def trajectory_id(experiment: str, task_id: str, attempt: int) -> str:
  """The stored id of an attempt: "{experiment}/{task_id}/{attempt}"."""
  return f"{experiment}/{task_id}/{attempt}"


def pending_attempts(tasks: Sequence[Any], attempts_per_task: int, store: data.TrajectoryStore,
                     *, experiment: str, task_id, retry_aborted: bool = True
                     ) -> tuple[list[tuple[Any, int]], int]:
  """The (task, attempt) pairs still to run, attempt-major (every task's attempt 0 first, so a
  budget spreads over tasks), and how many are already stored.

  A pair is done when the store holds its trajectory for `experiment`; an aborted one counts as
  not done when `retry_aborted`.
  """
  stored = {}
  for trajectory in store.trajectories(experiment=experiment):
    stored[(trajectory.task_id, trajectory.attempt)] = trajectory.exit_status
  todo, done = [], 0
  for attempt in range(attempts_per_task):
    for task in tasks:
      status = stored.get((task_id(task), attempt))
      if status is None or (retry_aborted and status == ABORTED):
        todo.append((task, attempt))
      else:
        done += 1
  return todo, done


def collect_trajectories(domain: Domain, tasks: Sequence[Any], env, teacher, store, *,
                         experiment: str, attempts_per_task: int, sampling: dict,
                         parallel: int = 2, budget: Budget = Budget(),
                         retry_aborted: bool = True, evaluate: bool = True,
                         log_dir: str | None = None, progress: bool = True
                         ) -> CollectionSummary:
  """Runs every pending (task, attempt) pair of `domain` with the teacher, `parallel` at a time.

  Ctrl-C stops new attempts; the running ones end within the harness's limits and are stored
  as aborted (retried by the next run).

  Raises:
    DistillError: attempts_per_task or parallel below 1.
  """
  import tqdm

  if attempts_per_task < 1 or parallel < 1:
    raise DistillError(f"attempts_per_task and parallel must be >= 1, got {attempts_per_task} "
                       f"and {parallel}")
  start = time.monotonic()
  todo, done = pending_attempts(tasks, attempts_per_task, store, experiment=experiment,
                                task_id=domain.task_id, retry_aborted=retry_aborted)
  summary = CollectionSummary(planned=len(tasks) * attempts_per_task, skipped=done)
  metadata = {"teacher": teacher.description, "model": teacher.served_model_name,
              "text_only": teacher.text_only,
              "teacher_tokenizer": None if teacher.text_only else teacher.tokenizer.name}
  # The teacher's own exits (out of steps, out of time, a refused request) are data; only a
  # run that raised is aborted.
  rules = dataclasses.replace(StatusRules.of(domain), aborted=frozenset({ABORTED}))
  runner = RolloutRunner(domain, teacher, env, store, sampling=sampling, experiment=experiment,
                         parallel=parallel, log_dir=log_dir, grade=evaluate, rules=rules,
                         metadata=metadata)
  requests = [RolloutRequest(task, attempt, None, trajectory_id=trajectory_id(
      experiment, domain.task_id(task), attempt)) for task, attempt in todo]
  total = len(todo) if not budget.max_attempts else min(len(todo), budget.max_attempts)
  bar = tqdm.tqdm(total=total, desc="distill", unit="attempt", disable=not progress,
                  dynamic_ncols=True)

  def reached(started: int):
    return budget.reached(attempts=started, seconds=time.monotonic() - start,
                          tokens=sum(runner.usage.values()))

  interrupted = False
  try:
    runner.run(requests, progress=bar, budget=reached)
  except KeyboardInterrupt:
    interrupted = True
    bar.write("interrupted: the running attempts were stored as aborted")
  bar.close()
  rollouts = runner.last_rollouts
  for rollout in rollouts:
    trajectory = rollout.trajectory
    if trajectory.exit_status == ABORTED:
      summary.aborted += 1
    else:
      summary.completed += 1
      if trajectory.resolved is not None:
        summary.evaluated += 1
        summary.resolved += bool(trajectory.resolved)
  summary.started = len(rollouts)
  summary.stopped_by = "interrupted" if interrupted else runner.stopped_by
  summary.remaining = len(requests) - summary.started
  summary.prompt_tokens = runner.usage["prompt_tokens"]
  summary.completion_tokens = runner.usage["completion_tokens"]
  summary.wall_time_s = time.monotonic() - start
  return summary


def collect(config: ConfigDict, domain: Domain) -> CollectionSummary:
  """Collects teacher trajectories of `domain` (module docstring) into the store, prints the
  run summary and the store's statistics for the experiment."""
  logging.getLogger("httpx").setLevel(logging.WARNING)
  progress = bool(config.get("progress", True))
  dc = config.distill
  domain.check_config("distill")
  budget = Budget(int(dc.max_attempts), float(dc.max_wall_time_s), int(dc.max_tokens))
  sampling = {k: v for k, v in dict(config.sampling).items() if v is not None}
  if not sampling.get("max_tokens"):
    sampling.pop("max_tokens", None)
  # The store's attempts are continued only by a collection of the same identity (teacher,
  # task set, experiment; run_config.py), checked before the task set is loaded. A run that
  # fails before storing anything (e.g. a teacher that does not load) leaves no empty run
  # folder behind (run_folder.py).
  with run_folder.run_folder(config.workdir, config):
    tasks = list(domain.load_tasks())
    with data.TrajectoryStore(store_path(config)) as store:
      todo, done = pending_attempts(tasks, int(dc.attempts_per_task), store,
                                    experiment=config.experiment, task_id=domain.task_id,
                                    retry_aborted=bool(dc.retry_aborted))
      print(f"tasks: {len(tasks)} x {dc.attempts_per_task} attempts; {done} already stored, "
            f"{len(todo)} to run; store: {store.root}", flush=True)
      if todo:
        with domain.environment() as env, \
            distillation_teacher(config.teacher, store,
                                 max_batch_size=int(dc.parallel)) as teacher:
          print(f"teacher: {teacher.description}", flush=True)
          summary = collect_trajectories(
              domain, tasks, env, teacher, store, experiment=config.experiment,
              attempts_per_task=int(dc.attempts_per_task), sampling=sampling,
              parallel=int(dc.parallel), budget=budget, retry_aborted=bool(dc.retry_aborted),
              evaluate=bool(dc.evaluate), log_dir=os.path.join(config.workdir, "eval_logs"),
              progress=progress)
          description = teacher.description
      else:
        summary = CollectionSummary(planned=len(tasks) * int(dc.attempts_per_task), skipped=done)
        description = None
      print(summary.table(), flush=True)
      with open(os.path.join(config.workdir, "collect_summary.json"), "w") as f:
        json.dump({**dataclasses.asdict(summary), "teacher": description}, f, indent=2)
      tokenizer = (load_tokenizer(config.stats.tokenizer, field="stats.tokenizer")
                   if config.stats.tokenizer else None)
      stats = data.dataset_stats(store.trajectories(experiment=config.experiment), store=store,
                                 tokenizer=tokenizer,
                                 max_tokens=int(config.stats.max_tokens) or None,
                                 image_tokens=student_image_tokens(config, store))
      print(f"\nstore, experiment {config.experiment!r}:\n{stats.table()}", flush=True)
  return summary
