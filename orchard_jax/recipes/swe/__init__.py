"""The Orchard-SWE recipe: the SWE domain on the agentic loop, plus its task-set and grading jobs.

Jobs:
  swe.build_tasks  build (or load from the cache) the task set and print what was tried, kept
                   and dropped                                   (experiments/swe_tasks.py)
  swe.evaluate     evaluate predictions ("gold", "empty" or a predictions file) in fresh
                   sandboxes and write per-instance reports + a summary; with
                   `checkpoint` set, run a policy checkpoint k times per instance and report
                   pass@1 (95% interval), pass@k, value best-of-k and random@k
                                                                 (experiments/swe_eval.py)
  swe.sft          credit-assignment SFT                          (experiments/swe_sft.py)
  swe.rl           the main job: SFT warm start, evaluation of the SFT policy, GRPO with BAR
                   (+ RPR, + OPD), evaluation of the final policy and the gain with its 95%
                   interval                     (experiments/swe_bar.py, swe_rpr.py, swe_opd.py)
  swe.value        the value model on the trajectory store       (experiments/swe_value.py)
  swe_distill.*    teacher trajectories into the store, and the store's data jobs
                                                                 (experiments/swe_distill.py)

Every job but the first two is one line: the loop's job (recipes/agentic) with `SWEDomain`.
The pieces: `domain.SWEDomain` (tasks, sandboxes, episodes, grading, seed data), `judge` (the
seven-rubric RPR judges), `annotate` (credit annotators), `evidence` (what a bash-agent
trajectory shows); tasks/swe holds the instances, episode, replay expert and selection.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping, Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import checks, jobs
from orchard_jax.recipes.agentic.sandboxes import sandbox_client
from orchard_jax.recipes.swe.datasets import build_dataset_job, prepare_dataset
from orchard_jax.recipes.swe.domain import SWEDomain, build_settings, load_task_set
from orchard_jax.tasks.swe import builder, evaluation
from orchard_jax.tasks.swe.episode import sandbox_factory
from orchard_jax.tasks.swe.instance import SWEInstance


def build_tasks(config: ConfigDict):
  """Job "swe.build_tasks": builds or loads the task set and prints its build report; with
  tasks.dataset or config.commits, builds (and validates) that dataset instead."""
  if config.tasks.get("dataset") or config.get("commits"):
    return build_dataset_job(config)
  task_set = builder.build_task_set(build_settings(config.tasks),
                                    output_dir=config.tasks.output_dir or None,
                                    rebuild=bool(config.tasks.rebuild),
                                    progress=bool(config.get("progress", True)))
  print(task_set.summary(), flush=True)
  return task_set


def evaluate_patches(instances: Sequence[SWEInstance], predictions: Mapping[str, str], client, *,
                     output_dir: str, max_workers: int = 2,
                     progress: bool = True) -> evaluation.EvalSummary:
  """Evaluates {instance_id: patch} in fresh sandboxes of `client` (see tasks.swe.evaluation)."""
  return evaluation.evaluate_predictions(instances, predictions,
                                         sandbox_factory=sandbox_factory(client),
                                         output_dir=output_dir, max_workers=max_workers,
                                         progress=progress)


def evaluate(config: ConfigDict):
  """Job "swe.evaluate": grades config.predictions on the task set; prints the summary.

  Results go to <workdir or output_dir>/<run_id or the predictions' name>. With
  `config.checkpoint` set, evaluates a policy checkpoint instead (the loop's
  `evaluate_checkpoint`).

  Raises:
    ConfigError: config.predictions names no file or a malformed one (both checked before the
      task set is loaded or built), or the file is not a predictions file of this task set.
  """
  if config.get("checkpoint"):
    return jobs.evaluate_checkpoint(config, SWEDomain(config))
  checks.check_cluster_settings(config, ("env.url",))
  if config.predictions not in ("gold", "empty"):
    if not os.path.exists(config.predictions):
      raise ConfigError(f"config.predictions: expected 'gold', 'empty' or a predictions file; "
                        f"{config.predictions!r} does not exist")
    try:        # the file's format needs no task set: refused before a dataset build starts
      evaluation.read_predictions_file(config.predictions)
    except evaluation.EvaluationError as e:
      raise ConfigError(f"config.predictions: {e}") from e
  logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per sandbox call otherwise
  instances = load_task_set(config.tasks, progress=bool(config.get("progress", True)))
  try:
    predictions = evaluation.load_predictions(config.predictions, instances)
  except evaluation.EvaluationError as e:      # a malformed file: the user's input
    raise ConfigError(f"config.predictions: {e}") from e
  name = config.run_id or os.path.splitext(os.path.basename(config.predictions))[0]
  # A set workdir (sweep.py gives each point its own) is the run folder, as in every other job.
  output_dir = os.path.join(config.workdir or config.output_dir, name)
  missing = [i.instance_id for i in instances if i.instance_id in predictions and i.test_spec
             is None]
  if not config.env.url:                       # the local backend reads image directories
    absent = [i.test_spec.image for i in instances if i.test_spec is not None and
              i.test_spec.image.startswith("/") and not os.path.isdir(i.test_spec.image)]
    if absent:
      raise ConfigError(f"tasks.dataset: {len(absent)} instance image director(ies) do not exist "
                        f"(e.g. {absent[0]}); rebuild them or drop test_spec to build anew")
  if missing:                                  # refused before the first sandbox starts
    raise ConfigError(f"tasks.dataset: {len(missing)} instance(s) have no test_spec (e.g. "
                      f"{missing[:3]}); set tasks.mirrors or tasks.url_template to build their "
                      f"images, see README 'Bring your own dataset'")
  with sandbox_client(config.env) as client:
    summary = evaluate_patches(instances, predictions, client, output_dir=output_dir,
                               max_workers=int(config.env.max_parallel),
                               progress=bool(config.get("progress", True)))
  print(summary.table(), flush=True)
  return summary


def sft(config: ConfigDict) -> dict:
  """Job "swe.sft" (experiments/swe_sft.py): credit-assignment SFT of the policy on replay-expert,
  store or mini-swe-agent trajectories; writes <run>/sft/checkpoints. Returns the data stats."""
  return jobs.train_sft(config, SWEDomain(config))


def train_rl(config: ConfigDict) -> dict:
  """Job "swe.rl" (experiments/swe_bar.py, swe_rpr.py, swe_opd.py): the main job
  (`agentic.train_rl` with the SWE domain)."""
  return jobs.train_rl(config, SWEDomain(config))


def value(config: ConfigDict) -> dict:
  """Job "swe.value" (experiments/swe_value.py): the value model on the trajectory store(s)."""
  return jobs.train_value(config)


__all__ = ["SWEDomain", "build_dataset_job", "build_settings", "build_tasks", "evaluate",
           "evaluate_patches", "load_task_set", "prepare_dataset", "sandbox_client",
           "sandbox_factory", "sft", "train_rl", "value"]
