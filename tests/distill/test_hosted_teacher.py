"""Distillation from a hosted-style teacher: an OpenAI-compatible server written for the test
(real HTTP, text only, bearer key) drives the bash agent on a real SWE instance through the
recording proxy; each attempt is graded in a fresh sandbox and stored.

One collection run (module fixture) makes two attempts whose outcomes a reader can see from the
script: attempt 0 looks around, applies the instance's gold patch and submits (resolved);
attempt 1 first answers without a bash block (a format error), then submits no change
(unresolved). The tests then check the records, the SFT and RL data paths, export/import and
the statistics job against those known facts.
"""
import json

import numpy as np
import pytest

from orchard_jax import data
from orchard_jax.harness.prompts import SUBMIT_COMMAND
from orchard_jax.recipes.agentic import trajectory_data
from orchard_jax.recipes.swe import distill as swe_distill
from tests.distill.openai_server import TextOnlyServer, act

KEY_ENV, KEY = "DISTILL_TEST_TEACHER_KEY", "sk-test-1234"
MALFORMED = "THOUGHT: I will just think about it and not run anything."


def teacher_config(config, server):
  config.teacher.url = server.base_url
  config.teacher.api = "openai"
  config.teacher.model = "hosted-teacher"
  config.teacher.api_key_env = KEY_ENV
  return config


@pytest.fixture(scope="module")
def hosted_run(tmp_path_factory, distill_config, task_set):
  """collect() with the scripted text-only teacher: 1 task x 2 attempts, one at a time."""
  instance = task_set.instances[0]
  scripts = {
      0: [act("Look at the layout.", "ls"),
          act("Apply my fix.", f"git apply <<'EOF'\n{instance.patch}EOF"),
          act("Submit.", SUBMIT_COMMAND)],
      1: [MALFORMED, act("Submit as is.", SUBMIT_COMMAND)],
  }
  mp = pytest.MonkeyPatch()
  mp.setenv(KEY_ENV, KEY)
  config = distill_config(tmp_path_factory.mktemp("hosted"))
  with TextOnlyServer(lambda conv, turn, _: scripts[conv][turn], api_key=KEY) as server:
    summary = swe_distill.collect(teacher_config(config, server))
  mp.undo()
  with data.TrajectoryStore(swe_distill.store_path(config)) as store:
    trajectories = store.trajectories(experiment=config.experiment)
    calls = {t.attempt: store.model_calls(t.session_id) for t in trajectories}
  return dict(config=config, summary=summary, server=server, instance=instance,
              trajectories={t.attempt: t for t in trajectories}, calls=calls, scripts=scripts)


def test_every_call_is_recorded_text_only_with_its_outcome(hosted_run):
  summary, trajectories = hosted_run["summary"], hosted_run["trajectories"]
  assert (summary.started, summary.completed, summary.aborted) == (2, 2, 0)
  assert (summary.evaluated, summary.resolved) == (2, 1)
  assert sorted(trajectories) == [0, 1]
  resolved, unresolved = trajectories[0], trajectories[1]
  assert resolved.resolved is True and resolved.outcome["status"] == "resolved"
  assert resolved.rewards == {"binary": 1.0, "total": 1.0} and resolved.exit_status == "Submitted"
  assert unresolved.resolved is False and unresolved.submission == ""
  for attempt, trajectory in trajectories.items():
    assert trajectory.task_id == hosted_run["instance"].instance_id
    assert trajectory.trajectory_id == f"swe_distill/{trajectory.task_id}/{attempt}"
    assert trajectory.metadata["text_only"] is True
    assert trajectory.metadata["teacher_tokenizer"] is None
    calls = hosted_run["calls"][attempt]
    assert [c.call_index for c in calls] == list(range(len(hosted_run["scripts"][attempt])))
    for call, reply in zip(calls, hosted_run["scripts"][attempt]):
      assert call.text_only and call.prompt_ids == [] and call.output_ids == []
      assert call.response["content"] == reply
      assert call.model == "hosted-teacher"
    # the harness saw exactly the teacher's replies
    assert [m["content"] for m in trajectory.messages if m["role"] == "assistant"] == \
        hosted_run["scripts"][attempt]
  # the key came from the environment variable; the model name from the config
  for request in hosted_run["server"].requests:
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "hosted-teacher" and request.body["temperature"] == 1.0


def test_sft_tokenises_text_only_records_and_rl_refuses_them(hosted_run, tok):
  calls = hosted_run["calls"][0]
  sequences = data.sequences_from_model_calls(calls, mode="sft", tokenizer=tok)
  trained = {}
  for seq in sequences:
    assert seq.loss_weights[0] == 0 and not seq.logprobs_known
    for action in np.unique(seq.action_ids[seq.loss_weights > 0]):
      trained[int(action)] = tok.decode([int(i) for i in seq.input_ids[
          (seq.action_ids == action) & (seq.loss_weights > 0)]], skip_special_tokens=False)
  # each assistant turn is trained on exactly the teacher's text and the end-of-turn token
  assert trained == {i: reply + "<|im_end|>" for i, reply in enumerate(hosted_run["scripts"][0])}
  with pytest.raises(data.TextOnlyRecordError, match="text-only.*RL trains only on ids"):
    data.sequences_from_model_calls(calls, mode="rl")


def test_export_then_import_round_trips_without_loss(hosted_run, distill_config, tmp_path):
  config = hosted_run["config"]
  config.export.miniswe_dir = str(tmp_path / "miniswe")
  config.export.hf_path = str(tmp_path / "sft.parquet")
  out = trajectory_data.export(config)
  assert out["trajectories"] == 2 and len(out["miniswe_files"]) == 2
  preds = json.loads((tmp_path / "miniswe" / "attempt_0" / "preds.json").read_text())
  task_id = hosted_run["instance"].instance_id
  assert preds[task_id]["model_patch"] == hosted_run["trajectories"][0].submission

  imported_config = distill_config(tmp_path / "import")
  imported_config.store = str(tmp_path / "imported_store")
  imported_config.import_from = str(tmp_path / "miniswe")
  trajectory_data.import_trajectories(imported_config)
  with data.TrajectoryStore(imported_config.store) as store:
    imported = {t.attempt: t for t in store.trajectories()}
  original = hosted_run["trajectories"]
  assert sorted(imported) == sorted(original)
  for attempt in original:
    assert imported[attempt].to_dict() == original[attempt].to_dict()
  # files -> store -> files gives the same files
  imported_config.export.miniswe_dir = str(tmp_path / "again")
  imported_config.export.hf_path = "none"
  imported_config.experiment = ""
  trajectory_data.export(imported_config)
  for path in (tmp_path / "miniswe").rglob("*.json"):
    again = tmp_path / "again" / path.relative_to(tmp_path / "miniswe")
    assert json.loads(again.read_text()) == json.loads(path.read_text()), path.name

  import datasets
  rows = datasets.load_dataset("parquet", data_files=str(tmp_path / "sft.parquet"))["train"]
  rows = {r["attempt"]: r for r in rows}
  for attempt, trajectory in original.items():
    assert rows[attempt]["resolved"] == trajectory.resolved
    chat = [m for m in trajectory.messages if m["role"] in ("system", "user", "assistant")]
    assert [(m["role"], m["content"]) for m in rows[attempt]["messages"]] == \
        [(m["role"], m["content"]) for m in chat]


def test_stats_job_prints_the_table_and_writes_plots(hosted_run, tmp_path, capsys):
  import matplotlib.image

  config = hosted_run["config"]
  config.stats.plots_dir = str(tmp_path / "plots")
  config.stats.max_tokens = 10 ** 6
  result = trajectory_data.stats(config)
  out = capsys.readouterr().out
  task_id = hosted_run["instance"].instance_id
  assert (result.trajectories, result.evaluated, result.resolved) == (2, 2, 1)
  assert result.exit_status == {"Submitted": 2}
  # attempt 1 answered once without a bash block; nothing is over 10**6 tokens
  assert result.filters == {"too_long": 0, "undefined_tool_call": 0, "unparsable_action": 1,
                            "any": 1}
  assert list(result.turns) == [3, 2]
  assert "resolved / evaluated   1 / 2  (50.0%)" in out
  assert "unparsable_action 1" in out
  assert any(line.split() == [task_id, "2", "1", "50%"] for line in out.splitlines())
  for name in ("turns", "tokens", "trajectories_per_task", "resolve_rate_per_task",
               "exit_status"):
    path = tmp_path / "plots" / f"{name}.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).ndim == 3
  assert json.loads((tmp_path / "plots" / "summary.json").read_text())["resolved"] == 1
  config.stats.max_tokens = 1        # every trajectory is longer than one token
  assert trajectory_data.stats(config).filters["too_long"] == 2


def test_a_crashed_attempt_is_stored_aborted_and_retried(tmp_path, distill_config, env_client,
                                                         monkeypatch):
  monkeypatch.setenv(KEY_ENV, KEY)
  config = distill_config(tmp_path / "crash", attempts_per_task=1)

  def lose_the_sandbox(conversation, turn):
    if turn == 1:  # the agent's sandbox disappears while it waits for the model (a lost node)
      for box in env_client.list_sandboxes():
        env_client.delete_sandbox(box["id"])

  look = act("Look around.", "ls")
  with TextOnlyServer(lambda *_: look, api_key=KEY, on_request=lose_the_sandbox) as server:
    summary = swe_distill.collect(teacher_config(config, server))
  assert (summary.started, summary.aborted, summary.completed) == (1, 1, 0)
  with data.TrajectoryStore(swe_distill.store_path(config)) as store:
    (aborted,) = store.trajectories()
    first_session_calls = store.model_calls(aborted.session_id)
  assert aborted.exit_status == "aborted" and aborted.outcome == {}
  assert aborted.metadata["aborted_stage"] == "episode" and aborted.metadata["error"]
  # the partial trajectory: both replies the teacher gave, and the first command's output
  assert [m["role"] for m in aborted.messages] == ["system", "user", "assistant", "user",
                                                   "assistant"]
  assert len(first_session_calls) == 2 and all(c.text_only for c in first_session_calls)

  config.distill.retry_aborted = False     # aborted counts as done: nothing to run
  assert swe_distill.collect(config).started == 0

  config.distill.retry_aborted = True
  submit = act("Submit.", SUBMIT_COMMAND)
  with TextOnlyServer(lambda *_: submit, api_key=KEY) as server:
    summary = swe_distill.collect(teacher_config(config, server))
  assert (summary.skipped, summary.started, summary.completed) == (0, 1, 1)
  with data.TrajectoryStore(swe_distill.store_path(config)) as store:
    (retried,) = store.trajectories()     # the retry superseded the aborted record
    assert retried.trajectory_id == aborted.trajectory_id
    assert retried.exit_status == "Submitted" and retried.resolved is False
    assert retried.session_id != aborted.session_id
    assert len(store.model_calls(aborted.session_id)) == 2   # the aborted try's calls stay
  assert swe_distill.collect(config).started == 0


def test_a_token_budget_stops_new_attempts(tmp_path, distill_config, monkeypatch):
  monkeypatch.setenv(KEY_ENV, KEY)
  config = distill_config(tmp_path / "budget", attempts_per_task=3, max_tokens=1)
  submit = act("Submit.", SUBMIT_COMMAND)
  with TextOnlyServer(lambda *_: submit, api_key=KEY) as server:
    summary = swe_distill.collect(teacher_config(config, server))
  assert (summary.started, summary.remaining, summary.stopped_by) == (1, 2, "max_tokens")
  assert summary.tokens == server.total_tokens > 1   # the usage the endpoint reported
  with data.TrajectoryStore(swe_distill.store_path(config)) as store:
    assert [t.attempt for t in store.trajectories()] == [0]


def test_an_unavailable_teacher_aborts_but_a_refused_request_is_an_outcome(
    tmp_path, distill_config, monkeypatch):
  monkeypatch.setenv(KEY_ENV, KEY)
  config = distill_config(tmp_path / "errors", attempts_per_task=1)
  config.teacher.max_retries = 0     # the proxy answers 502 at once; the harness retries twice
  with TextOnlyServer(lambda *_: 503, api_key=KEY) as server:     # overloaded
    assert swe_distill.collect(teacher_config(config, server)).aborted == 1
  config.distill.update(dict(attempts_per_task=2, retry_aborted=False))
  with TextOnlyServer(lambda *_: 400, api_key=KEY) as server:     # the request is refused
    assert swe_distill.collect(teacher_config(config, server)).completed == 1
  with data.TrajectoryStore(swe_distill.store_path(config)) as store:
    overloaded, refused = store.trajectories()
  assert overloaded.exit_status == "aborted" and overloaded.metadata["aborted_stage"] == "episode"
  assert "answered 502" in overloaded.metadata["error"]
  assert [m["role"] for m in overloaded.messages] == ["system", "user", "exit"]
  assert refused.exit_status == "ModelError" and refused.resolved is False


def test_budget_limits():
  budget = swe_distill.Budget(max_attempts=3, max_wall_time_s=10.0, max_tokens=100)
  assert budget.reached(attempts=2, seconds=9.9, tokens=99) is None
  assert budget.reached(attempts=3, seconds=0, tokens=0) == "max_attempts"
  assert budget.reached(attempts=0, seconds=10.0, tokens=0) == "max_wall_time_s"
  assert budget.reached(attempts=0, seconds=0, tokens=100) == "max_tokens"
  assert swe_distill.Budget().reached(attempts=10 ** 9, seconds=1e9, tokens=10 ** 12) is None
