"""The Orchard-GUI recipe: the GUI domain on the agentic loop (docs/algorithms.md section 9).

Jobs (configs in experiments/gui_*.py, fields from experiments/common.gui_base):
  gui.tasks      the task set: MiniWoB++ tasks and seeds, local-site tasks, open tasks, per
                 family and split                                  (--config.job=gui.tasks)
  gui.sft        SFT on the scripted demonstrations played through the browser harness, or on
                 a trajectory store (--config.sft.source=PATH)      (experiments/gui_sft.py)
  gui.rl         SFT warm start, then multi-turn GRPO: +1 success, -1 repeated format failure,
                 0 otherwise; the step budget's curriculum          (experiments/gui_rl.py)
  gui.evaluate   a checkpoint on the evaluation tasks: success rate per task family and per
                 site                                               (experiments/gui_eval.py)
  gui_distill.collect
                 a teacher (the embedded engine, SGLang, or an OpenAI-compatible endpoint,
                 shown each turn's screenshot as an image part) runs the browser harness, k
                 attempts per task, graded, into the trajectory store: the loop's
                 distillation stage, agentic/distill.py     (experiments/gui_distill.py)

This module holds the domain only (`GUIDomain`); tasks/gui holds the browser sandbox, the
tasks, sites, checkers and scripted experts, harness/ the browser agent, recipes/agentic the
loop.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections import Counter, defaultdict
from typing import Any, Mapping, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import distill as distill_lib, jobs
from orchard_jax.recipes.agentic.domain import Annotation, Outcome
from orchard_jax.recipes.agentic.sandboxes import sandbox_client
from orchard_jax.tasks import gui

_log = logging.getLogger(__name__)

OBSERVATIONS = ("screenshot", "a11y", "both")
SELECTIONS = ("spread", "first")
JUDGE_KINDS = ("none", "webjudge")


class OutcomeAnnotator:
  """Credit for SFT from the outcome alone: V rises from 0 to 1 over a successful trajectory
  and stays 0 on a failed one (credit-assignment SFT keeps the successful ones, every action)."""

  def annotate(self, trajectory: data.Trajectory, task: Any) -> Annotation:
    steps = sum(1 for m in trajectory.messages if m.get("role") == "assistant")
    value = 1.0 if trajectory.resolved else 0.0
    if steps <= 1:
      return Annotation([0], [value], max(steps, 1), "outcome")
    return Annotation([0, steps - 1], [0.0, value], steps, "outcome")


class GUIDomain:
  """Browser tasks in sandboxed Chromium (tasks/gui), graded by each task's own reward or
  checker (or the WebJudge), rewarded +1 / 0 / -1.

  Tasks: MiniWoB++ tasks at training seeds and evaluation seeds, the local sites' task families
  (3:1 train/eval), open tasks from a file; `split_tasks` keeps the splits. Episodes: the
  browser agent (one call per reply, the last k screenshots) acts in a fresh browser sandbox;
  the final state is graded before the sandbox goes (`run_episode` keeps the grade on the
  trajectory, `grade` reads it back). Statuses: "Submitted" (done, or the page ended the
  episode) is the agent's own end; "LimitsExceeded" is truncated; "RepeatedFormatError" is
  graded -1; "ModelError", "TimeExceeded", "aborted" (a crashed browser, a hung page) and
  "grader_error" abort the rollout.
  """

  name = "gui"
  rubrics = None
  aborted_statuses = frozenset({"ModelError", "TimeExceeded", "aborted", "grader_error"})
  truncated_statuses = frozenset({"LimitsExceeded"})
  submitted_statuses = frozenset({"Submitted"})

  def __init__(self, config: ConfigDict):
    self.config = config
    self.iteration = 0

  # ------------------------------------------------------------------ settings and tasks
  def browser_config(self) -> gui.BrowserConfig:
    b = dict(self.config.browser)
    b["a11y"] = self.config.agent.observation in ("a11y", "both")
    if not b.get("python"):
      b.pop("python", None)
    return gui.BrowserConfig.from_dict(b)

  def check_config(self, job: str) -> None:
    c = self.config
    try:
      self.browser_config()
    except (ValueError, TypeError) as e:
      raise ConfigError(f"browser: {e}") from None
    a = c.agent
    if a.observation not in OBSERVATIONS:
      raise ConfigError(f"agent.observation is {a.observation!r}; expected one of "
                        f"{OBSERVATIONS}")
    limits = tuple(a.step_limits)
    if not limits or any(int(x) < 1 for x in limits):
      raise ConfigError(f"agent.step_limits must be one or more positive step budgets, got "
                        f"{limits}")
    if len(tuple(a.curriculum_iterations)) != len(limits) - 1:
      raise ConfigError(f"agent.curriculum_iterations needs {len(limits) - 1} iteration(s) "
                        f"(one per change of agent.step_limits {limits}), got "
                        f"{tuple(a.curriculum_iterations)}")
    if a.tools != "all":
      unknown = [n for n in gui.task.names_of(a.tools) if n not in gui.actions.TOOL_NAMES]
      if unknown:
        raise ConfigError(f"agent.tools: unknown tool(s) {unknown}; the tools are "
                          f"{', '.join(gui.actions.TOOL_NAMES)}")
    if int(a.screenshots_in_context) < 0:
      raise ConfigError("agent.screenshots_in_context must be >= 0")
    if c.tasks.selection not in SELECTIONS:
      raise ConfigError(f"tasks.selection is {c.tasks.selection!r}; expected one of "
                        f"{SELECTIONS}")
    if c.tasks.open_file and not os.path.isfile(c.tasks.open_file):
      raise ConfigError(f"tasks.open_file: {c.tasks.open_file!r} does not exist")
    if c.gui_judge.kind not in JUDGE_KINDS:
      raise ConfigError(f"gui_judge.kind is {c.gui_judge.kind!r}; expected one of "
                        f"{JUDGE_KINDS}")
    if c.gui_judge.kind == "webjudge" and not c.gui_judge.url:
      raise ConfigError("gui_judge.kind is 'webjudge' but gui_judge.url is empty")
    if c.tasks.open_file and c.gui_judge.kind == "none":
      raise ConfigError("tasks.open_file names tasks without a checker; they need "
                        "gui_judge.kind='webjudge' and its url")
    if a.observation != "a11y" and job in ("sft", "rl", "evaluate") and \
        not _vision(c.policy.preset):
      raise ConfigError(f"policy.preset {c.policy.preset!r} reads text only; a screenshot "
                        "policy needs a vision-language preset (e.g. tiny_vl), or set "
                        "agent.observation='a11y'")
    try:
      self.load_tasks()
    except (ValueError, FileNotFoundError, gui.TaskFormatError) as e:
      raise ConfigError(f"tasks: {e}") from None

  def _spec(self, split: str) -> dict:
    t = self.config.tasks
    miniwob = gui.task.names_of(t.miniwob, ("experts", "all"))
    sites = gui.task.names_of(t.sites, ("all",))
    seeds = int(t.miniwob_seeds if split == "train" else t.miniwob_eval_seeds)
    return {"miniwob": miniwob if seeds > 0 else "", "miniwob_seeds": seeds,
            "sites": sites, "open_file": t.open_file, "split": split}

  def load_tasks(self) -> list:
    """The training tasks, then the evaluation tasks (stable order)."""
    return gui.load_tasks(self._spec("train")) + gui.load_tasks(self._spec("eval"))

  def split_tasks(self, tasks: Sequence[gui.GUITask]) -> tuple[list, list]:
    """(training tasks, evaluation tasks), by each task's split."""
    return ([t for t in tasks if t.split == "train"], [t for t in tasks if t.split == "eval"])

  def task_id(self, task: gui.GUITask) -> str:
    return task.id

  def environment(self):
    """Orchard Env; the local backend shows this interpreter's virtual environment (the driver
    imports Playwright from it) when there is one."""
    return sandbox_client(self.config.env, shared_paths=gui.host_paths_for_sandbox())

  def training_subset(self, run, env) -> list:
    """tasks.train_tasks training tasks (0: all), by tasks.selection: "spread" (families in
    turn) or "first"."""
    pool = list(run.train_all)
    if self.config.tasks.selection == "spread":
      by_family: dict[str, list] = defaultdict(list)
      for task in pool:
        by_family[task.family].append(task)
      pool = [queue[i] for i in range(max(map(len, by_family.values()), default=0))
              for queue in by_family.values() if i < len(queue)]
    count = int(self.config.tasks.train_tasks)
    return pool[:count] if count > 0 else pool

  # ------------------------------------------------------------------ episodes
  def begin_iteration(self, iteration: int, total: int) -> None:
    """The loop's RL iteration (the step budget's curriculum reads it)."""
    self.iteration = int(iteration)

  def step_limit(self, task: gui.GUITask) -> int:
    """The curriculum's step budget at this iteration (Orchard-GUI: 15, then 30), at most the
    task's own ceiling."""
    a = self.config.agent
    limits, switches = tuple(a.step_limits), tuple(a.curriculum_iterations)
    stage = sum(1 for s in switches if self.iteration >= int(s))
    return min(int(limits[stage]), int(task.max_steps) or int(limits[stage]))

  def tool_names(self) -> Optional[tuple]:
    """The tools offered (agent.tools: "all" or names; done is always among them)."""
    names = gui.task.names_of(self.config.agent.tools, ("all",))
    return None if names == "all" else tuple(dict.fromkeys(tuple(names) + ("done",)))

  def agent_config(self, task: gui.GUITask):
    from orchard_jax.harness.browser_agent import BrowserAgentConfig
    a = self.config.agent
    return BrowserAgentConfig(step_limit=self.step_limit(task),
                              screenshots_in_context=int(a.screenshots_in_context),
                              max_consecutive_format_errors=int(a.max_consecutive_format_errors),
                              wall_time_limit_s=float(a.wall_time_limit_s))

  def _judge(self):
    j = self.config.gui_judge
    if j.kind != "webjudge":
      return None
    from orchard_jax.recipes.agentic.llm import chat_model
    return gui.WebJudge(chat_model(j, temperature=float(j.temperature),
                                   max_tokens=int(j.max_tokens)),
                        max_screenshots=int(j.max_screenshots), threshold=int(j.threshold),
                        always=bool(j.always))

  def run_episode(self, task: gui.GUITask, env, base_url: str, *, model: str, session_id: str,
                  attempt: int, sampling: Mapping[str, Any],
                  log_dir: Optional[str]) -> data.Trajectory:
    """The browser agent on `task` in a fresh browser sandbox, its model at `base_url`, graded
    while the browser is alive (module docstring)."""
    from orchard_jax.harness import ChatModel
    from orchard_jax.harness.browser_agent import BrowserAgent
    agent_config = self.agent_config(task)
    with ChatModel(base_url, model, timeout_s=float(self.config.agent.model_timeout_s),
                   **dict(sampling)) as chat:
      def agent(tools, instruction):
        return BrowserAgent(chat, tools, agent_config).run(instruction)
      result = self._episode(task, env, agent)
    return _trajectory(task, result, attempt, session_id)

  def _episode(self, task: gui.GUITask, env, agent) -> gui.Episode:
    try:
      with gui.BrowserSandbox(env, self.browser_config(), sites=gui.sites_of(task)) as browser:
        result = gui.run_episode(task, browser, agent, observation=self.config.agent.observation,
                                 judge=self._judge(), tool_names=self.tool_names())
        result.startup_s = browser.startup_s
        return result
    except gui.BrowserSandboxError as e:   # the sandbox or Chromium did not start
      return gui.Episode(task, task.instruction, None, gui.aborted(f"browser sandbox: {e}"),
                         [], 0.0)

  def grade(self, task: gui.GUITask, trajectory: data.Trajectory, env, *,
            log_dir: Optional[str]) -> Outcome:
    """The grade `run_episode` computed while the browser was alive."""
    graded = trajectory.metadata.get("gui")
    if graded is None:
      raise gui.GraderError(f"trajectory {trajectory.trajectory_id} carries no GUI grade")
    return Outcome(resolved=bool(graded["success"]), status=graded["status"],
                   reward=graded["reward"] if graded["status"] not in ("aborted", "grader_error")
                   else None,
                   details={k: graded[k] for k in ("reason", "details") if k in graded})

  # ------------------------------------------------------------------ judging and seed data
  def make_judge(self):
    return None

  def make_annotator(self):
    return OutcomeAnnotator()

  def seed_trajectories(self, run, tasks: Sequence[gui.GUITask], env) -> list[data.Trajectory]:
    """Scripted demonstrations: each task's expert played through the browser harness in a
    browser sandbox, graded, and stored with one model-call record per turn (what the policy
    is sent under the context policy, the expert's call as the response; screenshots stored
    once by digest), so SFT trains one sample per turn with its loss on that turn's call.
    Stored once under experiment <name>-expert and read back after."""
    experiment = f"{self.config.name}-expert"
    have = {t.task_id: t for t in run.store.trajectories(experiment=experiment)}
    todo = [t for t in tasks if t.id not in have and gui.has_solution(t)]
    if todo:
      k = int(self.config.agent.screenshots_in_context)
      for task in todo:   # the expert's own budget: the task's ceiling, whatever the curriculum
        config = dataclasses.replace(self.agent_config(task), step_limit=task.max_steps + 5)
        agent = gui.scripted_agent(task, "expert", config)
        result = self._episode(task, env, agent)
        trajectory = _trajectory(task, result, 0, f"{experiment}-{task.id}")
        trajectory.trajectory_id = f"{task.id}-expert"
        trajectory.experiment = experiment
        trajectory.outcome = self.grade(task, trajectory, env, log_dir=None).to_dict()
        if result.run is not None:
          record_turns(run.store, trajectory.session_id, result.run.messages, result.run.tools,
                       k=k)
        run.store.append_trajectory(trajectory)
        have[task.id] = trajectory
        print(f"expert {task.id}: {trajectory.outcome['status']} in "
              f"{sum(1 for m in trajectory.messages if m.get('role') == 'assistant')} steps",
              flush=True)
    return [have[t.id] for t in tasks if t.id in have]


def _vision(preset: str) -> bool:
  from orchard_jax import models
  try:
    return models.get_preset(preset).vision is not None
  except Exception:  # noqa: BLE001 - an unknown preset is refused where the policy is built
    return True


def compact_images(messages: Sequence[dict], store=None) -> tuple[list, list]:
  """Messages whose image parts name their image by digest (data.images.with_image_digests),
  and the digests in order; with a store, each image is stored there once."""
  from orchard_jax.data import images as image_lib
  digests = []
  for source in image_lib.image_parts(messages):
    if image_lib.is_digest(source):
      digests.append(source)
      continue
    blob = image_lib.image_bytes(source, allow_files=False)
    digests.append(store.put_image(blob) if store is not None else image_lib.image_digest(blob))
  return image_lib.with_image_digests(messages, digests), digests


def record_turns(store, session_id: str, messages: Sequence[dict], tools: list, *, k: int) -> int:
  """One text-only model-call record per assistant turn of a scripted run (module docstring of
  `GUIDomain.seed_trajectories`); returns the number of records."""
  import time
  from orchard_jax.harness.browser_agent import last_k_images
  keys = ("role", "content", "tool_calls", "tool_call_id", "name")
  count = 0
  for i, message in enumerate(messages):
    if message.get("role") != "assistant":
      continue
    sent = last_k_images([{key: m[key] for key in keys if key in m} for m in messages[:i]], k)
    sent, digests = compact_images(sent, store)
    response = {key: message[key] for key in ("role", "content", "tool_calls") if key in message}
    store.append_model_call(data.ModelCall(
        session_id=session_id, call_index=count, messages=sent, tools=tools, response=response,
        finish_reason="tool_calls" if message.get("tool_calls") else "stop", text_only=True,
        model="scripted-expert", images=digests, started_at=time.time(),
        finished_at=time.time(), metadata={"source": "scripted expert"}))
    count += 1
  return count


def _trajectory(task: gui.GUITask, result, attempt: int,
                session_id: Optional[str]) -> data.Trajectory:
  run, outcome = result.run, result.outcome
  if run is not None and hasattr(run, "to_trajectory"):
    trajectory = run.to_trajectory(task_id=task.id, attempt=attempt, session_id=session_id)
    trajectory.messages, _ = compact_images(trajectory.messages)
  else:
    trajectory = data.Trajectory(
        trajectory_id=session_id or f"{task.id}-{attempt}", task_id=task.id, attempt=attempt,
        session_id=session_id, exit_status="aborted", submission="",
        messages=[{"role": "user", "content": task.instruction}],
        tools=gui.openai_tools())
  steps = sorted(result.step_seconds)
  trajectory.metadata.update({
      "gui": outcome.to_dict(), "family": task.family, "site": task.site,
      "instruction": result.instruction, "episode_s": round(result.seconds, 3),
      "startup_s": round(result.startup_s, 3),
      "step_p50_s": round(steps[len(steps) // 2], 4) if steps else None})
  if outcome.status == "aborted":
    trajectory.exit_status = "aborted"
  return trajectory


# ----------------------------------------------------------------------------- jobs
def build_tasks(config: ConfigDict) -> dict:
  """Job "gui.tasks": the task set's size per split and family."""
  domain = GUIDomain(config)
  domain.check_config("tasks")
  train, evaluation = domain.split_tasks(domain.load_tasks())
  summary = {"train": len(train), "eval": len(evaluation),
             "train_per_family": _count(t.family for t in train),
             "eval_per_family": _count(t.family for t in evaluation),
             "scripted": sum(gui.has_solution(t) for t in train + evaluation)}
  print(json.dumps(summary, indent=1), flush=True)
  return summary


def sft(config: ConfigDict) -> dict:
  """Job "gui.sft": the loop's SFT with the GUI domain."""
  return jobs.train_sft(config, GUIDomain(config))


def train_rl(config: ConfigDict) -> dict:
  """Job "gui.rl": the loop's RL job with the GUI domain."""
  return jobs.train_rl(config, GUIDomain(config))


def distill(config: ConfigDict) -> distill_lib.CollectionSummary:
  """Job "gui_distill.collect": the loop's distillation stage with the GUI domain."""
  return distill_lib.collect(config, GUIDomain(config))


def evaluate(config: ConfigDict) -> dict:
  """Job "gui.evaluate": the checkpoint on the evaluation tasks, eval.k attempts each; prints
  the success rate (and pass@k, pass^k, aborted) per task family and per site beside the loop's
  report and writes <run>/eval/gui_summary.json."""
  domain = GUIDomain(config)
  return jobs.evaluate_groups(config, domain, groupings(domain.load_tasks()), name="gui")


def groupings(tasks: Sequence[gui.GUITask]) -> dict[str, dict[str, list[str]]]:
  """The groups a GUI evaluation reports: each task's family and its site."""
  return {"family": {t.id: [t.family] for t in tasks}, "site": {t.id: [t.site] for t in tasks}}


def _count(items) -> dict:
  return dict(sorted(Counter(items).items()))
