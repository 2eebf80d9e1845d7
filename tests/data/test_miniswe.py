"""mini-swe-agent trajectory files: a real mini-swe-agent run is imported, exported, re-read."""
import json

import pytest

from orchard_jax.data import (
  Trajectory, TrajectoryFormatError, TrajectoryStore, export_miniswe, import_miniswe,
  sft_sequences_from_messages)

PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"


def _run_mini_swe_agent(tmp_path, monkeypatch, instance_id):
  """Run mini-swe-agent's DefaultAgent with its scripted test model in a scratch folder and
  save the trajectory the way its SWE-bench batch runner does."""
  from minisweagent.agents.default import DefaultAgent
  from minisweagent.environments.local import LocalEnvironment
  from minisweagent.models.test_models import DeterministicToolcallModel, make_toolcall_output

  def bash(call_id, command):
    call = {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return make_toolcall_output(None, [call], [{"command": command, "tool_call_id": call_id}])

  workdir = tmp_path / "work"
  workdir.mkdir()
  model = DeterministicToolcallModel(outputs=[
    bash("call_1", "echo hello && ls"),
    bash("call_2", f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && printf '{PATCH}'"),
  ])
  agent = DefaultAgent(model, LocalEnvironment(cwd=str(workdir)),
                       system_template="You are a helpful assistant.",
                       instance_template="Fix this: {{task}}", step_limit=5)
  info = agent.run("the bug")
  run = tmp_path / "run"
  path = run / instance_id / f"{instance_id}.traj.json"
  agent.save(path, {"info": {"exit_status": info["exit_status"],
                             "submission": info["submission"]}, "instance_id": instance_id})
  return run, path


def test_real_mini_swe_agent_run_round_trips(tmp_path, monkeypatch, tok):
  run, path = _run_mini_swe_agent(tmp_path, monkeypatch, "demo__demo-1")
  original = json.loads(path.read_text())
  (traj,) = import_miniswe(run, experiment="imported")
  assert traj.task_id == "demo__demo-1" and traj.attempt == 0
  assert traj.exit_status == "Submitted" and traj.submission == PATCH
  assert [m["role"] for m in traj.messages] == [
    "system", "user", "assistant", "tool", "assistant", "exit"]
  assert traj.num_turns == 2 and traj.experiment == "imported"

  # files -> store -> files: the same JSON (plus our own info block).
  store = TrajectoryStore(tmp_path / "store")
  store.append_trajectory(traj)
  (stored,) = store.trajectories()
  assert stored == traj
  (written,) = export_miniswe([stored], tmp_path / "out")
  assert written == tmp_path / "out" / "attempt_0" / "demo__demo-1" / "demo__demo-1.traj.json"
  again = json.loads(written.read_text())
  orchard = again["info"].pop("orchard")
  assert again == original
  assert orchard["experiment"] == "imported"
  preds = json.loads((written.parent.parent / "preds.json").read_text())
  assert preds == {"demo__demo-1": {"model_name_or_path": "orchard_jax",
                                    "instance_id": "demo__demo-1", "model_patch": PATCH}}
  # ... and back again: the same trajectory.
  assert import_miniswe(tmp_path / "out") == [traj]

  # The imported chat trains SFT with the student's template (exit/extra dropped).
  (seq,) = sft_sequences_from_messages(traj.messages, tok, session_id=traj.trajectory_id)
  assert seq.num_loss_tokens > 0


def test_store_trajectories_round_trip_through_files(tmp_path):
  trajs = [
    Trajectory(trajectory_id=f"t{task}{attempt}", task_id=f"pkg__pkg-{task}", attempt=attempt,
               session_id=f"s{task}{attempt}",
               messages=[{"role": "user", "content": "go"},
                         {"role": "assistant", "content": "done ✓"}],
               tools=[{"type": "function", "function": {"name": "bash"}}],
               exit_status="Submitted", submission=PATCH if attempt else "",
               outcome={"resolved": bool(attempt), "FAIL_TO_PASS": {"t": "PASSED"}},
               rewards={"binary": 1.0 if attempt else -1.0, "rubric": 0.7},
               experiment="distill", iteration=3, policy_version=2, created_at=1.5e9,
               metadata={"model": "teacher-a", "tokens": 1234})
    for task in (1, 2) for attempt in (0, 1)]
  export_miniswe(trajs, tmp_path / "out")
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["attempt_0", "attempt_1"]
  back = import_miniswe(tmp_path / "out", TrajectoryStore(tmp_path / "store"))
  assert back == trajs
  assert TrajectoryStore(tmp_path / "store").trajectories() == trajs
  preds = json.loads((tmp_path / "out" / "attempt_1" / "preds.json").read_text())
  assert preds["pkg__pkg-1"]["model_name_or_path"] == "teacher-a"


def test_bad_input_is_a_clear_error(tmp_path):
  t = Trajectory(trajectory_id="a", task_id="x")
  with pytest.raises(TrajectoryFormatError, match="both attempt 0"):
    export_miniswe([t, Trajectory(trajectory_id="b", task_id="x")], tmp_path / "o")
  with pytest.raises(TrajectoryFormatError, match="no \\*.traj.json"):
    import_miniswe(tmp_path / "empty-dir-that-does-not-exist")
  bad = tmp_path / "bad" / "x" / "x.traj.json"
  bad.parent.mkdir(parents=True)
  bad.write_text(json.dumps({"info": {}, "trajectory": []}))
  with pytest.raises(TrajectoryFormatError, match="'messages' list"):
    import_miniswe(tmp_path / "bad")
  bad.write_text("{torn")
  with pytest.raises(TrajectoryFormatError, match="cannot read"):
    import_miniswe(bad)
