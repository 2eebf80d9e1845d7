"""The SWE domain: real bugs in real Python packages (tasks/swe), the bash agent in Orchard Env
sandboxes, grading by SWE-bench's rules, the seven-rubric judge, the replay expert as seed data.

`SWEDomain(config)` is what the agentic loop runs (recipes/agentic/domain.py says what each
method owns); it reads the config's tasks, env, agent, sft, judge and annotator blocks.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
from typing import Any, Mapping, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic.domain import Outcome
from orchard_jax.recipes.agentic.sandboxes import sandbox_client
from orchard_jax.recipes.swe import annotate, harness as harness_lib, judge as judge_lib
from orchard_jax.tasks.errors import InstanceError, TaskError
from orchard_jax.tasks.swe import builder, episode, selection
from orchard_jax.tasks.swe.instance import SWEInstance, load_instances

_log = logging.getLogger(__name__)


def build_settings(tasks: ConfigDict) -> builder.BuildSettings:
  """BuildSettings from a `common.swe_tasks()` ConfigDict.

  Raises:
    ConfigError: tasks.packages names a package without a build profile (checked for every
      name before any is built; the builder found it only after building the ones before it).
  """
  unknown = [name for name in tasks.packages if name not in builder.PROFILES]
  if unknown:
    raise ConfigError(f"tasks.packages: unknown package(s) {unknown}; expected names from "
                      f"{sorted(builder.PROFILES)}")
  return builder.BuildSettings(
      packages=tuple(tasks.packages), instances_per_package=int(tasks.instances_per_package),
      max_candidates_per_package=int(tasks.max_candidates_per_package),
      seconds_per_package=float(tasks.seconds_per_package), workers=int(tasks.workers),
      test_timeout_s=float(tasks.test_timeout_s), seed=int(tasks.seed), python=tasks.python)


def load_task_set(tasks: ConfigDict, *, progress: bool = True) -> list[SWEInstance]:
  """The instances the config names: a dataset file, or the default set (built if missing),
  cut to the first `tasks.limit` (0: all).

  Raises:
    ConfigError: tasks.limit is negative (checked before anything is built or loaded), or
      tasks.dataset names no file or holds a record that is not an instance.
  """
  limit = int(tasks.get("limit", 0))
  if limit < 0:        # instances[:-1] would silently drop the last instance
    raise ConfigError(f"tasks.limit is {limit}; expected 0 (every instance) or a positive count")
  if tasks.dataset:
    try:
      instances = load_instances(tasks.dataset)
    except FileNotFoundError as e:
      raise ConfigError(f"tasks.dataset: {tasks.dataset!r} does not exist; expected a SWE-bench "
                        "JSONL/JSON/parquet file, a datasets folder or a hub name") from e
    except InstanceError as e:
      raise ConfigError(f"tasks.dataset: {e}") from e
    instances = instances[:limit] if limit else instances
    if tasks.get("cluster_images") or any(i.test_spec is None for i in instances) and (
        tasks.get("mirrors") or tasks.get("url_template")):
      from orchard_jax.recipes.swe.datasets import prepare_dataset
      instances = prepare_dataset(tasks, instances, progress=progress)
    return instances
  else:
    task_set = builder.build_task_set(build_settings(tasks), output_dir=tasks.output_dir or None,
                                      rebuild=bool(tasks.rebuild), progress=progress)
    if not task_set.from_cache:
      print(task_set.summary(), flush=True)
    instances = task_set.instances
  return instances[:limit] if limit else instances


def agent_config(agent: ConfigDict, workdir: str = "/testbed"):
  """harness.AgentConfig from a `common.swe_agent()` ConfigDict."""
  from orchard_jax.harness import AgentConfig
  return AgentConfig(step_limit=int(agent.step_limit),
                     wall_time_limit_s=float(agent.wall_time_limit_s),
                     max_consecutive_format_errors=int(agent.max_consecutive_format_errors),
                     command_timeout_s=float(agent.command_timeout_s),
                     output_limit_chars=int(agent.output_limit_chars), workdir=workdir)


def cached_expert_trajectories(instances: Sequence[SWEInstance], client, store, *,
                               variants: Sequence[str], agent_config, experiment: str,
                               parallel: int = 2, seed: int = 0) -> list[data.Trajectory]:
  """Replay-expert trajectories (executed and graded in sandboxes) for `instances`, from the
  store when it already holds them (same experiment, task and variant), else run and stored."""
  from orchard_jax.tasks.swe.expert import expert_trajectories
  have = {}
  for t in store.trajectories(experiment=experiment):
    variant = (t.metadata.get("expert") or {}).get("variant")
    if variant:
      have[(t.task_id, variant)] = t
  todo = [i for i in instances if any((i.instance_id, v) not in have for v in variants)]

  def run(instance):
    missing = [v for v in variants if (instance.instance_id, v) not in have]
    return expert_trajectories([instance], client, variants=missing, agent_config=agent_config,
                               seed=seed, experiment=experiment)

  if todo:
    _log.info("replay expert: %d instances x %s", len(todo), list(variants))
    with concurrent.futures.ThreadPoolExecutor(max(1, min(parallel, len(todo)))) as pool:
      for trajectories in pool.map(run, todo):
        for t in trajectories:
          store.append_trajectory(t)
          have[(t.task_id, t.metadata["expert"]["variant"])] = t
  wanted = {i.instance_id for i in instances}
  return [t for (task, variant), t in sorted(have.items())
          if task in wanted and variant in variants]


class SWEDomain:
  """The SWE domain (module docstring).

  The harness is `agent.harness`: the built-in bash agent, or an external one (mini-swe-agent,
  Codex CLI, Claude Code) run inside the task's sandbox against the proxy's session URL
  (harness.py). Exit statuses: "Submitted" ends an episode by the agent's decision;
  "LimitsExceeded" (out of steps) is truncated; "TimeExceeded" (the wall-time limit) and
  "ModelError" (a model call that failed after retries) are aborted; an external harness that
  exits non-zero ("HarnessFailed") is an ordinary failure. Grading statuses follow SWE-bench
  ("resolved", "unresolved", "error"); an evaluation that cannot run raises and aborts the
  rollout.
  """

  name = "swe"
  rubrics = judge_lib.RUBRIC_SET
  aborted_statuses = frozenset({"TimeExceeded", "ModelError"})
  truncated_statuses = frozenset({"LimitsExceeded"})
  submitted_statuses = frozenset({"Submitted"})

  def __init__(self, config: ConfigDict):
    self.config = config

  # ------------------------------------------------------------------ settings and tasks

  def check_config(self, job: str) -> None:
    """Refuses an unknown agent.harness (or a CLI that is not installed; see harness.py),
    annotator.kind (sft, rl), judge.kind (rl with RPR) or tasks.selection before any work."""
    c = self.config
    harness_lib.check_harness_config(c)
    if job in ("sft", "rl") and c.annotator.kind not in annotate.ANNOTATOR_KINDS:
      raise ConfigError(f"annotator.kind is {c.annotator.kind!r}; expected one of "
                        f"{annotate.ANNOTATOR_KINDS}")
    if job == "rl" and c.rl.reward == "rpr" and c.judge.kind not in judge_lib.JUDGE_KINDS:
      raise ConfigError(f"judge.kind is {c.judge.kind!r}; expected one of "
                        f"{judge_lib.JUDGE_KINDS}")
    if "selection" in c.tasks and c.tasks.selection not in selection.SELECTIONS:
      raise ConfigError(f"tasks.selection is {c.tasks.selection!r}; expected one of "
                        f"{selection.SELECTIONS}")

  def load_tasks(self) -> list[SWEInstance]:
    return load_task_set(self.config.tasks, progress=bool(self.config.get("progress", True)))

  def task_id(self, task: SWEInstance) -> str:
    return task.instance_id

  def environment(self):
    """Orchard Env; the local backend shows the external harnesses' install folder (the CLIs
    run inside the sandboxes from there)."""
    from orchard_jax.harness import install
    shown = [install.harness_dir()] if os.path.isdir(install.harness_dir()) else []
    return sandbox_client(self.config.env, shared_paths=shown)

  def _subset(self, run, count: int) -> list[SWEInstance]:
    t = self.config.tasks
    try:
      return selection.training_subset(run.train_all, count=count, selection=t.selection,
                                       per_package=int(t.get("per_package", 0)),
                                       tokenizer=run.tokenizer)
    except TaskError as e:
      raise ConfigError(str(e)) from e

  def training_subset(self, run, env) -> list[SWEInstance]:
    """tasks.train_tasks instances by tasks.selection; with the replay expert as SFT source,
    candidates whose gold trajectory does not resolve, or is longer than sft.max_tokens, are
    replaced by the next ones (such a task would give SFT no positive example)."""
    from orchard_jax.recipes.agentic.sft import trajectory_sequences
    c = self.config
    wanted = int(c.tasks.train_tasks)
    if (env is None or c.tasks.selection == "all" or wanted <= 0 or c.sft.source != "expert"
        or "gold" not in tuple(c.sft.variants)):
      return self._subset(run, wanted)
    pool = self._subset(run, len(run.train_all))
    chosen: list[SWEInstance] = []
    start = 0
    while len(chosen) < wanted and start < len(pool):
      batch = pool[start:start + (wanted - len(chosen))]
      start += len(batch)
      gold = self._expert(run, batch, env, variants=("gold",))
      limit = int(c.sft.max_tokens)
      solved = {t.task_id for t in gold if t.resolved and sum(
          len(q) for q in trajectory_sequences(t, run.tokenizer, run.store)) <= limit}
      skipped = [i.instance_id for i in batch if i.instance_id not in solved]
      if skipped:
        _log.warning("training subset: the replay expert's gold run does not resolve %s within "
                     "%d tokens; taking the next candidates", skipped, limit)
      chosen += [i for i in batch if i.instance_id in solved]
    return chosen

  # ------------------------------------------------------------------ episodes

  def agent_config(self):
    return agent_config(self.config.agent)

  def run_episode(self, task: SWEInstance, env, base_url: str, *, model: str, session_id: str,
                  attempt: int, sampling: Mapping[str, Any],
                  log_dir: Optional[str]) -> data.Trajectory:
    name = str(self.config.agent.get("harness", "bash"))
    if name != "bash":
      return harness_lib.run_cli_episode(
          task, env, base_url, harness=name, model=model, agent=self.agent_config(),
          session_id=session_id, attempt=attempt, sampling=sampling, evaluate_patch=False,
          log_dir=log_dir)
    return episode.run_episode(task, env, base_url, model=model, config=self.agent_config(),
                               session_id=session_id, attempt=attempt, sampling=sampling)

  def grade(self, task: SWEInstance, trajectory: data.Trajectory, env, *,
            log_dir: Optional[str]) -> Outcome:
    graded = episode.grade(task, trajectory.submission, env, log_dir=log_dir)
    details = {"error": graded.error, "eval_seconds": graded.seconds}
    return Outcome(resolved=graded.resolved, status=graded.outcome,
                   details={**details, **(graded.tests.to_dict() if graded.tests else {})})

  # ------------------------------------------------------------------ judging and seed data

  def make_judge(self):
    return judge_lib.make_judge(self.config.judge)

  def make_annotator(self):
    return annotate.make_annotator(self.config.annotator)

  def _expert(self, run, tasks, env, *, variants) -> list[data.Trajectory]:
    c = self.config
    expert = dataclasses.replace(self.agent_config(), step_limit=max(int(c.agent.step_limit), 50))
    return cached_expert_trajectories(tasks, env, run.store, variants=variants,
                                      agent_config=expert, experiment=f"{c.name}-expert",
                                      parallel=int(c.env.max_parallel), seed=int(c.seed))

  def seed_trajectories(self, run, tasks, env) -> list[data.Trajectory]:
    """The replay expert's sft.variants on `tasks`, executed and graded once, then read from
    the run's store. Its agent config is the rollouts' (same prompts and observation limits, so
    SFT data looks like what the policy sees), with room for the whole plan.

    With an external harness with a shell tool (codex, claude_code), the expert's gold plan
    (its sft.harness_expert_steps) is played through that harness instead, so SFT teaches the
    format the rollouts will see: the harness's system prompt, tools and shell tool
    (harness.harness_expert_trajectory)."""
    c = self.config
    name = str(c.agent.get("harness", "bash"))
    if name not in ("codex", "claude_code"):
      return self._expert(run, tasks, env, variants=tuple(c.sft.variants))
    experiment = f"{c.name}-expert-{name}"
    have = {t.task_id: t for t in run.store.trajectories(experiment=experiment)}
    agent = dataclasses.replace(self.agent_config(), step_limit=max(int(c.agent.step_limit), 50))
    steps = tuple(c.sft.get("harness_expert_steps", ("edit",)))
    out = []
    for task in tasks:
      if task.instance_id not in have:
        _log.info("replay expert through %s: %s", name, task.instance_id)
        trajectory = harness_lib.harness_expert_trajectory(
            task, env, run.store, harness=name, agent=agent, steps=steps, experiment=experiment,
            seed=int(c.seed), model_name=str(c.engine.get("served_model_name", "policy")))
        run.store.append_trajectory(trajectory)
        have[task.instance_id] = trajectory
      out.append(have[task.instance_id])
    return out
