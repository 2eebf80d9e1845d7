"""`--suite proxy`: latency the recording proxy adds to each model call.

An upstream that answers SGLang's `/generate` instantly with a fixed tool-calling turn (a stub,
so the engine's own time does not drown the proxy's) runs in its own process; the recording
proxy in front of it runs in a second process (its writer thread appends every call to a
trajectory store on disk), and the benchmark's client in this one, so that no two of them
share a GIL. One keep-alive `httpx.Client` makes every call, two ways, interleaved (the order
alternates call by call, so drift and warm-up effects fall on both alike):
  direct:    the `/generate` request the proxy itself sends (the same input_ids, sampling
             params and return_logprob), straight to the upstream (the floor);
  via proxy: an OpenAI chat-completions request to the proxy's session URL, which renders the
             new messages, extends the session's recorded ids, calls the same upstream, parses
             the tool call, answers and records the call.
Sessions are agent-like: 20 calls each, every call adding the returned assistant turn and a
tool result to the history; the first sessions are warm-up and not counted.

Added latency is measured per call, as the proxied call's latency minus the direct call's made
next to it, and its p50 and p99 are percentiles of those paired differences (not differences of
percentiles, which can put p99 below p50). Wall-clock latencies are only meaningful on a quiet
machine; the suite also reports CPU time of the proxy process per call (Linux schedstat): of
its event-loop thread while serving the call (the request path), and of the whole process
(recording included), which load barely inflates.
"""
from __future__ import annotations

import multiprocessing
import os
import tempfile
import time

from launch.benchmarks import common

_SESSIONS, _CALLS, _WARMUP_SESSIONS = 20, 20, 3
_MAX_TOKENS = 64
_BUDGET_MS = 2.0
_TURN = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
_TOOL = {"type": "function", "function": {
  "name": "bash", "description": "Run a command",
  "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def _stub_upstream(text: str, output_ids: list[int]):
  import fastapi

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


def _serve_upstream(conn) -> None:
  """Child process: the stub upstream until the parent says exit."""
  from orchard_jax.data import tiny_tokenizer
  from orchard_jax.rollout import BackgroundServer

  tokenizer = tiny_tokenizer()
  output_ids = tokenizer.encode(_TURN) + [tokenizer.eos_id]
  with BackgroundServer(_stub_upstream(_TURN, output_ids)) as server:
    conn.send(server.url)
    conn.recv()


def _serve_proxy(conn, upstream_url: str, store_dir: str) -> None:
  """Child process: the recording proxy until the parent says exit; on "records", the number of
  calls in the store and of those that reused recorded prompt ids."""
  import threading

  from orchard_jax.data import TrajectoryStore, tiny_tokenizer
  from orchard_jax.rollout import RecordingProxy, SGLangUpstream

  with TrajectoryStore(store_dir) as store, RecordingProxy(
      SGLangUpstream(upstream_url), tokenizer=tiny_tokenizer(), store=store) as proxy:
    name = f"uvicorn:{proxy.url.rsplit(':', 1)[1]}"
    loop_tid = next(t.native_id for t in threading.enumerate() if t.name == name)
    conn.send((proxy.url, loop_tid))
    while conn.recv() == "records":
      proxy.flush()
      records = store.model_calls()
      conn.send((len(records), sum(1 for r in records if r.metadata.get("reused_prompt_ids"))))


def run() -> list[common.Row]:
  import logging

  import httpx

  from orchard_jax.data import tiny_tokenizer

  logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

  tokenizer = tiny_tokenizer()
  ctx = multiprocessing.get_context("spawn")
  children = []

  def start(target, *args):
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    children.append((process, parent))
    if not parent.poll(120):
      raise RuntimeError(f"{target.__name__} did not start within 120 s")
    return process, parent, parent.recv()

  direct_s, proxy_s, added_s, loop_cpu_s = [], [], [], []
  with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=60) as http:
    try:
      _, _, upstream_url = start(_serve_upstream)
      proxy_process, proxy_conn, (proxy_url, loop_tid) = start(_serve_proxy, upstream_url, tmp)
      loop_stat = f"/proc/{proxy_process.pid}/task/{loop_tid}/schedstat"
      for session in range(_WARMUP_SESSIONS + _SESSIONS):
        if session == _WARMUP_SESSIONS:
          process_cpu = _process_cpu_s(proxy_process.pid)
        url = f"{proxy_url}/sessions/bench-{session}/v1/chat/completions"
        messages = [{"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": "Fix the failing test in the repository.\n"}]
        for call in range(_CALLS):
          prompt = tokenizer.render_chat(messages, [_TOOL])
          direct_body = {"input_ids": prompt, "return_logprob": True,
                         "sampling_params": {"max_new_tokens": _MAX_TOKENS}}
          proxy_body = {"model": "m", "messages": messages, "tools": [_TOOL],
                        "max_tokens": _MAX_TOKENS}

          def direct_call():
            response = http.post(f"{upstream_url}/generate", json=direct_body)
            response.raise_for_status()
            response.json()

          def proxy_call():
            response = http.post(url, json=proxy_body)
            response.raise_for_status()
            proxy_call.message = response.json()["choices"][0]["message"]

          if call % 2:
            [d] = common.time_calls(direct_call, warmup=0, repeats=1)
          cpu = _thread_cpu_s(loop_stat)
          [p] = common.time_calls(proxy_call, warmup=0, repeats=1)
          proxy_cpu = _thread_cpu_s(loop_stat) - cpu
          if not call % 2:
            [d] = common.time_calls(direct_call, warmup=0, repeats=1)
          if session >= _WARMUP_SESSIONS:
            direct_s.append(d)
            proxy_s.append(p)
            added_s.append(p - d)
            loop_cpu_s.append(proxy_cpu)
          message = proxy_call.message
          messages.append(message)
          messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                           "content": f"total {call}\ndrwxr-xr-x  2 root root 4096 src\n"})
      time.sleep(0.2)  # let the writer thread finish the last records before reading CPU time
      process_cpu = _process_cpu_s(proxy_process.pid) - process_cpu
      proxy_conn.send("records")
      records, reused = proxy_conn.recv()
    finally:
      for process, conn in reversed(children):
        if process.is_alive():
          conn.send("exit")
          process.join(30)
  total = (_WARMUP_SESSIONS + _SESSIONS) * _CALLS
  assert records == total, (records, total)
  assert reused == (_WARMUP_SESSIONS + _SESSIONS) * (_CALLS - 1), reused

  def ms(values, q):
    return 1000 * common.percentile(values, q)

  n = len(added_s)
  rows = []
  for q in (50, 99):
    direct_ms, proxy_ms = ms(direct_s, q), ms(proxy_s, q)
    rows.append(common.Row(case=f"direct /generate to the upstream (floor), p{q}",
                           metric="ms", ours=direct_ms, higher_is_better=False))
    rows.append(common.Row(case=f"chat completion through the proxy, p{q}", metric="ms",
                           ours=proxy_ms, baseline=direct_ms, baseline_name="direct call",
                           higher_is_better=False))
  for q in (50, 99):
    rows.append(common.Row(
      case=f"added by the proxy per call (paired), p{q} ({_SESSIONS}x{_CALLS} agent calls)",
      metric="ms", ours=max(ms(added_s, q), 1e-6),
      baseline=_BUDGET_MS if q == 50 else None, baseline_name="2 ms budget" if q == 50 else "",
      higher_is_better=False, target=1.0 if q == 50 else None))
  rows.append(common.Row(case="proxy event-loop thread on-CPU time per call, p50", metric="ms",
                         ours=ms(loop_cpu_s, 50), higher_is_better=False))
  rows.append(common.Row(case="proxy process on-CPU time per call, mean (recording included)",
                         metric="ms", ours=1000 * process_cpu / n, higher_is_better=False))
  return rows


def _thread_cpu_s(schedstat: str) -> float:
  """On-CPU seconds of one thread so far, from its /proc schedstat file."""
  with open(schedstat) as f:
    return int(f.read().split()[0]) / 1e9


def _process_cpu_s(pid: int) -> float:
  """User + system CPU seconds of process `pid` so far, all its threads (clock-tick units)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
