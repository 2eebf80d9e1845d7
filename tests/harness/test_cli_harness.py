"""The real Codex CLI and Claude Code (installed from npm by `python -m orchard_jax.harness
install`) inside local sandboxes, against the embedded engine through the recording proxy.

Each test first records the CLI's real requests without the engine: a scripted model behind
the proxy (harness/scripted_model.py) answers its first request with the tool call, so the
harness runs it and sends the tool's result back. The small policy is then taught, in seconds
(cli_policy.py), to answer that first request with the same tool call in the harness's own
tool format and the tool's result with a short message. The CLI then runs against the engine
in a fresh sandbox whose egress allow-list holds only the proxy: its tool call must execute in
the sandbox (the file shows in the workspace diff), every model call must be recorded, and
each recorded prompt must extend the previous call's prompt plus its sampled ids exactly.
The repository's base commit is made with fixed dates, so its hash (which Claude Code shows
the model) is the same in every sandbox and the taught request is the one the harness sends.
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
from orchard_jax.harness.scripted_model import ScriptedHarnessModel, ScriptStep
from orchard_jax.models import CausalLM, get_preset
from orchard_jax.rollout import (Engine, EngineConfig, InferenceServer, RecordingProxy,
                                 SGLangUpstream)

sys.path.insert(0, os.path.dirname(__file__))
from cli_policy import FINAL_ANSWER, harness_conversations, train_tool_caller  # noqa: E402

# Each test records the CLI's requests (seconds), trains once and runs the CLI against a
# 20k-token engine: a few minutes on 2 idle cores, far more on a loaded machine.
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
# One base commit hash in every sandbox (Claude Code shows it to the model).
BASE_COMMIT = ("git init -q . && echo base > README && git add -A && "
               "GIT_AUTHOR_DATE=2026-01-01T00:00:00Z GIT_COMMITTER_DATE=2026-01-01T00:00:00Z "
               "git -c user.email=t@t -c user.name=t commit -qm base")


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
    # Greedy decoding: the briefly taught policy's argmax is its target, whereas sampling at
    # the CLI's temperature broke a ~40-token tool call once in a while (invalid JSON).
    with RecordingProxy(upstream, tokenizer=tokenizer, store=store, served_model_name="orchard",
                        sampling_defaults={"max_new_tokens": 96},
                        sampling_overrides={"temperature": 0.0}) as proxy, \
         Orchestrator(LocalBackend(shared_paths=[install.harness_dir()])) as service, \
         SandboxClient(service.url, service.api_key) as client:
      yield dict(tokenizer=tokenizer, model=model, engine=engine, proxy=proxy, store=store,
                 upstream=upstream, client=client)


def _run(world, harness, session, limits, proxy=None):
  proxy, client = proxy or world["proxy"], world["client"]
  with client.create_sandbox(image="host", workdir=WORKDIR, egress=[proxy.url]) as box:
    box.exec(BASE_COMMIT, check=True)
    if proxy is world["proxy"]:
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
  proxy, store, engine, tokenizer = world["proxy"], world["store"], world["engine"], world["tokenizer"]
  limits = HarnessLimits(timeout_s=900, max_turns=4, context_window=ENGINE.max_seq_len,
                         max_output_tokens=96)
  # 1. The harness's real requests, answered by a scripted model (no engine): its first
  # request, then the one carrying the tool's result as the harness sends it back.
  tool, arguments = CALLS[harness.name]
  scripted = ScriptedHarnessModel(harness, [ScriptStep(arguments.get("description", ""), COMMAND)],
                                  final_answer=FINAL_ANSWER)
  with RecordingProxy(scripted, store=store, freeze_gc=False) as capture:
    _run(world, harness, f"{harness.name}-capture", limits, proxy=capture)
  first, second = store.model_calls(f"{harness.name}-capture")[:2]
  assert first.metadata["wire"] == harness.wire
  assert len(tokenizer.render_chat(first.messages, first.tools)) > 4000   # its own system
  assert tool in [t["function"]["name"] for t in first.tools]             # prompt and tools
  assert second.messages[-1]["role"] == "tool", second.messages[-1]
  # 2. Teach the policy that request's tool call, in the harness's own tool format, and the
  # answer to the tool's result: after the call as the policy writes it, the result as the
  # harness sent it (its echo of the call may render differently), and variants of the
  # result (Codex's carries a random chunk id).
  model = world["model"]
  original = nnx.state(model, nnx.Param)
  conversations = harness_conversations(first.messages, tool, arguments)
  assert second.messages[:len(first.messages)] == first.messages   # the history is resent
  echo = max(i for i, m in enumerate(second.messages) if m["role"] == "assistant")
  after_call = second.messages[echo + 1:]
  answered = conversations[0][:len(first.messages) + 1] + after_call + [
    {"role": "assistant", "content": FINAL_ANSWER}]
  try:
    loss = train_tool_caller(model, tokenizer, conversations + [answered], first.tools)
    assert loss < 0.05, f"the policy did not learn the {harness.name} turns ({loss:.3f})"
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
