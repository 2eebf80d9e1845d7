"""`python launch/run.py --config experiments/lm_sft.py`, run as a user runs it (shortened):
checkpoints, TensorBoard events, metrics with the held-out loss and the unigram baseline."""
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from orchard_jax import train
from orchard_jax.recipes import lm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_run_writes_checkpoints_tensorboard_and_heldout_loss(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device, as a user
  workdir = tmp_path / "lm"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "run.py"), "--config",
       os.path.join(ROOT, "experiments", "lm_sft.py"), f"--config.workdir={workdir}",
       "--config.train.total_steps=2", "--config.train.save_every=1",
       "--config.train.eval_every=1", "--config.data.batch_size=4", "--config.data.seq_len=64",
       "--config.data.eval_batches=1"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  assert "held-out loss" in result.stdout and "unigram baseline" in result.stdout
  assert "train:" in result.stderr                       # the progress bar
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2"]
  records = train.read_metrics(str(workdir))
  by_step = {r["step"]: r for r in records}
  assert by_step[0]["data/unigram_loss"] > 0
  assert np.isfinite(by_step[1]["loss"]) and np.isfinite(by_step[2]["eval/loss"])
  assert by_step[1]["learning_rate"] == 0.0 and by_step[2]["learning_rate"] > 0   # warmup
  events = EventAccumulator(str(workdir / "tensorboard"))
  events.Reload()
  assert {"loss", "grad_norm", "learning_rate", "tokens_per_s", "eval/loss"} <= set(
      events.Tags()["scalars"])
  assert os.path.exists(workdir / "tokenizer" / "tokenizer.json")


def test_heldout_split_and_unigram_baseline():
  texts = [f"file {i}" for i in range(400)]
  train_texts, heldout = lm.split_heldout(texts, 0.1)
  assert 20 <= len(heldout) <= 60 and len(train_texts) + len(heldout) == 400
  assert lm.split_heldout(texts, 0.1) == (train_texts, heldout)        # deterministic
  # unigram cross-entropy by hand: counts (+1 smoothing) of training loss tokens
  batch = {"input_ids": np.array([[0, 1, 1, 2]]), "loss_weights": np.array([[0, 1, 1, 1.0]])}
  held = {"input_ids": np.array([[3, 1, 2]]), "loss_weights": np.array([[0, 1, 1.0]])}
  p = np.array([1, 3, 2, 1]) / 7.0
  expected = -(np.log(p[1]) + np.log(p[2])) / 2
  assert abs(lm.unigram_cross_entropy([batch], [held], 4) - expected) < 1e-12


def test_documents_are_cut_into_sequences():
  sequences = lm.document_sequences([[5, 6, 7, 8, 9]], seq_len=3, end_id=0)
  assert [s.input_ids.tolist() for s in sequences] == [[5, 6, 7], [8, 9, 0]]
  assert sequences[0].loss_weights.tolist() == [0, 1, 1]


@pytest.mark.parametrize("override, message", [
    ("--config.train.total_steps=0", "error: train.total_steps is 0; expected at least 1"),
    ("--config.optimizer.warmup_steps=-1", "error: optimizer: need warmup_steps >= 0"),
])
def test_impossible_step_counts_are_one_line_before_any_work(tmp_path, override, message):
  # Walkthrough: a TrainError traceback (exit 1) after the corpus was read and tokenised.
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "run.py"), "--config",
       os.path.join(ROOT, "experiments", "lm_sft.py"), f"--config.workdir={tmp_path / 'run'}",
       override], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert message in result.stderr and "Traceback" not in result.stderr
  assert not (tmp_path / "run").exists()
