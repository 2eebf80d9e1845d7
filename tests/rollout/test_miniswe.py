"""mini-swe-agent (the real harness from PyPI) runs against the embedded engine through the
recording proxy, and every model call lands in the trajectory store.

How the run is made multi-step honestly: a random tiny policy writes no tool calls, so the
policy served here is the small test model trained for a few hundred steps on one conversation
in mini-swe-agent's tool-calling format (tests/rollout/agent_fixture.py). With greedy decoding
it calls `echo one`, then `echo two` after seeing "one", then submits with
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` after seeing "two"; mini-swe-agent executes each
command in a real shell (LocalEnvironment), feeds the output back, and stops when the submit
command prints its marker. Everything between the harness and the engine is the production
path: litellm's OpenAI client -> proxy -> SGLang client -> engine server -> engine.
"""
import os

import pytest

from agent_fixture import COMMANDS, SYSTEM, TASK
from orchard_jax.data import TrajectoryStore, sequences_from_model_calls
from orchard_jax.rollout import InferenceServer, RecordingProxy, SGLangUpstream


@pytest.mark.slow
def test_mini_swe_agent_multi_step_run_is_fully_recorded(agent_engine, tokenizer, tmp_path,
                                                          monkeypatch):
  # tests/conftest.py points mini-swe-agent's config folder and litellm's price table at local,
  # temporary state for the whole session (they are read once, on first import).
  monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
  from minisweagent.agents.default import DefaultAgent
  from minisweagent.environments.local import LocalEnvironment
  from minisweagent.models.litellm_model import LitellmModel

  workdir = tmp_path / "work"
  workdir.mkdir()
  with InferenceServer(agent_engine) as server, TrajectoryStore(tmp_path / "store") as store, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=tokenizer, store=store,
                      served_model_name="tiny-policy") as proxy:
    model = LitellmModel(
      model_name="openai/tiny-policy", cost_tracking="ignore_errors",
      observation_template="{{output.output}}",
      model_kwargs={"api_base": proxy.session_url("mswea-1"), "api_key": "none",
                    "temperature": 0.0, "max_tokens": 64})
    agent = DefaultAgent(model, LocalEnvironment(cwd=str(workdir)), system_template=SYSTEM,
                         instance_template="{{task}}", step_limit=8, cost_limit=0.0)
    result = agent.run(TASK)
    proxy.end_session("mswea-1")  # as recipes do: waits until the last call is recorded
    records = store.model_calls("mswea-1")

  assert result["exit_status"] == "Submitted", agent.messages[-1]
  assistant = [m for m in agent.messages if m["role"] == "assistant"]
  assert [m["extra"]["actions"][0]["command"] for m in assistant] == list(COMMANDS)
  observations = [m["content"] for m in agent.messages if m["role"] == "tool"]
  assert observations == ["one\n", "two\n"]  # real shell output, newline-ended
  # Every call the harness made is recorded, in order, extending one token sequence.
  assert agent.n_calls == len(records) == 3
  assert [r.call_index for r in records] == [0, 1, 2]
  assert [r.segment_index for r in records] == [0, 0, 0]
  for previous, record in zip(records, records[1:]):
    history = previous.prompt_ids + previous.output_ids
    assert record.prompt_ids[:len(history)] == history
  for record, message in zip(records, assistant):
    call = message["tool_calls"][0]
    assert record.response["tool_calls"][0]["id"] == call["id"]
    assert record.output_ids[-1] == tokenizer.eos_id and len(record.output_logprobs) == len(
      record.output_ids)
    assert tokenizer.decode(record.output_ids).startswith("<tool_call>")
  [sequence] = sequences_from_model_calls(records, mode="rl")
  assert sequence.num_loss_tokens == sum(len(r.output_ids) for r in records)
  assert os.path.isdir(os.environ["MSWEA_GLOBAL_CONFIG_DIR"])  # not under $HOME
