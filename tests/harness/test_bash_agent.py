"""The bash agent against a scripted model served over real HTTP (a tiny OpenAI-style server
in this test) and a real sandbox: format errors, timeouts, huge outputs, submit, limits, and the
mini-swe-agent trajectory file."""
import json

import pytest

from orchard_jax.harness import bash_agent
from orchard_jax.harness.bash_agent import AgentConfig, BashAgent
from orchard_jax.harness.model_client import ChatModel
from orchard_jax.harness.prompts import SUBMIT_COMMAND, SUBMIT_SENTINEL
from orchard_jax.tasks.swe.testbed import open_sandbox
from tests.harness import scripted

ScriptedServer = scripted.ScriptedServer
act = scripted.act


@pytest.fixture
def sandbox(env_client):
  # The workspace mount point is root's; the sandbox user needs git's safe.directory for it.
  git_env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
             "GIT_CONFIG_VALUE_0": "*"}
  with open_sandbox(env_client, "host", env=git_env) as box:
    box.run("cd /workspace && git init -q . && echo 'x = 1' > a.py && git add -A && "
            "git -c user.name=t -c user.email=t@t commit -qm init", timeout_s=30)
    yield box


def test_format_error_timeout_huge_output_and_submit(sandbox, tmp_path):
  replies = [
      ("I think I should look around but forgot the command block.", "stop"),
      (act("Two blocks is also wrong.", "ls")[0] + "\n```bash\npwd\n```", "stop"),
      act("List files.", "ls"),
      act("This hangs.", "sleep 30"),
      act("Lots of output.", "seq 1 200000"),
      act("Fix the value.", "sed -i 's/x = 1/x = 2/' a.py"),
      act("Submit.", SUBMIT_COMMAND),
  ]
  config = AgentConfig(command_timeout_s=2, output_limit_chars=1000, workdir="/workspace")
  with ScriptedServer(replies) as url, ChatModel(url, model="scripted") as model:
    result = BashAgent(model, sandbox, config).run("Make x equal 2.")
  assert result.exit_status == "Submitted"
  assert "-x = 1" in result.submission and "+x = 2" in result.submission
  assert result.submission.startswith("diff --git a/a.py b/a.py")
  users = [m for m in result.messages if m["role"] == "user"][1:]
  assert users[0]["extra"]["interrupt_type"] == "FormatError" and "found 0" in users[0]["content"]
  assert users[1]["extra"]["n_actions"] == 2
  assert "<returncode>0</returncode>" in users[2]["content"] and "a.py" in users[2]["content"]
  assert "timed out after 2 seconds" in users[3]["content"]
  assert users[3]["extra"]["returncode"] == -1
  huge = users[4]["content"]
  assert "<output_head>\n1\n2\n3" in huge and "199999\n200000" in huge
  assert len(huge) < 2000 and "elided" in huge
  assert result.messages[-1] == {**result.messages[-1], "role": "exit",
                                 "content": result.submission}
  assert result.steps == 7

  # The trajectory file is mini-swe-agent's format and reads back unchanged.
  from orchard_jax.data.miniswe import read_miniswe_trajectory, write_miniswe_trajectory
  trajectory = result.to_trajectory(task_id="demo-1")
  path = write_miniswe_trajectory(trajectory, tmp_path / "demo-1.traj.json")
  data = json.loads(path.read_text())
  assert data["trajectory_format"] == "mini-swe-agent-1.1"
  assert data["info"]["exit_status"] == "Submitted"
  assert data["info"]["submission"] == result.submission
  assert read_miniswe_trajectory(path).messages == result.messages


def test_submit_with_empty_submission(sandbox):
  replies = [act("Submit at once.", f"echo {SUBMIT_SENTINEL}")]
  with ScriptedServer(replies) as url, ChatModel(url, model="m", temperature=0.7) as model:
    result = BashAgent(model, sandbox, AgentConfig(workdir="/workspace")).run("Nothing to do.")
  assert result.exit_status == "Submitted" and result.submission == ""


def test_request_body_is_an_openai_chat_completion(sandbox):
  replies = [act("List.", "ls"), act("Submit.", f"echo {SUBMIT_SENTINEL}")]
  server = ScriptedServer(replies)
  with server as url, ChatModel(url, model="m", temperature=0.7, max_tokens=64) as model:
    BashAgent(model, sandbox, AgentConfig(workdir="/workspace")).run("Do the thing.")
  path, body = server.requests[1].path, server.requests[1].body
  assert path == "/sessions/s1/v1/chat/completions"
  assert body["model"] == "m" and body["temperature"] == 0.7 and body["max_tokens"] == 64
  assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
  assert all(set(m) == {"role", "content"} for m in body["messages"])
  assert "Do the thing." in body["messages"][1]["content"]


def test_limits_and_repeated_format_errors(sandbox):
  with ScriptedServer([act("a", "true")] * 5) as url, ChatModel(url) as model:
    result = BashAgent(model, sandbox, AgentConfig(step_limit=3, workdir="/workspace")).run("t")
  assert result.exit_status == bash_agent.EXIT_LIMITS and result.steps == 3
  assert result.messages[-1]["role"] == "exit"
  with ScriptedServer([("no action", "stop")] * 5) as url, ChatModel(url) as model:
    result = BashAgent(model, sandbox, AgentConfig(max_consecutive_format_errors=2,
                                                   workdir="/workspace")).run("t")
  assert result.exit_status == bash_agent.EXIT_FORMAT and result.steps == 2
  with ScriptedServer([("cut off mid-thought ```bash\nec", "length")] * 3) as url, \
      ChatModel(url) as model:
    result = BashAgent(model, sandbox, AgentConfig(max_consecutive_format_errors=1,
                                                   workdir="/workspace")).run("t")
  assert "finish_reason=length" in result.messages[-2]["content"]


def test_submit_needs_exit_code_zero_and_the_sentinel_first(sandbox):
  replies = [act("Not a submit: the sentinel is not the first line.", f"echo hi; echo {SUBMIT_SENTINEL}"),
             act("Not a submit: it fails.", f"echo {SUBMIT_SENTINEL}; exit 1"),
             act("Submit.", f"echo {SUBMIT_SENTINEL} && echo patch-body")]
  with ScriptedServer(replies) as url, ChatModel(url) as model:
    result = BashAgent(model, sandbox, AgentConfig(workdir="/workspace")).run("t")
  assert result.exit_status == "Submitted" and result.submission == "patch-body\n"
  assert result.steps == 3


def test_unreachable_model_ends_the_run_with_model_error(sandbox):
  with ChatModel("http://127.0.0.1:9/v1", retries=0, timeout_s=2) as model:
    result = BashAgent(model, sandbox, AgentConfig(workdir="/workspace")).run("t")
  assert result.exit_status == bash_agent.EXIT_MODEL_ERROR
  assert "127.0.0.1:9" in result.messages[-1]["extra"]["exception_str"]
