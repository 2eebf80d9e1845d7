"""Writes the recording proxy's model calls to the trajectory store from a background thread.

Building a `data.ModelCall` (converting the id lists, copying the messages) and appending it to
the store (serialising JSON, writing the file) cost about a millisecond per call of a long
agent session. `RecordWriter` takes that off the request path: the proxy hands over a callable
that builds the record, and one writer thread builds and appends the records in the order they
were submitted (so a session's calls are stored in call order). `flush` waits until everything
submitted (for one session or all) is in the store; `close` flushes and stops the thread.

The thread shares the proxy's GIL, so a record built while the proxy is still answering slows
the answer down. `submit(..., wake=False)` queues a record without waking the thread, and the
proxy calls `wake()` once the response has been sent (a Starlette background task); the thread
also looks at its queue every `idle_wake_s` on its own, and `flush`/`close` wake it, so a record
whose wake never comes (the client went away) is still written.

No submitted record is dropped: the thread drains its queue before it stops, and a record
whose build or append raised is logged and kept in `failed` (with the error) so a caller can
write it elsewhere; the proxy keeps serving.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Optional

from orchard_jax.rollout.errors import SessionError

_log = logging.getLogger(__name__)


class RecordWriter:
  """One background thread appending model calls to a store, in submission order.

  Args:
    store: a `data.TrajectoryStore` (anything with `append_model_call(record)`).
    name: the thread's name.
    idle_wake_s: seconds the thread sleeps at most before looking at its queue unasked.

  Attributes:
    written: records appended so far.
    failed: (session_id, record or None, exception) for records whose build or append raised.
  """

  def __init__(self, store: Any, name: str = "orchard-record-writer", idle_wake_s: float = 0.05):
    self.store = store
    self.written = 0
    self.failed: list[tuple[str, Any, BaseException]] = []
    self.idle_wake_s = idle_wake_s
    self._queue: collections.deque = collections.deque()   # (session_id, build); None: stop
    self._pending: collections.Counter = collections.Counter()
    lock = threading.Lock()
    self._work = threading.Condition(lock)    # the thread waits here for records
    self._done = threading.Condition(lock)    # flush waits here for appended records
    self._closed = False
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
    self._thread.start()

  def submit(self, session_id: str, build: Callable[[], Any], *, wake: bool = True,
             reserved: bool = False) -> None:
    """Queue one record: `build()` returns the `data.ModelCall`, called on the writer thread.

    `build` must only read data that nobody changes afterwards (the proxy passes the lists
    of the finished call). With wake=False the thread is not woken now (call `wake()` when
    the caller's latency-critical work is done; it wakes within idle_wake_s regardless).
    After `close`, the record is built and appended on the caller's thread instead, so
    nothing is lost. `reserved`: the record takes a reservation made by `reserve`.
    """
    with self._work:
      closed = self._closed
      if not closed:
        if not reserved:
          self._pending[session_id] += 1
        self._queue.append((session_id, build))  # under the lock: never behind close's marker
        if wake:
          self._work.notify()
    if closed:
      try:
        self._write(session_id, build)
      finally:
        if reserved:
          self.release(session_id)

  def reserve(self, session_id: str) -> None:
    """Count one record of `session_id` as pending before it can be built: `flush` waits for
    it until `submit(..., reserved=True)` queues it or `release` gives the reservation up.

    The proxy reserves a call's record before it sends the answer, and submits it once it
    knows whether the answer was delivered, so a caller who got the answer and then flushes
    the session always finds its record.
    """
    with self._work:
      self._pending[session_id] += 1

  def release(self, session_id: str) -> None:
    """Give up a reservation of `reserve` without a record."""
    with self._done:
      self._decrement(session_id)

  def wake(self) -> None:
    """Let the thread write what was submitted with wake=False."""
    with self._work:
      if self._queue:
        self._work.notify()

  def pending(self, session_id: Optional[str] = None) -> int:
    """Records submitted and not yet appended (of one session, or all)."""
    with self._done:
      if session_id is not None:
        return self._pending.get(session_id, 0)
      return sum(self._pending.values())

  def flush(self, session_id: Optional[str] = None, timeout_s: float = 60.0) -> None:
    """Block until every record submitted so far (of one session, or all) is appended.

    Raises:
      SessionError: records still pending after timeout_s.
    """
    deadline = time.monotonic() + timeout_s
    with self._done:
      self._work.notify()
      while (self._pending.get(session_id, 0) if session_id is not None
             else sum(self._pending.values())):
        left = deadline - time.monotonic()
        if left <= 0:
          raise SessionError(f"records of session {session_id!r} still unwritten after "
                             f"{timeout_s} s")
        self._done.wait(timeout=left)

  def close(self, timeout_s: float = 60.0) -> None:
    """Append everything queued, then stop the thread (idempotent).

    Raises:
      SessionError: the queue did not drain within timeout_s.
    """
    with self._work:
      if self._closed:
        return
      self._closed = True
      self._queue.append(None)
      self._work.notify()
    self._thread.join(timeout=timeout_s)
    if self._thread.is_alive():
      raise SessionError(f"{self.pending()} records still unwritten after {timeout_s} s")

  def __enter__(self) -> "RecordWriter":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def _run(self) -> None:
    while True:
      with self._work:
        while not self._queue:
          self._work.wait(timeout=self.idle_wake_s)
        item = self._queue.popleft()
      if item is None:
        return
      session_id, build = item
      try:
        self._write(session_id, build)
      finally:
        with self._done:
          self._decrement(session_id)

  def _decrement(self, session_id: str) -> None:
    """One pending record of the session done (call with the lock held)."""
    self._pending[session_id] -= 1
    if self._pending[session_id] <= 0:
      del self._pending[session_id]
    self._done.notify_all()

  def _write(self, session_id: str, build: Callable[[], Any]) -> None:
    record = None
    try:
      record = build()
      self.store.append_model_call(record)
      self.written += 1
    except Exception as e:  # noqa: BLE001 - a store fault must not take the proxy down
      _log.exception("could not record call %s of session %s",
                     getattr(record, "call_index", "?"), session_id)
      self.failed.append((session_id, record, e))
