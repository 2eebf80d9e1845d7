"""Credit-assignment SFT for any domain (docs/algorithms.md section 1).

Data: trajectories with outcomes, from the domain's seed trajectories (`Domain.seed_trajectories`,
e.g. SWE's replay expert executed on the training tasks; cached in the run's trajectory store),
from a trajectory store (e.g. a distillation or earlier RL run), or from a mini-swe-agent
trajectory folder.
Each trajectory becomes token sequences: from its recorded model calls when the store has them
(sampled ids are never re-tokenised), else from its messages with the student's chat template.
The paper's filters drop trajectories that are too long for the context, call undefined tools,
or hold unparsable actions (counted, never truncated).

Loss weights: the domain's annotator gives sparse V(s_t); `rl.trained_steps` keeps every
action of a resolved trajectory and only the actions in rise segments (credit >= eps) of an
unresolved one; observations never carry loss. `mode="resolved_only"` is the paper's ablation
(resolved trajectories only, every action).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from orchard_jax import data, rl, train
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic.checks import SFT_METHODS
from orchard_jax.train import cached_last_layer

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


def trajectory_sequences(trajectory: data.Trajectory, tokenizer, store=None,
                         image_tokens=None) -> list:
  """Token sequences of one trajectory: its recorded model calls when `store` has them (SFT
  mode: sampled ids kept, text-only calls tokenised, their images widened by `image_tokens`:
  digest -> token count), else its messages."""
  if store is not None and trajectory.session_id:
    calls = store.model_calls(trajectory.session_id)
    if calls:
      return data.sequences_from_model_calls(calls, mode="sft", tokenizer=tokenizer,
                                             image_tokens=image_tokens)
  return data.sft_sequences_from_messages(trajectory.messages, tokenizer, tools=trajectory.tools,
                                          session_id=trajectory.trajectory_id)


def count_actions(messages) -> int:
  """T, a trajectory's number of actions: its assistant messages (one per model call)."""
  return sum(1 for m in messages if m.get("role") == "assistant")


def credit_sequences(trajectories: Sequence[data.Trajectory], *, tokenizer, annotator,
                     mode: str = "credit", eps: float = 0.05, max_tokens: int = 65536,
                     tasks: Optional[dict] = None, store=None,
                     parser: str = "hermes", image_tokens=None) -> SFTData:
  """Credit-assignment SFT sequences (module docstring).

  Args:
    trajectories: evaluated trajectories.
    tokenizer: the student's tokenizer.
    annotator: the domain's `Annotator` (used for unresolved trajectories, and for resolved
      ones to report their rise segments).
    mode: "credit" or "resolved_only".
    eps: rise threshold.
    max_tokens: the context; longer trajectories are dropped.
    tasks: {task id: task} given to the annotator.
    store: where recorded model calls live (for trajectories with a session id).
    parser: tool-call parser for the unparsable-action filter.
    image_tokens: digest -> an image's token count, for text-only records with images (a
      vision-language student: images.PolicyImages.image_tokens).
  Raises:
    ConfigError (a ValueError): an unknown mode.
  """
  if mode not in SFT_MODES:
    raise ConfigError(f"sft.mode is {mode!r}; expected one of {SFT_MODES}")
  tasks = tasks or {}
  candidates, lengths, undefined, unparsable = [], [], [], []
  for t in trajectories:
    if mode == "resolved_only" and not t.resolved:
      continue
    sequences = trajectory_sequences(t, tokenizer, store, image_tokens)
    calls = store.model_calls(t.session_id) if store is not None and t.session_id else None
    reasons = data.trajectory_filter_reasons(t, parser=parser, calls=calls)
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
    num_steps = count_actions(t.messages)
    if num_steps == 0:
      continue
    resolved = bool(t.resolved)
    stats["resolved"] += resolved
    annotation = annotator.annotate(t, tasks.get(t.task_id))
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


def fit_sft(model, sequences: Sequence, sft_config, *, mesh, workdir: str, seed: int = 0,
              progress: bool = True, images=None) -> tuple[Any, dict]:
  """Trains `model` on the weighted sequences for sft.epochs epochs; returns (model, metrics).

  Resumes from workdir/checkpoints when a previous run left one (a finished run returns at
  once). Batches are fixed [batch_size, seq_len]; the batch order is reshuffled every epoch.
  Rows are no longer than the longest sequence needs (rounded up to sft.chunk_size): a
  sequence length raised for long prompts (an external harness's) then pads no row to it.
  A vision-language policy's `images` (images.PolicyImages) put the rows' images beside the
  batches; sft.frozen names parameters not trained (e.g. ("visual",): the vision tower), and
  sft.train_last_layers > 0 trains only the top decoder layers, final norm and LM head
  (train.OptimizerConfig.train_last_layers); sft.stop_loss > 0 ends the SFT at the first step
  whose loss is below it (early stopping; metrics["stopped_at"]).

  sft.method "cached_last_layer" trains instead only the last layer's readout on cached
  key/value states (`_fit_cached_last_layer`, train.cached_last_layer): exact, and a step costs
  milliseconds where a full step on an external CLI's 8-16k-token rows costs minutes on CPU.

  Raises:
    train.TrainError: no sequence to train on.
    ConfigError: an unknown sft.method, or images with the cached method.
    train.cached_last_layer.CachedLastLayerError: a model the cached method cannot train.
  """
  if not sequences:
    raise train.TrainError("SFT has no sequence with a loss token (no trajectories, or every "
                           "one was filtered)")
  method = str(sft_config.get("method", "full"))
  if method not in SFT_METHODS:
    raise ConfigError(f"sft.method is {method!r}; expected one of {SFT_METHODS}")
  if method == "cached_last_layer":
    if images is not None and images.image_tokens:
      raise ConfigError("sft.method 'cached_last_layer' trains text-only policies; these "
                        "sequences carry images (use sft.method 'full')")
    return _fit_cached_last_layer(model, sequences, sft_config, mesh=mesh, workdir=workdir,
                                  seed=seed, progress=progress)
  dp = train.data_parallel_size(mesh)
  chunk = max(1, int(sft_config.chunk_size))
  longest = max(len(s.input_ids) for s in sequences)
  seq_len = min(int(sft_config.seq_len), -(-longest // chunk) * chunk)
  packed = data.pack_sequences(sequences, batch_size=int(sft_config.batch_size),
                               seq_len=seq_len, data_parallel_size=dp,
                               overflow="drop", seed=seed,
                               num_batches_multiple_of=1,
                               **(images.pack_kwargs() if images else {}))
  batches = images.add(packed) if images else packed.batches
  total = int(sft_config.epochs) * len(batches)
  optimizer = train.OptimizerConfig(
      learning_rate=float(sft_config.lr), end_learning_rate=float(sft_config.end_lr),
      warmup_steps=int(sft_config.warmup_steps), total_steps=total, schedule="cosine",
      weight_decay=float(sft_config.weight_decay), max_grad_norm=float(sft_config.max_grad_norm),
      frozen=tuple(sft_config.get("frozen", ())),
      train_last_layers=int(sft_config.get("train_last_layers", 0)))
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
    last = trainer.fit(batch_for_step, stop_loss=float(sft_config.get("stop_loss", 0.0) or 0.0))
    return trainer.model(), {**last, "steps": trainer.step, "max_steps": total,
                             "batches": len(batches), **packed.stats.as_dict("packing/")}


def _fit_cached_last_layer(model, sequences: Sequence, sft_config, *, mesh, workdir: str,
                           seed: int, progress: bool) -> tuple[Any, dict]:
  """fit_sft for sft.method "cached_last_layer" (train.cached_last_layer): every step is one
  full-batch Adam update over all sequences (sft.epochs steps at most, sft.lr's schedule); it
  stops after the first step at which every target token has probability >= sft.min_target_prob
  (0: no early stop). The checkpoint under workdir/checkpoints is a Trainer's (every
  parameter, the optimiser state of the trained ones), written when the fit ends: a finished
  run returns at once, a run asked for a higher sft.min_target_prob than its checkpoint
  reached trains on from it, and policy.init can load it.
  """
  frozen = cached_last_layer.frozen_parameters(model)
  total = int(sft_config.epochs)
  optimizer = train.OptimizerConfig(
      learning_rate=float(sft_config.lr), end_learning_rate=float(sft_config.end_lr),
      warmup_steps=int(sft_config.warmup_steps), total_steps=total, schedule="cosine",
      weight_decay=float(sft_config.weight_decay), max_grad_norm=float(sft_config.max_grad_norm),
      frozen=frozen)
  trainer_config = train.TrainerConfig(
      workdir=workdir, total_steps=total, optimizer=optimizer, save_every=max(total, 1),
      keep_checkpoints=2, async_checkpoints=False, log_every=1, seed=seed, tensorboard=True,
      progress=False)
  min_prob = float(sft_config.get("min_target_prob", 0.0) or 0.0)
  with train.Trainer(model, train.SFTLoss(chunk_size=int(sft_config.chunk_size)), trainer_config,
                     mesh=mesh) as trainer:
    # Done: every step taken, or stopped by a margin at least the one asked for now (a
    # higher sft.min_target_prob resumes from the checkpoint's parameters and Adam state).
    done = trainer.restored_step is not None and (
        trainer.step >= total or (trainer.meta.get("stopped_at") is not None
                                  and float(trainer.meta.get("min_target_prob", 0.0)) >= min_prob))
    info = {"max_steps": total, "batches": len(sequences), "method": "cached_last_layer"}
    if done:
      last = {k: trainer.meta[k] for k in ("loss", "min_target_prob") if k in trainer.meta}
      if trainer.meta.get("stopped_at") is not None:
        last["stopped_at"] = trainer.meta["stopped_at"]
      return trainer.model(), {**last, "steps": trainer.step, **info}
    model = trainer.model()
    start = time.perf_counter()
    rows = cached_last_layer.cache_rows(
        model, [(s.input_ids, s.loss_weights) for s in sequences],
        chunk_size=int(sft_config.chunk_size))
    trainer.metrics.write(0, {"sft/cached_rows": len(rows),
                              "sft/loss_tokens": sum(int(r.targets.shape[0]) for r in rows),
                              "sft/cache_time_s": time.perf_counter() - start})

    def on_step(step: int, metrics: dict) -> None:
      trainer.metrics.write(step, metrics)
      if progress and (step == 1 or step % 50 == 0):
        print(f"SFT (cached last layer) step {step}: loss {metrics['loss']:.4f}, least likely "
              f"target token p={metrics['min_target_prob']:.3f}", flush=True)

    resumed = trainer.restored_step is not None
    result = cached_last_layer.fit(model, rows, trainer.optimizer, max_steps=total,
                                   min_target_prob=min_prob, on_step=on_step,
                                   opt_state=trainer.state["opt_state"] if resumed else None,
                                   start_step=trainer.step)
    params = train.ModelParts.of(model).pure_params()
    trainer.state = {**trainer.state, "step": jnp.asarray(result.steps, jnp.int32),
                     "params": jax.device_put(params, trainer.shardings["params"]),
                     "opt_state": jax.device_put(result.opt_state,
                                                 trainer.shardings["opt_state"])}
    last = {"loss": result.loss, "min_target_prob": result.min_target_prob}
    trainer.meta.pop("stopped_at", None)
    if result.stopped_at is not None:
      last["stopped_at"] = result.stopped_at
    trainer.save(extra_meta=last)
    return trainer.model(), {**last, "steps": result.steps, **info}
