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
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional, Sequence

import numpy as np

from orchard_jax import rl
from orchard_jax.recipes.agentic.rollouts import RolloutRequest, RolloutRunner, rollout_seed

_log = logging.getLogger(__name__)


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
    requests = [RolloutRequest(task, a, rollout_seed(seed, "eval", task_id(task), a), prompt=i)
                for i, task in enumerate(tasks) for a in range(k)]
    rollouts = runner.run_with_progress(requests, f"eval {split}", progress_factory,
                                        policy_version=policy_version)
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
