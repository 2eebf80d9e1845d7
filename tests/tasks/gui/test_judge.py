"""The WebJudge-style judge and open tasks, without a browser: the judge's three steps against a
scripted model (its requests are checked: key points from the task alone, one screenshot per
scoring call, the kept screenshots and the action history in the outcome call), its verdict
read back by `episode.grade`, and every way the judge can fail is a grader_error outcome, never
a silent 0. Open tasks load from JSON lines and refuse malformed lines by number."""
import json
import types

import pytest

from orchard_jax.tasks.gui import episode
from orchard_jax.tasks.gui.errors import GraderError, TaskFormatError
from orchard_jax.tasks.gui.judge import WebJudge
from orchard_jax.tasks.gui.task import open_tasks


class ScriptedJudgeModel:
  """Replies in order; records every request."""

  def __init__(self, replies):
    self.replies, self.requests = list(replies), []

  def complete(self, messages):
    self.requests.append(messages)
    reply = self.replies.pop(0)
    if isinstance(reply, Exception):
      raise reply
    return types.SimpleNamespace(content=reply)


def shot(n):
  return f"data:image/png;base64,{n:04d}"


def run_with(shots, calls=(("click", '{"x": 10, "y": 20}'),), answer="found it"):
  messages = [{"role": "user", "content": [{"type": "text", "text": "task"},
                                           {"type": "image_url", "image_url": {"url": shots[0]}}]}]
  for (name, arguments), url in zip(calls, shots[1:]):
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}]})
    messages.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})
  return types.SimpleNamespace(messages=messages, answer=answer, exit_status="Submitted")


OPEN_TASK = types.SimpleNamespace(id="open/x", kind="open", instruction="Find the red mug",
                                  family="open/shop")


def test_three_steps_keep_relevant_screenshots_and_the_final_page():
  model = ScriptedJudgeModel(["1. a red mug", "irrelevant\nScore: 1", "Score: 4", "Score: 2",
                              "It shows the mug.\nStatus: success"])
  run = run_with([shot(0), shot(1)])
  final = types.SimpleNamespace(screenshot=b"x", data_url=shot(2))
  verdict = WebJudge(model, threshold=3).judge("Find the red mug", run,
                                               types.SimpleNamespace(last=final))
  assert verdict.success and verdict.kept_screenshots == 2
  key_request, *scoring, outcome_request = model.requests
  assert "Find the red mug" in key_request[0]["content"]
  # one scoring call per distinct screenshot, the final page last
  assert [m[0]["content"][1]["image_url"]["url"] for m in scoring] == [shot(0), shot(1), shot(2)]
  images = [p["image_url"]["url"] for p in outcome_request[0]["content"] if p["type"] == "image_url"]
  assert images == [shot(1), shot(2)]   # score 1 dropped; the final page kept whatever its score
  assert 'click({"x": 10, "y": 20})' in outcome_request[0]["content"][0]["text"]
  assert '"found it"' in outcome_request[0]["content"][0]["text"]


@pytest.mark.parametrize("last, success", [("Status: failure", False),
                                           ("**Status: NOT SUCCESS**", False),
                                           ("Status: success", True)])
def test_the_last_status_line_decides(last, success):
  model = ScriptedJudgeModel(["1. x", "Score: 5", "Status: success was my first guess.\n" + last])
  assert WebJudge(model).judge("t", run_with([shot(0)])).success is success


@pytest.mark.parametrize("replies, expected", [
    ([RuntimeError("connection refused")], "endpoint failed: RuntimeError"),
    ([""], "reply was empty"),
    (["1. x", "looks fine"], "Score: 1-5"),
    (["1. x", "Score: 3", "I cannot tell."], "Status: success"),
])
def test_a_judge_that_cannot_decide_is_a_grader_error_outcome(replies, expected):
  with pytest.raises(GraderError, match=expected):
    WebJudge(ScriptedJudgeModel(list(replies))).judge("t", run_with([shot(0)]))
  outcome = episode.grade(OPEN_TASK, None, run_with([shot(0)]),
                          judge=WebJudge(ScriptedJudgeModel(list(replies))))
  assert outcome.status == "grader_error" and outcome.reward is None and expected in outcome.reason


def test_an_open_task_without_a_judge_is_a_grader_error_and_with_one_is_judged():
  outcome = episode.grade(OPEN_TASK, None, run_with([shot(0)]))
  assert outcome.status == "grader_error" and "no checker and no judge" in outcome.reason
  judge = WebJudge(ScriptedJudgeModel(["1. x", "Score: 5", "Status: success"]))
  outcome = episode.grade(OPEN_TASK, None, run_with([shot(0)]), judge=judge)
  assert (outcome.status, outcome.reward, outcome.details["grader"]) == ("success", 1.0, "judge")


def test_open_tasks_load_and_refuse_malformed_lines_by_number(tmp_path):
  path = tmp_path / "open.jsonl"
  path.write_text(json.dumps({"id": "mug", "instruction": "Find the red mug",
                              "start_url": "http://shop.test/", "sites": ["shop"]}) + "\n\n"
                  + json.dumps({"id": "w", "instruction": "Read the news",
                                "start_url": "https://example.org/", "split": "train"}) + "\n")
  first, second = open_tasks(str(path))
  assert (first.id, first.kind, first.family, first.split) == ("open/mug", "open", "open/shop",
                                                               "eval")
  assert (second.family, second.split, second.max_steps) == ("open/web", "train", 30)
  for line, expected in [("not json", ":1: not JSON"),
                         (json.dumps({"id": "x", "instruction": ""}), ":1: expected an object"),
                         (json.dumps({"id": "x", "instruction": "i", "start_url": "u",
                                      "sites": ["bank"]}), "unknown site"),
                         (json.dumps({"id": "x", "instruction": "i", "start_url": "u",
                                      "split": "test"}), "split must be train or eval")]:
    path.write_text(line + "\n")
    with pytest.raises(TaskFormatError, match=expected):
      open_tasks(str(path))
