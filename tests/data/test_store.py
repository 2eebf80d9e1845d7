"""The trajectory store: round trips, queries, crash safety, compact prompts."""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from orchard_jax.data import ModelCall, StoreError, Trajectory, TrajectoryStore


def _session(session_id, n_calls, prompt_len=200, out_len=20, start=1000):
  """Calls of an agent session whose every prompt extends the previous prompt + output."""
  calls, history = [], list(range(start, start + prompt_len))
  for k in range(n_calls):
    output = [(7 * k + j) % 500 for j in range(out_len)]
    calls.append(ModelCall(
      session_id=session_id, call_index=k, prompt_ids=list(history), output_ids=output,
      output_logprobs=[-0.01 * (j + 1) for j in range(out_len)],
      messages=[{"role": "user", "content": f"turn {k}"}], response={"role": "assistant",
                                                                     "content": "ok"},
      finish_reason="stop", started_at=1.0 + k, finished_at=1.5 + k))
    history = history + output + [3, 4, 5 + k]  # the next turn's observation tokens
  return calls


def _trajectory(tid, task, attempt=0, **kw):
  return Trajectory(trajectory_id=tid, task_id=task, attempt=attempt,
                    messages=[{"role": "user", "content": "fix it"}], **kw)


def test_round_trip_and_queries(tmp_path):
  with TrajectoryStore(tmp_path) as store:
    calls = _session("s1", 3) + _session("s2", 2)
    for call in calls:
      store.append_model_call(call)
    trajs = [_trajectory("t1", "taskA", 0, session_id="s1", experiment="e", iteration=0,
                         outcome={"resolved": True}, rewards={"binary": 1.0}),
             _trajectory("t2", "taskA", 1, session_id="s2", experiment="e", iteration=1),
             _trajectory("t3", "taskB", 0, experiment="other", iteration=0)]
    for t in trajs:
      store.append_trajectory(t)
    assert store.model_calls("s1") == calls[:3]
    assert store.model_calls() == calls
    assert store.session_ids() == ["s1", "s2"]
    assert store.trajectories() == trajs
    assert store.trajectories(task_id="taskA") == trajs[:2]
    assert store.trajectories(experiment="e", iteration=1) == [trajs[1]]
    assert store.trajectories(session_id="s1") == [trajs[0]]
    assert store.attempts(experiment="e") == {("taskA", 0), ("taskA", 1)}
    assert store.experiments() == [("e", 0), ("e", 1), ("other", 0)]
    assert store.get_trajectory("t1").resolved is True
    assert store.get_trajectory("missing") is None
  # A fresh reader (another process, later) sees the same.
  again = TrajectoryStore(tmp_path)
  assert again.model_calls() == calls and again.trajectories() == trajs


def test_latest_version_wins(tmp_path):
  store = TrajectoryStore(tmp_path)
  store.append_trajectory(_trajectory("t1", "task", exit_status="Submitted"))
  store.append_trajectory(_trajectory("t1", "task", exit_status="Submitted",
                                      outcome={"resolved": False}))
  (only,) = store.trajectories()
  assert only.outcome == {"resolved": False}
  first = _session("s", 1)[0]
  store.append_model_call(first)
  retry = ModelCall(**{**first.__dict__, "output_ids": [9, 9], "output_logprobs": [-1.0, -2.0]})
  store.append_model_call(retry)
  assert store.model_calls("s") == [retry]


def test_compact_prompts_are_rebuilt_and_small(tmp_path):
  calls = _session("long", 30, prompt_len=2000, out_len=100)
  compact, full = TrajectoryStore(tmp_path / "c"), TrajectoryStore(tmp_path / "f",
                                                                   compact_prompts=False)
  for call in calls:
    compact.append_model_call(call)
    full.append_model_call(call)
  assert TrajectoryStore(tmp_path / "c").model_calls("long") == calls
  assert TrajectoryStore(tmp_path / "f").model_calls("long") == calls
  size = lambda root: sum(p.stat().st_size for p in (root / "model_calls").glob("*.jsonl"))
  assert size(tmp_path / "c") * 5 < size(tmp_path / "f")
  # A diverged prompt (history compacted by the harness) is stored whole and read back.
  diverged = ModelCall(session_id="long", call_index=30, prompt_ids=[1, 2, 3], output_ids=[4],
                       output_logprobs=[-0.5])
  compact.append_model_call(diverged)
  assert TrajectoryStore(tmp_path / "c").model_calls("long")[-1] == diverged


def test_torn_and_corrupt_lines_are_skipped_with_a_warning(tmp_path, caplog):
  store = TrajectoryStore(tmp_path)
  for i in range(3):
    store.append_trajectory(_trajectory(f"t{i}", "task", i))
  store.close()
  (shard,) = (tmp_path / "trajectories").glob("*.jsonl")
  lines = shard.read_bytes().splitlines(keepends=True)
  shard.write_bytes(lines[0] + b"{not json\n" + lines[1] + lines[2][: len(lines[2]) // 2])
  with caplog.at_level(logging.WARNING, logger="orchard_jax.data.store"):
    got = TrajectoryStore(tmp_path).trajectories()
  assert [t.trajectory_id for t in got] == ["t0", "t1"]
  assert "torn last line" in caplog.text and "unreadable line" in caplog.text


def test_a_killed_writer_keeps_what_it_wrote(tmp_path):
  """Each record is flushed as written: SIGKILL after three appends loses none of them."""
  script = textwrap.dedent(f"""
    import os, signal, sys
    from orchard_jax.data import Trajectory, TrajectoryStore
    store = TrajectoryStore({str(tmp_path)!r})
    for i in range(3):
      store.append_trajectory(Trajectory(trajectory_id=f"t{{i}}", task_id="task", attempt=i))
    os.kill(os.getpid(), signal.SIGKILL)
  """)
  proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True)
  assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
  assert [t.attempt for t in TrajectoryStore(tmp_path).trajectories()] == [0, 1, 2]


def test_two_writers_share_a_store(tmp_path):
  a, b = TrajectoryStore(tmp_path), TrajectoryStore(tmp_path)
  for i in range(5):
    a.append_trajectory(_trajectory(f"a{i}", "task", i))
    b.append_trajectory(_trajectory(f"b{i}", "task", i))
  assert len(list((tmp_path / "trajectories").glob("*.jsonl"))) == 2
  assert len(a.trajectories()) == 10 and len(b.trajectories()) == 10


def test_bad_records_are_clear_errors(tmp_path):
  with pytest.raises(StoreError, match="output_logprobs"):
    ModelCall(session_id="s", call_index=0, prompt_ids=[1], output_ids=[2, 3],
              output_logprobs=[-1.0])
  with pytest.raises(StoreError, match="text_only"):
    ModelCall(session_id="s", call_index=0, prompt_ids=[1], text_only=True)
  with pytest.raises(StoreError, match="lacks required field"):
    Trajectory.from_dict({"trajectory_id": "t"})
  with pytest.raises(StoreError, match="kind"):
    Trajectory.from_dict({"kind": "model_call", "trajectory_id": "t", "task_id": "x"})
  store = TrajectoryStore(tmp_path)
  with pytest.raises(StoreError, match="expects a Trajectory"):
    store.append_trajectory({"trajectory_id": "t"})
  with pytest.raises(StoreError, match="JSON-serialisable"):
    store.append_trajectory(_trajectory("t", "task", metadata={"x": object()}))
  (tmp_path / "file").write_text("")
  with pytest.raises(StoreError, match="not a folder"):
    TrajectoryStore(tmp_path / "file")


def test_unknown_fields_are_kept_not_lost(tmp_path):
  record = _trajectory("t", "task").to_dict()
  record["written_by_a_newer_version"] = [1, 2]
  shard = tmp_path / "trajectories" / "manual.jsonl"
  shard.parent.mkdir(parents=True)
  shard.write_text(json.dumps(record) + "\n")
  (got,) = TrajectoryStore(tmp_path).trajectories()
  assert got.metadata["_extra"] == {"written_by_a_newer_version": [1, 2]}


def test_threads_appending_to_one_store(tmp_path):
  import threading

  store = TrajectoryStore(tmp_path)

  def work(t):
    for call in _session(f"s{t}", 25, prompt_len=300, out_len=30):
      store.append_model_call(call)

  threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  fresh = TrajectoryStore(tmp_path)
  assert fresh.session_ids() == ["s0", "s1", "s2", "s3"]
  for t in range(4):
    assert fresh.model_calls(f"s{t}") == _session(f"s{t}", 25, prompt_len=300, out_len=30)
