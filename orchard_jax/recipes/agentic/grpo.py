"""The RL stage of the agentic loop: BAR groups -> advantages -> packed batches -> sharded updates.

One iteration (docs/algorithms.md sections 2-5; docs/design.md "the main job"):
1. choose prompts (training tasks), over-sampled by `rl.oversample` to replace dropped groups;
2. `groups.balanced_groups`: BAR strides of the domain's episodes through the proxy, each
   graded by the domain and rewarded R_bin or R' = R_bin + alpha J (RPR);
3. the group filter (`rl.select_groups`: aborted, zero reward spread, or no resolved rollout)
   keeps `prompts_per_iteration` groups;
4. GRPO advantages per group (`rl.grpo_advantages`), broadcast onto the tokens each rollout
   sampled, read back from the proxy's records (`data.sequences_from_model_calls`, RL mode:
   ids and log-probs exactly as sampled);
5. on-policy distillation when configured: teacher log-probs of the sampled tokens;
6. fixed-shape packed batches (`data.pack_sequences`), one optimiser update per batch, with
   `train.PolicyLoss`;
7. new weights into the engine (`ModelService.sync_weights`), an orbax checkpoint with the
   iteration in its meta (a restarted run resumes at the next iteration).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Optional, Sequence

import numpy as np

from orchard_jax import data, rl, train
from orchard_jax.recipes.agentic.groups import PromptGroup

_log = logging.getLogger(__name__)


def policy_loss(config) -> train.PolicyLoss:
  """train.PolicyLoss from the config's rl and opd blocks."""
  r, o = config.rl, config.opd
  return train.PolicyLoss(
      eps_low=float(r.eps_low), eps_high=float(r.eps_high), aggregation=r.aggregation,
      kl_coef=float(r.kl_coef), entropy_coef=float(r.entropy_coef),
      tis_cap=float(r.tis_cap) if r.tis_cap else None, opd_mode=o.mode,
      opd_divergence=o.divergence, opd_coef=float(o.coef), opd_lambda=float(o.lam),
      chunk_size=int(r.chunk_size))


def trainer_config(config, workdir: str, model_config) -> train.TrainerConfig:
  """The RL trainer: one update per packed batch, a checkpoint at the end of each iteration."""
  r = config.rl
  total = max(int(r.iterations) * int(r.max_updates_per_iteration), 1)
  optimizer = train.OptimizerConfig(
      learning_rate=float(r.lr), end_learning_rate=float(r.end_lr),
      warmup_steps=int(r.warmup_steps), total_steps=total, schedule=r.schedule,
      weight_decay=float(r.weight_decay), max_grad_norm=float(r.max_grad_norm),
      frozen=tuple(r.get("frozen", ())), train_last_layers=int(r.get("train_last_layers", 0)))
  return train.TrainerConfig(
      workdir=workdir, total_steps=total, optimizer=optimizer, microbatches=int(r.microbatches),
      load_balancing_coef=float(getattr(model_config, "router_aux_loss_coef", 0.0) or 0.0),
      save_every=10 ** 9, keep_checkpoints=int(r.keep_checkpoints), async_checkpoints=False,
      log_every=1, seed=int(config.seed), tensorboard=True, progress=False)


def choose_prompts(tasks: Sequence[Any], count: int, *, iteration: int, seed: int) -> list:
  """`count` training tasks for iteration `iteration`: consecutive draws from a stream of
  seeded permutations of the tasks (one per epoch), so every task comes up once before any
  repeats. While count <= len(tasks) no task comes up twice in one iteration: a draw that
  would repeat one (an epoch boundary inside the iteration) is deferred to the next
  iteration, as a repeated prompt trains a second group of the same task in one update. With
  count > len(tasks) repeats are unavoidable (balanced_groups samples them with other seeds).

  Deterministic in (tasks, count, iteration, seed): a resumed run draws the same prompts.
  Returns:
    `count` tasks (empty when `tasks` is).
  """
  n = len(tasks)
  if not n or count < 1:
    return []
  if count > n:
    out = []
    for j in range(iteration * count, (iteration + 1) * count):
      epoch, index = divmod(j, n)
      out.append(tasks[np.random.default_rng([seed, epoch]).permutation(n)[index]])
    return out
  pending: list[int] = []
  epoch = 0
  chosen: list[int] = []
  for _ in range(iteration + 1):       # replay the stream from the start: O(iteration * count)
    chosen, deferred = [], []
    while len(chosen) < count:
      if not pending:
        pending = [int(i) for i in np.random.default_rng([seed, epoch]).permutation(n)]
        epoch += 1
      index = pending.pop(0)
      (deferred if index in chosen else chosen).append(index)
    pending = deferred + pending
  return [tasks[i] for i in chosen]


@dataclasses.dataclass
class IterationData:
  """What one iteration trains on and the numbers to log."""
  sequences: list
  stats: dict


def group_sequences(groups: Sequence[PromptGroup], store, *, num_groups: int,
                    positive_is_resolved: bool = True) -> IterationData:
  """Group filter, GRPO advantages and the recorded token sequences of the kept groups.

  Rollouts whose records cannot train RL (text-only or missing log-probs) are left out and
  counted; a group that loses a rollout that way is dropped.
  """
  kept, stats = rl.select_groups([g.assembly.rollouts for g in groups], num_groups,
                                 positive_is_resolved=positive_is_resolved)
  out_stats = {f"groups/{k}": v for k, v in stats.items()}
  sequences, unusable, wires = [], 0, {}
  for index in kept:
    group = groups[index].group
    rewards = np.asarray([r.reward for r in group], np.float32)
    advantages = rl.grpo_advantages(rewards)
    per_rollout = []
    try:
      for rollout in group:
        calls = store.model_calls(rollout.session_id)
        per_rollout.append(data.sequences_from_model_calls(calls, mode="rl"))
    except data.DataError as error:
      _log.warning("group %d dropped: %s", index, error)
      unusable += 1
      continue
    for rollout in group:
      for call in store.model_calls(rollout.session_id):
        wire = str((call.metadata or {}).get("wire") or "chat_completions")   # older records
        wires[wire] = wires.get(wire, 0) + 1
    for rollout, seqs, advantage in zip(group, per_rollout, advantages):
      for s in seqs:
        s = s.with_advantage(float(advantage))
        s.metadata.update({"session_id": rollout.session_id, "reward": rollout.reward,
                           "resolved": rollout.resolved})
        sequences.append(s)
  out_stats["groups/unusable_records"] = unusable
  out_stats["groups/trained"] = len(kept) - unusable
  out_stats["train/sessions"] = len({s.metadata["session_id"] for s in sequences})
  out_stats.update({f"train/calls/{wire}": n for wire, n in sorted(wires.items())})
  return IterationData(sequences, out_stats)


def add_teacher_logprobs(sequences: list, teacher) -> list:
  """On-policy distillation: the teacher's log-probs of each sequence's tokens (its sampled
  tokens are what the loss uses), with teacher_mask 1 on loss tokens the teacher scored.
  Each token is scored at the temperature it was sampled at (the sequence's temperatures),
  as the student's log-probs in the loss are.

  Args:
    sequences: TrainingSequences.
    teacher: anything with `score(ids, temperature=T) -> [log-prob or None]` (a
      `ModelService`).
  """
  out = []
  for s in sequences:
    ids = [int(t) for t in s.input_ids]
    logprobs = np.zeros(len(ids), np.float32)
    valid = np.zeros(len(ids), np.float32)
    sampled = s.temperatures[s.loss_weights > 0]
    for temperature in np.unique(sampled) if sampled.size else [1.0]:
      at = s.temperatures == temperature
      scores = teacher.score(ids, temperature=float(temperature))
      logprobs[at] = [0.0 if v is None else v for v, a in zip(scores, at) if a]
      valid[at] = [v is not None for v, a in zip(scores, at) if a]
    out.append(dataclasses.replace(s, teacher_logprobs=logprobs,
                                   teacher_mask=valid * (s.loss_weights > 0)))
  return out


def pack_updates(sequences: list, config, *, data_parallel_size: int, seed: int,
                 images=None) -> tuple[list[dict], dict]:
  """Fixed-shape batches for one iteration's updates (at most rl.max_updates_per_iteration;
  sequences beyond are counted as over capacity, longer ones truncated and counted). Rows are
  [rl.batch_size, L] with L the longest sequence rounded up to rl.chunk_size, at most
  rl.seq_len: a context raised for long prompts (an external harness's 8-16k-token ones, to
  24576) then pads no row to it, as attention's cost grows with the row length squared (a
  new L compiles the train step once more). With a vision-language policy's `images`
  (images.PolicyImages) the batches carry their rows' images."""
  r = config.rl
  if not sequences:
    return [], {"packing/sequences": 0}
  chunk = max(1, int(r.chunk_size))
  longest = max(len(s.input_ids) for s in sequences)
  seq_len = min(int(r.seq_len), -(-longest // chunk) * chunk)
  packed = data.pack_sequences(sequences, batch_size=int(r.batch_size), seq_len=seq_len,
                               data_parallel_size=data_parallel_size, overflow="truncate",
                               seed=seed, **(images.pack_kwargs() if images else {}))
  batches = images.add(packed) if images else packed.batches
  limit = int(r.max_updates_per_iteration)
  stats = packed.stats.as_dict("packing/")
  stats["packing/over_capacity_batches"] = max(len(batches) - limit, 0)
  return batches[:limit], stats


def summary_line(iteration: int, total: int, stats: dict) -> str:
  """The per-iteration console line (reward mean, resolved, BAR, groups, tokens, time split)."""
  return (f"[it {iteration + 1}/{total}] reward {stats['reward/mean']:+.3f}  "
          f"resolved {stats['resolved/first']:.2f} (first rollouts; all "
          f"{stats['resolved/all']:.2f})  BAR rollouts {stats['bar/rollouts']} "
          f"target/widened/ranked {stats['bar/target']}/{stats['bar/widened']}/"
          f"{stats['bar/ranked']} pos.frac {stats['bar/positive_fraction']:.2f}  "
          f"groups dropped {stats['groups/dropped']} (aborted {stats['groups/dropped_aborted']},"
          f" zero-std {stats['groups/dropped_zero_reward_std']}, no-resolved "
          f"{stats['groups/dropped_no_positive']})  tokens trained {stats['train/tokens']}"
          f"{_sources(stats)}  time rollout {stats['time/rollout_s']:.0f}s judge "
          f"{stats['time/judge_s']:.0f}s train {stats['time/train_s']:.0f}s")


def _sources(stats: dict) -> str:
  """Where the trained rows came from: " (from S sessions' recorded calls: W N, ...)", the
  proxy wire each call was served on (chat / responses / messages), or "" when none."""
  wires = {k.split("/", 2)[2]: v for k, v in stats.items() if k.startswith("train/calls/")}
  if not wires:
    return ""
  calls = ", ".join(f"{wire} {n}" for wire, n in sorted(wires.items()))
  return f" (from {stats.get('train/sessions', 0)} sessions' recorded calls: {calls})"


def iteration_stats(groups: Sequence[PromptGroup]) -> dict:
  """Reward, resolved-rate and BAR numbers of one iteration's rollouts."""
  rollouts = [r for g in groups for r in g.rollouts]
  first = [r for g in groups for r in g.first_rollouts]
  assemblies = [g.assembly for g in groups]
  group_rollouts = [r for g in groups for r in g.group]
  judged = [r for r in rollouts if r.judgement is not None]
  scores = [r.judge_score for r in judged if r.judge_score is not None]
  return {
      "reward/mean": float(np.mean([r.reward for r in group_rollouts])) if group_rollouts
      else float("nan"),
      "resolved/first": float(np.mean([r.resolved for r in first])) if first else 0.0,
      "resolved/all": float(np.mean([r.resolved for r in rollouts])) if rollouts else 0.0,
      "rollouts/aborted": sum(r.aborted for r in rollouts),
      "rollouts/response_tokens_mean": float(np.mean([r.response_tokens for r in rollouts]))
      if rollouts else 0.0,
      "bar/rollouts": len(rollouts),
      "bar/target": sum(a.mode == "target" for a in assemblies),
      "bar/widened": sum(a.mode == "widened" for a in assemblies),
      "bar/ranked": sum(a.mode == "ranked" for a in assemblies),
      "bar/positive_fraction": float(np.mean([a.num_positive / max(len(a.rollouts), 1)
                                              for a in assemblies])) if assemblies else 0.0,
      "judge/failures": sum(r.judge_score is None for r in judged),
      "judge/score_mean": float(np.mean(scores)) if scores else float("nan"),
  }


def train_iteration(trainer, batches: Sequence[dict], *, extra_meta: dict) -> dict:
  """One optimiser update per batch; returns summed tokens and the last step's metrics."""
  start = time.perf_counter()
  tokens, last = 0, {}
  for batch in batches:
    last = trainer.train_step(batch, extra_meta=extra_meta)
    tokens += int(np.sum(batch["loss_weights"] > 0))
  return {"train/tokens": tokens, "train/updates": len(batches),
          "time/train_s": time.perf_counter() - start,
          **{f"train/{k}": v for k, v in last.items() if np.ndim(v) == 0}}


def broadcast_batches(batches: list[dict], *, keys: Sequence[str], shape: tuple[int, int]
                      ) -> list[dict]:
  """On a multi-host run, process 0's batches on every process (rollouts run on process 0).

  Args:
    batches: process 0's batches (ignored elsewhere).
    keys: the batch keys (fixed by the loss: the same on every process).
    shape: [batch, seq] of every array at most (rl.batch_size, rl.seq_len); process 0's row
      length (pack_updates) is broadcast with the batch count.
  """
  import jax
  if jax.process_count() == 1:
    return batches
  from jax.experimental import multihost_utils
  header = np.asarray([len(batches), batches[0]["input_ids"].shape[1] if batches else shape[1]],
                      np.int32)
  count, seq = (int(x) for x in multihost_utils.broadcast_one_to_all(header))
  shape = (shape[0], seq)
  ints = ("input_ids", "positions", "segment_ids")
  out = []
  for i in range(count):
    out.append({k: np.asarray(multihost_utils.broadcast_one_to_all(
        batches[i][k] if jax.process_index() == 0
        else np.zeros(shape, np.int32 if k in ints else np.float32))) for k in keys})
  return out
