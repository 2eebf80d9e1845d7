"""Plain next-token SFT of the policy on a text corpus: the trainer's end-to-end check.

`python launch/run.py --config experiments/lm_sft.py` trains the tiny policy on the Python
standard library's source files (present on every machine with Python), holding out a
deterministic split of files, and reports held-out loss beside the unigram baseline (the
cross-entropy of a model that ignores context), writing checkpoints, metrics.jsonl and
TensorBoard logs under config.workdir.
"""
import dataclasses
import os
import zlib
from typing import Any

import numpy as np
from absl import logging
from flax import nnx
from ml_collections import ConfigDict

from orchard_jax import data, models, parallel, recipes, train
from orchard_jax.recipes.agentic import run_config

def split_heldout(texts: list[str], heldout_fraction: float) -> tuple[list[str], list[str]]:
  """Deterministic file-level split: a file is held out when crc32(text) falls in the fraction."""
  cut = int(round(heldout_fraction * 10_000))
  train_texts, heldout = [], []
  for text in texts:
    (heldout if zlib.crc32(text.encode("utf-8", "replace")) % 10_000 < cut else train_texts
     ).append(text)
  return train_texts, heldout


def document_sequences(token_lists: list[list[int]], *, seq_len: int,
                       end_id: int) -> list[data.TrainingSequence]:
  """Each document + end-of-text, cut into pieces of at most seq_len tokens, one sequence each.

  Every token after a piece's first carries loss weight 1 (plain next-token SFT).
  """
  sequences = []
  for ids in token_lists:
    ids = np.asarray(list(ids) + [end_id], np.int32)
    for start in range(0, len(ids), seq_len):
      piece = ids[start:start + seq_len]
      if len(piece) < 2:
        continue
      weights = np.ones(len(piece), np.float32)
      weights[0] = 0.0
      sequences.append(data.TrainingSequence(
          input_ids=piece, loss_weights=weights, old_logprobs=np.zeros(len(piece), np.float32),
          action_ids=np.full(len(piece), -1, np.int32), logprobs_known=False))
  return sequences


def unigram_cross_entropy(train_batches, heldout_batches, vocab_size: int) -> float:
  """Held-out cross-entropy (nats/token) of the add-one-smoothed unigram model of the training
  tokens, over the same loss-carrying tokens the held-out loss averages."""
  counts = np.ones(vocab_size, np.float64)
  for batch in train_batches:
    ids = batch["input_ids"][batch["loss_weights"] > 0]
    counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
  log_p = np.log(counts / counts.sum())
  total, n = 0.0, 0
  for batch in heldout_batches:
    ids = batch["input_ids"][batch["loss_weights"] > 0]
    total -= log_p[ids].sum()
    n += ids.size
  return total / max(n, 1)


def _model_config(config: ConfigDict, vocab_size: int) -> models.ModelConfig:
  model_config = models.get_preset(config.preset)
  overrides = dict(config.get("model", {}))
  model_config = dataclasses.replace(model_config, **overrides)
  if model_config.vocab_size < vocab_size:
    raise train.TrainError(f"preset {config.preset!r} has vocab_size {model_config.vocab_size}; "
                           f"the tokenizer needs {vocab_size}")
  return model_config


def sft(config: ConfigDict) -> dict[str, Any]:
  """Runs next-token SFT on the standard library's source; returns the final metrics.

  Returns:
    {"heldout_loss", "unigram_loss", "train_loss", "steps", "workdir", ...}.
  Raises:
    recipes.ConfigError: train.total_steps below 1, workdir holding another run
      (run_config.RunFolderMismatch) or optimizer settings OptimizerConfig refuses (before any
      work).
  """
  dc, tc = config.data, config.train
  if int(tc.total_steps) < 1:       # checked before the corpus is read and tokenised
    raise recipes.ConfigError(f"train.total_steps is {tc.total_steps}; expected at least 1")
  # The trainer resumes from workdir/checkpoints: only a run of the same identity may.
  run_config.check_resume(config, config.workdir)
  try:
    optimizer = train.OptimizerConfig(total_steps=tc.total_steps, **dict(config.optimizer))
  except train.TrainError as e:
    raise recipes.ConfigError(f"optimizer: {e}") from e
  tokenizer = recipes.load_tokenizer(dc.tokenizer, field="data.tokenizer")
  texts, fingerprint = data.stdlib_corpus(max_chars_per_file=dc.max_chars_per_file)
  train_texts, heldout_texts = split_heldout(texts, dc.heldout_fraction)
  end_id = tokenizer.token_to_id("<|endoftext|>")
  end_id = tokenizer.eos_id if end_id is None else end_id
  mesh = parallel.make_mesh(config.mesh)
  dp = train.data_parallel_size(mesh)
  packs = {}
  for name, split in (("train", train_texts), ("heldout", heldout_texts)):
    sequences = document_sequences(tokenizer.encode_batch(split), seq_len=dc.seq_len,
                                   end_id=end_id)
    packs[name] = data.pack_sequences(
        sequences, batch_size=dc.batch_size, seq_len=dc.seq_len, data_parallel_size=dp,
        seed=dc.seed, pad_id=tokenizer.pad_id, overflow="error")
  train_batches = packs["train"].batches
  heldout_batches = packs["heldout"].batches[:dc.eval_batches]
  unigram = unigram_cross_entropy(train_batches, heldout_batches, tokenizer.vocab_size)
  logging.info("corpus %s: %d train files -> %d batches, %d held-out files; unigram "
               "cross-entropy %.3f nats/token", fingerprint[:12], len(train_texts),
               len(train_batches), len(heldout_texts), unigram)

  model_config = _model_config(config, tokenizer.vocab_size)
  model = parallel.create_sharded(
      lambda: models.CausalLM(model_config, rngs=nnx.Rngs(config.train.seed)), mesh)
  run_config.save_config(config, config.workdir)   # the trainer's folder, from here on
  trainer_config = train.TrainerConfig(
      workdir=config.workdir, total_steps=tc.total_steps, optimizer=optimizer,
      microbatches=tc.microbatches,
      load_balancing_coef=(model_config.router_aux_loss_coef if tc.load_balancing_coef < 0
                           else tc.load_balancing_coef),
      save_every=tc.save_every, keep_checkpoints=tc.keep_checkpoints,
      async_checkpoints=tc.async_checkpoints, eval_every=tc.eval_every, log_every=tc.log_every,
      seed=tc.seed, tensorboard=tc.tensorboard, progress=tc.progress)
  num_batches = len(train_batches)

  def batch_for_step(step: int):
    epoch, index = divmod(step, num_batches)
    order = np.random.default_rng([dc.seed, epoch]).permutation(num_batches)
    return train_batches[order[index]]

  def eval_fn(trainer):
    metrics = trainer.evaluate(heldout_batches)
    metrics["unigram_loss"] = unigram
    return metrics

  with train.Trainer(model, train.SFTLoss(chunk_size=tc.chunk_size), trainer_config,
                     mesh=mesh) as trainer:
    if trainer.restored_step is None:
      trainer.metrics.write_text(0, "config", f"<pre>{config}</pre>")
      trainer.metrics.write(0, {"data/unigram_loss": unigram,
                                "data/train_batches": num_batches,
                                **packs["train"].stats.as_dict("data/train_packing/")})
    last = trainer.fit(batch_for_step, eval_fn=eval_fn)
    tokenizer.save(os.path.join(config.workdir, "tokenizer"))
  result = {"heldout_loss": last.get("eval/loss"), "unigram_loss": unigram,
            "train_loss": last.get("loss"), "steps": trainer_config.total_steps,
            "workdir": config.workdir}
  logging.info("held-out loss %.3f vs unigram baseline %.3f nats/token (%s)",
               result["heldout_loss"], unigram, config.workdir)
  print(f"held-out loss {result['heldout_loss']:.3f} nats/token; unigram baseline "
        f"{unigram:.3f}; checkpoints and TensorBoard logs in {config.workdir}")
  return result
