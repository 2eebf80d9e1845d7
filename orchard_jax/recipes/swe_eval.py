"""Checkpoint evaluation for Orchard-SWE: pass@1, pass@k, and value-model best-of-k vs random@k.

The policy (served by a `PolicyService`) runs the harness k times on each evaluation instance
(fresh sandboxes, graded by SWE-bench's rules, reward R_bin only: docs/algorithms.md section 5 says
evaluation never uses the judge). Attempt a of instance i samples with a seed derived from
(eval.seed, i, a), so the same checkpoint evaluated again gives the same rollouts (up to the
float non-associativity of different batch compositions in the engine).

Metrics per split ("train": the RL training subset, "heldout": instances never trained on):
  pass@1, pass@k      unbiased estimators (rl.pass_at_k) averaged over instances
  random@k            the expected resolution of a random one of k candidates (= pass@1)
  best_of_k           with a value model: the resolution of the candidate it scores highest
                      (rl.reranking_report), plus its AUC and calibration (ECE) on these runs
Every evaluation trajectory lands in the trajectory store (experiment "<name>-eval").
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional, Sequence

import numpy as np

from orchard_jax import rl
from orchard_jax.recipes import swe_rollouts

_log = logging.getLogger(__name__)


def evaluate_policy(runner: swe_rollouts.RolloutRunner, splits: dict[str, Sequence[Any]], *,
                    k: int, seed: int, value_scorer=None, output_dir: Optional[str] = None,
                    policy_version: Optional[int] = None, progress_factory=None
                    ) -> dict[str, Any]:
  """Runs k attempts per instance of each split and reports the metrics (module docstring).

  Args:
    runner: a RolloutRunner without a judge (R_bin only).
    splits: {split name: instances}.
    k: attempts per instance.
    seed: base seed of the attempts.
    value_scorer: `(rollouts) -> probabilities` for best-of-k, or None.
    output_dir: where results.jsonl and summary.json go, or None.
    policy_version: stored on the trajectories.
    progress_factory: (total, description) -> progress bar, or None.
  Returns:
    {split: {"instances", "attempts", "pass@1", "pass@k", "random@k", "resolved", ...,
     "per_instance": {instance_id: [resolved per attempt]}}}.
  """
  report: dict[str, Any] = {}
  for split, instances in splits.items():
    if not instances:
      continue
    requests = [swe_rollouts.RolloutRequest(inst, a, swe_rollouts.rollout_seed(
        seed, "eval", inst.instance_id, a), prompt=i)
                for i, inst in enumerate(instances) for a in range(k)]
    bar = progress_factory(len(requests), f"eval {split}") if progress_factory else None
    try:
      rollouts = runner.run(requests, iteration=None, policy_version=policy_version,
                            progress=bar)
    finally:
      if bar is not None:
        bar.close()
    by_instance: dict[str, list] = {}
    for rollout in rollouts:
      by_instance.setdefault(rollout.request.instance.instance_id, []).append(rollout)
    labels = {iid: [r.resolved for r in sorted(rs, key=lambda r: r.request.attempt)]
              for iid, rs in by_instance.items()}
    split_report = {
        "instances": len(instances), "attempts": len(rollouts), "k": k,
        "resolved": int(sum(sum(v) for v in labels.values())),
        "aborted": int(sum(r.aborted for r in rollouts)),
        "pass@1": float(np.mean([rl.pass_at_k(len(v), sum(v), 1) for v in labels.values()])),
        f"pass@{k}": float(np.mean([rl.pass_at_k(len(v), sum(v), k) for v in labels.values()])),
        f"random@{k}": float(np.mean([rl.random_at_k(v, k) for v in labels.values()])),
        "per_instance": labels,
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
              "instance_id": rollout.request.instance.instance_id,
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


def format_report(report: dict[str, Any]) -> str:
  """One line per split: pass@1, pass@k, random@k, best-of-k when present."""
  lines = []
  for split, r in report.items():
    k = r["k"]
    extra = ""
    if f"best_of_{k}" in r:
      nan = float("nan")
      extra = (f"  best-of-{k} {r[f'best_of_{k}']:.3f}  value AUC "
               f"{r.get('value/auc', nan):.3f}  ECE {r.get('value/ece', nan):.3f}")
    lines.append(f"eval[{split}] {r['instances']} instances x {k}: resolved {r['resolved']}/"
                 f"{r['attempts']}  pass@1 {r['pass@1']:.3f}  pass@{k} {r[f'pass@{k}']:.3f}  "
                 f"random@{k} {r[f'random@{k}']:.3f}{extra}  aborted {r['aborted']}")
  return "\n".join(lines)
