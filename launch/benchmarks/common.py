"""Shared pieces of the benchmark suites: the row type, the table, timing helpers."""
import dataclasses
import importlib
import json
import os
import statistics
import time
from typing import Callable, Optional

# Suite name -> module under launch/benchmarks. One line per suite.
SUITES = {
    "model": "model",
    "train": "train",
    "sampler": "sampler",
    "proxy": "proxy",
    "env": "env",
    "claw": "claw",
    "vlm": "vlm",
    "gui": "gui",
    "gpu": "gpu",
    "sglang": "sglang",
}


@dataclasses.dataclass
class Row:
  """One measured quantity for orchard_jax beside its baseline measured in the same run.

  Attributes:
    case: what was measured, e.g. "tiny qwen3_moe fwd+bwd 4x512".
    metric: the quantity and its unit, e.g. "tokens/s" or "p50 ms".
    ours: orchard_jax's value.
    baseline: the baseline's value (None when there is no peer for this row).
    baseline_name: who the baseline is, e.g. "transformers 5.24 (torch, 2 threads)".
    higher_is_better: True for throughput, False for latency and memory.
    target: the ratio the project aims for (ours/baseline when higher is better, else
      baseline/ours), or None.
  """
  case: str
  metric: str
  ours: float
  baseline: Optional[float] = None
  baseline_name: str = ""
  higher_is_better: bool = True
  target: Optional[float] = None

  @property
  def ratio(self) -> Optional[float]:
    """How many times better orchard_jax is than the baseline (>1 is better)."""
    if self.baseline is None or self.baseline == 0 or self.ours == 0:
      return None
    return self.ours / self.baseline if self.higher_is_better else self.baseline / self.ours


def load_suite(name: str):
  """Imports the module of suite `name`."""
  return importlib.import_module(f"launch.benchmarks.{SUITES[name]}")


def print_table(suite: str, rows: list[Row]) -> None:
  """Prints the rows as a table with the ratio and whether the target is met."""
  from rich.console import Console
  from rich.table import Table
  table = Table(title=f"bench --suite {suite}")
  for column in ("case", "metric", "orchard_jax", "baseline", "baseline is", "ratio", "target"):
    table.add_column(column)
  for row in rows:
    ratio = row.ratio
    target = "" if row.target is None else (
        f">= {row.target:g}x " + ("met" if ratio is not None and ratio >= row.target else "MISSED"))
    table.add_row(row.case, row.metric, _fmt(row.ours), _fmt(row.baseline), row.baseline_name,
                  "" if ratio is None else f"{ratio:.2f}x", target)
  Console(width=200).print(table)


def write_json(path: str, rows: list[Row]) -> None:
  """Writes the rows (with their ratios) as a JSON list to `path`, creating its folder."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump([dict(dataclasses.asdict(r), ratio=r.ratio) for r in rows], f, indent=1)


def _fmt(value) -> str:
  if value is None:
    return ""
  return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def time_calls(fn: Callable[[], object], *, warmup: int, repeats: int) -> list[float]:
  """Calls fn warmup + repeats times and returns the last `repeats` durations in seconds."""
  for _ in range(warmup):
    fn()
  durations = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    durations.append(time.perf_counter() - start)
  return durations


def percentile(values: list[float], q: float) -> float:
  """The q-th percentile (0-100) of values, linear interpolation (numpy's default)."""
  ordered = sorted(values)
  if not ordered:
    raise ValueError("percentile of an empty list")
  position = (len(ordered) - 1) * q / 100
  low = int(position)
  high = min(low + 1, len(ordered) - 1)
  return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: list[float]) -> float:
  return statistics.median(values)
