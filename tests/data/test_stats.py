"""Dataset statistics: counts checked by hand, plots checked as real PNG images."""
import matplotlib.image
import numpy as np

from orchard_jax.data import (
  ModelCall, Trajectory, TrajectoryStore, dataset_stats, plot_histograms,
  trajectory_filter_reasons)

BASH = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _call(name, args):
  return {"id": "c", "type": "function", "function": {"name": name, "arguments": args}}


def _assistant(*calls, content=None):
  return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def _trajectories():
  user = {"role": "user", "content": "task"}
  return [
    Trajectory(trajectory_id="ok", task_id="A", session_id="s-ok", tools=BASH,
               messages=[user, _assistant(_call("bash", '{"command": "ls"}')),
                         {"role": "tool", "content": "x"}, _assistant(content="done")],
               exit_status="Submitted", outcome={"resolved": True}),
    Trajectory(trajectory_id="undefined", task_id="A", attempt=1, tools=BASH,
               messages=[user, _assistant(_call("python", "{}"))], exit_status="Submitted",
               outcome={"resolved": False}),
    Trajectory(trajectory_id="unparsable", task_id="B", tools=BASH,
               messages=[user, _assistant(_call("bash", "{not json")),
                         {"role": "user", "content": "bad format",
                          "extra": {"interrupt_type": "FormatError"}}],
               exit_status="RepeatedFormatError"),
    Trajectory(trajectory_id="text", task_id="C", tools=BASH,
               messages=[user, {"role": "assistant",
                                "content": "<tool_call>\n{broken\n</tool_call>"}],
               exit_status="LimitsExceeded", outcome={"resolved": False}),
  ]


def test_filter_reasons():
  ok, undefined, unparsable, text = _trajectories()
  assert trajectory_filter_reasons(ok) == []
  assert trajectory_filter_reasons(ok, tokens=100, max_tokens=99) == ["too_long"]
  assert trajectory_filter_reasons(undefined) == ["undefined_tool_call"]
  assert trajectory_filter_reasons(unparsable) == ["unparsable_action"]
  assert trajectory_filter_reasons(text) == ["unparsable_action"]


def test_format_errors_in_text_or_records_are_counted():
  """The kinds the parsers report (docs: data/tool_calls.py) flag a trajectory, from the text
  the harness kept or from the errors the proxy recorded for the session's calls."""
  user = {"role": "user", "content": "task"}
  call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
  unclosed = Trajectory(trajectory_id="think", task_id="T", tools=BASH, messages=[
    user, {"role": "assistant", "content": "<think>\nI should list.\n" + call}])
  assert trajectory_filter_reasons(unclosed) == ["unparsable_action"]
  clean = Trajectory(trajectory_id="clean", task_id="T", tools=BASH, session_id="s",
                     messages=[user, {"role": "assistant", "content": "Done."}])
  assert trajectory_filter_reasons(clean) == []

  def recorded(*kinds, delivered=True):
    return ModelCall(session_id="s", call_index=0, delivered=delivered, metadata={
      "format_errors": [{"kind": k, "raw": "", "reason": ""} for k in kinds]})

  assert trajectory_filter_reasons(clean, calls=[recorded("unclosed_think")]) == [
    "unparsable_action"]
  assert trajectory_filter_reasons(clean, calls=[recorded("undeclared_parameter",
                                                          "undefined_tool")]) == [
    "undefined_tool_call", "unparsable_action"]
  assert trajectory_filter_reasons(clean, calls=[recorded("invalid_json", delivered=False)]) == []


def test_counts_and_table(tmp_path):
  store = TrajectoryStore(tmp_path / "store")
  # Session "s-ok": 10 prompt ids + 3 sampled, then 2 observation ids + 4 sampled = 19 tokens.
  store.append_model_call(ModelCall(session_id="s-ok", call_index=0, prompt_ids=list(range(10)),
                                    output_ids=[1, 2, 3], output_logprobs=[-1.0] * 3))
  store.append_model_call(ModelCall(
    session_id="s-ok", call_index=1, prompt_ids=list(range(10)) + [1, 2, 3, 7, 7],
    output_ids=[4, 5, 6, 2], output_logprobs=[-1.0] * 4))
  trajs = _trajectories()
  for t in trajs:
    store.append_trajectory(t)
  stats = dataset_stats(store.trajectories(), store=store, max_tokens=18)
  assert stats.trajectories == 4
  assert stats.per_task == {"A": 2, "B": 1, "C": 1}
  assert stats.resolved_per_task == {"A": 1, "B": 0, "C": 0}
  assert (stats.evaluated, stats.resolved) == (3, 1)
  assert np.isclose(stats.resolve_rate, 1 / 3)
  np.testing.assert_array_equal(stats.turns, [2, 1, 1, 1])
  np.testing.assert_array_equal(stats.tokens, [19])
  assert stats.exit_status == {"Submitted": 2, "RepeatedFormatError": 1, "LimitsExceeded": 1}
  assert stats.filters == {"too_long": 1, "undefined_tool_call": 1, "unparsable_action": 2,
                           "any": 4}
  table = stats.table()
  assert "resolved / evaluated   1 / 3  (33.3%)" in table
  assert "tokens per trajectory  mean 19.0" in table and "(1 of 4 counted)" in table
  assert "unparsable_action 2" in table
  summary = stats.summary()
  assert summary["tasks"] == 3 and summary["tasks_resolved"] == 1
  assert summary["filter/any"] == 4 and summary["turns_max"] == 2.0


def test_tokens_from_the_tokenizer_and_plots(tmp_path, tok):
  trajs = _trajectories()
  stats = dataset_stats(trajs, tokenizer=tok)
  assert len(stats.tokens) == 4 and (stats.tokens > 10).all()
  paths = plot_histograms(stats, tmp_path / "plots")
  assert sorted(p.name for p in paths) == [
    "exit_status.png", "resolve_rate_per_task.png", "tokens.png", "trajectories_per_task.png",
    "turns.png"]
  for path in paths:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something was drawn
