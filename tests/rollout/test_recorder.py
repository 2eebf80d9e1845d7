"""The proxy's background record writer on a real trajectory store: records land in submission
(call) order, flush waits per session, close drains the queue, a failing record is kept and
does not stop the others, and a record submitted after close is still written."""
import json
import threading
import time

import pytest

from orchard_jax.data import ModelCall, TrajectoryStore
from orchard_jax.rollout.recorder import RecordWriter


def _builder(session, index, gate=None, fail=False):
  def build():
    if gate is not None:
      gate.wait(timeout=10)
    if fail:
      raise ValueError(f"broken record {session}/{index}")
    return ModelCall(session_id=session, call_index=index, prompt_ids=list(range(index + 3)),
                     output_ids=[7, index], output_logprobs=[-0.5, -0.25 * index])
  return build


def _lines(path):
  out = []
  for file in sorted(path.rglob("*.jsonl")):
    out += [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
  return [(r["session_id"], r["call_index"]) for r in out if r.get("kind") == "model_call"]


def test_records_written_in_order_and_flush_waits(tmp_path):
  gate = threading.Event()
  with TrajectoryStore(tmp_path) as store, RecordWriter(store) as writer:
    writer.submit("a", _builder("a", 0, gate))       # holds the writer until the gate opens
    for i in range(1, 6):
      writer.submit("a", _builder("a", i))
      writer.submit("b", _builder("b", i - 1))
    assert writer.pending("a") == 6 and writer.pending("b") == 5
    with pytest.raises(Exception, match="still unwritten"):
      writer.flush("a", timeout_s=0.2)
    gate.set()
    writer.flush("a", timeout_s=10)
    assert writer.pending("a") == 0
    writer.flush(timeout_s=10)
    assert writer.pending() == 0 and writer.written == 11
    calls = store.model_calls("a")
    assert [c.call_index for c in calls] == list(range(6))
    assert calls[4].prompt_ids == list(range(7)) and calls[4].output_logprobs == [-0.5, -1.0]
  # The file holds them in submission order (the writer is one FIFO thread).
  order = _lines(tmp_path)
  assert order == [("a", 0)] + [x for i in range(1, 6) for x in (("a", i), ("b", i - 1))]


def test_a_failing_record_is_kept_and_the_rest_are_written(tmp_path):
  with TrajectoryStore(tmp_path) as store:
    writer = RecordWriter(store)
    writer.submit("s", _builder("s", 0))
    writer.submit("s", _builder("s", 1, fail=True))
    writer.submit("s", _builder("s", 2))
    writer.flush("s", timeout_s=10)
    assert [c.call_index for c in store.model_calls("s")] == [0, 2]
    [(session, record, error)] = writer.failed
    assert session == "s" and record is None and "broken record s/1" in str(error)
    writer.close()


def test_close_drains_the_queue_and_later_records_are_written_inline(tmp_path):
  with TrajectoryStore(tmp_path) as store:
    writer = RecordWriter(store)

    def slow(i):
      build = _builder("s", i)
      return lambda: (time.sleep(0.01), build())[1]

    for i in range(20):
      writer.submit("s", slow(i))
    writer.close(timeout_s=30)
    assert writer.written == 20 and writer.pending() == 0
    writer.submit("s", _builder("s", 20))             # after close: written on this thread
    writer.close()                                    # idempotent
    assert [c.call_index for c in store.model_calls("s")] == list(range(21))


def test_a_record_submitted_without_wake_waits_for_wake_or_flush(tmp_path):
  # The proxy submits with wake=False and wakes the thread once its answer is sent.
  with TrajectoryStore(tmp_path) as store, RecordWriter(store, idle_wake_s=30.0) as writer:
    writer.submit("s", _builder("s", 0))
    writer.flush("s", timeout_s=10)                  # the thread is asleep now
    writer.submit("s", _builder("s", 1), wake=False)
    time.sleep(0.2)
    assert writer.pending("s") == 1 and writer.written == 1
    writer.wake()
    writer.flush("s", timeout_s=10)
    writer.submit("s", _builder("s", 2), wake=False)
    writer.flush("s", timeout_s=10)                  # flush wakes it too
    assert [c.call_index for c in store.model_calls("s")] == [0, 1, 2]
  with TrajectoryStore(tmp_path / "idle") as store, RecordWriter(store, idle_wake_s=0.05) as writer:
    writer.submit("t", _builder("t", 0), wake=False)  # never woken: written within idle_wake_s
    deadline = time.monotonic() + 10
    while writer.written < 1 and time.monotonic() < deadline:
      time.sleep(0.01)
    assert writer.written == 1 and writer.pending() == 0


def test_reserved_record_is_waited_for_until_submitted_or_released(tmp_path):
  """The proxy reserves a call's record before sending the answer and submits it once it knows
  whether the answer was delivered: a flush in between waits for it."""
  with TrajectoryStore(tmp_path) as store, RecordWriter(store) as writer:
    writer.reserve("a")
    writer.reserve("b")
    assert writer.pending("a") == 1 and writer.pending() == 2
    with pytest.raises(Exception, match="still unwritten"):
      writer.flush("a", timeout_s=0.1)
    threading.Timer(0.2, writer.submit, args=("a", _builder("a", 0)),
                    kwargs={"reserved": True}).start()
    writer.flush("a", timeout_s=10)
    assert [c.call_index for c in store.model_calls("a")] == [0]
    writer.release("b")                       # nothing to record after all
    writer.flush(timeout_s=1)
    assert writer.pending() == 0 and writer.written == 1
