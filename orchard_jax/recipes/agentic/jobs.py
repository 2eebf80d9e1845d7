"""The loop's jobs, written once for every domain: `train_sft`, `train_rl` (BAR, RPR, OPD, with
the evaluation of the starting and the final policy), `evaluate_checkpoint`, and `train_value`.
A domain's job functions are one line of wiring each
(`agentic.train_rl(config, SWEDomain(config))`). No job function shares a name with a module
or a package it could hide (`rl`, `sft`, `value`).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import checks, evaluation, policy, run_folder, sft as sft_lib
from orchard_jax.recipes.agentic.domain import Domain
from orchard_jax.recipes.agentic.rollouts import RolloutRunner
from orchard_jax.recipes.agentic.run import RunContext, run_dir


def sft_data(run: RunContext, train_tasks, env, model_config=None) -> tuple:
  """Credit-assignment SFT sequences from config.sft.source: "expert" (the domain's seed
  trajectories on `train_tasks`), a trajectory store, or a mini-swe-agent folder. Returns
  (SFTData, the PolicyImages of a vision-language policy's source store or None)."""
  from orchard_jax.recipes.agentic.images import PolicyImages
  c = run.config
  by_id = {run.domain.task_id(t): t for t in run.tasks}
  if c.sft.source == "expert":
    trajectories = run.domain.seed_trajectories(run, train_tasks, env)
    source_store = run.store
  else:
    trajectories, source_store = sft_lib.load_trajectories(
        c.sft.source, experiments=tuple(c.sft.experiments))
  images = (PolicyImages.of(model_config, source_store,
                            images_per_row=int(c.sft.get("images_per_row", 4)))
            if source_store is not None else None)
  return sft_lib.credit_sequences(
      trajectories, tokenizer=run.tokenizer, annotator=run.domain.make_annotator(),
      mode=c.sft.mode, eps=float(c.sft.eps), max_tokens=int(c.sft.max_tokens), tasks=by_id,
      store=source_store, parser=c.policy.tool_call_parser,
      image_tokens=images.image_tokens if images else None), images


def _partial_scope(block) -> str:
  """What a partial fine-tune trains (block.train_last_layers > 0, or sft.method
  "cached_last_layer"), or "" (every parameter)."""
  if block.get("method", "full") == "cached_last_layer":
    return ("the last layer's readout (query side, feed-forward), the final norm and the LM "
            "head, on cached keys/values (exact; everything else frozen)")
  n = int(block.get("train_last_layers", 0) or 0)
  return (f"the top {n} decoder layer{'s' if n > 1 else ''}, the final norm and the LM head "
          "(embedding and lower layers frozen)") if n else ""


def stage_sft(run: RunContext, model, train_tasks, env):
  """Warm start: credit-assignment SFT into <run>/sft; returns (trained model, data stats)."""
  data, images = sft_data(run, train_tasks, env, model.config)
  print("SFT data: " + ", ".join(f"{k}={v}" for k, v in data.stats.items()), flush=True)
  model, metrics = sft_lib.fit_sft(model, data.sequences, run.config.sft, mesh=run.mesh,
                                   workdir=os.path.join(run.dir, "sft"),
                                   seed=int(run.config.seed),
                                   progress=bool(run.config.progress), images=images)
  if "min_target_prob" in metrics:
    stopped = (f" (of at most {metrics['max_steps']}; least likely target token p="
               f"{metrics['min_target_prob']:.3f}, sft.min_target_prob "
               f"{float(run.config.sft.get('min_target_prob', 0.0))})")
  else:
    stopped = (f" (of at most {metrics['max_steps']}: loss below sft.stop_loss "
               f"{float(run.config.sft.get('stop_loss', 0.0))})" if "stopped_at" in metrics
               else "")
  print(f"SFT done: {metrics['steps']} steps{stopped} over {metrics['batches']} batches, final "
        f"loss {metrics.get('loss', float('nan')):.4f}"
        + (f"; trained {_partial_scope(run.config.sft)}" if _partial_scope(run.config.sft)
           else ""), flush=True)
  return model, data.stats


def _training_subset(run: RunContext, env) -> list:
  tasks = run.domain.training_subset(run, env)
  if not tasks:
    raise ConfigError(f"no training task: the {run.domain.name} task set is empty, or the "
                      "domain kept none of its candidates (e.g. no seed trajectory solved one)")
  return tasks


def train_sft(config: ConfigDict, domain: Domain) -> dict:
  """Credit-assignment SFT of the policy on seed, store or mini-swe-agent trajectories; writes
  <run>/sft/checkpoints and the tokenizer. Returns the data stats."""
  checks.check_cluster_settings(config, ("workdir", "env.url"))
  checks.check_sft_config(config)
  domain.check_config("sft")
  checks.check_sft_source(config)
  run = RunContext(config, domain, resumes=True)
  try:
    checks.check_batch_sizes(config, ("sft",))      # needs the devices; before any training
    with domain.environment() as env:
      train_tasks = _training_subset(run, env)
      run.save_split(train_tasks, run.heldout)
      model = policy.build_policy(config.policy, run.mesh, vocab_size=run.tokenizer.vocab_size,
                                  seed=int(config.seed))
      _, stats = stage_sft(run, model, train_tasks, env)
    run.tokenizer.save(os.path.join(run.dir, "tokenizer"))
    return stats
  finally:
    run.close()


def rollout_runner(run: RunContext, service, env, *, judge=None, experiment: str,
                   log_name: str) -> RolloutRunner:
  """The run's RolloutRunner: sampling, parallelism, time budget and judging from the config."""
  c = run.config
  return RolloutRunner(
      run.domain, service, env, run.store,
      sampling={"temperature": float(c.sampling.temperature), "top_p": float(c.sampling.top_p),
                "max_tokens": int(c.sampling.max_tokens)},
      judge=judge, rpr_alpha=float(c.rl.rpr_alpha), experiment=experiment,
      parallel=int(c.rl.parallel_rollouts), rollout_timeout_s=float(c.rl.rollout_timeout_s),
      judge_workers=int(c.judge.max_workers), log_dir=os.path.join(run.dir, "logs", log_name))


def evaluate_policy(run: RunContext, service, env, train_tasks, *, name: str, policy_version,
                    split_record: Optional[dict] = None, value_scorer=None) -> dict:
  """The evaluation protocol (evaluation.py): eval.k attempts per task of eval.splits at
  eval.temperature with seeds from eval.seed, results in <run>/<name> (or eval.output_dir)."""
  c = run.config
  runner = rollout_runner(run, service, env, experiment=f"{c.name}-{name}", log_name=name)
  runner.sampling["temperature"] = float(c.eval.temperature)
  if int(c.eval.parallel):
    runner.parallel = int(c.eval.parallel)
  output_dir = (os.path.join(c.eval.output_dir, name) if c.eval.output_dir and name != "eval"
                else c.eval.output_dir or os.path.join(run.dir, name))
  return evaluation.evaluate_policy(
      runner, run.eval_splits(train_tasks, split_record), k=int(c.eval.k),
      seed=int(c.eval.seed), value_scorer=value_scorer, output_dir=output_dir,
      policy_version=policy_version, progress_factory=run.progress_factory())


def data_keys(config: ConfigDict) -> tuple[str, ...]:
  """The keys of the RL packed batches (REQUIRED_KEYS, plus the teacher's with OPD)."""
  from orchard_jax import data
  keys = tuple(data.REQUIRED_KEYS)
  if config.opd.mode != "none":
    keys += ("teacher_logprobs", "teacher_mask")
  return keys


def _check_rl(config: ConfigDict, domain: Domain) -> None:
  import jax
  c = config
  checks.check_cluster_settings(c, ("workdir", "env.url", "engine.urls")
                                + (("opd.teacher_urls",) if c.opd.mode != "none"
                                   and not c.opd.teacher_init else ()))
  checks.check_sft_config(c)
  domain.check_config("rl")
  if not c.policy.init and c.sft.enabled:     # (policy.init itself: RunContext)
    checks.check_sft_source(c)
  checks.check_rl_config(c)
  if c.rl.reward == "rpr" and domain.rubrics is None:
    raise ConfigError(f"rl.reward is 'rpr' but the {domain.name} domain has no rubric set; "
                      "expected rl.reward='binary'")
  if jax.process_count() > 1 and _has_vision(c.policy):
    raise ConfigError("a multi-host RL run of a vision-language policy is not supported yet: "
                      "process 0's batches carry image arrays whose shapes the other hosts "
                      "cannot know in advance (broadcast_batches); run it on one host")
  if jax.process_count() > 1 and not (str(c.engine.urls).strip() and (
      c.opd.mode == "none" or str(c.opd.teacher_urls).strip())):
    raise ConfigError("a multi-host run needs remote engines (engine.urls, and opd.teacher_urls "
                      "with OPD; the cluster preset sets both): an embedded engine would serve a "
                      "model sharded over every host from process 0 alone and hang")


def _has_vision(policy_block) -> bool:
  from orchard_jax import models
  try:
    return models.get_preset(policy_block.preset).vision is not None
  except Exception:  # noqa: BLE001 - an unknown preset is refused where the policy is built
    return False


def train_rl(config: ConfigDict, domain: Domain) -> dict:
  """The main job: task set -> (SFT warm start unless policy.init is set) -> evaluation of the
  starting policy (eval.baseline) -> RL iterations (BAR rollouts through the proxy, grading, RPR
  judging, group filter, packed updates, weight sync, checkpoints) -> evaluation of the final
  policy under the same protocol, and the change of pass@1 with its 95% interval.

  Returns:
    {"iterations": [per-iteration stats], "eval_start": the starting policy's report ({} when
    off), "eval": the final report, "gain": evaluation.compare(eval_start, eval),
    "workdir": the run folder}.
  """
  import jax
  from orchard_jax import train
  from orchard_jax.recipes.agentic import grpo, groups, serving, teachers
  from orchard_jax.recipes.agentic.images import PolicyImages
  c = config
  _check_rl(c, domain)
  main_process = jax.process_index() == 0
  run = RunContext(config, domain, resumes=True)
  history: list[dict] = []
  started = time.perf_counter()
  try:
    # Needs the devices; before seed trajectories, SFT or any rollout.
    checks.check_batch_sizes(c, ("rl",) + (("sft",) if not c.policy.init and c.sft.enabled
                                           else ()))
    with domain.environment() as env:
      train_tasks = _training_subset(run, env)
      run.save_split(train_tasks, run.heldout)
      print(f"tasks: {len(run.tasks)} ({len(run.train_all)} train / {len(run.heldout)} held "
            f"out); training subset {run.task_ids(train_tasks)}", flush=True)
      model = policy.build_policy(c.policy, run.mesh, vocab_size=run.tokenizer.vocab_size,
                                  seed=int(c.seed))
      rl_dir = os.path.join(run.dir, "rl")
      resuming = policy.find_checkpoint_dir(rl_dir) is not None
      if not c.policy.init and c.sft.enabled and not resuming:
        model, _ = stage_sft(run, model, train_tasks, env)
      judge = domain.make_judge() if c.rl.reward == "rpr" else None
      bar = checks.bar_config(c)
      with train.Trainer(model, grpo.policy_loss(c), grpo.trainer_config(c, rl_dir, model.config),
                         mesh=run.mesh) as trainer, \
          serving.policy_service(c, trainer.model(), run.tokenizer, run.store,
                                 engine_seed=int(c.seed)) as service, \
          contextlib.ExitStack() as stack:
        teacher = (stack.enter_context(teachers.opd_teacher(c, run.tokenizer, run.mesh))
                   if c.opd.mode != "none" else None)
        start_iteration = int(trainer.meta.get("iteration", 0))
        if _partial_scope(c.rl):
          print(f"RL updates train {_partial_scope(c.rl)}", flush=True)
        if trainer.restored_step is not None:
          service.sync_weights(trainer.model(), version=trainer.step)
          print(f"resumed at iteration {start_iteration} (step {trainer.step})", flush=True)
        start_report = {}
        if c.eval.baseline and main_process:
          start_report = _start_evaluation(run, service, env, train_tasks,
                                           fresh=trainer.restored_step is None)
        runner = rollout_runner(run, service, env, judge=judge, experiment=c.name,
                                log_name="rl")
        policy_images = PolicyImages.of(model.config, run.store,
                                        images_per_row=int(c.rl.get("images_per_row", 4)))
        for iteration in range(start_iteration, int(c.rl.iterations)):
          runner.timing = {"rollout_s": 0.0, "judge_s": 0.0}
          begin = getattr(domain, "begin_iteration", None)   # optional: curricula
          if begin is not None:
            begin(iteration, int(c.rl.iterations))
          prompts = grpo.choose_prompts(
              train_tasks, int(c.rl.prompts_per_iteration) + int(c.rl.oversample),
              iteration=iteration, seed=int(c.seed))
          prompt_groups = []
          if main_process:
            prompt_groups = groups.balanced_groups(
                runner, prompts, bar, iteration=iteration, seed=int(c.seed),
                policy_version=service.version, progress_factory=run.progress_factory())
          stats = grpo.iteration_stats(prompt_groups)
          it_data = grpo.group_sequences(prompt_groups, run.store,
                                         num_groups=int(c.rl.prompts_per_iteration))
          stats.update(it_data.stats)
          sequences = it_data.sequences
          if teacher is not None and sequences:
            sequences = grpo.add_teacher_logprobs(sequences, teacher)
          batches, pack_stats = grpo.pack_updates(
              sequences, c, data_parallel_size=train.data_parallel_size(run.mesh),
              seed=int(c.seed) + iteration, images=policy_images)
          stats.update(pack_stats)
          keys = list(batches[0]) if batches else list(data_keys(c))
          batches = grpo.broadcast_batches(batches, keys=keys, shape=(
              int(c.rl.batch_size), int(c.rl.seq_len)))
          stats.update(grpo.train_iteration(trainer, batches,
                                            extra_meta={"iteration": iteration + 1}))
          stats["time/rollout_s"] = runner.timing["rollout_s"]
          stats["time/judge_s"] = runner.timing["judge_s"]
          if batches:
            service.sync_weights(trainer.model(), version=trainer.step)
          trainer.save(force=True, extra_meta={"iteration": iteration + 1})
          trainer.metrics.write(trainer.step, {k: v for k, v in stats.items()
                                               if isinstance(v, (int, float))})
          history.append(stats)
          if main_process:     # other hosts train on process 0's batches; they roll out nothing
            print(grpo.summary_line(iteration, int(c.rl.iterations), stats), flush=True)
        report, gain = {}, {}
        if c.rl.final_eval and main_process:   # rollouts, like RL's, run on process 0 only
          report = evaluate_policy(run, service, env, train_tasks, name="eval",
                                   policy_version=service.version)
          print(evaluation.format_report(report), flush=True)
          if start_report:
            gain = evaluation.compare(start_report, report)
            _write_json(os.path.join(run.dir, "eval", "gain.json"), gain)
            print(evaluation.format_comparison(gain), flush=True)
    if main_process:
      print(f"run finished in {(time.perf_counter() - started) / 60:.1f} min; resolved rate "
            f"(first rollouts of each prompt) per iteration: "
            f"{[round(h['resolved/first'], 3) for h in history]}", flush=True)
    return {"iterations": history, "eval_start": start_report, "eval": report, "gain": gain,
            "workdir": run.dir}
  finally:
    run.close()


def _start_evaluation(run: RunContext, service, env, train_tasks, *, fresh: bool) -> dict:
  """The starting policy's evaluation: run now on a fresh run (the service holds the SFT or
  policy.init weights, version 0), read back from <run>/eval_start on a resumed one."""
  path = os.path.join(run.dir, "eval_start", "summary.json")
  if not fresh:
    if os.path.exists(path):
      with open(path) as f:
        return json.load(f)
    print("resumed run: no evaluation of the starting policy to compare with", flush=True)
    return {}
  report = evaluate_policy(run, service, env, train_tasks, name="eval_start", policy_version=0)
  print(evaluation.format_report(report, "eval_start"), flush=True)
  return report


def _write_json(path: str, value: Any) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=1)


def evaluate_checkpoint(config: ConfigDict, domain: Domain) -> dict:
  """Serves the policy checkpoint `config.checkpoint` (a run folder, trainer folder or HF
  folder) and runs the domain's episode eval.k times per task on the evaluation splits (the
  run's own training subset and held-out tasks when it is a run folder with tasks.json),
  reporting pass@1 with its interval, pass@k, random@k and value-model best-of-k."""
  from orchard_jax.recipes.agentic import serving, value as value_lib
  checks.check_cluster_settings(config, ("env.url", "engine.urls"))
  policy.check_checkpoint(config.checkpoint, field="config.checkpoint")  # before any work
  checks.check_eval_config(config)
  domain.check_config("evaluate")
  if config.eval.value_checkpoint:
    value_lib.value_checkpoint_dir(config.eval.value_checkpoint)
  run = RunContext(config, domain)
  try:
    record = run.load_split(config.checkpoint)
    train_tasks = [] if record else domain.training_subset(run, None)
    model = policy.build_policy(config.policy, run.mesh, vocab_size=run.tokenizer.vocab_size,
                                init=config.checkpoint)
    scorer = None
    if config.eval.value_checkpoint:
      value_model = value_lib.load_value_model(config, config.eval.value_checkpoint, run.mesh,
                                               run.tokenizer)
      scorer = value_lib.rollout_scorer(value_model, run.store, run.tokenizer,
                                        seq_len=int(config.value.seq_len),
                                        batch_size=int(config.value.batch_size), mesh=run.mesh)
    with domain.environment() as env, \
        serving.policy_service(config, model, run.tokenizer, run.store,
                               engine_seed=int(config.seed)) as service:
      report = evaluate_policy(run, service, env, train_tasks, name="eval", policy_version=None,
                               split_record=record, value_scorer=scorer)
    print(evaluation.format_report(report), flush=True)
    return report
  finally:
    run.close()


def evaluate_groups(config: ConfigDict, domain: Domain,
                    groupings: Mapping[str, Mapping[str, Sequence[str]]], *, name: str,
                    trial_score: Optional[Callable[[Any], float]] = None, header: str = "",
                    extra: Optional[Mapping[str, Any]] = None) -> dict:
  """`evaluate_checkpoint`, then the evaluation per group of tasks (evaluation.summarize_groups:
  success, pass@k, pass^k, mean score, grader errors, aborted), one table per grouping printed
  under `header` and all written to <run>/eval/<name>_summary.json.

  Args:
    groupings: {kind (e.g. "service", "family"): {task id: the task's groups of that kind}}.
    name: the domain's name (the summary file's and the returned key's).
    trial_score: a domain's score of an evaluation trajectory from the store (e.g. Claw's
      task_score), or None.
    extra: more fields for the summary file.
  Returns:
    {"report": the loop's report, name: {kind: {group: GroupSummary.to_dict()}}}.
  """
  report = evaluate_checkpoint(config, domain)
  k = int(config.eval.k)
  scores = None
  if trial_score is not None:
    scores = {}
    store_path = config.store.path or os.path.join(run_dir(config), "store")
    if os.path.isdir(store_path):
      from orchard_jax import data
      with data.TrajectoryStore(store_path) as store:
        for t in store.trajectories(experiment=f"{config.name}-eval"):
          scores[(t.task_id, t.attempt)] = float(trial_score(t))
  trials = evaluation.report_trials(report, scores)
  summaries = {kind: evaluation.summarize_groups(trials, groups, k)
               for kind, groups in groupings.items()}
  tables = "\n".join(evaluation.format_group_table(s, k, title=kind)
                     for kind, s in summaries.items())
  print(f"{header}\n{tables}" if header else tables, flush=True)
  out = {kind: {g: s.to_dict() for g, s in groups.items()} for kind, groups in summaries.items()}
  _write_json(os.path.join(config.eval.output_dir or run_dir(config), "eval",
                           f"{name}_summary.json"), {**dict(extra or {}), "k": k, "summary": out})
  return {"report": report, name: out}


def train_value(config: ConfigDict) -> dict:
  """Trains the value model on the trajectory store(s) and reports held-out AUC, calibration
  and best-of-k vs pass@k vs random@k (no domain: it learns from stored trajectories)."""
  from orchard_jax import parallel
  from orchard_jax.recipes.agentic import value as value_lib
  checks.check_cluster_settings(config, ("workdir",))
  directory = run_dir(config)
  with run_folder.run_folder(directory, config):  # another run's folder: stops here
    tokenizer = policy.load_tokenizer(config.policy)
    report = value_lib.fit_value(config, directory, parallel.make_mesh(config.mesh), tokenizer)
  print(value_lib.format_value_report(report), flush=True)
  return report
