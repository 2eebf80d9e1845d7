"""The real Codex CLI and Claude Code (installed from npm by `python -m orchard_jax.harness
install`) inside local sandboxes, against the embedded engine through the recording proxy.

Each test first runs the CLI once with the random small policy (one token per call) to record
its real first request, then teaches the policy, in seconds (cli_policy.py), to answer that
request with one tool call in the harness's own tool format and to answer the tool's result
with a short message. The CLI then runs again in a fresh sandbox whose egress allow-list
holds only the proxy: its tool call must execute in the sandbox (the file shows in the
workspace diff), every model call must be recorded, and each recorded prompt must extend the
previous call's prompt plus its sampled ids exactly.
"""
import dataclasses
import os
import sys

import pytest
from flax import nnx

from orchard_jax.data import TrajectoryStore, tiny_tokenizer
from orchard_jax.env.backends.local import LocalBackend
from orchard_jax.env.client import SandboxClient
from orchard_jax.env.orchestrator import Orchestrator
from orchard_jax.harness import install
from orchard_jax.harness.cli_harness import CLAUDE_CODE, CODEX, HarnessLimits, run_cli_harness
from orchard_jax.models import CausalLM, get_preset
from orchard_jax.rollout import (Engine, EngineConfig, InferenceServer, RecordingProxy,
                                 SGLangUpstream)

sys.path.insert(0, os.path.dirname(__file__))
from cli_policy import FINAL_ANSWER, harness_conversations, train_tool_caller  # noqa: E402

# Each test starts a 20k-token engine, runs the CLI three times and trains twice: about 6 min
# on 2 idle cores, far more on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
             num_experts_per_tok=2)
# Claude Code's first prompt is ~15.6k tokens of the tiny tokenizer, Codex's ~8.4k.
ENGINE = EngineConfig(max_batch_size=1, batch_buckets=(1,), max_seq_len=20480,
                      cache_len_buckets=(20480,), prefill_chunk_buckets=(1024,), decode_steps=8,
                      seed=0)
WORKDIR = "/work/repo"
TASK = "Create a file hello.txt containing the word hi."
COMMAND = "echo hi > hello.txt"
CALLS = {"codex": ("exec_command", {"cmd": COMMAND}),
         "claude_code": ("Bash", {"command": COMMAND, "description": "Create hello.txt"})}
DIFF = f"cd {WORKDIR} && git add -A >/dev/null && git diff --cached"


class _CapturingUpstream(SGLangUpstream):
  """The engine upstream, counting every finished generation (every call the proxy served)."""

  def __init__(self, url):
    super().__init__(url)
    self.finished = []

  async def generate(self, prompt_ids, params, **kwargs):
    out = await super().generate(prompt_ids, params, **kwargs)
    self.finished.append(kwargs.get("session_id"))
    return out

  async def generate_stream(self, prompt_ids, params, **kwargs):
    async for out in super().generate_stream(prompt_ids, params, **kwargs):
      if out.meta_info.finish_reason is not None:
        self.finished.append(kwargs.get("session_id"))
      yield out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  tokenizer = tiny_tokenizer()
  model = CausalLM(dataclasses.replace(get_preset("tiny"), **SMALL), rngs=nnx.Rngs(0))
  store_dir = tmp_path_factory.mktemp("store")
  with Engine(model, tokenizer, config=ENGINE) as engine, InferenceServer(engine) as server, \
       TrajectoryStore(store_dir) as store:
    upstream = _CapturingUpstream(server.url)
    with RecordingProxy(upstream, tokenizer=tokenizer, store=store, served_model_name="orchard",
                        sampling_defaults={"max_new_tokens": 96}) as proxy, \
         Orchestrator(LocalBackend(shared_paths=[install.harness_dir()])) as service, \
         SandboxClient(service.url, service.api_key) as client:
      yield dict(tokenizer=tokenizer, model=model, engine=engine, proxy=proxy, store=store,
                 upstream=upstream, client=client)


def _run(world, harness, session, limits):
  proxy, client = world["proxy"], world["client"]
  with client.create_sandbox(image="host", workdir=WORKDIR, egress=[proxy.url]) as box:
    box.exec("git init -q . && echo base > README && git add -A && "
             "git -c user.email=t@t -c user.name=t commit -qm base", check=True)
    # Nothing but the proxy is reachable: the engine's own port is not.
    engine_url = proxy.upstream.client.urls[0]
    probe = box.exec(f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' {engine_url}/health")
    assert probe.stdout.strip() in ("", "000")
    run = run_cli_harness(harness, box, TASK, base_url=box.egress_url(proxy.session_url(session)),
                          workdir=WORKDIR, model="orchard", limits=limits, diff_command=DIFF)
  proxy.end_session(session)
  return run


@pytest.mark.parametrize("harness", [CODEX, CLAUDE_CODE], ids=lambda h: h.name)
def test_cli_harness_in_sandbox_through_proxy(world, harness):
  install.executable(harness.name)   # a clear error naming the install command when missing
  proxy, store, engine = world["proxy"], world["store"], world["engine"]
  limits = HarnessLimits(timeout_s=900, max_turns=4, context_window=ENGINE.max_seq_len,
                         max_output_tokens=96)
  # 1. The harness's real first request, answered by the random policy in one token.
  original = nnx.state(world["model"], nnx.Param)
  proxy.sampling_overrides = {"max_new_tokens": 1}
  try:
    _run(world, harness, f"{harness.name}-capture", limits)
  finally:
    proxy.sampling_overrides = {}
  first = store.model_calls(f"{harness.name}-capture")[0]
  assert first.metadata["wire"] == harness.wire
  assert len(first.prompt_ids) > 4000    # the CLI's own system prompt and tool schemas
  # 2. Teach the policy that request's tool call, in the harness's own tool format, and let
  # the harness run it once to record how it sends the tool's result back; then teach the
  # policy to answer that result.
  tool, arguments = CALLS[harness.name]
  assert tool in [t["function"]["name"] for t in first.tools]
  model = world["model"]
  conversations = harness_conversations(first.messages, tool, arguments)
  try:
    # The harness's next first request can differ a little from the recorded one (Claude
    # Code's context varies); a probe whose first turn missed the call teaches that request too.
    for round_ in range(3):
      loss = train_tool_caller(model, world["tokenizer"], conversations, first.tools)
      assert loss < 0.05, f"the policy did not learn the {harness.name} tool call ({loss:.3f})"
      engine.update_params(nnx.state(model, nnx.Param), weight_version="6")
      _run(world, harness, f"{harness.name}-probe{round_}", limits)
      probe = store.model_calls(f"{harness.name}-probe{round_}")
      if probe and (probe[0].response or {}).get("tool_calls"):
        break
      conversations += harness_conversations(probe[0].messages, tool, arguments)
    assert len(probe) >= 2 and probe[1].messages[-1]["role"] == "tool", probe[0].response
    # The tool's result as the harness sends it back, after the call as the policy writes it
    # (the harness's echo of the call may render differently: one target per context).
    after_call = probe[1].messages[len(first.messages) + 1:]
    answered = conversations[0][:len(first.messages) + 1] + after_call + [
      {"role": "assistant", "content": FINAL_ANSWER}]
    loss = train_tool_caller(model, world["tokenizer"], conversations + [answered], first.tools)
    assert loss < 0.05, f"the policy did not learn to answer the tool's result ({loss:.3f})"
    engine.update_params(nnx.state(model, nnx.Param), weight_version="7")
    served_before = len(world["upstream"].finished)
    run = _run(world, harness, f"{harness.name}-run", limits)
  finally:
    engine.update_params(original, weight_version="0")
    nnx.update(model, original)
  # 3. The tool call ran in the sandbox; the harness ended on its own.
  records = store.model_calls(f"{harness.name}-run")
  seen = [(r.finish_reason, r.response, r.metadata.get("tool_call_errors")) for r in records]
  assert run.exit_code == 0, (run.output[-3000:], seen)
  assert "hello.txt" in run.patch and "+hi" in run.patch, (run.patch, seen)
  assert FINAL_ANSWER in run.output, run.output[-3000:]
  assert any(name != f"{harness.name}.output.log" for name in run.logs)   # its own trajectory
  # 4. Every call recorded, each prompt extending the last prompt plus its sampled ids.
  served = world["upstream"].finished[served_before:]
  assert len(records) == len(served) >= 2
  assert records[0].response["tool_calls"][0]["function"]["name"] == tool
  for previous, record in zip(records, records[1:]):
    history = previous.prompt_ids + previous.output_ids
    assert record.prompt_ids[:len(history)] == history
    assert record.metadata["reused_prompt_ids"] == len(history)
  assert {r.segment_index for r in records} == {0}
  assert {r.metadata["wire"] for r in records} == {harness.wire}
  assert {r.policy_version for r in records} == {7}
  # The last turn answers (greedy decoding of a briefly taught head may add a character).
  assert records[-1].response.get("content", "").strip().startswith(FINAL_ANSWER)
  assert not records[-1].response.get("tool_calls")
