"""Metrics files read back by independent readers: JSON lines, and TensorBoard's own
EventAccumulator for the event files."""
import glob
import json
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from orchard_jax import train


def _events(directory):
  accumulator = EventAccumulator(os.path.join(directory, "tensorboard"),
                                 size_guidance={"scalars": 0, "histograms": 0})
  accumulator.Reload()
  return accumulator


def test_jsonl_and_tensorboard(tmp_path):
  load = np.array([[0.1, 0.4, 0.5], [0.3, 0.3, 0.4]])
  with train.MetricsWriter(str(tmp_path)) as writer:
    writer.write(1, {"loss": np.float32(2.5), "learning_rate": 1e-3, "moe/expert_load": load})
    writer.write(2, {"loss": 2.0, "nan_metric": float("nan")})
  lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [line["step"] for line in lines] == [1, 2]
  assert lines[0]["loss"] == 2.5 and lines[0]["moe/expert_load"] == load.tolist()
  assert lines[1]["nan_metric"] is None       # valid JSON, not NaN
  events = _events(str(tmp_path))
  assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 2.5), (2, 2.0)]
  assert events.Scalars("learning_rate")[0].value == pytest.approx(1e-3)
  assert "moe/expert_load" in events.Tags()["histograms"]


def test_resume_purges_later_steps(tmp_path):
  with train.MetricsWriter(str(tmp_path)) as writer:
    for step in range(1, 6):
      writer.write(step, {"loss": float(step)})
  with train.MetricsWriter(str(tmp_path), start_step=3) as writer:   # resumed from step 3
    for step in range(4, 6):
      writer.write(step, {"loss": 10.0 * step})
  records = train.read_metrics(str(tmp_path))
  assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0),
                                                        (5, 50.0)]
  scalars = [(e.step, e.value) for e in _events(str(tmp_path)).Scalars("loss")]
  assert scalars == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]


def test_torn_last_line_is_skipped(tmp_path):
  with train.MetricsWriter(str(tmp_path), tensorboard=False) as writer:
    writer.write(1, {"loss": 1.0})
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 2, "loss": ')
  assert [r["step"] for r in train.read_metrics(str(tmp_path))] == [1]
  assert not glob.glob(str(tmp_path / "tensorboard" / "*"))


def test_only_process_zero_writes_metrics_and_progress(tmp_path, monkeypatch, capsys):
  """A multi-host run, simulated: jax.process_index is monkeypatched to return 1 (this test
  runs in one process, so there is no real second host). Process 1 must not open, create or
  append to the shared run folder's files, nor draw a progress bar; process 0 still does."""
  import jax
  shared = tmp_path / "run"
  monkeypatch.setattr(jax, "process_index", lambda *args, **kwargs: 1)
  with train.MetricsWriter(str(shared), start_step=2) as writer:
    assert not writer.enabled
    writer.write(3, {"loss": 1.0})
    writer.write_text(3, "config", "lr: 1e-3")
    writer.flush()
  assert not shared.exists()
  bar = train.ProgressBar(10, description="host1", enabled=True)
  bar.update({"loss": 1.0})
  bar.close()
  assert "host1" not in capsys.readouterr().err
  with pytest.raises(train.TrainError, match="closed"):
    writer.write(4, {"loss": 1.0})       # closing still means closed on every process

  monkeypatch.setattr(jax, "process_index", lambda *args, **kwargs: 0)
  with train.MetricsWriter(str(shared), tensorboard=False) as writer:
    assert writer.enabled
    writer.write(1, {"loss": 2.0})
  assert [(r["step"], r["loss"]) for r in train.read_metrics(str(shared))] == [(1, 2.0)]
  bar = train.ProgressBar(10, description="host0", enabled=True)
  bar.update({"loss": 1.0})
  bar.close()
  assert "host0" in capsys.readouterr().err
