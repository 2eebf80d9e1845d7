"""Data distillation: a teacher model runs the SWE harness on a task set and every trajectory,
with its outcome, lands in the trajectory store (the paper's SFT data: agent interactions
distilled from open-weight teachers in the deployment harness).

Jobs (experiments/swe_distill.py; choose one with --config.job=NAME):
  swe_distill.collect  k attempts per task, `distill.parallel` at a time, each in its own
                       sandbox, every model call through the recording proxy, every submission
                       graded in a fresh sandbox; resumable, with budgets and a progress bar
  swe_distill.stats, swe_distill.export, swe_distill.import   see recipes/trajectory_data.py

The teacher (config.teacher, recipes/teacher.py) is the embedded engine serving a checkpoint
(token ids and log-probs recorded), an SGLang server (token ids recorded), or any
OpenAI-compatible endpoint (messages recorded, marked text-only: SFT data, never RL data).

Resuming. Trajectory ids are "{experiment}/{task_id}/{attempt}". A run skips every (task,
attempt) pair whose trajectory the store already holds for the experiment. An attempt that
raises (a sandbox that died, an evaluation that crashed, the run interrupted, a teacher endpoint
that stayed unreachable or answered 429/5xx after the retries) is stored with
exit_status "aborted", its partial messages and the error; the next run tries it again (its
new record supersedes the aborted one) unless distill.retry_aborted is False. Each try talks
through its own proxy session, so the calls of an aborted try never mix with its retry's.
A process killed outright (SIGKILL) stores nothing for its running attempts: they are run
again.

Budgets (distill.max_attempts, max_wall_time_s, max_tokens; 0 = no limit) are per run: when one
is reached no new attempt starts, and the attempts already running finish within the agent's
own limits. Tokens are prompt + completion tokens of every model call as the endpoint reports
them (what a hosted API bills).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import threading
import time
import traceback
import uuid
from typing import Any, Mapping, Sequence

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import ConfigError, load_tokenizer, run_folder, swe
from orchard_jax.recipes.teacher import Teacher, open_teacher
from orchard_jax.tasks.swe import evaluation, testbed

_log = logging.getLogger(__name__)

ABORTED = "aborted"


class DistillError(ConfigError):
  """A distillation setting is invalid (the message names the field, expected and seen)."""


class TransientTeacherError(RuntimeError):
  """The teacher endpoint was unreachable or overloaded (connection error, 429, 5xx) after the
  client's retries: the attempt is aborted (and retried by the next run), not stored as the
  teacher's behaviour."""


# ----------------------------------------------------------------------------- budgets


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


class _RunState:
  """Counters shared by the workers (under a lock) and the stop signal."""

  def __init__(self):
    self.lock = threading.Lock()
    self.stop = threading.Event()
    self.prompt_tokens = 0
    self.completion_tokens = 0

  @property
  def tokens(self) -> int:
    return self.prompt_tokens + self.completion_tokens

  def add_usage(self, usage: Mapping[str, Any]) -> tuple[int, int]:
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    with self.lock:
      self.prompt_tokens += prompt
      self.completion_tokens += completion
    return prompt, completion


class _MeteredModel:
  """Wraps a harness.ChatModel: counts usage, and refuses new calls once the run stops."""

  def __init__(self, chat, state: _RunState):
    self.chat = chat
    self.state = state
    self.calls = self.prompt_tokens = self.completion_tokens = 0

  def complete(self, messages):
    from orchard_jax.harness import ModelCallError
    if self.state.stop.is_set():
      raise ModelCallError("the collection run was interrupted")
    response = self.chat.complete(messages)
    prompt, completion = self.state.add_usage(response.usage)
    self.calls += 1
    self.prompt_tokens += prompt
    self.completion_tokens += completion
    return response


# ----------------------------------------------------------------------------- one attempt


def trajectory_id(experiment: str, task_id: str, attempt: int) -> str:
  """The stored id of an attempt: "{experiment}/{task_id}/{attempt}"."""
  return f"{experiment}/{task_id}/{attempt}"


def run_attempt(instance, attempt: int, client, teacher: Teacher, store: data.TrajectoryStore,
                *, experiment: str, agent_config, sampling: Mapping[str, Any] | None = None,
                evaluate: bool = True, log_dir: str | None = None,
                state: _RunState | None = None) -> data.Trajectory:
  """One attempt: the bash agent in a fresh sandbox, talking to the teacher through its own
  proxy session, then grading in another fresh sandbox; the trajectory is appended to `store`.

  Never raises for a failure inside the attempt: it is stored with exit_status "aborted", the
  messages so far, the stage ("setup", "agent", "evaluation") and the error in metadata.

  Args:
    instance: an SWEInstance with a test_spec.
    attempt: the attempt number (0 .. k-1).
    client: an Orchard Env SandboxClient.
    teacher: the running `Teacher`.
    store: the trajectory store (the proxy writes the model calls to it too).
    experiment: stored on the trajectory; part of its id.
    agent_config: harness.AgentConfig (its workdir becomes the instance's).
    sampling: ChatModel keywords (temperature, max_tokens, top_p).
    evaluate: grade the submission.
    log_dir: evaluation logs go to log_dir/<task>/<attempt>.
    state: the run's shared counters and stop signal.
  Returns:
    The stored trajectory.
  """
  from orchard_jax.harness import BashAgent, ChatModel

  state = state or _RunState()
  task_id = instance.instance_id
  session_id = f"{_safe(experiment)}-{_safe(task_id)}-a{attempt}-{uuid.uuid4().hex[:8]}"
  config = dataclasses.replace(agent_config, workdir=instance.test_spec.workdir)
  factory = swe.sandbox_factory(client)
  started = time.time()
  agent, model, result, stage = None, None, None, "setup"
  metadata = {"teacher": teacher.description, "model": teacher.model,
              "text_only": teacher.text_only, "teacher_tokenizer": teacher.tokenizer,
              "harness": "orchard_jax.harness.bash_agent"}
  try:
    with factory(instance) as sandbox:
      ready = sandbox.run(testbed.setup_script(instance, workdir=config.workdir), timeout_s=300)
      if ready.exit_code != 0:
        raise evaluation.EvaluationError(
            f"{task_id}: workspace setup failed (exit {ready.exit_code}): {ready.output[-500:]}")
      stage = "agent"
      with ChatModel(teacher.proxy.session_url(session_id), teacher.model,
                     **dict(sampling or {})) as chat:
        model = _MeteredModel(chat, state)
        agent = BashAgent(model, sandbox, config)
        result = agent.run(instance.problem_statement)
    if state.stop.is_set():
      raise KeyboardInterrupt("the collection run was interrupted during the agent's run")
    if result.exit_status == "ModelError" and _transient_model_error(result):
      raise TransientTeacherError(result.messages[-1].get("extra", {}).get("exception_str", ""))
    trajectory = result.to_trajectory(task_id=task_id, attempt=attempt, session_id=session_id,
                                      trajectory_id=trajectory_id(experiment, task_id, attempt),
                                      metadata=metadata)
    trajectory.experiment = experiment
    if evaluate:
      stage = "evaluation"
      attempt_logs = os.path.join(log_dir, _safe(task_id), str(attempt)) if log_dir else None
      with factory(instance) as sandbox:
        graded = evaluation.evaluate_in_sandbox(sandbox, instance, result.submission,
                                                log_dir=attempt_logs)
      trajectory.outcome = {"resolved": graded.resolved, "status": graded.outcome,
                            "error": graded.error, "eval_seconds": graded.seconds,
                            **(graded.tests.to_dict() if graded.tests else {})}
      trajectory.rewards = {"binary": float(graded.resolved)}
  except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - any failure aborts this attempt
    messages = list(agent.messages) if agent is not None else []
    trajectory = data.Trajectory(
        trajectory_id=trajectory_id(experiment, task_id, attempt), task_id=task_id,
        attempt=attempt, session_id=session_id if stage != "setup" else None,
        messages=messages, exit_status=ABORTED,
        submission=result.submission if result is not None else "", experiment=experiment,
        metadata={**metadata, "aborted_stage": stage, "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc(limit=8),
                  "agent_exit_status": result.exit_status if result is not None else None})
    _log.warning("%s attempt %d aborted during %s: %s: %s", task_id, attempt, stage,
                 type(e).__name__, e)
  finally:
    teacher.proxy.end_session(session_id)
  trajectory.metadata.update({
      "model_calls": model.calls if model else 0,
      "prompt_tokens": model.prompt_tokens if model else 0,
      "completion_tokens": model.completion_tokens if model else 0,
      "seconds": round(time.time() - started, 3)})
  store.append_trajectory(trajectory)
  return trajectory


def _transient_model_error(result) -> bool:
  """True when a ModelError exit came from the endpoint's availability, not from the request:
  an HTTP 4xx answer other than 429 (e.g. a prompt over the context length) is the teacher's
  outcome and is kept; anything else (no answer, 429, 5xx) is transient."""
  text = result.messages[-1].get("extra", {}).get("exception_str", "") if result.messages else ""
  status = re.search(r" answered (\d{3})", text)
  return status is None or not (400 <= int(status.group(1)) < 500 and status.group(1) != "429")


def _safe(text: str) -> str:
  """A URL-path-safe piece of a session id."""
  return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80]


# ----------------------------------------------------------------------------- collection


def pending_attempts(instances: Sequence, attempts_per_task: int, store: data.TrajectoryStore,
                     *, experiment: str, retry_aborted: bool = True
                     ) -> tuple[list[tuple[Any, int]], int]:
  """The (instance, attempt) pairs still to run, attempt-major (every task's attempt 0 first,
  so a budget spreads over tasks), and how many are already stored.

  A pair is done when the store holds its trajectory for `experiment`; an aborted one counts as
  not done when `retry_aborted`.
  """
  stored = {}
  for trajectory in store.trajectories(experiment=experiment):
    stored[(trajectory.task_id, trajectory.attempt)] = trajectory.exit_status
  todo, done = [], 0
  for attempt in range(attempts_per_task):
    for instance in instances:
      status = stored.get((instance.instance_id, attempt))
      if status is None or (retry_aborted and status == ABORTED):
        todo.append((instance, attempt))
      else:
        done += 1
  return todo, done


def collect_trajectories(instances: Sequence, client, teacher: Teacher,
                         store: data.TrajectoryStore, *, experiment: str, attempts_per_task: int,
                         agent_config, sampling: Mapping[str, Any] | None = None,
                         parallel: int = 2, budget: Budget = Budget(),
                         retry_aborted: bool = True, evaluate: bool = True,
                         log_dir: str | None = None, progress: bool = True
                         ) -> CollectionSummary:
  """Runs every pending (task, attempt) pair with `run_attempt`, `parallel` at a time.

  Ctrl-C stops new attempts and makes the running ones stop at their next model call; they are
  stored as aborted (retried by the next run).

  Returns:
    A `CollectionSummary` of this run.
  Raises:
    DistillError: attempts_per_task or parallel below 1.
  """
  import tqdm

  if attempts_per_task < 1 or parallel < 1:
    raise DistillError(f"attempts_per_task and parallel must be >= 1, got {attempts_per_task} "
                       f"and {parallel}")
  start = time.monotonic()
  todo, done = pending_attempts(instances, attempts_per_task, store, experiment=experiment,
                                retry_aborted=retry_aborted)
  summary = CollectionSummary(planned=len(instances) * attempts_per_task, skipped=done)
  state = _RunState()
  total = len(todo) if not budget.max_attempts else min(len(todo), budget.max_attempts)
  bar = tqdm.tqdm(total=total, desc="distill", unit="attempt", disable=not progress,
                  dynamic_ncols=True)
  queue = list(reversed(todo))
  running: dict[concurrent.futures.Future, tuple] = {}

  def tally(trajectory: data.Trajectory) -> None:
    if trajectory.exit_status == ABORTED:
      summary.aborted += 1
    else:
      summary.completed += 1
      if trajectory.resolved is not None:
        summary.evaluated += 1
        summary.resolved += bool(trajectory.resolved)
    bar.set_postfix_str(f"resolved {summary.resolved}/{summary.evaluated}, aborted "
                        f"{summary.aborted}, tokens {state.tokens}", refresh=False)
    bar.update(1)

  with concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="distill") as pool:
    try:
      while queue or running:
        while queue and len(running) < parallel and not summary.stopped_by:
          summary.stopped_by = budget.reached(
              attempts=summary.started, seconds=time.monotonic() - start,
              tokens=state.tokens)
          if summary.stopped_by:
            break
          instance, attempt = queue.pop()
          future = pool.submit(run_attempt, instance, attempt, client, teacher, store,
                               experiment=experiment, agent_config=agent_config,
                               sampling=sampling, evaluate=evaluate, log_dir=log_dir,
                               state=state)
          running[future] = (instance.instance_id, attempt)
          summary.started += 1
        if not running:
          break
        finished, _ = concurrent.futures.wait(running, timeout=1.0,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
        for future in finished:
          running.pop(future)
          tally(future.result())
    except KeyboardInterrupt:
      summary.stopped_by = "interrupted"
      state.stop.set()
      bar.write("interrupted: waiting for running attempts to stop (they are stored as aborted)")
      for future in concurrent.futures.as_completed(list(running)):
        tally(future.result())
      running.clear()
  bar.close()
  summary.remaining = len(queue)
  summary.prompt_tokens, summary.completion_tokens = state.prompt_tokens, state.completion_tokens
  summary.wall_time_s = time.monotonic() - start
  return summary


# ----------------------------------------------------------------------------- jobs


def store_path(config: ConfigDict) -> str:
  """config.store, or workdir/store when empty."""
  return config.store or os.path.join(config.workdir, "store")


def collect(config: ConfigDict) -> CollectionSummary:
  """Job "swe_distill.collect": collect teacher trajectories (see the module docstring), print
  the run summary and the store's statistics for the experiment."""
  logging.getLogger("httpx").setLevel(logging.WARNING)
  progress = bool(config.get("progress", True))
  dc = config.distill
  instances = swe.load_task_set(config.tasks, progress=progress)
  budget = Budget(int(dc.max_attempts), float(dc.max_wall_time_s), int(dc.max_tokens))
  sampling = {k: v for k, v in dict(config.sampling).items() if v is not None}
  if not sampling.get("max_tokens"):
    sampling.pop("max_tokens", None)
  # A run that fails before storing anything (e.g. a teacher that does not load) leaves no
  # empty run folder behind (run_folder.py).
  with run_folder.run_folder(config.workdir), data.TrajectoryStore(store_path(config)) as store:
    todo, done = pending_attempts(instances, int(dc.attempts_per_task), store,
                                  experiment=config.experiment,
                                  retry_aborted=bool(dc.retry_aborted))
    print(f"tasks: {len(instances)} x {dc.attempts_per_task} attempts; {done} already stored, "
          f"{len(todo)} to run; store: {store.root}", flush=True)
    if todo:
      with swe.sandbox_client(config.env) as client, \
          open_teacher(config.teacher, store, max_batch_size=int(dc.parallel)) as teacher:
        print(f"teacher: {teacher.description}", flush=True)
        summary = collect_trajectories(
            instances, client, teacher, store, experiment=config.experiment,
            attempts_per_task=int(dc.attempts_per_task),
            agent_config=swe.agent_config(config.agent), sampling=sampling,
            parallel=int(dc.parallel), budget=budget, retry_aborted=bool(dc.retry_aborted),
            evaluate=bool(dc.evaluate), log_dir=os.path.join(config.workdir, "eval_logs"),
            progress=progress)
        description = teacher.description
    else:
      summary = CollectionSummary(planned=len(instances) * int(dc.attempts_per_task),
                                  skipped=done)
      description = None
    print(summary.table(), flush=True)
    with open(os.path.join(config.workdir, "collect_summary.json"), "w") as f:
      json.dump({**dataclasses.asdict(summary), "teacher": description}, f, indent=2)
    tokenizer = (load_tokenizer(config.stats.tokenizer, field="stats.tokenizer")
                 if config.stats.tokenizer else None)
    stats = data.dataset_stats(store.trajectories(experiment=config.experiment), store=store,
                               tokenizer=tokenizer, max_tokens=int(config.stats.max_tokens) or None)
    print(f"\nstore, experiment {config.experiment!r}:\n{stats.table()}", flush=True)
  return summary
