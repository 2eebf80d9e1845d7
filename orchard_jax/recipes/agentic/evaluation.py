"""Policy evaluation for any domain: pass@1 with its 95% interval, pass@k, and value-model
best-of-k vs random@k; and the comparison of two policies under the same protocol.

The policy (served by a `ModelService`) runs the domain's episode k times on each evaluation
task (graded by the domain, reward R_bin only: docs/algorithms.md section 5 says evaluation
never uses the judge). Attempt a of task i samples with a seed derived from (eval.seed, task id,
a), so the same checkpoint evaluated again gives the same rollouts (up to the float
non-associativity of different batch compositions in the engine), and two policies evaluated
with the same seed see the same draws of the sampler.

Metrics per split ("train": the RL training subset, "heldout": tasks never trained on):
  pass@1, pass@k      unbiased estimators (rl.pass_at_k) averaged over tasks; pass@1 with its
                      95% Wilson interval over the attempts (rl.wilson_interval)
  random@k            the expected resolution of a random one of k candidates (= pass@1)
  best_of_k           with a value model: the resolution of the candidate it scores highest
                      (rl.reranking_report), plus its AUC and calibration (ECE) on these runs
`compare` gives the change of pass@1 between two reports with its 95% Newcombe interval
(rl.newcombe_interval). Every evaluation trajectory lands in the trajectory store.

Per group of tasks (a Claw service, a GUI task family or site; `summarize_groups`, from a
report's per-attempt verdicts): the success rate over trials, pass@k (a task counts when any of
its first k trials passed) and pass^k (when all k did; a task with fewer than k trials cannot),
the mean of a domain's trial score when it has one, grader errors and aborted trials (as the
loop counted them, so a table's aborted column sums to the report's `aborted`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from orchard_jax import rl
from orchard_jax.recipes.agentic.rollouts import RolloutRequest, RolloutRunner, rollout_seed

_log = logging.getLogger(__name__)


def trial_order(tasks: int, k: int, parallel: int) -> list[tuple[int, int]]:
  """The order in which evaluation runs its (task index, attempt) pairs, `parallel` at a time:
  tasks in blocks of `parallel`, each block's first attempts, then its second attempts, ...
  A task's attempts share their first prompt, and when attempt a + 1 starts, attempt a has
  usually finished, its cache row still resident: an engine with a prefix cache (the embedded
  engine's, SGLang's radix cache) then prefills that prompt once per block instead of k times.
  Started together (task by task, k side by side), every attempt prefilled it in full.
  Results do not depend on the order (each attempt's seed comes from its task and number).
  """
  block = max(int(parallel), 1)
  return [(i, a) for start in range(0, tasks, block) for a in range(k)
          for i in range(start, min(start + block, tasks))]


def evaluate_policy(runner: RolloutRunner, splits: dict[str, Sequence[Any]], *,
                    k: int, seed: int, value_scorer=None, output_dir: Optional[str] = None,
                    policy_version: Optional[int] = None, progress_factory=None
                    ) -> dict[str, Any]:
  """Runs k attempts per instance of each split and reports the metrics (module docstring).

  Args:
    runner: a RolloutRunner without a judge (R_bin only).
    splits: {split name: tasks}.
    k: attempts per task.
    seed: base seed of the attempts.
    value_scorer: `(rollouts) -> probabilities` for best-of-k, or None.
    output_dir: where results.jsonl and summary.json go, or None.
    policy_version: stored on the trajectories.
    progress_factory: (total, description) -> progress bar, or None.
  Returns:
    {split: {"instances", "attempts", "pass@1", "pass@1_ci95", "pass@k", "random@k",
     "resolved", "aborted", ..., "per_instance": {task id: [resolved per attempt]},
     "per_instance_aborted": {task id: [aborted per attempt]} (they sum to "aborted"),
     "per_instance_status": {task id: [outcome status, else exit status, per attempt]}}}.
  """
  report: dict[str, Any] = {}
  task_id = runner.domain.task_id
  for split, tasks in splits.items():
    if not tasks:
      continue
    requests = [RolloutRequest(tasks[i], a, rollout_seed(seed, "eval", task_id(tasks[i]), a),
                               prompt=i) for i, a in trial_order(len(tasks), k, runner.parallel)]
    rollouts = runner.run_with_progress(requests, f"eval {split}", progress_factory,
                                        policy_version=policy_version)
    rollouts.sort(key=lambda r: (r.request.prompt, r.request.attempt))   # task by task
    by_instance: dict[str, list] = {}
    for rollout in rollouts:
      by_instance.setdefault(task_id(rollout.request.task), []).append(rollout)
    for rs in by_instance.values():
      rs.sort(key=lambda r: r.request.attempt)
    labels = {iid: [r.resolved for r in rs] for iid, rs in by_instance.items()}
    resolved = int(sum(sum(v) for v in labels.values()))
    split_report = {
        "instances": len(tasks), "attempts": len(rollouts), "k": k, "resolved": resolved,
        "pass@1_ci95": list(rl.wilson_interval(resolved, len(rollouts))),
        "aborted": int(sum(r.aborted for r in rollouts)),
        "pass@1": float(np.mean([rl.pass_at_k(len(v), sum(v), 1) for v in labels.values()])),
        f"pass@{k}": float(np.mean([rl.pass_at_k(len(v), sum(v), k) for v in labels.values()])),
        f"random@{k}": float(np.mean([rl.random_at_k(v, k) for v in labels.values()])),
        "per_instance": labels,
        "per_instance_aborted": {iid: [r.aborted for r in rs] for iid, rs in by_instance.items()},
        "per_instance_status": {iid: [r.trajectory.outcome.get("status") or r.trajectory.exit_status
                                      for r in rs] for iid, rs in by_instance.items()},
    }
    if value_scorer is not None:
      probs = value_scorer(rollouts)
      tasks = []
      for iid, rs in by_instance.items():
        idx = [rollouts.index(r) for r in rs]
        tasks.append(([float(probs[i]) for i in idx], [r.resolved for r in rs]))
      ranking = rl.reranking_report(tasks, ks=(1, k))
      split_report.update({f"value/{name}": value for name, value in ranking.items()})
      split_report[f"best_of_{k}"] = ranking.get(f"best_of_{k}", float("nan"))
    report[split] = split_report
    if output_dir:
      os.makedirs(output_dir, exist_ok=True)
      with open(os.path.join(output_dir, f"results_{split}.jsonl"), "w") as f:
        for rollout in rollouts:
          f.write(json.dumps({
              "instance_id": task_id(rollout.request.task),
              "attempt": rollout.request.attempt, "seed": rollout.request.seed,
              "resolved": rollout.resolved, "aborted": rollout.aborted,
              "exit_status": rollout.trajectory.exit_status,
              "status": rollout.trajectory.outcome.get("status"),
              "session_id": rollout.session_id, "model_patch": rollout.trajectory.submission,
              "response_tokens": rollout.response_tokens}) + "\n")
  if output_dir:
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
      json.dump(report, f, indent=1)
  return report


def format_report(report: dict[str, Any], label: str = "eval") -> str:
  """One line per split: pass@1 with its 95% interval, pass@k, random@k, best-of-k when
  present."""
  lines = []
  for split, r in report.items():
    k = r["k"]
    extra = ""
    if f"best_of_{k}" in r:
      nan = float("nan")
      extra = (f"  best-of-{k} {r[f'best_of_{k}']:.3f}  value AUC "
               f"{r.get('value/auc', nan):.3f}  ECE {r.get('value/ece', nan):.3f}")
    low, high = r["pass@1_ci95"]
    lines.append(f"{label}[{split}] {r['instances']} tasks x {k}: resolved {r['resolved']}/"
                 f"{r['attempts']}  pass@1 {r['pass@1']:.3f} [{low:.3f}, {high:.3f}]  "
                 f"pass@{k} {r[f'pass@{k}']:.3f}  random@{k} {r[f'random@{k}']:.3f}{extra}  "
                 f"aborted {r['aborted']}")
  return "\n".join(lines)


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
  """The change of pass@1 from `before` to `after` per split both evaluated.

  Returns:
    {split: {"before", "after", "gain", "gain_ci95": [low, high] (Newcombe, 95%),
     "significant": the interval excludes 0}}.
  """
  out = {}
  for split in after:
    if split not in before:
      continue
    a, b = after[split], before[split]
    low, high = rl.newcombe_interval(a["resolved"], a["attempts"], b["resolved"], b["attempts"])
    out[split] = {"before": b["pass@1"], "after": a["pass@1"],
                  "gain": a["resolved"] / a["attempts"] - b["resolved"] / b["attempts"],
                  "gain_ci95": [low, high], "significant": low > 0 or high < 0}
  return out


def format_comparison(comparison: dict[str, Any], *, before: str = "SFT start",
                      after: str = "final") -> str:
  """One line per split: pass@1 before and after, and the gain with its 95% interval."""
  lines = []
  for split, c in comparison.items():
    low, high = c["gain_ci95"]
    verdict = "outside" if c["significant"] else "inside"
    lines.append(f"pass@1[{split}] {before} {c['before']:.3f} -> {after} {c['after']:.3f}: gain "
                 f"{c['gain']:+.3f} [{low:+.3f}, {high:+.3f}] (0 is {verdict} the 95% interval)")
  return "\n".join(lines)


@dataclasses.dataclass
class GroupSummary:
  """The evaluation of a group of tasks (module docstring).

  Attributes:
    tasks: tasks in the group.
    trials: trials counted (at most k per task).
    success: the fraction of those trials that passed.
    pass_at_k, pass_hat_k: fractions of the group's tasks.
    mean_score: mean trial score, or None when the domain gave none.
    grader_errors: trials whose outcome status is "grader_error".
    aborted: trials the loop counted aborted (its per-attempt flags; without them, those with
      status "aborted"). Grader errors are a part of aborted trials when the flags are given.
  """
  tasks: int = 0
  trials: int = 0
  success: float = 0.0
  pass_at_k: float = 0.0
  pass_hat_k: float = 0.0
  mean_score: Optional[float] = None
  grader_errors: int = 0
  aborted: int = 0

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def report_trials(report: Mapping[str, Any],
                  scores: Optional[Mapping[tuple, float]] = None) -> dict[str, list[dict]]:
  """Every trial of every split of an `evaluate_policy` report, attempts in order.

  Args:
    report: {split: {"per_instance": {task id: [resolved per attempt]}, and optionally
      "per_instance_aborted" and "per_instance_status" alike}}.
    scores: {(task id, attempt): a domain's trial score}, or None.
  Returns:
    {task id: [{"passed", "status", and "aborted" / "score" when known}]}.
  """
  trials: dict[str, list[dict]] = {}
  for split in report.values():
    aborted = split.get("per_instance_aborted", {})
    statuses = split.get("per_instance_status", {})
    for task_id, verdicts in split.get("per_instance", {}).items():
      flags, status = aborted.get(task_id, ()), statuses.get(task_id, ())
      trials[task_id] = [
          {"passed": bool(v), "status": status[a] if a < len(status) else None,
           **({"aborted": bool(flags[a])} if a < len(flags) else {}),
           **({"score": float(scores.get((task_id, a), 0.0))} if scores is not None else {})}
          for a, v in enumerate(verdicts)]
  return trials


def summarize_groups(trials: Mapping[str, Sequence[Mapping]],
                     groups: Mapping[str, Sequence[str]], k: int, *,
                     overall: Optional[str] = "all") -> dict[str, GroupSummary]:
  """One GroupSummary per group, and one over every task named `overall` (None: none).

  Args:
    trials: {task id: trials} as `report_trials` gives ("passed", "status", optional "aborted"
      and "score"). Only a task's first k trials count.
    groups: {task id: the groups it belongs to} (a task may be in several, or none).
    k: trials per task.
  """
  members: dict[str, list[str]] = {}
  if overall is not None:
    members[overall] = list(trials)
  for task_id in trials:
    for group in groups.get(task_id, ()):
      members.setdefault(group, []).append(task_id)
  out = {}
  for group, ids in members.items():
    s = GroupSummary(tasks=len(ids))
    scores, passed = [], 0
    for task_id in ids:
      done = list(trials[task_id])[:k]
      verdicts = [bool(t.get("passed")) for t in done]
      passed += sum(verdicts)
      s.pass_at_k += any(verdicts)
      s.pass_hat_k += bool(verdicts) and all(verdicts) and len(verdicts) == k
      scores += [float(t["score"]) for t in done if t.get("score") is not None]
      s.grader_errors += sum(t.get("status") == "grader_error" for t in done)
      s.aborted += sum(bool(t.get("aborted", t.get("status") == "aborted")) for t in done)
      s.trials += len(done)
    if ids:
      s.pass_at_k /= len(ids)
      s.pass_hat_k /= len(ids)
    s.success = passed / s.trials if s.trials else 0.0
    s.mean_score = sum(scores) / len(scores) if scores else None
    out[group] = s
  return out


def format_group_table(summaries: Mapping[str, GroupSummary], k: int, *,
                       title: str = "group", overall: str = "all") -> str:
  """A fixed-width table, one row per group (sorted, `overall` last): tasks, trials, success,
  pass@k, pass^k, mean score (when any group has one), grader errors, aborted."""
  order = sorted(g for g in summaries if g != overall) + ([overall] if overall in summaries
                                                          else [])
  width = max([len(title), *(len(g) for g in order)])
  scored = any(s.mean_score is not None for s in summaries.values())
  lines = [f"{title:<{width}} {'tasks':>5} {'trials':>6} {'success':>7} {f'pass@{k}':>7} "
           f"{f'pass^{k}':>7}{' score' if scored else ''} {'grader_err':>10} {'aborted':>7}"]
  for g in order:
    s = summaries[g]
    score = (f" {s.mean_score:>5.3f}" if s.mean_score is not None else f" {'-':>5}") \
        if scored else ""
    lines.append(f"{g:<{width}} {s.tasks:>5} {s.trials:>6} {s.success:>7.1%} "
                 f"{s.pass_at_k:>7.1%} {s.pass_hat_k:>7.1%}{score} {s.grader_errors:>10} "
                 f"{s.aborted:>7}")
  return "\n".join(lines)
