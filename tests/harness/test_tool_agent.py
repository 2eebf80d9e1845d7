"""The ReAct tool-calling agent over real HTTP: `ChatModel` against a scripted OpenAI endpoint
(tests/openai_stub.py: no model can run here) with a recording tool backend. Checked: what the
model is sent (tools, the assistant turn as returned, tool results by call id), how each run
ends, and that tool errors and bad arguments are results for the model, not the end."""
import json

import pytest

from orchard_jax.harness import ChatModel, ToolAgent, ToolAgentConfig
from tests.openai_stub import ChatStub

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}}]


class Result:
  def __init__(self, content, is_error=False, abort=None, status=200):
    self.content, self.is_error, self.abort, self.status = content, is_error, abort, status


class Backend:
  """Adds numbers; refuses arguments that are not a JSON object of two integers."""
  tools = TOOLS

  def __init__(self, abort_after=None):
    self.calls = []
    self.abort_after = abort_after

  def call(self, name, arguments):
    self.calls.append((name, arguments))
    if self.abort_after is not None and len(self.calls) > self.abort_after:
      return Result("Error: the math service died", True, abort="the math service died", status=0)
    try:
      args = json.loads(arguments)
      return Result(json.dumps({"sum": int(args["a"]) + int(args["b"])}))
    except (ValueError, KeyError, TypeError) as e:
      return Result(f"Error 400 (invalid_arguments): {e}", True, status=400)


def tool_call(i, name, arguments):
  return {"id": f"call_{i}", "type": "function",
          "function": {"name": name, "arguments": arguments}}


def run(script, backend=None, **config):
  backend = backend or Backend()
  with ChatStub(lambda request: script(request.index, request.body)) as stub, \
       ChatModel(stub.root + "/v1", retries=0) as model:
    result = ToolAgent(model, backend, ToolAgentConfig(**config)).run("What is 2 + 3?")
    return result, stub.requests, backend


def test_tool_calls_results_and_final_answer():
  def script(i, body):
    if i == 0:
      return {"content": "Let me add.", "tool_calls": [tool_call(0, "add", '{"a": 2, "b": 3}'),
                                                       tool_call(1, "add", '{"a": "x"}')]}
    return "2 + 3 = 5"
  result, requests, backend = run(script)
  assert result.exit_status == "Submitted" and result.answer == "2 + 3 = 5"
  assert result.steps == 2 and result.tool_calls == 2 and result.tool_errors == 1
  assert requests[0].body["tools"] == TOOLS
  second = requests[1].body["messages"]
  assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
  assert second[2]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
  assert second[3] == {"role": "tool", "tool_call_id": "call_0", "content": '{"sum": 5}'}
  assert second[4]["tool_call_id"] == "call_1" and second[4]["content"].startswith("Error 400")
  assert all("extra" not in m for m in second)                  # harness-only keys stay local
  assert backend.calls[1] == ("add", '{"a": "x"}')              # arguments reach the backend as sent
  trajectory = result.to_trajectory(task_id="t")
  assert trajectory.exit_status == "Submitted" and trajectory.tools == TOOLS
  assert trajectory.submission == "2 + 3 = 5"


def test_step_limit_and_format_errors():
  loop = lambda i, body: {"tool_calls": [tool_call(i, "add", '{"a": 1, "b": 1}')]}  # noqa: E731
  assert run(loop, step_limit=3)[0].exit_status == "LimitsExceeded"
  empty = lambda i, body: ""  # noqa: E731
  result, requests, _ = run(empty, max_consecutive_format_errors=2)
  assert result.exit_status == "RepeatedFormatError" and len(requests) == 2
  assert requests[1].body["messages"][-1]["role"] == "user"
  cut = lambda i, body: ("I will now call the tool <tool_call>{\"na", "length") if i == 0 \
      else "5"  # noqa: E731
  result, requests, _ = run(cut)
  assert result.exit_status == "Submitted" and "cut off" in requests[1].body["messages"][-1]["content"]


def test_an_environment_failure_aborts_with_the_reason():
  loop = lambda i, body: {"tool_calls": [tool_call(i, "add", '{"a": 1, "b": 1}')]}  # noqa: E731
  result, _, backend = run(loop, backend=Backend(abort_after=1))
  assert result.exit_status == "aborted" and result.abort_reason == "the math service died"
  assert len(backend.calls) == 2 and result.messages[-1]["role"] == "tool"


def test_a_model_failure_ends_the_run():
  result, _, _ = run(lambda i, body: 503)
  assert result.exit_status == "ModelError" and "503" in result.abort_reason


def test_too_many_calls_in_one_reply_are_not_run():
  def script(i, body):
    if i == 0:
      return {"tool_calls": [tool_call(k, "add", '{"a": 1, "b": 1}') for k in range(3)]}
    return "done"
  result, requests, backend = run(script, max_tool_calls_per_turn=2)
  assert len(backend.calls) == 2
  assert requests[1].body["messages"][-1]["content"].startswith("Error: at most 2 tool calls")


@pytest.mark.parametrize("limit,expected", [(10, "x" * 10 + "\n[... 90 more characters cut]")])
def test_long_results_are_cut(limit, expected):
  class Long(Backend):
    def call(self, name, arguments):
      return Result("x" * 100)
  script = lambda i, body: {"tool_calls": [tool_call(0, "add", "{}")]} if i == 0 else "ok"  # noqa
  result, requests, _ = run(script, backend=Long(), output_limit_chars=limit)
  assert requests[1].body["messages"][-1]["content"] == expected
