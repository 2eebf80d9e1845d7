"""`--suite proxy`: latency the recording proxy adds to each model call.

An upstream that answers SGLang's `/generate` instantly with a fixed tool-calling turn (a stub,
so the engine's own time does not drown the proxy's) is called two ways in the same run:
  direct:    the SGLang client's request straight to the upstream (the floor),
  via proxy: an OpenAI chat-completions request to the proxy's session URL, which renders the
             new messages, extends the session's recorded ids, calls the same upstream, parses
             the tool call, answers and appends the model call to a trajectory store on disk.
Sessions are agent-like: 20 calls each, every call adding the returned assistant turn and a
tool result to the history. Added latency = via-proxy latency - direct latency, at p50 and p99,
against the 2 ms p50 budget of issue 5. Wall-clock latencies are only meaningful on a quiet
machine; the suite also reports the on-CPU time of the proxy's server thread per call (Linux
schedstat; the work the proxy does on the request path, which load does not inflate much).
"""
from __future__ import annotations

import os
import tempfile
import threading

import fastapi

from launch.benchmarks import common

_SESSIONS, _CALLS, _WARMUP_SESSIONS = 10, 20, 2
_BUDGET_MS = 2.0


def _stub_upstream(text: str, output_ids: list[int]) -> fastapi.FastAPI:
  app = fastapi.FastAPI()

  @app.post("/generate")
  async def generate(body: dict):
    n = len(body["input_ids"])
    return {"text": text, "output_ids": output_ids, "meta_info": {
      "id": "stub", "finish_reason": {"type": "stop", "matched": output_ids[-1]},
      "prompt_tokens": n, "completion_tokens": len(output_ids), "cached_tokens": 0,
      "weight_version": "0", "e2e_latency": 0.0,
      "output_token_logprobs": [[-0.1, t, None] for t in output_ids]}}

  return app


def run() -> list[common.Row]:
  import logging

  import httpx

  logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

  from orchard_jax.data import TrajectoryStore, tiny_tokenizer
  from orchard_jax.rollout import (
    BackgroundServer, RecordingProxy, SGLangClient, SGLangUpstream)

  tokenizer = tiny_tokenizer()
  turn = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
  output_ids = tokenizer.encode(turn) + [tokenizer.eos_id]
  tool = {"type": "function", "function": {
    "name": "bash", "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
  stub = _stub_upstream(turn, output_ids)
  direct_s, proxy_s, proxy_cpu_s = [], [], []
  with tempfile.TemporaryDirectory() as tmp, BackgroundServer(stub) as upstream_server, \
       TrajectoryStore(tmp) as store, \
       RecordingProxy(SGLangUpstream(upstream_server.url), tokenizer=tokenizer, store=store) \
       as proxy, SGLangClient(upstream_server.url) as direct, httpx.Client(timeout=60) as http:
    proxy_thread = _thread_id(f"uvicorn:{proxy.url.rsplit(':', 1)[1]}")
    for session in range(_WARMUP_SESSIONS + _SESSIONS):
      url = proxy.session_url(f"bench-{session}") + "/chat/completions"
      messages = [{"role": "system", "content": "You are an agent."},
                  {"role": "user", "content": "Fix the failing test in the repository.\n"}]
      for call in range(_CALLS):
        prompt = tokenizer.render_chat(messages, [tool])

        def direct_call():
          direct.generate(input_ids=prompt, sampling_params={"max_new_tokens": 64},
                          return_logprob=True)

        def proxy_call():
          response = http.post(url, json={"model": "m", "messages": messages, "tools": [tool],
                                           "max_tokens": 64})
          response.raise_for_status()
          proxy_call.message = response.json()["choices"][0]["message"]

        [d] = common.time_calls(direct_call, warmup=0, repeats=1)
        cpu = _cpu_s(proxy_thread)
        [p] = common.time_calls(proxy_call, warmup=0, repeats=1)
        cpu = _cpu_s(proxy_thread) - cpu
        if session >= _WARMUP_SESSIONS:
          direct_s.append(d)
          proxy_s.append(p)
          proxy_cpu_s.append(cpu)
        message = proxy_call.message
        messages.append(message)
        messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                         "content": f"total {call}\ndrwxr-xr-x  2 root root 4096 src\n"})
    proxy.flush()
    records = store.model_calls()
    reused = sum(1 for r in records if r.metadata.get("reused_prompt_ids"))
    assert len(records) == (_WARMUP_SESSIONS + _SESSIONS) * _CALLS, len(records)
    assert reused == (_WARMUP_SESSIONS + _SESSIONS) * (_CALLS - 1), reused

  def ms(values, q):
    return 1000 * common.percentile(values, q)

  rows = []
  for q in (50, 99):
    direct_ms, proxy_ms = ms(direct_s, q), ms(proxy_s, q)
    rows.append(common.Row(case=f"direct /generate to the upstream (floor), p{q}",
                           metric="ms", ours=direct_ms, higher_is_better=False))
    rows.append(common.Row(case=f"chat completion through the proxy, p{q}", metric="ms",
                           ours=proxy_ms, baseline=direct_ms, baseline_name="direct call",
                           higher_is_better=False))
    rows.append(common.Row(
      case=f"added by the proxy per call, p{q} ({_SESSIONS}x{_CALLS} agent calls)",
      metric="ms", ours=max(proxy_ms - direct_ms, 1e-6),
      baseline=_BUDGET_MS if q == 50 else None, baseline_name="2 ms budget" if q == 50 else "",
      higher_is_better=False, target=1.0 if q == 50 else None))
  if proxy_thread is not None:
    rows.append(common.Row(case="proxy server thread on-CPU time per call, p50", metric="ms",
                           ours=ms(proxy_cpu_s, 50), higher_is_better=False))
  return rows


def _thread_id(name: str):
  for thread in threading.enumerate():
    if thread.name == name and os.path.exists(f"/proc/self/task/{thread.native_id}/schedstat"):
      return thread.native_id
  return None


def _cpu_s(tid) -> float:
  """On-CPU seconds of thread `tid` so far (0.0 where /proc has no schedstat)."""
  if tid is None:
    return 0.0
  with open(f"/proc/self/task/{tid}/schedstat") as f:
    return int(f.read().split()[0]) / 1e9
