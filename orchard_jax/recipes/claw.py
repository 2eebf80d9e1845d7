"""The Orchard-Claw recipe: the Claw domain on the agentic loop (docs/algorithms.md section 8).

Jobs (configs in experiments/claw_*.py, fields from experiments/common.claw_base):
  claw.tasks      build (or read from the cache) the synthetic training set and print what it
                  holds beside the evaluation set                (experiments/claw_tasks.py)
  claw.sft        SFT on the reference solutions played through the harness, or on a
                  trajectory store (e.g. a teacher's)            (experiments/claw_sft.py)
  claw.rl         SFT warm start, then GRPO with BAR on the synthetic tasks: every model call of
                  a rollout trains with its rollout's +-1 reward      (experiments/claw_rl.py)
  claw.evaluate   a checkpoint on the evaluation tasks, k trials each, with the configured
                  harness: pass@k and pass^k per service and overall (experiments/claw_eval.py)

This module holds the domain only (`ClawDomain`); tasks/claw holds the services, tasks, graders
and scoring, harness/ the agents, and recipes/agentic everything else.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import evaluation, jobs, run_dir
from orchard_jax.recipes.agentic.evaluation import GroupSummary
from orchard_jax.recipes.agentic.domain import Annotation, Outcome
from orchard_jax.recipes.agentic.sandboxes import sandbox_client
from orchard_jax.tasks import claw
from orchard_jax.tasks.claw import solutions, synth

_log = logging.getLogger(__name__)

HARNESSES = ("react", "codex", "claude_code")
SELECTIONS = ("spread", "first", "shortest")
CLI_CONTEXT_TOKENS = 24576    # Codex's first prompt is ~8.4k tokens, Claude Code's ~15.9k
EXTERNAL_PROMPT = (
    "\n\nYou act on the user's data only through the `claw` command in your shell: `claw tools` "
    "lists the tools and their JSON arguments, `claw call TOOL '<json arguments>'` runs one and "
    "prints its result. When the work is done, reply with a short final answer.")


def _agent(config: ConfigDict, task: claw.Task, model):
  """The built-in ReAct agent on `task`, its model a ChatModel-like object."""
  from orchard_jax.harness import ToolAgent, ToolAgentConfig
  a = config.agent
  steps = int(a.step_limit) if not task.max_steps else min(int(a.step_limit), task.max_steps)
  limits = ToolAgentConfig(step_limit=steps, wall_time_limit_s=float(a.wall_time_limit_s),
                           max_consecutive_format_errors=int(a.max_consecutive_format_errors),
                           max_tool_calls_per_turn=int(a.max_tool_calls_per_turn),
                           output_limit_chars=int(a.output_limit_chars),
                           system_prompt=claw.system_prompt(task))
  return lambda world, backend, instruction: ToolAgent(model, backend, limits).run(instruction)


def play_scripted(task: claw.Task, env=None, *, which: str = "reference", seed: int = 0,
                  world_options: Optional[dict] = None) -> claw.Episode:
  """One episode of the task's scripted solution through the ReAct harness: in a fresh
  sandbox of `env`, or in-process (`LocalWorld`) when env is None."""
  from orchard_jax.harness import ToolAgent, ToolAgentConfig
  steps = solutions.solution_steps(task, which)
  limits = ToolAgentConfig(system_prompt=claw.system_prompt(task), step_limit=4 * len(steps) + 4)
  agent = lambda world, backend, instruction: ToolAgent(  # noqa: E731
      solutions.ScriptedModel(steps), backend, limits).run(instruction)
  return claw.run_episode(task, env, agent, seed=seed, world_options=world_options)


class OutcomeAnnotator:
  """Credit for SFT from the outcome alone: V rises from 0 to 1 over a passed trajectory and
  stays 0 on a failed one (so credit-assignment SFT keeps the passed ones, every action)."""

  def annotate(self, trajectory: data.Trajectory, task: Any) -> Annotation:
    steps = sum(1 for m in trajectory.messages if m.get("role") == "assistant")
    value = 1.0 if trajectory.resolved else 0.0
    if steps <= 1:
      return Annotation([0], [value], max(steps, 1), "outcome")
    return Annotation([0, steps - 1], [0.0, value], steps, "outcome")


class ClawDomain:
  """Personal-assistant tasks on sandboxed services, scored the Claw-Eval way.

  Tasks: the synthetic training set (train) and the hand-written evaluation set (held out);
  `split_tasks` keeps them apart whatever tasks.heldout_fraction says. Episodes: the configured
  harness acts on the task's services in a fresh sandbox; the world's audit log and state are
  graded before the sandbox goes (`run_episode` keeps the grade on the trajectory, `grade`
  reads it back). Statuses: "Submitted" is the agent's own end; "LimitsExceeded" is truncated
  (-1); "ModelError", "TimeExceeded" (the 10-minute budget), "aborted" (a service died) and
  "grader_error" abort the rollout.
  """

  name = "claw"
  rubrics = None
  aborted_statuses = frozenset({"ModelError", "TimeExceeded", "aborted", "grader_error"})
  truncated_statuses = frozenset({"LimitsExceeded"})
  submitted_statuses = frozenset({"Submitted"})

  def __init__(self, config: ConfigDict):
    self.config = config

  # ------------------------------------------------------------------ settings and tasks
  def check_config(self, job: str) -> None:
    c = self.config
    if c.agent.harness not in HARNESSES:
      raise ConfigError(f"agent.harness is {c.agent.harness!r}; expected one of {HARNESSES}")
    if c.tasks.selection not in SELECTIONS:
      raise ConfigError(f"tasks.selection is {c.tasks.selection!r}; expected one of {SELECTIONS}")
    if int(c.tasks.synth_count) < 1 and not c.tasks.train_file:
      raise ConfigError("tasks.synth_count must be >= 1 (or name tasks.train_file)")
    for field in ("train_file", "eval_dir"):
      path = c.tasks.get(field)
      if path and not os.path.exists(path):
        raise ConfigError(f"tasks.{field}: {path!r} does not exist")
    if c.rubric_judge.kind not in ("none", "llm"):
      raise ConfigError(f"rubric_judge.kind is {c.rubric_judge.kind!r}; expected 'none' or 'llm'")
    if c.rubric_judge.kind == "llm" and not c.rubric_judge.url:
      raise ConfigError("rubric_judge.kind is 'llm' but rubric_judge.url is empty")
    if c.agent.harness != "react":
      from orchard_jax.harness import HarnessError, install
      try:
        install.executable(c.agent.harness)
      except HarnessError as e:
        raise ConfigError(f"agent.harness={c.agent.harness}: {e}") from None
      for block, field in (("engine", "max_seq_len"), ("rl", "seq_len")):
        if int(c[block][field]) < CLI_CONTEXT_TOKENS and not (
            block == "engine" and str(c.engine.urls).strip()):
          print(f"agent.harness={c.agent.harness}: {block}.{field} raised from "
                f"{c[block][field]} to {CLI_CONTEXT_TOKENS} (the CLI's own first prompt is "
                "8-16k tokens)", flush=True)
          c[block][field] = CLI_CONTEXT_TOKENS
    if job in ("sft", "rl") and c.sft.source == "expert" and c.agent.harness != "react":
      _log.info("SFT seed trajectories come from the built-in harness; rollouts use %s",
                c.agent.harness)

  def _evaluation_tasks(self) -> list[claw.Task]:
    eval_dir = self.config.tasks.get("eval_dir")
    return claw.load_tasks(eval_dir) if eval_dir else claw.eval_tasks()

  def load_tasks(self) -> list[claw.Task]:
    """The training tasks (synthetic, validated, cached; or tasks.train_file) then the
    evaluation tasks. Raises ConfigError when a training task coincides with an evaluation
    task."""
    from orchard_jax.tasks.claw.task import overlap
    t = self.config.tasks
    evaluation = self._evaluation_tasks()
    try:
      if t.train_file:
        train = [task for task in claw.load_tasks(t.train_file)]
      else:
        train, _ = synth.training_set(
            int(t.synth_count), int(t.synth_seed), lambda task: play_scripted(task).outcome,
            evaluation=evaluation, distractors=int(t.distractor_tools), progress=print)
    except claw.TaskFormatError as e:
      raise ConfigError(f"tasks: {e}") from e
    clash = overlap(train, evaluation)
    if clash:
      raise ConfigError(f"training tasks coincide with evaluation tasks: {clash[:5]}")
    for task in train:
      if task.split != "train":
        raise ConfigError(f"tasks.train_file: task {task.id!r} has split {task.split!r}")
    return list(train) + list(evaluation)

  def split_tasks(self, tasks: Sequence[claw.Task]) -> tuple[list, list]:
    """(training tasks, evaluation tasks), by each task's split."""
    return ([t for t in tasks if t.split == "train"], [t for t in tasks if t.split == "eval"])

  def task_id(self, task: claw.Task) -> str:
    return task.id

  def environment(self):
    """Orchard Env; the local backend shows the external harnesses' install folder (their CLIs
    run inside the sandboxes from there)."""
    from orchard_jax.harness import install
    shown = [install.harness_dir()] if os.path.isdir(install.harness_dir()) else []
    return sandbox_client(self.config.env, shared_paths=shown)

  def training_subset(self, run, env) -> list[claw.Task]:
    """tasks.train_tasks of the training tasks (0: all), chosen by tasks.selection: "spread"
    (templates in turn), "first", or "shortest" (fewest solution steps, then the shortest tool
    schemas and instruction: the cheapest to learn on a small preset)."""
    t = self.config.tasks
    pool = list(run.train_all)
    if t.selection == "shortest":    # fewest solution steps, then the shortest prompt text
      pool.sort(key=lambda task: (len(task.reference), len(json.dumps(
          claw.openai_tools(task.tools))) + len(task.instruction), task.id))
    elif t.selection == "spread":
      by_template: dict[str, list] = {}
      for task in pool:
        by_template.setdefault(task.template or task.category, []).append(task)
      pool = [queue[i] for i in range(max(map(len, by_template.values()), default=0))
              for queue in by_template.values() if i < len(queue)]
    count = int(t.train_tasks)
    return pool[:count] if count > 0 else pool

  # ------------------------------------------------------------------ episodes
  def _world_options(self) -> dict:
    s = self.config.sandbox
    return dict(image=s.image, cpu=float(s.cpu), memory=s.memory, disk=s.disk,
                call_timeout_s=float(s.call_timeout_s))

  def _rubric_grader(self):
    j = self.config.rubric_judge
    if j.kind != "llm":
      return None
    from orchard_jax.recipes.agentic.llm import chat_model
    return claw.RubricGrader(chat_model(j, temperature=float(j.temperature),
                                        max_tokens=int(j.max_tokens)))

  def run_episode(self, task: claw.Task, env, base_url: str, *, model: str, session_id: str,
                  attempt: int, sampling: Mapping[str, Any],
                  log_dir: Optional[str]) -> data.Trajectory:
    """The configured harness on `task` in a fresh sandbox, graded there (module docstring).
    The fault injector's seed is the attempt's sampling seed, so trials meet different faults
    and a repeated evaluation the same ones."""
    from orchard_jax.harness import ChatModel
    harness = self.config.agent.harness
    seed = int(sampling.get("seed", attempt) or 0)
    if harness == "react":
      with ChatModel(base_url, model, timeout_s=float(self.config.agent.model_timeout_s),
                     **dict(sampling)) as chat:
        episode = claw.run_episode(task, env, _agent(self.config, task, chat), seed=seed,
                                   rubric_grader=self._rubric_grader(),
                                   world_options=self._world_options())
    else:
      episode = claw.run_episode(
          task, env, self._external_agent(harness, task, base_url, model, sampling), seed=seed,
          rubric_grader=self._rubric_grader(),
          world_options={**self._world_options(), "egress": [base_url]})
    return _trajectory(task, episode, attempt, session_id, harness)

  def _external_agent(self, harness: str, task: claw.Task, base_url: str, model: str,
                      sampling: Mapping[str, Any]):
    """An external CLI harness (harness.cli_harness) inside the world's sandbox: the task's
    tools through the `claw` command beside it, its model through the proxy's session URL
    (the sandbox's egress allow-list holds only that endpoint)."""
    from orchard_jax.harness.cli_harness import HarnessLimits, get_cli_harness, run_cli_harness
    cli = get_cli_harness(harness)
    a = self.config.agent
    limits = HarnessLimits(timeout_s=float(a.wall_time_limit_s), max_turns=int(a.step_limit),
                           context_window=int(self.config.engine.max_seq_len),
                           max_output_tokens=int(sampling.get("max_tokens") or 4096))

    def agent(world, backend, instruction):
      world.install_tools(task.tools)
      prompt = f"{claw.system_prompt(task)}\n\n{instruction}{EXTERNAL_PROMPT}"
      run = run_cli_harness(cli, world.box, prompt, base_url=world.box.egress_url(base_url),
                            workdir="/tmp/claw", model=model, limits=limits)
      return ExternalRun(harness, run)
    return agent

  def grade(self, task: claw.Task, trajectory: data.Trajectory, env, *,
            log_dir: Optional[str]) -> Outcome:
    """The grade `run_episode` computed while the world was alive (its audit log and state)."""
    graded = trajectory.metadata.get("claw")
    if graded is None:
      raise claw.GraderError(f"trajectory {trajectory.trajectory_id} carries no Claw grade")
    return Outcome(resolved=graded["status"] == "passed", status=graded["status"], details={
        k: graded[k] for k in ("task_score", "completion", "robustness", "safety", "error")})

  # ------------------------------------------------------------------ judging and seed data
  def make_judge(self):
    return None

  def make_annotator(self):
    return OutcomeAnnotator()

  def seed_trajectories(self, run, tasks: Sequence[claw.Task], env) -> list[data.Trajectory]:
    """The tasks' reference solutions played through the ReAct harness in sandboxes and graded
    (the same messages and tool schemas a model's run produces), stored once in the run's store
    under experiment <name>-reference and read back after."""
    experiment = f"{self.config.name}-reference"
    have = {t.task_id: t for t in run.store.trajectories(experiment=experiment)}
    out = []
    for task in tasks:
      if task.id not in have:
        episode = play_scripted(task, env, world_options=self._world_options())
        trajectory = _trajectory(task, episode, 0, None, "react")
        trajectory.trajectory_id = f"{task.id}-reference"
        trajectory.experiment = experiment
        trajectory.outcome = self.grade(task, trajectory, env, log_dir=None).to_dict()
        run.store.append_trajectory(trajectory)
        have[task.id] = trajectory
      out.append(have[task.id])
    return out


class ExternalRun:
  """An external harness's run as an episode sees it: its exit status ("Submitted" when the
  CLI ended by itself, "TimeExceeded" when it was killed at its time limit, "HarnessFailed"
  otherwise), its final answer read from its event stream, and its logs."""

  def __init__(self, harness: str, run):
    self.harness, self.run = harness, run
    self.exit_status = ("TimeExceeded" if run.timed_out else "Submitted" if run.exit_code == 0
                        else "HarnessFailed")
    self.answer = final_answer(run.output)
    self.messages: list = []
    self.abort_reason = None


def final_answer(output: str) -> str:
  """The last answer in a CLI's JSON-lines event stream: Codex's `item.completed` agent
  message or Claude Code's `result` event ("" when there is none)."""
  answer = ""
  for line in (output or "").splitlines():
    line = line.strip()
    if not line.startswith("{"):
      continue
    try:
      event = json.loads(line)
    except ValueError:
      continue
    item = event.get("item") if isinstance(event.get("item"), dict) else {}
    if event.get("type") == "item.completed" and item.get("type") == "agent_message":
      answer = str(item.get("text") or "")
    elif event.get("type") == "result" and isinstance(event.get("result"), str):
      answer = event["result"]
  return answer.strip()


def _trajectory(task: claw.Task, episode: claw.Episode, attempt: int,
                session_id: Optional[str], harness: str) -> data.Trajectory:
  run, outcome = episode.run, episode.outcome
  if run is not None and hasattr(run, "to_trajectory"):
    trajectory = run.to_trajectory(task_id=task.id, attempt=attempt, session_id=session_id)
  else:
    trajectory = data.Trajectory(
        trajectory_id=session_id or f"{task.id}-{attempt}", task_id=task.id, attempt=attempt,
        session_id=session_id, exit_status=episode.exit_status,
        submission=getattr(run, "answer", "") or "", tools=claw.openai_tools(task.tools))
  trajectory.metadata.update({
      "harness": harness, "claw": outcome.to_dict(), "services": list(task.services),
      "startup_s": round(episode.startup_s, 3), "episode_s": round(episode.seconds, 3),
      "audit_calls": len(episode.evidence.audit) if episode.evidence else 0})
  if outcome.status == "aborted":
    trajectory.exit_status = "aborted"
  return trajectory


# ----------------------------------------------------------------------------- jobs
def build_tasks(config: ConfigDict) -> dict:
  """Job "claw.tasks": the training set (built and validated, or read from the cache) and the
  evaluation set, with counts per template, service and fault."""
  domain = ClawDomain(config)
  domain.check_config("tasks")
  train, evaluation = domain.split_tasks(domain.load_tasks())
  summary = {"train": len(train), "eval": len(evaluation),
             "train_with_faults": sum(t.has_faults for t in train),
             "eval_with_faults": sum(t.has_faults for t in evaluation),
             "train_per_service": _count(s for t in train for s in t.services),
             "eval_per_service": _count(s for t in evaluation for s in t.services)}
  print(json.dumps(summary, indent=1), flush=True)
  return summary


def sft(config: ConfigDict) -> dict:
  """Job "claw.sft": the loop's SFT with the Claw domain."""
  return jobs.train_sft(config, ClawDomain(config))


def train_rl(config: ConfigDict) -> dict:
  """Job "claw.rl": the loop's RL job with the Claw domain."""
  return jobs.train_rl(config, ClawDomain(config))


def evaluate(config: ConfigDict) -> dict:
  """Job "claw.evaluate": the checkpoint on the evaluation tasks, eval.k trials each, with
  agent.harness; prints pass@k and pass^k per service and overall (and each trial's mean
  task_score) beside the loop's pass@1 report, then where the rollouts spent their time
  (`rollout_times`); writes <run>/eval/claw_summary.json and rollout_times.json."""
  domain = ClawDomain(config)
  services = {t.id: t.services for t in domain._evaluation_tasks()}
  result = jobs.evaluate_groups(
      config, domain, {"service": services}, name="claw", trial_score=_task_score,
      header=f"harness {config.agent.harness}, checkpoint {config.checkpoint}:",
      extra={"harness": config.agent.harness})
  store_path = config.store.path or os.path.join(run_dir(config), "store")
  if os.path.isdir(store_path):
    with data.TrajectoryStore(store_path) as store:
      result["rollout_times"] = rollout_times(store, f"{config.name}-eval")
    print(format_rollout_times(result["rollout_times"]), flush=True)
    path = os.path.join(config.eval.output_dir or run_dir(config), "eval", "rollout_times.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      json.dump(result["rollout_times"], f, indent=1)
  return result


def _task_score(trajectory: data.Trajectory) -> float:
  return float((trajectory.metadata.get("claw") or {}).get("task_score", 0.0))


def claw_summary(report: Mapping[str, Any], services: Mapping[str, Sequence[str]],
                 scores: Mapping[tuple, float], k: int) -> dict[str, GroupSummary]:
  """pass@k / pass^k per service and overall ("all") from the loop's evaluation report and
  each trial's task_score (the table claw.evaluate prints). A trial is aborted exactly when the
  loop counted it aborted (its exit or outcome status is one of ClawDomain.aborted_statuses, or
  the rollout raised or ran out of time), so the aborted column sums to the loop's own count."""
  trials = evaluation.report_trials(report, scores)
  return evaluation.summarize_groups(trials, {i: services.get(i, ()) for i in trials}, k)


def rollout_times(store: data.TrajectoryStore, experiment: str) -> dict:
  """Where the rollouts of `experiment` spent their time, read back from the store.

  Per rollout: `startup_s` (sandbox create until every service answers, `ClawWorld`),
  `model_s` (the sum of its model calls as the recording proxy timed them: engine queueing,
  prefill and decode), `other_s` (the rest of the episode: tool calls through the sandbox,
  the harness, grading) and its number of model calls. Tokens: `first_prompt_tokens` (every
  rollout's first prompt, prefilled in full unless the engine's prefix cache holds it),
  `later_prompt_tokens` (what later calls add beyond the previous call's prompt and output: the
  tool results and harness messages) and `output_tokens`.

  Returns:
    {"rollouts", "calls", "calls_per_rollout", "model_share" (model time / episode time),
     "first_prompt_tokens", "later_prompt_tokens", "output_tokens", and for each of
     "startup_s", "model_s", "other_s", "episode_s": {"p50", "p99", "max", "sum"}} in seconds;
    {"rollouts": 0} when the experiment has no trajectories.
  """
  import numpy as np
  rows = {k: [] for k in ("startup_s", "model_s", "other_s", "episode_s")}
  calls_total, first_tokens, later_tokens, output_tokens = 0, 0, 0, 0
  for t in store.trajectories(experiment=experiment):
    calls = store.model_calls(t.session_id) if t.session_id else []
    model = sum(max(c.finished_at - c.started_at, 0.0) for c in calls)
    startup, episode = (float(t.metadata.get(k) or 0.0) for k in ("startup_s", "episode_s"))
    for key, value in (("startup_s", startup), ("model_s", model), ("episode_s", episode),
                       ("other_s", max(episode - startup - model, 0.0))):
      rows[key].append(value)
    calls_total += len(calls)
    seen = 0
    for i, c in enumerate(calls):
      if i == 0:
        first_tokens += len(c.prompt_ids)
      else:
        later_tokens += max(len(c.prompt_ids) - seen, 0)
      seen = len(c.prompt_ids) + len(c.output_ids)
      output_tokens += len(c.output_ids)
  n = len(rows["episode_s"])
  if not n:
    return {"rollouts": 0}
  out: dict = {"rollouts": n, "calls": calls_total, "calls_per_rollout": calls_total / n,
               "model_share": sum(rows["model_s"]) / max(sum(rows["episode_s"]), 1e-9),
               "first_prompt_tokens": first_tokens, "later_prompt_tokens": later_tokens,
               "output_tokens": output_tokens}
  for key, values in rows.items():
    v = np.asarray(values, np.float64)
    out[key] = {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                "max": float(v.max()), "sum": float(v.sum())}
  return out


def format_rollout_times(times: Mapping[str, Any]) -> str:
  """`rollout_times` in three lines."""
  if not times.get("rollouts"):
    return "rollout times: no rollouts"
  def span(key):
    return f"p50 {times[key]['p50']:.2f} s, p99 {times[key]['p99']:.2f} s"
  return (f"rollout times ({times['rollouts']} rollouts): services up {span('startup_s')}; "
          f"model calls {span('model_s')} ({times['model_share']:.0%} of episode time); "
          f"other {span('other_s')}\n"
          f"  {times['calls']} model calls ({times['calls_per_rollout']:.1f} per rollout): "
          f"{times['first_prompt_tokens']} first-prompt tokens, {times['later_prompt_tokens']} "
          f"added by later calls, {times['output_tokens']} output tokens")


def _count(items) -> dict:
  out: dict = {}
  for item in items:
    out[item] = out.get(item, 0) + 1
  return dict(sorted(out.items()))
