"""mini-swe-agent (PyPI) run inside a local sandbox by `run_cli_harness`, against the embedded
engine through the recording proxy: the sandbox reaches the proxy through its egress
allow-list, the agent's calls are all recorded on the chat-completions wire, and its own
trajectory file comes back. The policy is the random small test model, so the agent never acts
and stops at its step limit.

The records follow what the harness sent, not what a test expects it to send. A call whose
messages resend the previous call's messages and answer extends that call's prompt plus its
sampled ids (same segment). mini-swe-agent 2.x does not resend an answer it could not parse (the
random policy's every answer): it drops that turn from its history and sends a format-error
user message instead (its trajectory keeps the dropped answer in that message's
`extra.response`), so the proxy cannot extend the sampled ids and starts a new segment, rendered
from scratch. (The
extending path with the real mini-swe-agent, a policy that acts, is tests/rollout/
test_miniswe.py.)"""
import dataclasses
import json

import pytest
from flax import nnx

from orchard_jax.data import TrajectoryStore, tiny_tokenizer
from orchard_jax.env.backends.local import LocalBackend
from orchard_jax.env.client import SandboxClient
from orchard_jax.env.orchestrator import Orchestrator
from orchard_jax.harness.cli_harness import MINI_SWE_AGENT, HarnessLimits, run_cli_harness
from orchard_jax.models import CausalLM, get_preset
from orchard_jax.rollout import (Engine, EngineConfig, InferenceServer, RecordingProxy,
                                 SGLangUpstream)

SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
             num_experts_per_tok=2)


@pytest.mark.slow
def test_mini_swe_agent_runs_in_the_sandbox_through_the_proxy(tmp_path):
  tokenizer = tiny_tokenizer()
  model = CausalLM(dataclasses.replace(get_preset("tiny"), **SMALL), rngs=nnx.Rngs(0))
  config = EngineConfig(max_batch_size=1, batch_buckets=(1,), max_seq_len=4096,
                        cache_len_buckets=(4096,), prefill_chunk_buckets=(512,), decode_steps=8)
  with Engine(model, tokenizer, config=config) as engine, InferenceServer(engine) as server, \
       TrajectoryStore(tmp_path / "store") as store, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=tokenizer, store=store,
                      served_model_name="orchard") as proxy, \
       Orchestrator(LocalBackend()) as service, \
       SandboxClient(service.url, service.api_key) as client:
    with client.create_sandbox(image="host", workdir="/work/repo", egress=[proxy.url]) as box:
      run = run_cli_harness(MINI_SWE_AGENT, box, "Print hello.",
                            base_url=box.egress_url(proxy.session_url("mini")),
                            workdir="/work/repo", limits=HarnessLimits(
                              timeout_s=600, max_turns=2, max_output_tokens=16))
    proxy.end_session("mini")
    records = store.model_calls("mini")
  assert run.exit_code == 1, run.output[-2000:]   # not submitted: the random policy never acts
  [traj_name] = [name for name in run.logs if name.endswith(".traj.json")]
  saved = json.loads(run.logs[traj_name])
  assert saved["info"]["exit_status"] != "Submitted"
  assert len(records) >= 1 and {r.metadata["wire"] for r in records} == {"chat_completions"}
  assert len(records) == 2   # one call per step, up to its step limit (max_turns)
  for previous, record in zip(records, records[1:]):
    sent, resent = record.messages, previous.messages + [previous.response]
    if len(sent) > len(resent) and [_turn(m) for m in sent[:len(resent)]] == list(map(
        _turn, resent)):      # the harness resent what it was given: one token sequence
      history = previous.prompt_ids + previous.output_ids
      assert record.prompt_ids[:len(history)] == history
      assert record.segment_index == previous.segment_index
    else:                     # the harness changed its history: a new segment, from scratch
      assert record.segment_index == previous.segment_index + 1
      assert record.prompt_ids == tokenizer.render_chat(
          record.messages, record.tools, add_generation_prompt=True)
  # What mini-swe-agent did here: the unparsable first answer is not in the second call; its
  # place is a format-error message, and mini's own trajectory names the answer it dropped.
  first, second = records
  assert [_turn(m) for m in second.messages[:len(first.messages)]] == list(map(
      _turn, first.messages))
  assert [m["role"] for m in second.messages[len(first.messages):]] == ["user"]
  assert second.segment_index == first.segment_index + 1
  dropped = [m["extra"]["response"]["choices"][0]["message"] for m in saved["messages"]
             if m.get("extra", {}).get("interrupt_type") == "FormatError"]
  assert len(dropped) == 2 and dropped[0]["content"] == first.response["content"]
  assert not any(m["role"] == "assistant" for m in saved["messages"])


def _turn(message: dict) -> tuple:
  """A message's role, text and tool calls (name, arguments): what a chat template renders."""
  calls = tuple((c["function"]["name"], c["function"]["arguments"])
                for c in message.get("tool_calls") or ())
  return message.get("role"), (message.get("content") or "").strip(), calls
