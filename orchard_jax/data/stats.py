"""Dataset statistics of a trajectory store: the table and the histograms.

`dataset_stats` counts trajectories per task, resolve rate, turns and tokens per trajectory,
exit statuses, and how many trajectories the Orchard SFT filters would drop (docs/algorithms.md
section 1: longer than the context, an undefined tool call, an unparsable action).
`DatasetStats.table()` formats them for a console; `plot_histograms` writes PNG plots.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from orchard_jax.data.records import ModelCall, Trajectory
from orchard_jax.data.sequences import sequences_from_model_calls, sft_sequences_from_messages
from orchard_jax.data.tool_calls import get_tool_call_parser

FILTERS = ("too_long", "undefined_tool_call", "unparsable_action")
# Exit statuses harnesses use for a malformed action (mini-swe-agent's names).
_FORMAT_EXITS = ("FormatError", "RepeatedFormatError")


@dataclasses.dataclass(frozen=True)
class DatasetStats:
  """Statistics of a set of trajectories.

  Attributes:
    trajectories: number of trajectories.
    per_task: task_id -> number of trajectories.
    resolved_per_task: task_id -> number resolved.
    evaluated, resolved: trajectories with an outcome, and resolved ones.
    turns: [trajectories] assistant turns of each trajectory.
    tokens: [k] tokens of each trajectory whose token count is known (recorded ids, or the
      tokenizer's count of its messages); may be shorter than `turns`.
    exit_status: exit status -> count.
    filters: filter name (FILTERS) -> trajectories it flags (one trajectory may count in
      several); plus "any" -> trajectories flagged by at least one.
  """
  trajectories: int
  per_task: dict[str, int]
  resolved_per_task: dict[str, int]
  evaluated: int
  resolved: int
  turns: np.ndarray
  tokens: np.ndarray
  exit_status: dict[str, int]
  filters: dict[str, int]

  @property
  def resolve_rate(self) -> float:
    """resolved / evaluated (nan when nothing was evaluated)."""
    return self.resolved / self.evaluated if self.evaluated else float("nan")

  def summary(self) -> dict[str, Any]:
    """Flat JSON-compatible summary."""
    return {
      "trajectories": self.trajectories, "tasks": len(self.per_task),
      "tasks_resolved": sum(1 for n in self.resolved_per_task.values() if n),
      "evaluated": self.evaluated, "resolved": self.resolved, "resolve_rate": self.resolve_rate,
      **{f"turns_{k}": v for k, v in _describe(self.turns).items()},
      **{f"tokens_{k}": v for k, v in _describe(self.tokens).items()},
      **{f"exit/{k}": v for k, v in self.exit_status.items()},
      **{f"filter/{k}": v for k, v in self.filters.items()},
    }

  def table(self) -> str:
    """A plain-text table for the console."""
    attempts = np.array(list(self.per_task.values()) or [0])
    rate = "n/a" if not self.evaluated else f"{100 * self.resolve_rate:.1f}%"
    rows = [
      ("trajectories", f"{self.trajectories}"),
      ("tasks", f"{len(self.per_task)}"),
      ("trajectories per task", f"min {attempts.min()}  mean {attempts.mean():.2f}  "
                                f"max {attempts.max()}"),
      ("resolved / evaluated", f"{self.resolved} / {self.evaluated}  ({rate})"),
      ("tasks with a resolve", f"{sum(1 for n in self.resolved_per_task.values() if n)} / "
                               f"{len(self.per_task)}"),
      ("turns per trajectory", _format_distribution(self.turns)),
      ("tokens per trajectory", _format_distribution(self.tokens)
       + ("" if len(self.tokens) == self.trajectories
          else f"  ({len(self.tokens)} of {self.trajectories} counted)")),
      ("exit status", ", ".join(f"{k or '(none)'} {v}" for k, v in
                                sorted(self.exit_status.items(), key=lambda kv: -kv[1])) or "-"),
      ("filters", ", ".join(f"{k} {v}" for k, v in self.filters.items())),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def trajectory_filter_reasons(trajectory: Trajectory, *, tokens: int | None = None,
                              max_tokens: int | None = None, parser: str = "hermes",
                              calls: Sequence[ModelCall] | None = None) -> list[str]:
  """Which of the Orchard SFT filters flag a trajectory (docs/algorithms.md section 1).

  - "too_long": `tokens` > `max_tokens` (both known).
  - "undefined_tool_call": an assistant tool call names a tool not in `trajectory.tools`, or
    tool-call markup in assistant text does (checked when the tools are known), or a recorded
    call's parse found one.
  - "unparsable_action": an assistant tool call whose arguments are not a JSON object, a
    format error in assistant text (tool-call markup that does not parse, an undeclared
    parameter, a think block that never closes; `data.parse_assistant_text`), a format error
    the proxy recorded for one of the session's delivered calls (`calls`, metadata
    "format_errors"), a harness format-error message (mini-swe-agent's extra.interrupt_type
    "FormatError"), or a format-error exit status.

  Args:
    trajectory: the trajectory.
    tokens, max_tokens: its token count and the context length.
    parser: tool-call parser name for markup in assistant text.
    calls: the session's recorded model calls, or None.
  Returns:
    Flagging filters, in FILTERS order.
  """
  reasons = set()
  if tokens is not None and max_tokens is not None and tokens > max_tokens:
    reasons.add("too_long")
  names = None
  if trajectory.tools:
    names = {t.get("function", t).get("name") for t in trajectory.tools}
  text_parser = get_tool_call_parser(parser)
  for message in trajectory.messages:
    extra = message.get("extra")
    if isinstance(extra, dict) and extra.get("interrupt_type") == "FormatError":
      reasons.add("unparsable_action")
    if message.get("role") != "assistant":
      continue
    for call in message.get("tool_calls") or ():
      fn = call.get("function", call) if isinstance(call, dict) else {}
      if names is not None and fn.get("name") not in names:
        reasons.add("undefined_tool_call")
      if not _is_json_object(fn.get("arguments", {})):
        reasons.add("unparsable_action")
    content = message.get("content")
    if isinstance(content, str) and ("<tool_call>" in content or "<think>" in content):
      parsed = text_parser.parse(content, trajectory.tools)
      if parsed.has_unparsable_call:
        reasons.add("unparsable_action")
      if parsed.has_undefined_tool:
        reasons.add("undefined_tool_call")
  for call in calls or ():
    if not call.delivered:
      continue
    kinds = {e.get("kind") for e in call.metadata.get("format_errors") or ()
             if isinstance(e, dict)}
    if kinds - {"undefined_tool"}:
      reasons.add("unparsable_action")
    if "undefined_tool" in kinds:
      reasons.add("undefined_tool_call")
  if trajectory.exit_status in _FORMAT_EXITS:
    reasons.add("unparsable_action")
  return [f for f in FILTERS if f in reasons]


def dataset_stats(trajectories: Iterable[Trajectory], *, store: Any = None,
                  tokenizer: Any = None, max_tokens: int | None = None, parser: str = "hermes",
                  filter_fn: Callable[[Trajectory, int | None], Sequence[str]] | None = None,
                  image_tokens: Callable[[str], int] | None = None) -> DatasetStats:
  """Statistics of trajectories (e.g. `store.trajectories(experiment=...)`).

  Tokens per trajectory: from the recorded ids of its session's model calls when `store` holds
  them, else from `tokenizer` rendering its messages (SFT tokenisation), else unknown.

  Args:
    trajectories: the trajectories.
    store: the `TrajectoryStore` holding their model calls, or None.
    tokenizer: `Tokenizer` to count tokens of trajectories without recorded ids, or None.
    max_tokens: context length for the "too_long" filter (None: filter not applied).
    parser: tool-call parser name for tool-call markup in assistant text.
    filter_fn: replaces `trajectory_filter_reasons`: (trajectory, tokens) -> reasons.
    image_tokens: digest -> an image's token count under the student's vision encoder, to
      count text-only records that show images (without it their tokens are unknown).
  Returns:
    `DatasetStats`.
  """
  per_task, resolved_per_task = collections.Counter(), collections.Counter()
  exits, filters = collections.Counter(), collections.Counter({f: 0 for f in FILTERS})
  filters["any"] = 0
  turns, tokens = [], []
  evaluated = resolved = count = 0
  for trajectory in trajectories:
    count += 1
    per_task[trajectory.task_id] += 1
    resolved_per_task[trajectory.task_id] += 0
    if trajectory.resolved is not None:
      evaluated += 1
      if trajectory.resolved:
        resolved += 1
        resolved_per_task[trajectory.task_id] += 1
    exits[trajectory.exit_status] += 1
    turns.append(trajectory.num_turns)
    n_tokens = _token_count(trajectory, store, tokenizer, image_tokens)
    if n_tokens is not None:
      tokens.append(n_tokens)
    calls = (store.model_calls(trajectory.session_id)
             if store is not None and trajectory.session_id else None)
    reasons = (filter_fn(trajectory, n_tokens) if filter_fn is not None else
               trajectory_filter_reasons(trajectory, tokens=n_tokens, max_tokens=max_tokens,
                                         parser=parser, calls=calls))
    for reason in reasons:
      filters[reason] += 1
    filters["any"] += bool(reasons)
  return DatasetStats(
    trajectories=count, per_task=dict(per_task), resolved_per_task=dict(resolved_per_task),
    evaluated=evaluated, resolved=resolved, turns=np.asarray(turns, np.int64),
    tokens=np.asarray(tokens, np.int64), exit_status=dict(exits), filters=dict(filters))


def plot_histograms(stats: DatasetStats, out_dir: str | os.PathLike) -> list[Path]:
  """Write the histograms as PNG files: turns.png, tokens.png (when counted),
  trajectories_per_task.png, resolve_rate_per_task.png, exit_status.png.

  Returns:
    The paths written.
  """
  import matplotlib

  matplotlib.use("Agg", force=False)
  import matplotlib.pyplot as plt

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []

  def save(fig, name):
    path = out_dir / name
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

  def histogram(values, name, xlabel, title):
    fig, ax = plt.subplots(figsize=(6, 4))
    values = np.asarray(values)
    ax.hist(values, bins=min(50, max(1, len(np.unique(values)))), color="#4c72b0")
    ax.set(xlabel=xlabel, ylabel="count", title=title)
    save(fig, name)

  histogram(stats.turns, "turns.png", "assistant turns", "Turns per trajectory")
  if len(stats.tokens):
    histogram(stats.tokens, "tokens.png", "tokens", "Tokens per trajectory")
  histogram(list(stats.per_task.values()) or [0], "trajectories_per_task.png",
            "trajectories", "Trajectories per task")
  rates = [stats.resolved_per_task[t] / n for t, n in stats.per_task.items() if n]
  histogram(rates or [0.0], "resolve_rate_per_task.png", "fraction resolved",
            "Resolve rate per task")
  fig, ax = plt.subplots(figsize=(6, 4))
  items = sorted(stats.exit_status.items(), key=lambda kv: -kv[1])
  ax.barh([k or "(none)" for k, _ in items], [v for _, v in items], color="#55a868")
  ax.invert_yaxis()
  ax.set(xlabel="trajectories", title="Exit status")
  save(fig, "exit_status.png")
  return written


def _token_count(trajectory: Trajectory, store: Any, tokenizer: Any,
                 image_tokens: Callable[[str], int] | None = None) -> int | None:
  if store is not None and trajectory.session_id:
    calls = store.model_calls(trajectory.session_id)
    if calls and (tokenizer is not None or not any(c.text_only for c in calls)):
      if image_tokens is None and any(c.text_only and c.images for c in calls):
        return None      # its images' token counts depend on a student's vision encoder
      return sum(len(s) for s in sequences_from_model_calls(
          calls, mode="sft", tokenizer=tokenizer, image_tokens=image_tokens))
  if tokenizer is not None and trajectory.messages:
    return sum(len(s) for s in sft_sequences_from_messages(trajectory.messages, tokenizer,
                                                           tools=trajectory.tools))
  return None


def _is_json_object(arguments: Any) -> bool:
  if isinstance(arguments, dict):
    return True
  if isinstance(arguments, str):
    try:
      return isinstance(json.loads(arguments), dict)
    except ValueError:
      return False
  return False


def _describe(values: np.ndarray) -> dict[str, float]:
  if not len(values):
    return {}
  return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
          "p90": float(np.percentile(values, 90)), "max": float(values.max())}


def _format_distribution(values: np.ndarray) -> str:
  d = _describe(values)
  if not d:
    return "-"
  return f"mean {d['mean']:.1f}  p50 {d['p50']:.0f}  p90 {d['p90']:.0f}  max {d['max']:.0f}"
