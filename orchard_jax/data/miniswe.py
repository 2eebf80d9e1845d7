"""mini-swe-agent trajectory files: read, write, and export/import whole run folders.

mini-swe-agent (https://github.com/SWE-agent/mini-swe-agent, v2) saves one JSON file per
instance, `<run>/<instance_id>/<instance_id>.traj.json`:
  {"info": {"model_stats": {"instance_cost": float, "api_calls": int},
            "config": {"agent": {...}, "agent_type": str, "model": {...}, "model_type": str,
                       "environment": {...}, "environment_type": str},
            "mini_version": str, "exit_status": str, "submission": str,
            ["traceback": str, "exception_str": str]},
   "messages": [{"role": "system"|"user"|"assistant"|"tool"|"exit", "content": ...,
                 ["tool_calls": [...], "tool_call_id": str], "extra": {...}}, ...],
   "trajectory_format": "mini-swe-agent-1.1", "instance_id": str}
and `<run>/preds.json`, {instance_id: {"model_name_or_path", "instance_id", "model_patch"}},
the input of SWE-bench's evaluation. v1 files ("mini-swe-agent-1") have the same shape with
text-only actions.

Export writes one such run folder per attempt (`<out>/attempt_<k>/`), so each is what a
mini-swe-agent batch run would have written. Fields mini-swe-agent has no place for (outcome,
rewards, experiment, ...) go under info["orchard"], and a trajectory imported from
mini-swe-agent keeps the file's other top-level and info keys in metadata["miniswe"], so
store -> files -> store and files -> store -> files both round-trip without loss.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable

from orchard_jax.data.errors import TrajectoryFormatError
from orchard_jax.data.records import Trajectory

_log = logging.getLogger(__name__)

TRAJECTORY_FORMAT = "mini-swe-agent-1.1"
KNOWN_FORMATS = ("mini-swe-agent-1", "mini-swe-agent-1.1")
TRAJ_SUFFIX = ".traj.json"
_ORCHARD = "orchard"
_SYNTHESISED = "wrapper_synthesised"  # info/config keys were made up at export, not imported
_ATTEMPT_DIR = re.compile(r"^attempt_(\d+)\Z")
# Trajectory fields stored under info["orchard"] (messages, exit_status, submission and the
# task id have mini-swe-agent homes of their own).
_ORCHARD_FIELDS = ("trajectory_id", "attempt", "session_id", "tools", "outcome", "rewards",
                   "experiment", "iteration", "policy_version", "created_at")


def trajectory_to_miniswe(trajectory: Trajectory) -> dict[str, Any]:
  """The mini-swe-agent JSON object of one trajectory (see the module docstring)."""
  metadata = dict(trajectory.metadata)
  original = metadata.pop("miniswe", None) or {}
  data = json.loads(json.dumps(original))  # deep copy of the imported file's other keys
  info = data.setdefault("info", {})
  info.setdefault("model_stats", {"instance_cost": 0.0, "api_calls": trajectory.num_turns})
  info.setdefault("config", {})
  info.setdefault("mini_version", _miniswe_version())
  info["exit_status"] = trajectory.exit_status
  info["submission"] = trajectory.submission
  info[_ORCHARD] = {**{f: getattr(trajectory, f) for f in _ORCHARD_FIELDS},
                    "metadata": metadata, _SYNTHESISED: not original}
  data["messages"] = trajectory.messages
  data.setdefault("trajectory_format", TRAJECTORY_FORMAT)
  data["instance_id"] = trajectory.task_id
  return data


def trajectory_from_miniswe(data: dict[str, Any], *, source: str = "<data>",
                            attempt: int | None = None) -> Trajectory:
  """A `Trajectory` from a mini-swe-agent JSON object.

  Args:
    data: the parsed *.traj.json.
    source: where it came from (error messages; default trajectory id).
    attempt: attempt number when the file itself does not record one (else 0).
  Raises:
    TrajectoryFormatError: not a mini-swe-agent trajectory (no messages list or info object),
      or no instance id.
  """
  if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
    raise TrajectoryFormatError(
      f"{source}: expected a mini-swe-agent trajectory (an object with a 'messages' list), "
      f"got {type(data).__name__} with keys {sorted(data)[:8] if isinstance(data, dict) else ''}")
  info = data.get("info", {})
  if not isinstance(info, dict):
    raise TrajectoryFormatError(f"{source}: 'info' must be an object, got {type(info).__name__}")
  fmt = data.get("trajectory_format")
  if fmt not in KNOWN_FORMATS:
    _log.warning("%s: trajectory_format %r is not one of %s; reading it anyway", source, fmt,
                 KNOWN_FORMATS)
  task_id = data.get("instance_id") or info.get("instance_id")
  if not task_id:
    raise TrajectoryFormatError(f"{source}: no 'instance_id' in the trajectory")
  orchard = dict(info.get(_ORCHARD) or {})
  original = {k: v for k, v in data.items() if k not in ("messages", "instance_id")}
  original["info"] = {k: v for k, v in info.items()
                      if k not in (_ORCHARD, "exit_status", "submission")}
  metadata = dict(orchard.pop("metadata", {}) or {})
  if not orchard.pop(_SYNTHESISED, False):  # keep what mini-swe-agent wrote, not what we made up
    metadata["miniswe"] = original
  fields = {f: orchard[f] for f in _ORCHARD_FIELDS if f in orchard}
  fields.setdefault("trajectory_id", f"miniswe-{task_id}-{_digest(data)}")
  fields.setdefault("attempt", attempt or 0)
  fields.setdefault("created_at", _last_timestamp(data["messages"]))
  return Trajectory(task_id=str(task_id), messages=data["messages"],
                    exit_status=str(info.get("exit_status") or ""),
                    submission=str(info.get("submission") or ""), metadata=metadata, **fields)


def read_miniswe_trajectory(path: str | os.PathLike, *, attempt: int | None = None
                            ) -> Trajectory:
  """Read one *.traj.json file (see `trajectory_from_miniswe`).

  Raises:
    TrajectoryFormatError: unreadable JSON or not a mini-swe-agent trajectory.
  """
  path = Path(path)
  try:
    data = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise TrajectoryFormatError(f"{path}: cannot read a JSON trajectory ({e})") from e
  return trajectory_from_miniswe(data, source=str(path), attempt=attempt)


def write_miniswe_trajectory(trajectory: Trajectory, path: str | os.PathLike) -> Path:
  """Write one trajectory as a mini-swe-agent *.traj.json file (parents created)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(trajectory_to_miniswe(trajectory), indent=2, ensure_ascii=False))
  return path


def export_miniswe(trajectories: Iterable[Trajectory], out_dir: str | os.PathLike, *,
                   model_name: str = "orchard_jax") -> list[Path]:
  """Write trajectories as mini-swe-agent run folders, one per attempt number.

  Layout: out_dir/attempt_<k>/<task_id>/<task_id>.traj.json and out_dir/attempt_<k>/preds.json
  (SWE-bench predictions: the submission of each task's attempt k).

  Args:
    trajectories: e.g. `store.trajectories(experiment=...)`.
    out_dir: destination folder.
    model_name: preds.json's model_name_or_path, unless a trajectory's metadata has "model".
  Returns:
    Paths of the trajectory files written.
  Raises:
    TrajectoryFormatError: two trajectories with the same task and attempt.
  """
  out_dir = Path(out_dir)
  written, preds, seen = [], {}, {}
  for trajectory in trajectories:
    key = (trajectory.task_id, trajectory.attempt)
    if key in seen:
      raise TrajectoryFormatError(
        f"trajectories {seen[key]!r} and {trajectory.trajectory_id!r} are both attempt "
        f"{trajectory.attempt} of task {trajectory.task_id!r}; a run folder holds one per task")
    seen[key] = trajectory.trajectory_id
    run = out_dir / f"attempt_{trajectory.attempt}"
    name = _safe_name(trajectory.task_id)
    written.append(write_miniswe_trajectory(trajectory, run / name / f"{name}{TRAJ_SUFFIX}"))
    preds.setdefault(run, {})[trajectory.task_id] = {
      "model_name_or_path": trajectory.metadata.get("model", model_name),
      "instance_id": trajectory.task_id, "model_patch": trajectory.submission}
  for run, entries in preds.items():
    (run / "preds.json").write_text(json.dumps(entries, indent=2, ensure_ascii=False))
  return written


def import_miniswe(path: str | os.PathLike, store: Any = None, *, experiment: str | None = None
                   ) -> list[Trajectory]:
  """Read every *.traj.json under `path` (a file, a run folder, or a folder of run folders).

  The attempt number comes from the file's info["orchard"], else from an enclosing
  "attempt_<k>" folder, else 0. Files without orchard ids get a trajectory id derived from their
  content, so importing the same folder twice supersedes rather than duplicates.

  Args:
    path: where to look.
    store: a `TrajectoryStore` to append them to, or None to only return them.
    experiment: set on trajectories that have none.
  Returns:
    The trajectories, sorted by (task_id, attempt).
  Raises:
    TrajectoryFormatError: a file is not a mini-swe-agent trajectory, or none was found.
  """
  path = Path(path)
  files = [path] if path.is_file() else sorted(path.rglob(f"*{TRAJ_SUFFIX}"))
  if not files:
    raise TrajectoryFormatError(f"no *{TRAJ_SUFFIX} files under {path}")
  result = []
  for file in files:
    attempt = next((int(m.group(1)) for part in reversed(file.parts[:-1])
                    if (m := _ATTEMPT_DIR.match(part))), None)
    trajectory = read_miniswe_trajectory(file, attempt=attempt)
    if experiment is not None and trajectory.experiment is None:
      trajectory = dataclasses.replace(trajectory, experiment=experiment)
    result.append(trajectory)
  result.sort(key=lambda t: (t.task_id, t.attempt))
  if store is not None:
    for trajectory in result:
      store.append_trajectory(trajectory)
  return result


def _miniswe_version() -> str:
  try:
    return importlib.metadata.version("mini-swe-agent")
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


def _digest(data: Any) -> str:
  return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _last_timestamp(messages: list) -> float:
  stamps = [m.get("extra", {}).get("timestamp") for m in messages if isinstance(m, dict)
            and isinstance(m.get("extra"), dict)]
  stamps = [s for s in stamps if isinstance(s, (int, float))]
  return float(max(stamps)) if stamps else 0.0


def _safe_name(task_id: str) -> str:
  """A folder name for a task id (SWE-bench ids such as 'astropy__astropy-12907' pass as is)."""
  name = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)
  if name != task_id:
    name += "-" + hashlib.sha256(task_id.encode()).hexdigest()[:8]
  return name
