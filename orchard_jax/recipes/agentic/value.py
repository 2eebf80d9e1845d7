"""Historical experience distillation: a value model trained on the trajectory store
(docs/algorithms.md section 6; Orchard: 69.7 -> 73.0 on SWE-bench Verified with best-of-k).

Trajectories from earlier experiments (RL rollouts, evaluations, distillation, the replay
expert) are read from one or more trajectory stores; each evaluated, non-aborted trajectory
becomes one token sequence (its recorded ids when the proxy recorded it, else its messages with
the policy's chat template) labelled with its resolved outcome. A `ValueModel` (the
policy backbone with a scalar head; from a policy checkpoint or a preset) is trained with binary
cross-entropy at the final position (optionally every position) by the shared trainer. Tasks
are split into train and held-out by a hash of their id, and the held-out trajectories give
ROC AUC, expected calibration error, and best-of-k next to pass@k and random@k
(rl.reranking_report), as SWE-RM and R2E-Gym advise.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import zlib
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from orchard_jax import data, models, parallel, rl, train
from orchard_jax.models.value import ValueModel  # not re-exported by orchard_jax.models yet
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import checks, policy as policy_lib
from orchard_jax.recipes.agentic.sft import trajectory_sequences

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class LabelledSequence:
  """One trajectory's token sequence and its resolved label."""
  sequence: Any
  label: float
  task_id: str
  trajectory_id: str


def stores_of(config) -> list[str]:
  """The stores config.value.stores names (default: every runs/*/store).

  Raises:
    ConfigError: a named store does not exist (opening it would create an empty one).
  """
  stores = [s for s in tuple(config.value.stores) if s]
  missing = [s for s in stores if not os.path.isdir(s)]
  if missing:
    raise ConfigError(f"value.stores names {missing}, which do not exist (expected "
                            "trajectory store folders such as runs/swe_rpr_tiny/store; relative "
                            f"to {os.getcwd()})")
  if not stores:
    stores = sorted(glob.glob(os.path.join("runs", "*", "store")))
  return stores


def labelled_sequences(store_paths: Sequence[str], tokenizer, *, seq_len: int,
                       experiments: Sequence[str] = ()) -> tuple[list[LabelledSequence], dict]:
  """One labelled sequence per evaluated, non-aborted trajectory in the stores.

  The sequence is the last (most complete) one of the trajectory; trajectories longer than
  seq_len are skipped and counted (a value model must see the whole history).
  """
  out, stats = [], {"trajectories": 0, "unevaluated": 0, "aborted": 0, "too_long": 0,
                    "no_tokens": 0}
  seen = set()
  for path in store_paths:
    with data.TrajectoryStore(path) as store:
      for t in store.trajectories():
        if experiments and t.experiment not in set(experiments):
          continue
        if t.trajectory_id in seen:
          continue
        seen.add(t.trajectory_id)
        stats["trajectories"] += 1
        if t.resolved is None:
          stats["unevaluated"] += 1
          continue
        if t.metadata.get("aborted") or t.exit_status == "aborted":
          stats["aborted"] += 1
          continue
        try:
          sequences = trajectory_sequences(t, tokenizer, store)
        except data.DataError:
          sequences = []
        if not sequences:
          stats["no_tokens"] += 1
          continue
        sequence = sequences[-1]
        if len(sequence) > seq_len:
          stats["too_long"] += 1
          continue
        out.append(LabelledSequence(sequence, float(bool(t.resolved)), t.task_id,
                                    t.trajectory_id))
  stats["kept"] = len(out)
  stats["resolved"] = int(sum(s.label for s in out))
  return out, stats


def split_by_task(items: Sequence[LabelledSequence], heldout_fraction: float
                  ) -> tuple[list[LabelledSequence], list[LabelledSequence]]:
  """(train, held-out) by crc32 of the task id (all attempts of a task stay together)."""
  cut = int(round(heldout_fraction * 10_000))
  train_items, heldout = [], []
  for item in items:
    (heldout if zlib.crc32(item.task_id.encode()) % 10_000 < cut else train_items).append(item)
  return train_items, heldout


def pack_labelled(items: Sequence[LabelledSequence], *, batch_size: int, seq_len: int,
                  data_parallel_size: int, seed: int = 0, shuffle: bool = True):
  """Packed batches with `value_labels` [batch, seq] (the label on each sequence's tokens,
  `data.pack_sequences(value_labels=...)`) and the placements, so predictions can be read back
  per sequence."""
  return data.pack_sequences([i.sequence for i in items], batch_size=batch_size,
                             seq_len=seq_len, data_parallel_size=data_parallel_size,
                             overflow="drop", seed=seed, shuffle=shuffle,
                             value_labels=[i.label for i in items])


def build_value_model(config, mesh, tokenizer) -> ValueModel:
  """A ValueModel: from value.init_from_policy (a policy checkpoint or HF folder) when set,
  else a fresh one of value.preset."""
  v = config.value
  if v.init_from_policy:
    policy = policy_lib.build_policy(config.policy, mesh, vocab_size=tokenizer.vocab_size,
                                     init=v.init_from_policy)
    return ValueModel.from_policy(policy, rngs=nnx.Rngs(int(config.seed)))
  model_config = models.get_preset(v.preset)
  if model_config.vocab_size < tokenizer.vocab_size:
    raise policy_lib.PolicyError(f"value preset {v.preset!r} has vocab_size "
                                f"{model_config.vocab_size}; the tokenizer needs "
                                f"{tokenizer.vocab_size}")
  return parallel.create_sharded(
      lambda: ValueModel(model_config, rngs=nnx.Rngs(int(config.seed))), mesh)


def value_checkpoint_dir(path: str, *, field: str = "eval.value_checkpoint") -> str:
  """The orbax checkpoint folder of the value model a value run wrote under `path` (the run
  folder, its value/ folder, or checkpoints/). Cheap: callers check it before any work.

  Raises:
    PolicyError: there is none (the message names the config field and the path).
  """
  for sub in ("value", ""):
    folder = policy_lib.find_checkpoint_dir(os.path.join(path, sub) if sub else path)
    if folder:
      return folder
  raise policy_lib.PolicyError(f"{field}: no value-model checkpoint under {path!r} (expected "
                              "the folder of a value run, e.g. swe_value)")


def load_value_model(config, path: str, mesh, tokenizer) -> ValueModel:
  """The value model a value run wrote (run folder, its value/ folder, or checkpoints/)."""
  folder = value_checkpoint_dir(path)
  model = build_value_model(config, mesh, tokenizer)
  policy_lib.load_params(model, folder, mesh)
  return model


def value_probabilities(model, items: Sequence[LabelledSequence], *, batch_size: int,
                        seq_len: int, mesh) -> np.ndarray:
  """P(resolved) the value model gives each sequence at its final token; [len(items)]."""
  if not items:
    return np.zeros(0, np.float32)
  dp = train.data_parallel_size(mesh)
  batch_size = max(batch_size - batch_size % dp, dp)
  packed = pack_labelled(items, batch_size=batch_size, seq_len=seq_len, data_parallel_size=dp,
                         shuffle=False)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, ids, positions, segments):
    return nnx.merge(graphdef, state)(ids, positions, segments)

  values = [np.asarray(forward(state, b["input_ids"], b["positions"], b["segment_ids"]))
            for b in packed.batches]
  out = np.full(len(items), np.nan, np.float32)
  for i, place in enumerate(packed.placements):
    if place is not None:
      logit = values[place.batch][place.row, place.start + place.length - 1]
      out[i] = 1.0 / (1.0 + np.exp(-float(logit)))
  return out


def reranking(items: Sequence[LabelledSequence], probs: np.ndarray,
              ks: Sequence[int]) -> dict[str, float]:
  """rl.reranking_report over the tasks of `items` (candidates = a task's trajectories)."""
  tasks: dict[str, tuple[list, list]] = {}
  for item, p in zip(items, probs):
    scores, labels = tasks.setdefault(item.task_id, ([], []))
    scores.append(float(p))
    labels.append(bool(item.label))
  return rl.reranking_report(list(tasks.values()), ks=tuple(ks))


def fit_value(config, run_dir: str, mesh, tokenizer) -> dict[str, Any]:
  """Trains the value model on the stores and reports held-out reranking metrics.

  Returns:
    {"data": stats, "train": last metrics, "heldout": reranking report, "train_fit": the same on
    the training trajectories}; also written to run_dir/value/report.json.
  Raises:
    ConfigError: a named store does not exist, the stores hold no labelled trajectory to
      train on, or value.batch_size does not split over microbatches and devices (launch/run.py
      prints each as one line).
  """
  v = config.value
  items, stats = labelled_sequences(stores_of(config), tokenizer, seq_len=int(v.seq_len),
                                    experiments=tuple(v.experiments))
  train_items, heldout = split_by_task(items, float(v.heldout_fraction))
  stats.update({"train": len(train_items), "heldout": len(heldout)})
  print("value data: " + ", ".join(f"{k}={val}" for k, val in stats.items()), flush=True)
  if not train_items:
    raise ConfigError(f"no labelled trajectory to train the value model on in "
                      f"{stores_of(config)}; run an RL or eval experiment first")
  checks.check_batch_sizes(config, ("value",))
  dp = train.data_parallel_size(mesh)
  packed = pack_labelled(train_items, batch_size=int(v.batch_size), seq_len=int(v.seq_len),
                         data_parallel_size=dp, seed=int(config.seed))
  batches = packed.batches
  total = int(v.epochs) * len(batches)
  model = build_value_model(config, mesh, tokenizer)
  optimizer = train.OptimizerConfig(learning_rate=float(v.lr), end_learning_rate=float(v.end_lr),
                                    warmup_steps=int(v.warmup_steps), total_steps=total,
                                    weight_decay=0.0)
  trainer_config = train.TrainerConfig(
      workdir=os.path.join(run_dir, "value"), total_steps=total, optimizer=optimizer,
      microbatches=int(v.microbatches), save_every=10 ** 9, keep_checkpoints=1,
      async_checkpoints=False, seed=int(config.seed), progress=bool(config.progress))

  def batch_for_step(step: int):
    epoch, index = divmod(step, len(batches))
    order = np.random.default_rng([int(config.seed), epoch]).permutation(len(batches))
    return batches[order[index]]

  loss = train.ValueLoss(every_position=bool(v.every_position))
  with train.Trainer(model, loss, trainer_config, mesh=mesh) as trainer:
    last = trainer.fit(batch_for_step)
    trained = trainer.model()
  report = {"data": stats, "train": {k: float(val) for k, val in last.items()
                                     if np.ndim(val) == 0}}
  for name, subset in (("heldout", heldout), ("train_fit", train_items)):
    if subset:
      probs = value_probabilities(trained, subset, batch_size=int(v.batch_size),
                                  seq_len=int(v.seq_len), mesh=mesh)
      report[name] = reranking(subset, probs, v.ks)
  os.makedirs(os.path.join(run_dir, "value"), exist_ok=True)
  with open(os.path.join(run_dir, "value", "report.json"), "w") as f:
    json.dump(report, f, indent=1, default=float)
  return report


def rollout_scorer(value_model, store, tokenizer, *, seq_len: int, batch_size: int, mesh):
  """`rollouts -> P(resolved)` for best-of-k in evaluation (0.5 for a rollout with no
  tokens or longer than seq_len, which ranks it in the middle)."""
  def score(rollouts) -> np.ndarray:
    items, index = [], []
    for i, r in enumerate(rollouts):
      try:
        sequences = trajectory_sequences(r.trajectory, tokenizer, store)
      except data.DataError:
        sequences = []
      if sequences and len(sequences[-1]) <= seq_len:
        items.append(LabelledSequence(sequences[-1], 0.0, r.trajectory.task_id,
                                      r.trajectory.trajectory_id))
        index.append(i)
    out = np.full(len(rollouts), 0.5, np.float32)
    probs = value_probabilities(value_model, items, batch_size=batch_size, seq_len=seq_len,
                                mesh=mesh)
    for i, p in zip(index, probs):
      if np.isfinite(p):
        out[i] = p
    return out
  return score


def format_value_report(report: dict[str, Any]) -> str:
  lines = []
  for name in ("heldout", "train_fit"):
    if name in report:
      r = report[name]
      parts = [f"AUC {r.get('auc', float('nan')):.3f}", f"ECE {r.get('ece', float('nan')):.3f}"]
      for key in sorted(r):
        if key.startswith("best_of_"):
          k = key.split("_")[-1]
          nan = float("nan")
          parts.append(f"best-of-{k} {r[key]:.3f} pass@{k} {r.get(f'pass_at_{k}', nan):.3f}"
                       f" random@{k} {r.get(f'random_at_{k}', nan):.3f}")
      lines.append(f"value[{name}] " + "  ".join(parts))
  return "\n".join(lines)
