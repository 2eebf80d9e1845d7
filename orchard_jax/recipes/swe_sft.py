"""Credit-assignment SFT for Orchard-SWE (docs/algorithms.md section 1).

Data: trajectories with outcomes, from the replay expert executed on the training tasks (the
default on machines without a teacher; cached in the run's trajectory store), from a trajectory
store (e.g. `swe_distill` or earlier RL runs), or from a mini-swe-agent trajectory folder.
Each trajectory becomes token sequences: from its recorded model calls when the store has them
(sampled ids are never re-tokenised), else from its messages with the student's chat template.
The paper's filters drop trajectories that are too long for the context, call undefined tools,
or hold unparsable actions (counted, never truncated).

Loss weights: an annotator (swe_annotate) gives sparse V(s_t); `rl.trained_steps` keeps every
action of a resolved trajectory and only the actions in rise segments (credit >= eps) of an
unresolved one; observations never carry loss. `mode="resolved_only"` is the paper's ablation
(resolved trajectories only, every action).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
from typing import Any, Optional, Sequence

import numpy as np

from orchard_jax import data, rl, train
from orchard_jax.recipes import ConfigError, swe_annotate
from orchard_jax.recipes.swe_evidence import read_steps

_log = logging.getLogger(__name__)

SFT_MODES = ("credit", "resolved_only")


@dataclasses.dataclass
class SFTData:
  """Training sequences with their provenance and the numbers to log.

  Attributes:
    sequences: TrainingSequences with credit-assignment loss weights.
    stats: counts: trajectories, resolved, filters (rl.filter_sft_trajectories' keys),
      annotation sources, rise segments, trained/total action steps, loss tokens.
  """
  sequences: list
  stats: dict


def expert_trajectories(instances: Sequence[Any], env_client, store, *, variants: Sequence[str],
                        agent_config, experiment: str, parallel: int = 2,
                        seed: int = 0) -> list[data.Trajectory]:
  """Replay-expert trajectories (executed and graded in sandboxes) for `instances`, from the
  store when it already holds them (same experiment, task and variant), else run and stored."""
  from orchard_jax.recipes import swe
  have = {}
  for t in store.trajectories(experiment=experiment):
    variant = (t.metadata.get("expert") or {}).get("variant")
    if variant:
      have[(t.task_id, variant)] = t
  todo = [i for i in instances if any((i.instance_id, v) not in have for v in variants)]

  def run(instance):
    missing = [v for v in variants if (instance.instance_id, v) not in have]
    return swe.expert_trajectories([instance], env_client, variants=missing,
                                   agent_config=agent_config, seed=seed, experiment=experiment)

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


def load_trajectories(source: str, *, experiments: Sequence[str] = (),
                      task_ids: Optional[set] = None) -> tuple[list[data.Trajectory], Any]:
  """Trajectories from a trajectory-store folder or a mini-swe-agent folder.

  Returns:
    (trajectories with an evaluation outcome, the store they came from or None).
  Raises:
    FileNotFoundError: `source` does not exist.
  """
  if not os.path.exists(source):
    raise FileNotFoundError(f"sft.source {source!r} does not exist (expected 'expert', a "
                            "trajectory store folder or a mini-swe-agent trajectory folder)")
  store = None
  if os.path.isdir(os.path.join(source, "trajectories")):
    store = data.TrajectoryStore(source)
    found = store.trajectories()
  else:
    found = data.import_miniswe(source)
  if experiments:
    found = [t for t in found if t.experiment in set(experiments)]
  if task_ids is not None:
    found = [t for t in found if t.task_id in task_ids]
  return [t for t in found if t.resolved is not None], store


def trajectory_sequences(trajectory: data.Trajectory, tokenizer, store=None) -> list:
  """Token sequences of one trajectory: its recorded model calls when `store` has them (SFT
  mode: sampled ids kept, text-only calls tokenised), else its messages."""
  if store is not None and trajectory.session_id:
    calls = store.model_calls(trajectory.session_id)
    if calls:
      return data.sequences_from_model_calls(calls, mode="sft", tokenizer=tokenizer)
  return data.sft_sequences_from_messages(trajectory.messages, tokenizer, tools=trajectory.tools,
                                          session_id=trajectory.trajectory_id)


def credit_sequences(trajectories: Sequence[data.Trajectory], *, tokenizer, annotator,
                     mode: str = "credit", eps: float = 0.05, max_tokens: int = 65536,
                     instances: Optional[dict] = None, store=None,
                     parser: str = "hermes") -> SFTData:
  """Credit-assignment SFT sequences (module docstring).

  Args:
    trajectories: evaluated trajectories.
    tokenizer: the student's tokenizer.
    annotator: EvidenceAnnotator or LLMAnnotator (used for unresolved trajectories, and for
      resolved ones to report their rise segments).
    mode: "credit" or "resolved_only".
    eps: rise threshold.
    max_tokens: the context; longer trajectories are dropped.
    instances: {instance_id: SWEInstance} given to the annotator.
    store: where recorded model calls live (for trajectories with a session id).
    parser: tool-call parser for the unparsable-action filter.
  Raises:
    ConfigError (a ValueError): an unknown mode.
  """
  if mode not in SFT_MODES:
    raise ConfigError(f"sft.mode is {mode!r}; expected one of {SFT_MODES}")
  instances = instances or {}
  candidates, lengths, undefined, unparsable = [], [], [], []
  for t in trajectories:
    if mode == "resolved_only" and not t.resolved:
      continue
    sequences = trajectory_sequences(t, tokenizer, store)
    reasons = data.trajectory_filter_reasons(t, parser=parser)
    candidates.append((t, sequences))
    lengths.append(sum(len(s) for s in sequences))
    undefined.append("undefined_tool_call" in reasons)
    unparsable.append("unparsable_action" in reasons)
  keep, stats = rl.filter_sft_trajectories(lengths, max_tokens=max_tokens,
                                           undefined_tool_call=undefined,
                                           unparsable_action=unparsable)
  stats = {f"filter/{k}": v for k, v in stats.items()}
  stats.update({"trajectories": len(trajectories), "resolved": 0, "segments": 0,
                "steps": 0, "trained_steps": 0, "loss_tokens": 0, "no_rise_dropped": 0,
                "annotation_fallbacks": 0})
  out = []
  for (t, sequences), kept in zip(candidates, keep):
    if not kept:
      continue
    num_steps = len(read_steps(t.messages))
    if num_steps == 0:
      continue
    resolved = bool(t.resolved)
    stats["resolved"] += resolved
    annotation = annotator.annotate(t, instances.get(t.task_id))
    stats["annotation_fallbacks"] += annotation.source == "evidence_fallback"
    if mode == "resolved_only":
      mask, segments = np.ones(num_steps, bool), []
    else:
      mask, segments = rl.trained_steps(num_steps, resolved, annotated_steps=annotation.steps,
                                        annotated_values=annotation.values, eps=eps)
    stats["segments"] += len(segments)
    stats["steps"] += num_steps
    stats["trained_steps"] += int(mask.sum())
    if not mask.any():
      stats["no_rise_dropped"] += 1
      continue
    for sequence in sequences:
      weighted = sequence.with_action_weights(mask.astype(np.float32))
      weighted.metadata.update({"trajectory_id": t.trajectory_id, "resolved": resolved})
      if weighted.num_loss_tokens:
        out.append(weighted)
        stats["loss_tokens"] += weighted.num_loss_tokens
  return SFTData(out, stats)


def train_sft(model, sequences: Sequence, sft_config, *, mesh, workdir: str, seed: int = 0,
              progress: bool = True) -> tuple[Any, dict]:
  """Trains `model` on the weighted sequences for sft.epochs epochs; returns (model, metrics).

  Resumes from workdir/checkpoints when a previous run left one (a finished run returns at
  once). Batches are fixed [batch_size, seq_len]; the batch order is reshuffled every epoch.

  Raises:
    train.TrainError: no sequence to train on.
  """
  if not sequences:
    raise train.TrainError("SFT has no sequence with a loss token (no trajectories, or every "
                           "one was filtered)")
  dp = train.data_parallel_size(mesh)
  packed = data.pack_sequences(sequences, batch_size=int(sft_config.batch_size),
                               seq_len=int(sft_config.seq_len), data_parallel_size=dp,
                               overflow="drop", seed=seed,
                               num_batches_multiple_of=1)
  batches = packed.batches
  total = int(sft_config.epochs) * len(batches)
  optimizer = train.OptimizerConfig(
      learning_rate=float(sft_config.lr), end_learning_rate=float(sft_config.end_lr),
      warmup_steps=int(sft_config.warmup_steps), total_steps=total, schedule="cosine",
      weight_decay=float(sft_config.weight_decay), max_grad_norm=float(sft_config.max_grad_norm))
  trainer_config = train.TrainerConfig(
      workdir=workdir, total_steps=total, optimizer=optimizer,
      microbatches=int(sft_config.microbatches),
      load_balancing_coef=float(getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0),
      save_every=int(sft_config.save_every), keep_checkpoints=2, async_checkpoints=False,
      log_every=1, seed=seed, tensorboard=True, progress=progress)

  def batch_for_step(step: int):
    epoch, index = divmod(step, len(batches))
    order = np.random.default_rng([seed, epoch]).permutation(len(batches))
    return batches[order[index]]

  with train.Trainer(model, train.SFTLoss(chunk_size=int(sft_config.chunk_size)), trainer_config,
                     mesh=mesh) as trainer:
    if trainer.restored_step is None:
      trainer.metrics.write(0, packed.stats.as_dict("sft/packing/"))
    last = trainer.fit(batch_for_step)
    return trainer.model(), {**last, "steps": total, "batches": len(batches),
                             **packed.stats.as_dict("packing/")}


def make_annotator(config):
  return swe_annotate.make_annotator(config.annotator)
