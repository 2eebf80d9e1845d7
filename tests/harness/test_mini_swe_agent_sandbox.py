"""mini-swe-agent (PyPI) run inside a local sandbox by `run_cli_harness`, against the embedded
engine through the recording proxy: the sandbox reaches the proxy through its egress
allow-list, the agent's calls are all recorded on the chat-completions wire, each extending the
last prompt plus its sampled ids, and its own trajectory file comes back. The policy is the
random small test model, so the agent never acts and stops at its step limit."""
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
    history = previous.prompt_ids + previous.output_ids
    assert record.prompt_ids[:len(history)] == history
