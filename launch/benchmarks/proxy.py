"""`--suite proxy`: latency the recording proxy adds to each model call.

An upstream that answers SGLang's `/generate` instantly with a fixed tool-calling turn (a stub,
so the engine's own time does not drown the proxy's) runs in its own process; the recording
proxy in front of it runs in a second process (its writer thread appends every call to a
trajectory store on disk), and the benchmark's client in this one, so that no two of them
share a GIL. One keep-alive `httpx.Client` makes every call, two ways, interleaved (the order
alternates call by call, so drift and warm-up effects fall on both alike):
  direct:    the `/generate` request the proxy itself sends (the same input_ids, sampling
             params and return_logprob), straight to the upstream (the floor);
  via proxy: a model call to the proxy's session URL on one of its wires, which maps the
             request onto chat messages, extends the session's recorded ids, calls the same
             upstream, parses the tool call, answers in the wire's shape and records the call.
Each wire is measured on its own: OpenAI chat completions, the OpenAI Responses API and the
Anthropic Messages API, each unstreamed and streamed (a streamed call is timed to its last
event, against the direct streamed `/generate`). Sessions are agent-like: 20 calls each, every
call adding the returned assistant turn and a tool result to the history in the wire's own
items; the first sessions are warm-up and not counted.

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

_SESSIONS, _CALLS, _WARMUP_SESSIONS = 12, 20, 2
_WIRES = (("chat_completions", False), ("responses", False), ("messages", False),
          ("chat_completions", True), ("responses", True), ("messages", True))
_MAX_TOKENS = 64
_BUDGET_MS = 2.0
_TURN = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
_TOOL = {"type": "function", "function": {
  "name": "bash", "description": "Run a command",
  "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def _stub_upstream(text: str, output_ids: list[int]):
  import fastapi

  app = fastapi.FastAPI()

  from fastapi.responses import StreamingResponse

  @app.post("/generate")
  async def generate(body: dict):
    n = len(body["input_ids"])
    result = {"text": text, "output_ids": output_ids, "meta_info": {
      "id": "stub", "finish_reason": {"type": "stop", "matched": output_ids[-1]},
      "prompt_tokens": n, "completion_tokens": len(output_ids), "cached_tokens": 0,
      "weight_version": "0", "e2e_latency": 0.0,
      "output_token_logprobs": [[-0.1, t, None] for t in output_ids]}}
    if not body.get("stream"):
      return result
    import json

    async def events():   # SGLang's stream: a partial result, the finished one, [DONE]
      half = len(output_ids) // 2
      partial = {**result, "text": "", "output_ids": output_ids[:half],
                 "meta_info": {**result["meta_info"], "finish_reason": None,
                               "output_token_logprobs": [[-0.1, t, None]
                                                         for t in output_ids[:half]]}}
      yield f"data: {json.dumps(partial)}\n\n"
      yield f"data: {json.dumps(result)}\n\n"
      yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")

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


class _Session:
  """One agent-like session on one wire: the request body of the next call, and the history
  extended with each answer (the assistant turn as the wire returns it, then a tool result)."""

  def __init__(self, wire: str, stream: bool):
    self.wire, self.stream = wire, stream
    self.items: list = [{"role": "user", "content": "Fix the failing test in the repository.\n"}]
    self.system = "You are an agent."

  def body(self) -> dict:
    fn = _TOOL["function"]
    if self.wire == "chat_completions":
      return {"model": "m", "messages": [{"role": "system", "content": self.system}, *self.items],
              "tools": [_TOOL], "max_tokens": _MAX_TOKENS, "stream": self.stream}
    if self.wire == "responses":
      return {"model": "m", "instructions": self.system, "input": self.items, "store": False,
              "tools": [{"type": "function", "name": fn["name"], "description": fn["description"],
                         "parameters": fn["parameters"]}],
              "max_output_tokens": _MAX_TOKENS, "stream": self.stream}
    return {"model": "m", "system": self.system, "messages": self.items,
            "tools": [{"name": fn["name"], "description": fn["description"],
                       "input_schema": fn["parameters"]}],
            "max_tokens": _MAX_TOKENS, "stream": self.stream}

  def answer(self, response, call: int) -> None:
    """Reads the answer and extends the history (checks the tool call came back)."""
    import json

    output = f"total {call}\ndrwxr-xr-x  2 root root 4096 src\n"
    if self.wire == "chat_completions":
      if self.stream:
        chunks = [json.loads(line[6:]) for line in response.text.split("\n\n")
                  if line.startswith("data: {")]
        calls = [c for chunk in chunks for d in chunk["choices"] if d["delta"].get("tool_calls")
                 for c in d["delta"]["tool_calls"]]
        message = {"role": "assistant", "content": None, "tool_calls": [
          {"id": c["id"], "type": "function", "function": c["function"]} for c in calls]}
      else:
        message = response.json()["choices"][0]["message"]
      self.items += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                               "content": output}]
    elif self.wire == "responses":
      body = (_last_event(response.text, "response.completed")["response"] if self.stream
              else response.json())
      [fc] = [o for o in body["output"] if o["type"] == "function_call"]
      self.items += [*body["output"], {"type": "function_call_output", "call_id": fc["call_id"],
                                       "output": output}]
    else:
      if self.stream:
        blocks = [e["content_block"] for e in _events(response.text, "content_block_start")]
        partial = "".join(e["delta"].get("partial_json", "")
                          for e in _events(response.text, "content_block_delta"))
        for block in blocks:
          if block["type"] == "tool_use":
            block["input"] = json.loads(partial)
        content = blocks
      else:
        content = response.json()["content"]
      [use] = [b for b in content if b["type"] == "tool_use"]
      self.items += [{"role": "assistant", "content": content},
                     {"role": "user", "content": [{"type": "tool_result",
                                                   "tool_use_id": use["id"], "content": output}]}]


def _events(text: str, kind: str) -> list:
  import json
  out = []
  for block in text.split("\n\n"):
    lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
    if lines.get("event") == kind:
      out.append(json.loads(lines["data"]))
  return out


def _last_event(text: str, kind: str) -> dict:
  return _events(text, kind)[-1]


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

  results = {}
  with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=60) as http:
    try:
      _, _, upstream_url = start(_serve_upstream)
      proxy_process, proxy_conn, (proxy_url, loop_tid) = start(_serve_proxy, upstream_url, tmp)
      loop_stat = f"/proc/{proxy_process.pid}/task/{loop_tid}/schedstat"
      for wire, stream in _WIRES:
        direct_s, proxy_s, added_s, loop_cpu_s = [], [], [], []
        path = {"chat_completions": "chat/completions"}.get(wire, wire)
        for session_index in range(_WARMUP_SESSIONS + _SESSIONS):
          session = _Session(wire, stream)
          url = f"{proxy_url}/sessions/bench-{wire}-{stream}-{session_index}/v1/{path}"
          for call in range(_CALLS):
            prompt = tokenizer.render_chat(_chat_history(session), [_TOOL])
            direct_body = {"input_ids": prompt, "return_logprob": True, "stream": stream,
                           "sampling_params": {"max_new_tokens": _MAX_TOKENS}}
            proxy_body = session.body()

            def direct_call():
              response = http.post(f"{upstream_url}/generate", json=direct_body)
              response.raise_for_status()
              response.text if stream else response.json()

            def proxy_call():
              response = http.post(url, json=proxy_body)
              response.raise_for_status()
              proxy_call.response = response

            if call % 2:
              [d] = common.time_calls(direct_call, warmup=0, repeats=1)
            cpu = _thread_cpu_s(loop_stat)
            [p] = common.time_calls(proxy_call, warmup=0, repeats=1)
            proxy_cpu = _thread_cpu_s(loop_stat) - cpu
            if not call % 2:
              [d] = common.time_calls(direct_call, warmup=0, repeats=1)
            if session_index >= _WARMUP_SESSIONS:
              direct_s.append(d)
              proxy_s.append(p)
              added_s.append(p - d)
              loop_cpu_s.append(proxy_cpu)
            session.answer(proxy_call.response, call)
        results[(wire, stream)] = (direct_s, proxy_s, added_s, loop_cpu_s)
      time.sleep(0.2)  # let the writer thread finish the last records
      proxy_conn.send("records")
      records, reused = proxy_conn.recv()
    finally:
      for process, conn in reversed(children):
        if process.is_alive():
          conn.send("exit")
          process.join(30)
  sessions = (_WARMUP_SESSIONS + _SESSIONS) * len(_WIRES)
  assert records == sessions * _CALLS, (records, sessions * _CALLS)
  assert reused == sessions * (_CALLS - 1), reused   # every call extended the recorded ids

  def ms(values, q):
    return 1000 * common.percentile(values, q)

  rows = []
  for (wire, stream), (direct_s, proxy_s, added_s, loop_cpu_s) in results.items():
    name = f"{wire}{' streamed' if stream else ''}"
    rows.append(common.Row(case=f"{name}: direct /generate (floor), p50", metric="ms",
                           ours=ms(direct_s, 50), higher_is_better=False))
    rows.append(common.Row(case=f"{name}: through the proxy, p50", metric="ms",
                           ours=ms(proxy_s, 50), baseline=ms(direct_s, 50),
                           baseline_name="direct call", higher_is_better=False))
    for q in (50, 99):
      rows.append(common.Row(
        case=f"{name}: added by the proxy per call (paired), p{q} ({_SESSIONS}x{_CALLS} calls)",
        metric="ms", ours=max(ms(added_s, q), 1e-6),
        baseline=_BUDGET_MS if q == 50 else None,
        baseline_name="2 ms budget" if q == 50 else "", higher_is_better=False,
        target=1.0 if q == 50 else None))
    rows.append(common.Row(case=f"{name}: proxy event-loop on-CPU time per call, p50",
                           metric="ms", ours=ms(loop_cpu_s, 50), higher_is_better=False))
  return rows


def _chat_history(session: "_Session") -> list:
  """The chat messages of a session's next call (what the direct call's prompt renders)."""
  from orchard_jax.rollout.wires.registry import WIRES
  request, _ = WIRES[{"chat_completions": "chat/completions"}.get(session.wire, session.wire)
                     ].parse(__import__("json").dumps(session.body()).encode())
  from orchard_jax.rollout.openai_chat import template_messages
  return template_messages(request.messages)


def _thread_cpu_s(schedstat: str) -> float:
  """On-CPU seconds of one thread so far, from its /proc schedstat file."""
  with open(schedstat) as f:
    return int(f.read().split()[0]) / 1e9


def _process_cpu_s(pid: int) -> float:
  """User + system CPU seconds of process `pid` so far, all its threads (clock-tick units)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
