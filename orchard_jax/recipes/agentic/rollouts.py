"""Rollouts: episodes of a domain through the recording proxy, graded, judged and stored.

One rollout is one `domain.run_episode` on one task (a harness in a fresh sandbox, its model
calls through the proxy's per-session URL, so the store holds their token ids and log-probs as
sampled), then `domain.grade`. `RolloutRunner.run` executes many in parallel threads, judges them
on the domain's rubric set (RPR) when asked, and appends every trajectory with its rewards to
the trajectory store, so later experiments (the value model) can use it. RL, evaluation and
distillation all run their episodes here.

A rollout is *aborted* when its episode or its grading raised (sandbox, engine, proxy or grader
failure), it went past the time budget, or its exit status or outcome status is one the domain
names aborted (e.g. the agent's wall-time limit, a model-call failure, a grader error): BAR puts
such rollouts on its backfill pile and the group filter drops a group holding one
(docs/algorithms.md section 2). A rollout whose exit status the domain names *truncated* (out
of steps) gets R_bin = -1 and never counts as resolved, whatever its partial submission does.

Reward: R_out = the domain's outcome reward when its grade gives one, else R_bin (+1 resolved,
-1 otherwise); with a judge R' = R_out + alpha J on the domain's rubric set (R_out alone when the
judgement failed). Aborted rollouts get -1 and no judgement.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import re
import threading
import time
import traceback
import zlib
from typing import Any, Callable, Optional, Sequence

from orchard_jax import data, rl
from orchard_jax.recipes.agentic.domain import ABORTED, Domain, Judgement, StatusRules
from orchard_jax.rollout.proxy import new_session_id

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class RolloutRequest:
  """One rollout to run.

  Attributes:
    task: the domain's task.
    attempt: the attempt number on this task.
    seed: the sampling seed (None: the engine draws one).
    prompt: index of the prompt (group) it belongs to.
    trajectory_id: the stored trajectory's id; "" uses the proxy session id.
  """
  task: Any
  attempt: int
  seed: Optional[int]
  prompt: int = 0
  trajectory_id: str = ""


@dataclasses.dataclass
class Rollout:
  """A finished (or aborted) rollout.

  Attributes:
    request: what was asked.
    session_id: the proxy session; its model calls are in the store under this id.
    trajectory: the stored `data.Trajectory` (messages, exit status, outcome, rewards).
    aborted, truncated: see the module docstring.
    seconds: wall time of the run and its grading.
    response_tokens: tokens the policy sampled in the whole run.
    reward: R_out, or R' = R_out + alpha J with RPR.
    judgement: the judge's verdict (None without RPR).
    judge_score: J (None without a usable judgement).
  """
  request: RolloutRequest
  session_id: str
  trajectory: data.Trajectory
  aborted: bool
  seconds: float
  truncated: bool = False
  response_tokens: int = 0
  reward: float = -1.0
  judgement: Optional[Judgement] = None
  judge_score: Optional[float] = None
  status_rank: int = 1

  @property
  def resolved(self) -> bool:
    """Graded resolved, and neither aborted nor truncated (docs/algorithms.md section 5)."""
    return bool(self.trajectory.resolved) and not self.aborted and not self.truncated

  def scored(self, index: int) -> rl.ScoredRollout:
    """BAR's view of this rollout (status 0 = the agent ended it; rollout_id = `index`)."""
    return rl.ScoredRollout(reward=self.reward, resolved=self.resolved,
                            response_length=self.response_tokens, status=self.status_rank,
                            aborted=self.aborted, rollout_id=index)


def rollout_seed(base: int, *parts: Any) -> int:
  """A stable 31-bit seed from a base seed and identifying parts (task id, attempt, ...)."""
  text = "/".join(str(p) for p in (base,) + parts)
  return zlib.crc32(text.encode()) & 0x7FFFFFFF


def safe_id(text: str, limit: int = 80) -> str:
  """A URL-path-safe piece of a session id."""
  return re.sub(r"[^A-Za-z0-9._-]", "_", str(text))[:limit]


class RolloutRunner:
  """Runs a domain's episodes in parallel through a ModelService (module docstring).

  Args:
    domain: the `Domain`.
    service: the `ModelService` (proxy in front of the engine).
    env: what the domain's episodes act in (`domain.environment(config)`).
    store: the `data.TrajectoryStore` (the proxy writes model calls into the same one).
    sampling: {"temperature", "top_p", "max_tokens"} sent by the harness.
    judge: a judge for RPR, or None for the outcome reward only.
    rpr_alpha: alpha of R' = R_out + alpha J.
    experiment: experiment name on the stored trajectories.
    parallel: rollouts at a time.
    rollout_timeout_s: a rollout still running after this is abandoned as aborted (0 = never);
      the budget of a call is this times its number of waves (ceil(requests / parallel)).
    judge_workers: judgements at a time.
    log_dir: where grading logs go (one folder per session), or None.
    stop: an Event; once set, no new rollout starts and rollouts that finish are stored
      aborted. A first Ctrl-C during `run` sets it and waits for the running episodes to end
      within the harness's own limits; a second abandons them.
    grade: grade episodes with `domain.grade` (False: trajectories without an outcome).
    rules: which statuses abort or truncate (default: the domain's, `StatusRules.of`).
    metadata: fields added to every stored trajectory's metadata.
  Attributes:
    timing: seconds spent rolling out and judging since the last reset.
    usage: prompt and completion tokens of the finished rollouts' model calls (the endpoint's
      reported usage where the record has it, else the recorded ids).
    stopped_by: the budget limit that stopped the last `run` early, "interrupted", or None.
    last_rollouts: the last `run`'s rollouts (also after it raised KeyboardInterrupt).
  """

  def __init__(self, domain: Domain, service, env, store, *, sampling: dict, judge=None,
               rpr_alpha: float = 0.5, experiment: str = "run", parallel: int = 4,
               rollout_timeout_s: float = 0.0, judge_workers: int = 4,
               log_dir: Optional[str] = None, stop: Optional[threading.Event] = None,
               grade: bool = True, rules: Optional[StatusRules] = None,
               metadata: Optional[dict] = None):
    self.domain = domain
    self.rules = rules or StatusRules.of(domain)
    self.grade = grade
    self.metadata = dict(metadata or {})
    self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
    self.stopped_by: Optional[str] = None
    self.last_rollouts: list[Rollout] = []
    self.service = service
    self.env = env
    self.store = store
    self.sampling = dict(sampling)
    self.judge = judge
    self.rpr_alpha = float(rpr_alpha)
    self.experiment = experiment
    self.parallel = max(1, int(parallel))
    self.rollout_timeout_s = float(rollout_timeout_s)
    self.judge_workers = max(1, int(judge_workers))
    self.log_dir = log_dir
    self.stop = stop or threading.Event()
    self.timing = {"rollout_s": 0.0, "judge_s": 0.0}

  def session_id(self, request: RolloutRequest, iteration: Optional[int]) -> str:
    task_id = self.domain.task_id(request.task)
    return new_session_id(f"{safe_id(self.experiment)}-"
                          f"{iteration if iteration is not None else 'x'}-"
                          f"{safe_id(task_id)[-24:]}-a{request.attempt}")

  def _one(self, request: RolloutRequest, session_id: str, iteration: Optional[int]):
    """Episode then grade; never raises (a failure aborts this rollout only)."""
    task = request.task
    task_id = self.domain.task_id(task)
    start = time.perf_counter()
    sampling = dict(self.sampling)
    if request.seed is not None:
      sampling["seed"] = request.seed
    log_dir = os.path.join(self.log_dir, session_id) if self.log_dir else None
    trajectory, stage, error = None, "episode", ""
    try:
      try:
        if self.stop.is_set():
          raise KeyboardInterrupt("the run was interrupted before this rollout started")
        trajectory = self.domain.run_episode(
            task, self.env, self.service.session_url(session_id),
            model=self.service.served_model_name, session_id=session_id,
            attempt=request.attempt, sampling=sampling, log_dir=log_dir)
      finally:
        self._end_session(session_id)     # its model calls are in the store from here on
      if self.stop.is_set():
        raise KeyboardInterrupt("the run was interrupted during the episode")
      if not trajectory.messages:
        # An external harness keeps its conversation to itself: the trajectory gets the one its
        # last delivered model call recorded (messages and the answer), for judges and readers.
        calls = [c for c in self.store.model_calls(session_id) if c.delivered]
        if calls:
          trajectory.messages = list(calls[-1].messages) + (
              [calls[-1].response] if calls[-1].response else [])
          trajectory.tools = calls[-1].tools
      if self.grade:
        stage = "grading"
        outcome = self.domain.grade(task, trajectory, self.env, log_dir=log_dir)
        trajectory.outcome = outcome.to_dict()
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - aborts only this rollout
      _log.warning("rollout %s on %s aborted during %s: %s: %s", session_id, task_id, stage,
                   type(e).__name__, e)
      error = f"{type(e).__name__}: {e}"
      # An episode that failed part-way may carry what it did so far (`partial`).
      partial = trajectory if trajectory is not None else getattr(e, "partial", None)
      trajectory = data.Trajectory(
          trajectory_id=session_id, task_id=task_id, attempt=request.attempt,
          session_id=session_id, exit_status=ABORTED,
          messages=list(partial.messages) if partial is not None else [],
          submission=partial.submission if partial is not None else "",
          metadata={"aborted_stage": stage, "traceback": traceback.format_exc(limit=8),
                    "agent_exit_status": partial.exit_status if partial is not None else None})
    trajectory.trajectory_id = request.trajectory_id or session_id
    trajectory.session_id = session_id
    trajectory.experiment = self.experiment
    trajectory.iteration = iteration
    trajectory.metadata.update(self.metadata)
    if error:
      trajectory.metadata["error"] = error
    return trajectory, time.perf_counter() - start

  def _end_session(self, session_id: str) -> None:
    try:
      self.service.end_session(session_id)
    except Exception:  # noqa: BLE001 - the proxy may already be gone on shutdown
      pass

  def run(self, requests: Sequence[RolloutRequest], *, iteration: Optional[int] = None,
          policy_version: Optional[int] = None, progress: Any = None,
          budget: Optional[Callable[[int], Optional[str]]] = None) -> list[Rollout]:
    """Runs, grades, judges and stores the requested rollouts, `parallel` at a time.

    Args:
      requests: what to run, started in this order.
      iteration: the RL iteration (stored on the trajectories).
      policy_version: the weights' version (stored).
      progress: an object with `update(n)` (e.g. a tqdm bar), or None.
      budget: called with the number of rollouts started so far before each start; a
        returned name (e.g. "max_tokens") stops new starts (`stopped_by`), the running ones
        finish. `usage` is up to date when it is called.
    Returns:
      The started requests' rollouts, in request order (every request without a budget).
    Raises:
      KeyboardInterrupt: after a Ctrl-C, once the running rollouts stopped (they are stored,
        aborted).
    """
    self.stopped_by = None
    if not requests:
      return []
    start = time.perf_counter()
    sessions = [self.session_id(r, iteration) for r in requests]
    results: dict[int, tuple] = {}
    waiting = list(range(len(requests)))
    running: dict[concurrent.futures.Future, int] = {}
    interrupted = False
    waves = -(-len(requests) // self.parallel)
    deadline = (time.monotonic() + self.rollout_timeout_s * waves
                if self.rollout_timeout_s > 0 else None)
    pool = concurrent.futures.ThreadPoolExecutor(min(self.parallel, len(requests)),
                                                 thread_name_prefix="rollout")
    try:
      while waiting or running:
        while waiting and len(running) < self.parallel and not self.stopped_by:
          reason = budget(len(results) + len(running)) if budget is not None else None
          if reason:
            self.stopped_by = reason
            break
          i = waiting.pop(0)
          running[pool.submit(self._one, requests[i], sessions[i], iteration)] = i
        if not running:
          break
        timeout = 1.0 if deadline is None else min(max(deadline - time.monotonic(), 0.0), 1.0)
        try:
          done, _ = concurrent.futures.wait(list(running), timeout=timeout,
                                            return_when=concurrent.futures.FIRST_COMPLETED)
        except KeyboardInterrupt:
          if interrupted:          # a second Ctrl-C: abandon what still runs
            deadline, done = time.monotonic(), set()
          else:
            interrupted = True
            self.stop.set()
            self.stopped_by = "interrupted"
            _log.warning("interrupted: waiting for %d running rollouts to end (Ctrl-C again "
                         "abandons them)", len(running))
            continue
        for future in done:
          i = running.pop(future)
          results[i] = future.result()
          self._count_usage(sessions[i])
          if progress is not None:
            progress.update(1)
        if deadline is not None and time.monotonic() >= deadline and (running or waiting):
          reason = "interrupted" if interrupted else "over the rollout time budget"
          for i in sorted(list(running.values()) + waiting):
            _log.warning("rollout %s abandoned as aborted: %s", sessions[i], reason)
            results[i] = (data.Trajectory(
                trajectory_id=requests[i].trajectory_id or sessions[i],
                task_id=self.domain.task_id(requests[i].task), attempt=requests[i].attempt,
                session_id=sessions[i], exit_status=ABORTED, experiment=self.experiment,
                iteration=iteration, metadata={**self.metadata, "error": reason}),
                          time.perf_counter() - start)
            if progress is not None:
              progress.update(1)
          running, waiting = {}, []
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
    self.timing["rollout_s"] += time.perf_counter() - start

    rollouts = []
    for i in sorted(results):
      trajectory, seconds = results[i]
      calls = self.store.model_calls(sessions[i])
      rollouts.append(Rollout(
          requests[i], sessions[i], trajectory, aborted=self.rules.is_aborted(trajectory),
          truncated=self.rules.is_truncated(trajectory), seconds=seconds,
          response_tokens=sum(len(c.output_ids) for c in calls),
          status_rank=self.rules.rank(trajectory)))
    self._score(rollouts)
    for rollout in rollouts:
      t = rollout.trajectory
      t.policy_version = policy_version
      prompt, completion = _tokens(self.store.model_calls(rollout.session_id))
      t.metadata.update({"aborted": rollout.aborted, "seconds": round(rollout.seconds, 3),
                         "response_tokens": rollout.response_tokens, "seed": rollout.request.seed,
                         "model_calls": len(self.store.model_calls(rollout.session_id)),
                         "prompt_tokens": prompt, "completion_tokens": completion})
      self.store.append_trajectory(t)
    self.last_rollouts = rollouts
    if interrupted:
      raise KeyboardInterrupt
    return rollouts

  def run_with_progress(self, requests: Sequence[RolloutRequest], description: str,
                        progress_factory: Optional[Callable[[int, str], Any]], **kwargs
                        ) -> list[Rollout]:
    """`run` with a progress bar from `progress_factory(total, description)` (None: none),
    closed at the end."""
    bar = progress_factory(len(requests), description) if progress_factory else None
    try:
      return self.run(requests, progress=bar, **kwargs)
    finally:
      if bar is not None:
        bar.close()

  def _count_usage(self, session_id: str) -> None:
    prompt, completion = _tokens(self.store.model_calls(session_id))
    self.usage["prompt_tokens"] += prompt
    self.usage["completion_tokens"] += completion

  def _score(self, rollouts: list[Rollout]) -> None:
    start = time.perf_counter()
    judged = [r for r in rollouts if not r.aborted] if self.judge is not None else []
    verdicts = judge_all(self.judge, [(r.trajectory, r.request.task) for r in judged],
                         max_workers=self.judge_workers)
    by_session = {r.session_id: v for r, v in zip(judged, verdicts)}
    for rollout in rollouts:
      binary = rl.binary_reward(rollout.resolved, rollout.truncated or rollout.aborted)
      outcome_reward = (rollout.trajectory.outcome or {}).get("reward")
      base = binary if outcome_reward is None or rollout.aborted else float(outcome_reward)
      rewards = {"binary": binary}
      if outcome_reward is not None and not rollout.aborted:
        rewards["outcome"] = base
      verdict = by_session.get(rollout.session_id)
      if verdict is not None:
        combined = rl.rpr_reward(rollout.resolved, None if verdict.failed else verdict.scores,
                                 rubrics=self.domain.rubrics,
                                 alpha=self.rpr_alpha, truncated=rollout.truncated,
                                 outcome_reward=None if outcome_reward is None else base,
                                 failure=verdict.failure)
        rollout.judgement = verdict
        rollout.judge_score = combined.judge_score
        rewards.update({"judge": combined.judge_score, "total": combined.reward})
        rollout.trajectory.metadata["judge"] = {
            "kind": verdict.judge, "scores": verdict.scores, "reasoning": verdict.reasoning,
            "failed": combined.judge_failed, "failure": combined.failure}
        rollout.reward = combined.reward
      else:
        rewards["total"] = base
        rollout.reward = base
      rollout.trajectory.rewards = rewards
    self.timing["judge_s"] += time.perf_counter() - start


def _tokens(calls) -> tuple[int, int]:
  """(prompt, completion) tokens of recorded model calls: the usage the endpoint reported
  (text-only records), else the recorded ids."""
  prompt = completion = 0
  for call in calls:
    usage = (call.metadata or {}).get("usage") or {}
    prompt += int(usage.get("prompt_tokens") or len(call.prompt_ids))
    completion += int(usage.get("completion_tokens") or len(call.output_ids))
  return prompt, completion


def judge_all(judge, items: Sequence[tuple[Any, Any]], *, max_workers: int = 4
              ) -> list[Judgement]:
  """Judges (trajectory, task) pairs concurrently; results in input order. A judge that raises
  gives a failed Judgement (the reward falls back to the outcome reward)."""
  if not items or judge is None:
    return []

  def one(item):
    begin = time.perf_counter()
    try:
      return judge.judge(*item)
    except Exception as error:  # noqa: BLE001 - a judge failure is a failed judgement
      return Judgement(None, "", f"{type(error).__name__}: {error}",
                       getattr(judge, "name", type(judge).__name__), time.perf_counter() - begin)

  with concurrent.futures.ThreadPoolExecutor(max(1, min(max_workers, len(items)))) as pool:
    return list(pool.map(one, items))
