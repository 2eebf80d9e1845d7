"""Export trajectories as a Hugging Face `datasets` file of chat messages with outcomes.

One row per trajectory, in the shape chat SFT tools (TRL's SFTTrainer, transformers'
apply_chat_template) read:
  trajectory_id, task_id, attempt: str, str, int
  messages: list of {role, content, reasoning_content, tool_calls, tool_call_id, name}; chat
    roles only (mini-swe-agent's "exit" and "extra" are dropped); content parts joined to text;
    tool_calls as [{id, type, function: {name, arguments}}] with arguments a JSON string
  tools: JSON string of the tool schemas ("" when none), since schemas differ per tool
  resolved: bool or None (not evaluated); exit_status, submission: str
  rewards, outcome, metadata: JSON strings (free-form dicts)
  experiment: str or None; iteration, policy_version: int or None
Every row has the same Arrow schema, whatever the tools and outcomes hold.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from orchard_jax.data.errors import DataError
from orchard_jax.data.records import Trajectory, chat_messages


def trajectory_row(trajectory: Trajectory) -> dict[str, Any]:
  """The dataset row of one trajectory (see the module docstring)."""
  return {
    "trajectory_id": trajectory.trajectory_id, "task_id": trajectory.task_id,
    "attempt": trajectory.attempt, "messages": [_message(m) for m in
                                                chat_messages(trajectory.messages)],
    "tools": json.dumps(trajectory.tools, ensure_ascii=False) if trajectory.tools else "",
    "resolved": trajectory.resolved, "exit_status": trajectory.exit_status,
    "submission": trajectory.submission,
    "rewards": json.dumps(trajectory.rewards, ensure_ascii=False),
    "outcome": json.dumps(trajectory.outcome, ensure_ascii=False),
    "metadata": json.dumps(trajectory.metadata, ensure_ascii=False, default=str),
    "experiment": trajectory.experiment, "iteration": trajectory.iteration,
    "policy_version": trajectory.policy_version,
  }


def export_hf_dataset(trajectories: Iterable[Trajectory], path: str | os.PathLike | None = None):
  """Build a `datasets.Dataset` of the trajectories and optionally write it.

  Args:
    trajectories: e.g. `store.trajectories(experiment="swe_distill")`.
    path: where to write: "*.parquet" (to_parquet), "*.jsonl" / "*.json" (JSON lines), any
      other path a folder for `save_to_disk`; None writes nothing.
  Returns:
    The `datasets.Dataset` (load it back with datasets.load_dataset("parquet", data_files=...)
    or load_from_disk).
  Raises:
    DataError: no trajectories.
  """
  import datasets  # deferred: importing datasets takes a second

  rows = [trajectory_row(t) for t in trajectories]
  if not rows:
    raise DataError("no trajectories to export")
  dataset = datasets.Dataset.from_list(rows, features=_features(datasets))
  if path is not None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
      dataset.to_parquet(str(path))
    elif path.suffix in (".jsonl", ".json"):
      dataset.to_json(str(path), lines=True, force_ascii=False)
    else:
      dataset.save_to_disk(str(path))
  return dataset


def _message(message: dict) -> dict[str, Any]:
  content = message.get("content")
  if isinstance(content, list):
    content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
  calls = None
  if message.get("tool_calls"):
    calls = []
    for call in message["tool_calls"]:
      fn = call.get("function", call)
      args = fn.get("arguments", {})
      calls.append({"id": call.get("id"), "type": call.get("type", "function"),
                    "function": {"name": fn.get("name"),
                                 "arguments": args if isinstance(args, str)
                                 else json.dumps(args, ensure_ascii=False)}})
  return {"role": message["role"], "content": content,
          "reasoning_content": message.get("reasoning_content"), "tool_calls": calls,
          "tool_call_id": message.get("tool_call_id"), "name": message.get("name")}


def _features(datasets):
  # A Python list [feature] is a list feature in every datasets release (datasets.List is 4.x+).
  string, value = datasets.Value("string"), datasets.Value
  call = {"id": string, "type": string, "function": {"name": string, "arguments": string}}
  message = {"role": string, "content": string, "reasoning_content": string,
             "tool_calls": [call], "tool_call_id": string, "name": string}
  return datasets.Features({
    "trajectory_id": string, "task_id": string, "attempt": value("int64"),
    "messages": [message], "tools": string, "resolved": value("bool"),
    "exit_status": string, "submission": string, "rewards": string, "outcome": string,
    "metadata": string, "experiment": string, "iteration": value("int64"),
    "policy_version": value("int64")})
