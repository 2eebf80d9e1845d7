"""Training metrics: one JSON line per step, TensorBoard event files, and a console progress bar.

Layout under the run's directory:
  metrics.jsonl      {"step": int, "time": unix seconds, "<name>": value, ...} per logged step;
                     a resumed run appends {"event": "resume", "step": N} and continues, so a
                     step can appear twice (read_metrics keeps the one that counted).
  tensorboard/       event files (`tensorboard --logdir <run dir>/tensorboard`); a resumed run
                     purges events after the resume step, so curves do not double back.
Scalars go to both; arrays (e.g. expert load [layers, experts]) go to JSONL as nested lists and
to TensorBoard as one scalar per row's max/min plus a histogram.

In a multi-host run every process runs the same training loop, but only process 0
(`jax.process_index() == 0`) writes these files and draws the progress bar; the others would
append the same records to the same shared files and print every bar once per host.
"""
import json
import math
import os
import time
from typing import Any, Mapping, Optional

import numpy as np

from orchard_jax.train.errors import TrainError


def is_main_process() -> bool:
  """True on the process that writes metrics and progress: jax.process_index() == 0 (always
  true in a single-process run)."""
  import jax
  return jax.process_index() == 0


def _to_python(value: Any):
  array = np.asarray(value)
  if array.ndim == 0:
    item = array.item()
    return None if isinstance(item, float) and not math.isfinite(item) else item
  return array.tolist()


class MetricsWriter:
  """Writes per-step metrics to JSONL and TensorBoard; a context manager (closes the files).

  Args:
    directory: the run directory; created if missing.
    tensorboard: also write TensorBoard event files (tensorboardX).
    start_step: the number of steps already done when training resumes (0 for a fresh run);
      records are logged at the step count after each update (1, 2, ...), so TensorBoard events
      after start_step are purged and the JSONL gets a resume marker.
    enabled: write anything at all; None (default) means "on process 0 only"
      (`is_main_process()`). A disabled writer opens no file and its methods do nothing.
  """

  def __init__(self, directory: str, *, tensorboard: bool = True, start_step: int = 0,
               enabled: Optional[bool] = None):
    self.directory = directory
    self.jsonl_path = os.path.join(directory, "metrics.jsonl")
    self.enabled = is_main_process() if enabled is None else bool(enabled)
    self._closed = False
    self._jsonl = None
    self._tb = None
    if not self.enabled:
      return
    os.makedirs(directory, exist_ok=True)
    self._jsonl = open(self.jsonl_path, "a", buffering=1)
    if start_step > 0:
      self._jsonl.write(json.dumps({"event": "resume", "step": start_step, "time": time.time()})
                        + "\n")
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(directory, "tensorboard"),
                               purge_step=start_step + 1 if start_step > 0 else None, flush_secs=10,
                               # event file names carry whole seconds: a writer opened within
                               # the same second (a quick resume) must not reuse the old file.
                               filename_suffix=f".{os.getpid()}.{start_step}.{time.time_ns()}")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Records `metrics` for `step` (values: Python or NumPy/JAX scalars or arrays).

    Raises:
      TrainError: the writer is closed.
    """
    if self._closed:
      raise TrainError("MetricsWriter is closed")
    if not self.enabled:
      return
    record = {"step": int(step), "time": time.time()}
    record.update({name: _to_python(value) for name, value in metrics.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    if self._tb is None:
      return
    for name, value in metrics.items():
      array = np.asarray(value, dtype=np.float64) if not isinstance(value, str) else None
      if array is None:
        continue
      if array.ndim == 0:
        if math.isfinite(float(array)):
          self._tb.add_scalar(name, float(array), step)
      elif array.size:
        self._tb.add_histogram(name, array.reshape(-1), step)

  def write_text(self, step: int, name: str, text: str) -> None:
    """A free-form note (e.g. the config) in TensorBoard's text tab and the JSONL."""
    if self._jsonl is None:
      return
    self._jsonl.write(json.dumps({"step": int(step), "event": name, "text": text}) + "\n")
    if self._tb is not None:
      self._tb.add_text(name, text, step)

  def flush(self) -> None:
    if self._jsonl is not None:
      self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    self._closed = True
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_metrics(directory: str) -> list[dict]:
  """The per-step records of a run's metrics.jsonl, resolved across resumes, in step order.

  Records of one step (train metrics, then eval metrics) are merged; a resume marker discards
  what the interrupted run logged after the checkpoint it resumed from. A torn last line (a
  killed run) is skipped."""
  path = os.path.join(directory, "metrics.jsonl")
  by_step: dict[int, dict] = {}
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if "event" in record:
        if record["event"] == "resume":
          by_step = {s: r for s, r in by_step.items() if s <= record["step"]}
        continue
      by_step.setdefault(record["step"], {}).update(record)
  return [by_step[s] for s in sorted(by_step)]


class ProgressBar:
  """A tqdm bar over training steps showing the latest loss, learning rate and tokens/s.

  Args:
    total_steps, start_step: the bar's length and where it starts (a resumed run).
    description: the bar's label.
    enabled: False hides the bar; otherwise it is drawn on process 0 only (`is_main_process()`).
  """

  def __init__(self, total_steps: int, start_step: int = 0, *, description: str = "train",
               enabled: Optional[bool] = None):
    from tqdm.auto import tqdm
    self.enabled = enabled is not False and is_main_process()
    self._bar = tqdm(total=total_steps, initial=start_step, desc=description, unit="step",
                     dynamic_ncols=True, disable=not self.enabled, mininterval=0.5)

  def update(self, metrics: Mapping[str, Any], steps: int = 1) -> None:
    shown = {}
    for name, label, fmt in (("loss", "loss", "{:.4f}"), ("eval/loss", "eval", "{:.4f}"),
                             ("learning_rate", "lr", "{:.2e}"), ("tokens_per_s", "tok/s", "{:,.0f}")):
      if name in metrics and metrics[name] is not None:
        shown[label] = fmt.format(float(np.asarray(metrics[name])))
    self._bar.set_postfix(shown, refresh=False)
    self._bar.update(steps)

  def close(self) -> None:
    self._bar.close()
