"""The trajectory store: one append-only, crash-safe format for every recipe, the proxy and
the harness.

Layout of a store folder:
  model_calls/<shard>.jsonl     one `ModelCall` per line, written by the recording proxy
  trajectories/<shard>.jsonl    one `Trajectory` per line, written by recipes and harnesses
  images/<aa>/<sha256 hex>      image blobs of vision-language calls, by content: each image
                                is stored once however many calls and sessions show it
                                (records name it by "sha256:<hex>", data.images.image_digest)
Every writing process appends to its own shard files (named host-pid-time), so writers never
interleave. A record is one `os.write` of one JSON line, flushed to the OS before `append_*`
returns (and fsync'ed with durability="fsync"): a crash loses at most the line being written.
Readers skip a torn last line (no newline yet) with a warning, and skip (with a warning) a
complete line that is not valid JSON, so one bad record never hides the others.

Records are never rewritten. Appending a trajectory again with the same trajectory_id, or a
model call again with the same (session_id, call_index), supersedes the earlier line; queries
return the latest one written.

Long agent sessions resend their whole history on every call, so a call's prompt usually starts
with the previous call's prompt + output. A writer stores such a prompt as a reference to that
earlier call (same shard, same session) plus the new suffix ("_prompt_base", "_prompt_shared"
keys on the line); readers rebuild the full prompt_ids. This keeps a session's disk size linear
in its length instead of quadratic.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from orchard_jax.data.errors import StoreError
from orchard_jax.data.records import MODEL_CALL, TRAJECTORY, ModelCall, Trajectory

_log = logging.getLogger(__name__)

_DIRS = {MODEL_CALL: "model_calls", TRAJECTORY: "trajectories"}
_WRITTEN = "_written_ns"
_BASE, _SHARED = "_prompt_base", "_prompt_shared"
_MIN_SHARED = 32  # shorter shared prefixes are written out in full
_MAX_REMEMBERED_SESSIONS = 1024


@dataclasses.dataclass(frozen=True)
class _Entry:
  """Where one record lies, and the fields queries filter on."""
  path: Path
  offset: int
  length: int
  written_ns: int
  keys: tuple  # model call: (session_id, call_index); trajectory: (trajectory_id,)
  task_id: str | None = None
  session_id: str | None = None
  experiment: str | None = None
  iteration: int | None = None
  attempt: int | None = None


class TrajectoryStore:
  """Append-only store of model calls and trajectories (see the module docstring).

  Use as a context manager (it owns open shard files), or call `close()`:
    with TrajectoryStore("runs/exp1/store") as store:
      store.append_trajectory(traj)
      calls = store.model_calls("session-7")

  Args:
    root: the store folder (created when missing).
    durability: "flush" (each record handed to the OS before append returns: survives a
      process crash) or "fsync" (also forced to disk: survives a machine crash, slower).
    compact_prompts: store prompts that extend the session's previous call as a reference
      plus suffix (readers rebuild them; see the module docstring).
  Raises:
    StoreError: root exists and is not a folder, or durability is unknown.
  """

  def __init__(self, root: str | os.PathLike, *, durability: str = "flush",
               compact_prompts: bool = True):
    if durability not in ("flush", "fsync"):
      raise StoreError(f"durability must be 'flush' or 'fsync', got {durability!r}")
    self.root = Path(root)
    if self.root.exists() and not self.root.is_dir():
      raise StoreError(f"trajectory store root {self.root} exists and is not a folder")
    for sub in _DIRS.values():
      (self.root / sub).mkdir(parents=True, exist_ok=True)
    self._fsync = durability == "fsync"
    self._compact = compact_prompts
    self._lock = threading.RLock()
    self._fds: dict[str, int] = {}
    self._pid = os.getpid()
    self._shard = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}-{uuid.uuid4().hex[:6]}"
    self._remembered: collections.OrderedDict[str, tuple[int, np.ndarray]] = (
      collections.OrderedDict())
    self._offsets: dict[Path, int] = {}
    self._calls: dict[str, list[_Entry]] = collections.defaultdict(list)  # by session id
    self._trajectories: list[_Entry] = []
    self._warned: set[tuple[Path, int]] = set()

  def __enter__(self) -> "TrajectoryStore":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __repr__(self) -> str:
    return f"TrajectoryStore({str(self.root)!r})"

  def close(self) -> None:
    """Close this writer's shard files (reading still works; a later append reopens)."""
    with self._lock:
      for fd in self._fds.values():
        os.close(fd)
      self._fds.clear()

  # ---------------------------------------------------------------- writing

  def append_model_call(self, call: ModelCall) -> None:
    """Append one model call (the proxy calls this as each call finishes).

    Raises:
      StoreError: `call` is not a ModelCall.
    """
    if not isinstance(call, ModelCall):
      raise StoreError(f"append_model_call expects a ModelCall, got {type(call).__name__}")
    line = call.to_dict()
    with self._lock:
      if self._compact and not call.text_only:
        self._compact_prompt(call, line)
      self._write(MODEL_CALL, line)

  def append_trajectory(self, trajectory: Trajectory) -> None:
    """Append one trajectory (again with the same id to supersede an earlier version).

    Raises:
      StoreError: `trajectory` is not a Trajectory.
    """
    if not isinstance(trajectory, Trajectory):
      raise StoreError(
        f"append_trajectory expects a Trajectory, got {type(trajectory).__name__}")
    with self._lock:
      self._write(TRAJECTORY, trajectory.to_dict())

  def _compact_prompt(self, call: ModelCall, line: dict) -> None:
    remembered = self._remembered.get(call.session_id)
    prompt = np.asarray(call.prompt_ids, dtype=np.int64)
    if remembered is not None:
      base_index, base_ids = remembered
      n = min(len(base_ids), len(prompt))
      differ = np.flatnonzero(base_ids[:n] != prompt[:n])
      shared = int(differ[0]) if len(differ) else n
      if shared >= _MIN_SHARED:
        line[_BASE], line[_SHARED] = base_index, shared
        line["prompt_ids"] = call.prompt_ids[shared:]
    full = np.concatenate([prompt, np.asarray(call.output_ids, dtype=np.int64)])
    self._remembered[call.session_id] = (call.call_index, full)
    self._remembered.move_to_end(call.session_id)
    while len(self._remembered) > _MAX_REMEMBERED_SESSIONS:
      self._remembered.popitem(last=False)

  def _write(self, kind: str, line: dict) -> None:
    if os.getpid() != self._pid:  # forked: the child gets shards of its own
      self._fds.clear()
      self._remembered.clear()
      self._pid = os.getpid()
      self._shard = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}-{uuid.uuid4().hex[:6]}"
    fd = self._fds.get(kind)
    if fd is None:
      path = self.root / _DIRS[kind] / f"{self._shard}.jsonl"
      fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
      self._fds[kind] = fd
    record = {"kind": line.pop("kind"), _WRITTEN: time.time_ns(), **line}
    try:
      # NaN/inf (a -inf log-prob) are kept as Python's JSON extension rather than lost.
      data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
    except (TypeError, ValueError) as e:
      raise StoreError(f"{kind} record is not JSON-serialisable: {e}") from e
    view = memoryview(data)
    while view:
      view = view[os.write(fd, view):]
    if self._fsync:
      os.fsync(fd)

  def put_image(self, data: bytes) -> str:
    """Stores an encoded image once (content-addressed) and returns its digest.

    Atomic: the blob is written to a temporary file and renamed, so a reader sees the whole
    image or none; storing an image the store holds already writes nothing.
    """
    from orchard_jax.data.images import image_digest

    digest = image_digest(bytes(data))
    path = self._image_path(digest)
    if path.exists():
      return digest
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    with open(scratch, "wb") as f:
      f.write(data)
      if self._fsync:
        f.flush()
        os.fsync(f.fileno())
    os.replace(scratch, path)
    return digest

  def get_image(self, digest: str) -> bytes:
    """The encoded image stored under `digest` ("sha256:<hex>").

    Raises:
      StoreError: a malformed digest, no such image, or a blob whose content does not match
        its digest (corrupted on disk).
    """
    from orchard_jax.data.images import image_digest

    path = self._image_path(digest)
    try:
      data = path.read_bytes()
    except FileNotFoundError:
      raise StoreError(f"image {digest} is not in the store {self.root}") from None
    if image_digest(data) != digest:
      raise StoreError(f"image blob {path} does not match its digest {digest} (corrupted)")
    return data

  def has_image(self, digest: str) -> bool:
    """Whether the store holds the image `digest`."""
    return self._image_path(digest).exists()

  def _image_path(self, digest: str) -> Path:
    from orchard_jax.data.images import is_digest

    if not is_digest(digest):
      raise StoreError(f"expected an image digest 'sha256:<64 hex digits>', got {digest!r}")
    hexdigest = digest.split(":", 1)[1]
    return self.root / "images" / hexdigest[:2] / hexdigest

  # ---------------------------------------------------------------- reading

  def refresh(self) -> None:
    """Index records appended since the last read (queries call this themselves)."""
    with self._lock:
      for kind, sub in _DIRS.items():
        for path in sorted((self.root / sub).glob("*.jsonl")):
          self._index_file(kind, path)

  def _index_file(self, kind: str, path: Path) -> None:
    start = self._offsets.get(path, 0)
    size = path.stat().st_size
    if size <= start:
      return
    with open(path, "rb") as f:
      f.seek(start)
      data = f.read(size - start)
    end = data.rfind(b"\n") + 1
    if end < len(data) and (path, start + end) not in self._warned:
      self._warned.add((path, start + end))
      _log.warning("%s: skipping a torn last line (%d bytes at offset %d): a writer crashed "
                   "mid-record or is still writing it", path, len(data) - end, start + end)
    pos = 0
    while pos < end:
      nl = data.index(b"\n", pos)
      offset = start + pos
      try:
        record = json.loads(data[pos:nl])
        entry = _entry_of(kind, record, path, offset, nl - pos)
      except (ValueError, KeyError, TypeError) as e:
        _log.warning("%s: skipping unreadable line at offset %d (%s)", path, offset, e)
      else:
        if kind == MODEL_CALL:
          self._calls[entry.keys[0]].append(entry)
        else:
          self._trajectories.append(entry)
      pos = nl + 1
    self._offsets[path] = start + end

  def session_ids(self) -> list[str]:
    """Sessions with at least one model call, sorted."""
    self.refresh()
    return sorted(self._calls)

  def model_calls(self, session_id: str | None = None) -> list[ModelCall]:
    """Model calls of one session (or of all), latest version of each, in call order.

    Returns:
      Calls sorted by (session_id, call_index).
    Raises:
      StoreError: a compacted prompt refers to a call the store no longer holds.
    """
    with self._lock:
      return self._model_calls(session_id)

  def _model_calls(self, session_id: str | None) -> list[ModelCall]:
    self.refresh()
    if session_id is None:
      entries = [e for session in self._calls.values() for e in session]
    else:
      entries = self._calls.get(session_id, [])
    by_file: dict[Path, list[_Entry]] = collections.defaultdict(list)
    for entry in entries:
      by_file[entry.path].append(entry)
    latest: dict[tuple, tuple[int, ModelCall]] = {}
    for path, file_entries in by_file.items():
      full_ids: dict[tuple, list[int]] = {}  # what the shard's writer remembered
      for entry, record in zip(file_entries, _read(path, file_entries)):
        base = record.pop(_BASE, None)
        shared = record.pop(_SHARED, None)
        if base is not None:
          key = (record["session_id"], base)
          if key not in full_ids:
            raise StoreError(
              f"{path} offset {entry.offset}: prompt of call {entry.keys} extends call {base} "
              "of the same session, which this shard does not hold")
          record["prompt_ids"] = full_ids[key][:shared] + record["prompt_ids"]
        call = ModelCall.from_dict(record)
        full_ids[entry.keys] = call.prompt_ids + call.output_ids
        if entry.keys not in latest or latest[entry.keys][0] <= entry.written_ns:
          latest[entry.keys] = (entry.written_ns, call)
    return [latest[k][1] for k in sorted(latest)]

  def iter_sessions(self) -> Iterator[tuple[str, list[ModelCall]]]:
    """(session_id, its model calls in order) for every session, one session at a time."""
    for session_id in self.session_ids():
      yield session_id, self.model_calls(session_id)

  def trajectories(self, *, task_id: str | None = None, experiment: str | None = None,
                   iteration: int | None = None, session_id: str | None = None
                   ) -> list[Trajectory]:
    """Latest version of every trajectory matching all the given filters.

    Returns:
      Trajectories sorted by (task_id, attempt, created_at, trajectory_id).
    """
    with self._lock:
      return self._query_trajectories(task_id, experiment, iteration, session_id)

  def _query_trajectories(self, task_id, experiment, iteration, session_id) -> list[Trajectory]:
    self.refresh()
    latest: dict[str, _Entry] = {}
    for e in self._trajectories:
      if e.keys[0] not in latest or latest[e.keys[0]].written_ns <= e.written_ns:
        latest[e.keys[0]] = e
    chosen = [e for e in latest.values()
              if (task_id is None or e.task_id == task_id)
              and (experiment is None or e.experiment == experiment)
              and (iteration is None or e.iteration == iteration)
              and (session_id is None or e.session_id == session_id)]
    result = []
    by_file: dict[Path, list[_Entry]] = collections.defaultdict(list)
    for entry in sorted(chosen, key=lambda e: (str(e.path), e.offset)):
      by_file[entry.path].append(entry)
    for path, file_entries in by_file.items():
      result.extend(Trajectory.from_dict(r) for r in _read(path, file_entries))
    return sorted(result, key=lambda t: (t.task_id, t.attempt, t.created_at, t.trajectory_id))

  def get_trajectory(self, trajectory_id: str) -> Trajectory | None:
    """The latest version of one trajectory, or None."""
    self.refresh()
    found = [e for e in self._trajectories if e.keys[0] == trajectory_id]
    if not found:
      return None
    entry = max(found, key=lambda e: e.written_ns)
    return Trajectory.from_dict(_read(entry.path, [entry])[0])

  def attempts(self, *, experiment: str | None = None) -> set[tuple[str, int]]:
    """(task_id, attempt) pairs already stored (for resuming a collection run)."""
    self.refresh()
    return {(e.task_id, e.attempt) for e in self._trajectories
            if experiment is None or e.experiment == experiment}

  def experiments(self) -> list[tuple[str | None, int | None]]:
    """Distinct (experiment, iteration) pairs of the stored trajectories."""
    self.refresh()
    pairs = {(e.experiment, e.iteration) for e in self._trajectories}
    return sorted(pairs, key=lambda p: (p[0] or "", -1 if p[1] is None else p[1]))


def _entry_of(kind: str, record: dict, path: Path, offset: int, length: int) -> _Entry:
  if record.get("kind") != kind:
    raise ValueError(f"expected kind {kind!r}, got {record.get('kind')!r}")
  written = int(record.get(_WRITTEN, 0))
  if kind == MODEL_CALL:
    return _Entry(path, offset, length, written, (record["session_id"], int(record["call_index"])))
  return _Entry(path, offset, length, written, (record["trajectory_id"],),
                task_id=record["task_id"], session_id=record.get("session_id"),
                experiment=record.get("experiment"), iteration=record.get("iteration"),
                attempt=int(record.get("attempt", 0)))


def _read(path: Path, entries: list[_Entry]) -> list[dict[str, Any]]:
  records = []
  with open(path, "rb") as f:
    for entry in entries:
      f.seek(entry.offset)
      record = json.loads(f.read(entry.length))
      record.pop(_WRITTEN, None)
      records.append(record)
  return records
