"""Rollouts of the Orchard-SWE recipe: harness runs through the proxy, graded, judged, stored.

One rollout is one run of the bash agent on one instance in a fresh sandbox, its model calls
going through the recording proxy (`PolicyService.session_url`), then the evaluation of its
submission in another fresh sandbox (`swe.run_episode`). `RolloutRunner.run` executes many in
parallel threads, judges them (RPR) when asked, and appends every trajectory with its rewards
to the trajectory store, so later experiments (the value model) can use it.

A rollout is *aborted* when its run raised (sandbox, engine or proxy failure), went past
`rollout_timeout_s`, or the agent's wall-time limit or a model-call failure ended it: BAR puts
such rollouts on its backfill pile and the group filter drops a group holding one
(docs/algorithms.md section 2). A rollout that ran out of steps is *truncated*: R_bin = -1 and it
never counts as resolved, whatever its partial patch does. Repeated format errors are an
ordinary failure: the (usually empty) submission is graded like any other.

`balanced_groups` runs BAR (rl.assemble_group, rl.rollouts_to_request) for many prompts at
once: each round asks every unfinished prompt for its next stride, runs all of them together,
and assembles; a prompt is finished when its group assembles or it reached N_max.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
import uuid
import zlib
from typing import Any, Callable, Optional, Sequence

from orchard_jax import data, rl
from orchard_jax.recipes import swe_judge

_log = logging.getLogger(__name__)

ABORTED = "aborted"
_ABORT_EXITS = ("TimeExceeded", "ModelError", ABORTED)
_TRUNCATED_EXITS = ("LimitsExceeded",)


@dataclasses.dataclass
class RolloutRequest:
  """One rollout to run: an instance, its attempt number, and the sampling seed."""
  instance: Any
  attempt: int
  seed: int
  prompt: int = 0      # index of the prompt (group) it belongs to


@dataclasses.dataclass
class Rollout:
  """A finished (or aborted) rollout.

  Attributes:
    request: what was asked.
    session_id: the proxy session; its model calls are in the store under this id.
    trajectory: the stored `data.Trajectory` (messages, exit status, outcome, rewards).
    aborted: see the module docstring.
    seconds: wall time of the run and its grading.
    response_tokens: tokens the policy sampled in the whole run.
    reward: R_bin, or R' = R_bin + alpha J with RPR.
    judgement: the judge's verdict (None without RPR).
  """
  request: RolloutRequest
  session_id: str
  trajectory: data.Trajectory
  aborted: bool
  seconds: float
  response_tokens: int = 0
  reward: float = -1.0
  judgement: Optional[swe_judge.Judgement] = None

  @property
  def resolved(self) -> bool:
    """Graded resolved, and neither aborted nor truncated (docs/algorithms.md section 5)."""
    return bool(self.trajectory.resolved) and not self.aborted and not self.truncated

  @property
  def truncated(self) -> bool:
    return self.trajectory.exit_status in _TRUNCATED_EXITS

  def scored(self, index: int) -> rl.ScoredRollout:
    """BAR's view of this rollout (status 0 = submitted; rollout_id = `index`)."""
    return rl.ScoredRollout(reward=self.reward, resolved=self.resolved,
                            response_length=self.response_tokens,
                            status=0 if self.trajectory.exit_status == "Submitted" else 1,
                            aborted=self.aborted, rollout_id=index)


def rollout_seed(base: int, *parts: Any) -> int:
  """A stable 31-bit seed from a base seed and identifying parts (task id, attempt, ...)."""
  text = "/".join(str(p) for p in (base,) + parts)
  return zlib.crc32(text.encode()) & 0x7FFFFFFF


class RolloutRunner:
  """Runs rollouts in parallel through a PolicyService (module docstring).

  Args:
    service: the `PolicyService` (proxy in front of the engine).
    env_client: an Orchard Env SandboxClient.
    store: the `data.TrajectoryStore` (the proxy writes model calls into the same one).
    agent_config: harness.AgentConfig.
    sampling: {"temperature", "top_p", "max_tokens"} sent by the harness.
    judge: a judge for RPR, or None for R_bin only.
    rpr_alpha: alpha of R' = R_bin + alpha J.
    experiment: experiment name on the stored trajectories.
    parallel: rollouts at a time.
    rollout_timeout_s: a rollout still running after this is abandoned as aborted (0 = never).
    judge_workers: judgements at a time.
    log_dir: where evaluation logs go (one folder per session), or None.
    episode_fn: `swe.run_episode` (a seam for fault-injection tests).
  """

  def __init__(self, service, env_client, store, *, agent_config, sampling: dict,
               judge=None, rpr_alpha: float = 0.5, experiment: str = "swe", parallel: int = 4,
               rollout_timeout_s: float = 0.0, judge_workers: int = 4,
               log_dir: Optional[str] = None, episode_fn: Optional[Callable] = None):
    from orchard_jax.recipes import swe
    self.service = service
    self.env_client = env_client
    self.store = store
    self.agent_config = agent_config
    self.sampling = dict(sampling)
    self.judge = judge
    self.rpr_alpha = rpr_alpha
    self.experiment = experiment
    self.parallel = max(1, int(parallel))
    self.rollout_timeout_s = float(rollout_timeout_s)
    self.judge_workers = judge_workers
    self.log_dir = log_dir
    self.episode_fn = episode_fn or swe.run_episode
    self.timing = {"rollout_s": 0.0, "judge_s": 0.0}

  def _one(self, request: RolloutRequest, session_id: str, iteration: Optional[int]):
    instance = request.instance
    start = time.perf_counter()
    sampling = dict(self.sampling, seed=request.seed)
    log_dir = os.path.join(self.log_dir, session_id) if self.log_dir else None
    try:
      trajectory = self.episode_fn(
          instance, self.env_client, self.service.session_url(session_id),
          model=self.service.config.engine.served_model_name, config=self.agent_config,
          session_id=session_id, attempt=request.attempt, sampling=sampling, log_dir=log_dir)
      aborted = trajectory.exit_status in _ABORT_EXITS
      error = ""
    except Exception as e:  # noqa: BLE001 - any failure of one rollout aborts only that rollout
      _log.warning("rollout %s on %s aborted: %s: %s", session_id, instance.instance_id,
                   type(e).__name__, e)
      trajectory = data.Trajectory(
          trajectory_id=session_id, task_id=instance.instance_id, attempt=request.attempt,
          session_id=session_id, exit_status=ABORTED)
      aborted, error = True, f"{type(e).__name__}: {e}"
    finally:
      try:
        self.service.end_session(session_id)
      except Exception:  # noqa: BLE001 - the proxy may already be gone on shutdown
        pass
    if not trajectory.messages and trajectory.metadata.get("harness") and not aborted:
      # An external harness keeps its conversation to itself: the trajectory gets the one its
      # last delivered model call recorded (messages and the answer), for judges and readers.
      calls = [c for c in self.store.model_calls(session_id) if c.delivered]
      if calls:
        trajectory.messages = list(calls[-1].messages) + (
          [calls[-1].response] if calls[-1].response else [])
        trajectory.tools = calls[-1].tools
    trajectory.trajectory_id = session_id
    trajectory.experiment = self.experiment
    trajectory.iteration = iteration
    if error:
      trajectory.metadata["error"] = error
    return trajectory, aborted, time.perf_counter() - start

  def run(self, requests: Sequence[RolloutRequest], *, iteration: Optional[int] = None,
          policy_version: Optional[int] = None, progress: Any = None) -> list[Rollout]:
    """Runs, grades, judges and stores the requested rollouts; results in request order.

    Args:
      requests: what to run.
      iteration: the RL iteration (stored on the trajectories).
      policy_version: the weights' version (stored).
      progress: an object with `update(n)` (e.g. a tqdm bar), or None.
    """
    if not requests:
      return []
    start = time.perf_counter()
    sessions = [f"{self.experiment}-{iteration if iteration is not None else 'x'}-"
                f"{r.instance.instance_id[-24:]}-a{r.attempt}-{uuid.uuid4().hex[:6]}"
                for r in requests]
    results: list[Optional[tuple]] = [None] * len(requests)
    pool = concurrent.futures.ThreadPoolExecutor(min(self.parallel, len(requests)))
    try:
      futures = {pool.submit(self._one, r, s, iteration): i
                 for i, (r, s) in enumerate(zip(requests, sessions))}
      deadline = (time.monotonic() + self.rollout_timeout_s * -(-len(requests) // self.parallel)
                  if self.rollout_timeout_s > 0 else None)
      pending = set(futures)
      while pending:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        done, pending = concurrent.futures.wait(
            pending, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
          results[futures[future]] = future.result()
          if progress is not None:
            progress.update(1)
        if deadline is not None and time.monotonic() >= deadline and pending:
          for future in pending:
            i = futures[future]
            _log.warning("rollout %s passed its time budget; abandoned as aborted", sessions[i])
            results[i] = (data.Trajectory(
                trajectory_id=sessions[i], task_id=requests[i].instance.instance_id,
                attempt=requests[i].attempt, session_id=sessions[i], exit_status=ABORTED,
                experiment=self.experiment, iteration=iteration,
                metadata={"error": "over the rollout time budget"}), True,
                          time.perf_counter() - start)
            if progress is not None:
              progress.update(1)
          break
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
    self.timing["rollout_s"] += time.perf_counter() - start

    rollouts = []
    for request, session_id, (trajectory, aborted, seconds) in zip(requests, sessions, results):
      calls = self.store.model_calls(session_id)
      rollouts.append(Rollout(request, session_id, trajectory, aborted, seconds,
                              response_tokens=sum(len(c.output_ids) for c in calls)))
    self._score(rollouts)
    for rollout in rollouts:
      t = rollout.trajectory
      t.policy_version = policy_version
      t.metadata.update({"aborted": rollout.aborted, "seconds": round(rollout.seconds, 3),
                         "response_tokens": rollout.response_tokens, "seed": rollout.request.seed,
                         "model_calls": len(self.store.model_calls(rollout.session_id))})
      self.store.append_trajectory(t)
    return rollouts

  def _score(self, rollouts: list[Rollout]) -> None:
    start = time.perf_counter()
    judged = [r for r in rollouts if not r.aborted] if self.judge is not None else []
    verdicts = swe_judge.judge_all(self.judge, [(r.trajectory, r.request.instance)
                                                for r in judged],
                                   max_workers=self.judge_workers) if judged else []
    by_session = {r.session_id: v for r, v in zip(judged, verdicts)}
    for rollout in rollouts:
      binary = rl.binary_reward(rollout.resolved, rollout.truncated or rollout.aborted)
      rewards = {"binary": binary}
      if self.judge is not None and not rollout.aborted:
        verdict = by_session[rollout.session_id]
        combined = swe_judge.rpr_reward(verdict, resolved=rollout.resolved,
                                        truncated=rollout.truncated, alpha=self.rpr_alpha)
        rollout.judgement = verdict
        rewards.update({"judge": combined.judge_score, "total": combined.reward})
        rollout.trajectory.metadata["judge"] = {
            "kind": verdict.judge, "scores": verdict.scores, "reasoning": verdict.reasoning,
            "failed": combined.judge_failed, "failure": combined.failure}
        rollout.reward = combined.reward
      else:
        rewards["total"] = binary
        rollout.reward = binary
      rollout.trajectory.rewards = rewards
    self.timing["judge_s"] += time.perf_counter() - start


@dataclasses.dataclass
class PromptGroup:
  """BAR's result for one prompt: every rollout generated, and the assembled group."""
  instance: Any
  rollouts: list[Rollout]
  assembly: rl.Assembly
  stride: int
  group_size: int

  @property
  def group(self) -> list[Rollout]:
    """The assembled group's rollouts."""
    return [self.rollouts[s.rollout_id] for s in self.assembly.rollouts]

  @property
  def first_rollouts(self) -> list[Rollout]:
    """The rollouts BAR generates whatever their results: the first stride, or the first
    ceil(N / s) strides when a stride is smaller than the group (no group can assemble
    before N rollouts exist). An unbiased sample of the policy's success rate on this
    prompt; later strides depend on earlier results."""
    always = -(-self.group_size // self.stride) * self.stride
    return [r for r in self.rollouts if r.request.attempt < always]


def balanced_groups(runner: RolloutRunner, instances: Sequence[Any], bar: rl.BARConfig, *,
                    iteration: int, seed: int, policy_version: Optional[int] = None,
                    progress_factory: Optional[Callable[[int, str], Any]] = None
                    ) -> list[PromptGroup]:
  """BAR (docs/algorithms.md section 2) for every prompt at once (module docstring).

  Args:
    runner: runs the rollouts.
    instances: one prompt each.
    bar: BARConfig.
    iteration: stored on the trajectories; part of the rollout seeds.
    seed: base seed.
    policy_version: stored on the trajectories.
    progress_factory: (total, description) -> progress bar with update/close, or None.
  Returns:
    One PromptGroup per instance, in order.
  """
  pools: list[list[Rollout]] = [[] for _ in instances]
  requested = [0] * len(instances)
  assemblies: list[Optional[rl.Assembly]] = [None] * len(instances)
  round_index = 0
  while True:
    requests = []
    for p, instance in enumerate(instances):
      if assemblies[p] is not None:
        continue
      for _ in range(rl.rollouts_to_request(requested[p], bar)):
        attempt = requested[p]
        requests.append(RolloutRequest(instance, attempt, rollout_seed(
            seed, iteration, instance.instance_id, attempt), prompt=p))
        requested[p] += 1
    if not requests:
      break
    bar_progress = progress_factory(len(requests), f"rollouts it{iteration} r{round_index}") \
        if progress_factory else None
    try:
      finished = runner.run(requests, iteration=iteration, policy_version=policy_version,
                            progress=bar_progress)
    finally:
      if bar_progress is not None:
        bar_progress.close()
    for rollout in finished:
      pools[rollout.request.prompt].append(rollout)
    for p in range(len(instances)):
      if assemblies[p] is None:   # every request yields a rollout, so len(pool) == requested
        assemblies[p] = rl.assemble_group([r.scored(i) for i, r in enumerate(pools[p])], bar)
    round_index += 1
  return [PromptGroup(instance, pools[p], assemblies[p], bar.stride, bar.group_size)
          for p, instance in enumerate(instances)]

