"""The Orchard-SWE recipe: task set, sandboxes, evaluation (SFT and RL stages build on these).

Jobs:
  swe.build_tasks  build (or load from the cache) the task set and print what was tried, kept
                   and dropped                                   (experiments/swe_tasks.py)
  swe.evaluate     evaluate predictions ("gold", "empty" or a predictions file) in fresh
                   sandboxes and write per-instance reports + a summary (experiments/swe_eval.py)

Reusable pieces for later stages:
  load_task_set(config.tasks) -> list[SWEInstance]
  sandbox_client(config.env)  -> context manager yielding an Orchard Env SandboxClient
  sandbox_factory(client)     -> instance -> context manager yielding a fresh task Sandbox
  evaluate_patches(instances, predictions, client, output_dir, ...) -> EvalSummary
  expert_trajectories(instances, client, variants, ...) -> list of data.Trajectory
  run_episode(instance, client, base_url, ...) -> data.Trajectory (agent run + grading)
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Iterator, Mapping, Sequence

from ml_collections import ConfigDict

from orchard_jax.tasks.swe import builder, evaluation, testbed
from orchard_jax.tasks.swe.instance import SWEInstance, load_instances

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- task set


def build_settings(tasks: ConfigDict) -> builder.BuildSettings:
  """BuildSettings from a `common.swe_tasks()` ConfigDict."""
  return builder.BuildSettings(
      packages=tuple(tasks.packages), instances_per_package=int(tasks.instances_per_package),
      max_candidates_per_package=int(tasks.max_candidates_per_package),
      seconds_per_package=float(tasks.seconds_per_package), workers=int(tasks.workers),
      test_timeout_s=float(tasks.test_timeout_s), seed=int(tasks.seed), python=tasks.python)


def load_task_set(tasks: ConfigDict, *, progress: bool = True) -> list[SWEInstance]:
  """The instances the config names: a dataset file, or the default set (built if missing)."""
  if tasks.dataset:
    instances = load_instances(tasks.dataset)
  else:
    task_set = builder.build_task_set(build_settings(tasks), output_dir=tasks.output_dir or None,
                                      rebuild=bool(tasks.rebuild), progress=progress)
    if not task_set.from_cache:
      print(task_set.summary(), flush=True)
    instances = task_set.instances
  return instances[:tasks.limit] if tasks.get("limit", 0) else instances


def build_tasks(config: ConfigDict) -> builder.TaskSet:
  """Job "swe.build_tasks": builds or loads the task set and prints its build report."""
  task_set = builder.build_task_set(build_settings(config.tasks),
                                    output_dir=config.tasks.output_dir or None,
                                    rebuild=bool(config.tasks.rebuild),
                                    progress=bool(config.get("progress", True)))
  print(task_set.summary(), flush=True)
  return task_set


# ----------------------------------------------------------------------------- sandboxes


@contextlib.contextmanager
def sandbox_client(env: ConfigDict) -> Iterator:
  """An Orchard Env client: to `env.url` if set, else to an in-process local-backend service."""
  from orchard_jax.env.client import SandboxClient
  if env.url:
    with SandboxClient(env.url, env.api_key or None) as client:
      yield client
    return
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.orchestrator import Orchestrator
  with Orchestrator(LocalBackend()) as service, \
      SandboxClient(service.url, service.api_key) as client:
    yield client


def sandbox_factory(client, **create_kwargs):
  """`instance -> context manager yielding a fresh Sandbox` started from its test_spec image."""
  def factory(instance: SWEInstance):
    return testbed.open_sandbox(client, instance.test_spec.image, **create_kwargs)
  return factory


# ----------------------------------------------------------------------------- evaluation


def evaluate_patches(instances: Sequence[SWEInstance], predictions: Mapping[str, str], client, *,
                     output_dir: str, max_workers: int = 2,
                     progress: bool = True) -> evaluation.EvalSummary:
  """Evaluates {instance_id: patch} in fresh sandboxes of `client` (see tasks.swe.evaluation)."""
  return evaluation.evaluate_predictions(instances, predictions,
                                         sandbox_factory=sandbox_factory(client),
                                         output_dir=output_dir, max_workers=max_workers,
                                         progress=progress)


def evaluate(config: ConfigDict) -> evaluation.EvalSummary:
  """Job "swe.evaluate": grades config.predictions on the task set; prints the summary."""
  logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per sandbox call otherwise
  instances = load_task_set(config.tasks, progress=bool(config.get("progress", True)))
  predictions = evaluation.load_predictions(config.predictions, instances)
  name = config.run_id or os.path.splitext(os.path.basename(config.predictions))[0]
  output_dir = os.path.join(config.output_dir, name)
  with sandbox_client(config.env) as client:
    summary = evaluate_patches(instances, predictions, client, output_dir=output_dir,
                               max_workers=int(config.env.max_parallel),
                               progress=bool(config.get("progress", True)))
  print(summary.table(), flush=True)
  return summary


# ----------------------------------------------------------------------------- seed data


def expert_trajectories(instances: Sequence[SWEInstance], client, *,
                        variants: Sequence[str] = ("gold", "detour", "wrong_fix", "give_up"),
                        agent_config=None, output_dir: str | None = None, seed: int = 0,
                        experiment: str | None = None) -> list:
  """Executes the replay expert's variants on each instance and grades every submission.

  A variant that does not apply to an instance (e.g. "partial" on a one-hunk patch) is skipped.
  Returns `data.Trajectory` objects (outcome filled, expert evidence in metadata); with
  `output_dir`, each is also written as a mini-swe-agent `*.traj.json` file there.
  """
  from orchard_jax.data.miniswe import write_miniswe_trajectory
  from orchard_jax.harness import AgentConfig, HarnessError, run_expert
  factory = sandbox_factory(client)
  config = agent_config or AgentConfig()

  def grade(instance, patch):
    with factory(instance) as sandbox:
      return evaluation.evaluate_in_sandbox(sandbox, instance, patch)

  trajectories = []
  for instance in instances:
    for attempt, variant in enumerate(variants):
      try:
        run = run_expert(instance, variant, sandbox_factory=factory, evaluate=grade,
                         config=config, seed=seed + attempt)
      except HarnessError as e:
        _log.info("expert variant %s skipped on %s: %s", variant, instance.instance_id, e)
        continue
      trajectory = run.to_trajectory(instance.instance_id, attempt=attempt, experiment=experiment)
      trajectories.append(trajectory)
      if output_dir:
        write_miniswe_trajectory(trajectory, os.path.join(
            output_dir, variant, instance.instance_id, f"{instance.instance_id}.traj.json"))
  return trajectories


# ----------------------------------------------------------------------------- agent episodes


def agent_config(agent: ConfigDict, workdir: str = "/testbed"):
  """harness.AgentConfig from a `common.swe_agent()` ConfigDict."""
  from orchard_jax.harness import AgentConfig
  return AgentConfig(step_limit=int(agent.step_limit),
                     wall_time_limit_s=float(agent.wall_time_limit_s),
                     max_consecutive_format_errors=int(agent.max_consecutive_format_errors),
                     command_timeout_s=float(agent.command_timeout_s),
                     output_limit_chars=int(agent.output_limit_chars), workdir=workdir)


def run_episode(instance: SWEInstance, client, base_url: str, *, model: str = "default",
                config=None, session_id: str | None = None, attempt: int = 0,
                sampling: Mapping | None = None, evaluate_patch: bool = True,
                log_dir: str | None = None):
  """One rollout: the bash agent on `instance` in a fresh sandbox, then grading in another.

  Args:
    instance: an instance with a test_spec.
    client: an Orchard Env SandboxClient.
    base_url: the model's OpenAI-compatible base URL, normally the recording proxy's
      `http://HOST:PORT/sessions/{session_id}/v1`.
    model: the `model` field of requests.
    config: harness.AgentConfig (its workdir is replaced by the instance's).
    session_id: the proxy session, stored on the trajectory so its model calls can be joined.
    attempt: attempt number of this instance.
    sampling: extra ChatModel keywords (temperature, max_tokens, top_p).
    evaluate_patch: grade the submission (outcome "resolved"/... in `trajectory.outcome`).
    log_dir: evaluation logs folder.

  Returns:
    A `data.Trajectory` with the harness messages, exit status, submission and outcome.
  """
  from orchard_jax.harness import AgentConfig, BashAgent, ChatModel
  workdir = instance.test_spec.workdir
  config = dataclasses.replace(config or AgentConfig(), workdir=workdir)
  factory = sandbox_factory(client)
  with factory(instance) as sandbox:
    ready = sandbox.run(testbed.setup_script(instance, workdir=workdir), timeout_s=300)
    if ready.exit_code != 0:
      raise evaluation.EvaluationError(
          f"{instance.instance_id}: workspace setup failed: {ready.output[-500:]}")
    with ChatModel(base_url, model, **dict(sampling or {})) as chat:
      result = BashAgent(chat, sandbox, config).run(instance.problem_statement)
  trajectory = result.to_trajectory(task_id=instance.instance_id, attempt=attempt,
                                    session_id=session_id)
  if evaluate_patch:
    with factory(instance) as sandbox:
      graded = evaluation.evaluate_in_sandbox(sandbox, instance, result.submission,
                                              log_dir=log_dir)
    trajectory.outcome = {"resolved": graded.resolved, "status": graded.outcome,
                          **(graded.tests.to_dict() if graded.tests else {})}
  return trajectory
