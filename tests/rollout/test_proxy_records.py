"""The proxy's records are what happened: a caller that disconnects aborts its engine request and
its call is recorded as undelivered (never trained on, the session continues from the last
delivered call); a refused call moves no counter; a turn is closed only by the end-of-turn
token the chat template closes turns with."""
import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from orchard_jax.data import TrajectoryStore, sequences_from_model_calls
from orchard_jax.rollout import InferenceServer, RecordingProxy, SGLangUpstream
from orchard_jax.rollout.proxy import _WireFastPath


@pytest.fixture
def stack(engine, tokenizer, tmp_path):
  with InferenceServer(engine) as server, TrajectoryStore(tmp_path / "store") as store:
    with RecordingProxy(SGLangUpstream(server.url, max_retries=0), tokenizer=tokenizer,
                        store=store, freeze_gc=False) as proxy:
      yield proxy, store


def _client(proxy, session):
  return openai.OpenAI(base_url=proxy.session_url(session), api_key="none", max_retries=0)


def _wait(predicate, what, timeout_s=120.0):
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.02)


MESSAGES = [{"role": "system", "content": "Answer briefly.\n"},
            {"role": "user", "content": "Count to a thousand.\n"}]


def test_disconnect_aborts_the_engine_request_and_marks_the_call(stack, engine):
  proxy, store = stack
  aborted_before = engine.num_requests_aborted
  served_before = engine.num_requests_served
  body = json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 900, "temperature": 0,
                     "ignore_eos": True}).encode()
  path = proxy.session_url("gone-1").split(proxy.url)[1] + "/chat/completions"
  with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))) as sock:
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    _wait(lambda: engine.model_info()["running_requests"] > 0, "the request to start decoding")
  # The caller is gone: the proxy closes its upstream request and the engine ends it early.
  _wait(lambda: engine.num_requests_aborted > aborted_before, "the engine to abort the request")
  assert engine.model_info()["running_requests"] == 0
  # The caller retries the same call; the session goes on as if the first never happened.
  retry = _client(proxy, "gone-1").chat.completions.create(
    model="m", messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
  assert retry.usage.completion_tokens == 4
  proxy.end_session("gone-1")
  first, second = store.model_calls("gone-1")
  assert (first.call_index, first.delivered, first.finish_reason) == (0, False, "abort")
  assert first.output_ids == [] and "disconnected" in first.metadata["undelivered"]
  assert (second.call_index, second.delivered) == (1, True)
  assert first.segment_index == second.segment_index == 0
  assert first.prompt_ids == second.prompt_ids
  [sequence] = sequences_from_model_calls([first, second], mode="rl")
  assert sequence.call_indices == (1,) and sequence.num_loss_tokens == 4
  assert set(sequence.action_ids[sequence.loss_weights > 0]) == {0}   # the harness's turn 0
  assert engine.num_requests_served >= served_before + 2


def test_streamed_call_cut_by_the_caller_is_aborted_and_recorded_with_its_output(stack, engine):
  proxy, store = stack
  aborted_before = engine.num_requests_aborted
  body = json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 900, "temperature": 0,
                     "ignore_eos": True, "stream": True}).encode()
  path = "/sessions/stream-gone/v1/chat/completions"
  with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))) as sock:
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while received.count(b"data: ") < 3:   # the role chunk and some content deltas
      received += sock.recv(65536)
  _wait(lambda: engine.num_requests_aborted > aborted_before, "the engine to abort the stream")
  # The same call streamed to the end is delivered and continues the same segment.
  chunks = list(_client(proxy, "stream-gone").chat.completions.create(
    model="m", messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
    extra_body={"ignore_eos": True}))
  assert chunks[-1].choices[0].finish_reason == "length"
  proxy.end_session("stream-gone")
  cut, done = store.model_calls("stream-gone")
  assert (cut.delivered, cut.finish_reason, cut.response) == (False, "abort", None)
  assert 0 < len(cut.output_ids) < 900 and len(cut.output_logprobs) == len(cut.output_ids)
  assert (done.delivered, done.call_index, done.segment_index) == (True, 1, 0)
  assert done.output_ids == cut.output_ids[:5]     # greedy: the same first tokens
  [sequence] = sequences_from_model_calls([cut, done], mode="rl")
  assert sequence.call_indices == (1,)


def _asgi_call(app, path, body, *, leave_during_send):
  """Drive the proxy's ASGI app in memory; the client leaves while the response is written
  when leave_during_send (the server notices it during a write, as with a full socket)."""
  async def run():
    gone = asyncio.Event()
    sent = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
      if chunks:
        return chunks.pop(0)
      await gone.wait()
      return {"type": "http.disconnect"}

    async def send(message):
      sent.append(message)
      if leave_during_send and message["type"] == "http.response.start":
        gone.set()
        await asyncio.sleep(0)     # the write waits; the disconnect is reported meanwhile
    scope = {"type": "http", "method": "POST", "path": path, "headers": [
      (b"content-type", b"application/json")], "query_string": b""}
    await app(scope, receive, send)
    await app.proxy.upstream.aclose()
    return sent
  return asyncio.run(run())


def test_answer_lost_while_sent_is_recorded_undelivered(stack, tokenizer):
  proxy, store = stack
  path = "/sessions/lost-1/v1/chat/completions"
  body = json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 6, "temperature": 0,
                     "ignore_eos": True}).encode()
  sent = _asgi_call(_WireFastPath(proxy, proxy.app), path, body, leave_during_send=True)
  assert sent[0]["status"] == 200
  # The harness never saw that answer; it asks again and gets one.
  retry = _client(proxy, "lost-1").chat.completions.create(
    model="m", messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
  proxy.end_session("lost-1")
  lost, kept = store.model_calls("lost-1")
  assert not lost.delivered and len(lost.output_ids) == 6 and lost.response is not None
  assert kept.delivered and kept.call_index == 1 and kept.segment_index == 0
  # Not the lost answer's ids extended: the retry's prompt is the chat rendered afresh.
  assert kept.prompt_ids == tokenizer.render_chat(MESSAGES, None)
  assert kept.response["content"] == retry.choices[0].message.content
  sequences = sequences_from_model_calls([lost, kept], mode="rl")
  assert [s.call_indices for s in sequences] == [(1,)]


def test_delivered_in_memory_answer_is_committed(stack):
  proxy, store = stack
  body = json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 3, "temperature": 0,
                     "ignore_eos": True}).encode()
  sent = _asgi_call(_WireFastPath(proxy, proxy.app), "/sessions/kept-1/v1/chat/completions",
                    body, leave_during_send=False)
  assert sent[0]["status"] == 200 and json.loads(sent[1]["body"])["usage"]["completion_tokens"] == 3
  proxy.end_session("kept-1")
  [record] = store.model_calls("kept-1")
  assert record.delivered and "undelivered" not in record.metadata


def test_refused_calls_move_no_counter(stack, engine):
  proxy, store = stack
  client = _client(proxy, "refused-1")
  first = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4,
                                         temperature=0, extra_body={"ignore_eos": True})
  other = [{"role": "user", "content": "Something else.\n"}]
  vocab = engine.model_config.vocab_size
  for _ in range(2):   # refused by the engine: a stop id beyond the vocabulary
    with pytest.raises(openai.BadRequestError, match="stop_token_ids"):
      client.chat.completions.create(model="m", messages=other, max_tokens=4,
                                     extra_body={"stop_token_ids": [vocab + 5]})
  with pytest.raises(openai.BadRequestError):   # refused by the proxy itself
    client.chat.completions.create(model="m", messages=other + [{"role": "user", "content": 7}])
  second = client.chat.completions.create(model="m", messages=other, max_tokens=4,
                                          temperature=0, extra_body={"ignore_eos": True})
  assert first.usage.completion_tokens == second.usage.completion_tokens == 4
  proxy.end_session("refused-1")
  records = store.model_calls("refused-1")
  assert [(r.call_index, r.segment_index) for r in records] == [(0, 0), (1, 1)]


def test_turn_cut_by_another_stop_id_is_closed_by_the_template(stack, tokenizer):
  proxy, store = stack
  client = _client(proxy, "free-run")
  probe = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12,
                                         temperature=0, extra_body={"ignore_eos": True})
  proxy.end_session("free-run")
  [free] = store.model_calls("free-run")
  assert probe.usage.completion_tokens == 12
  # A caller's stop id that the greedy turn samples, not the end-of-turn token.
  position = next(i for i, t in enumerate(free.output_ids)
                  if i >= 1 and t not in free.output_ids[:i] and t not in tokenizer.stop_ids)
  stop_id = free.output_ids[position]
  client = _client(proxy, "stopped")
  reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12,
                                         temperature=0, extra_body={"stop_token_ids": [stop_id]})
  assert reply.choices[0].finish_reason == "stop"
  messages = MESSAGES + [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "Go on.\n"}]
  client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)
  proxy.end_session("stopped")
  cut, following = store.model_calls("stopped")
  assert cut.output_ids == free.output_ids[:position + 1]   # the stop id is kept, as sampled
  history = cut.prompt_ids + cut.output_ids
  assert following.segment_index == 0 and following.prompt_ids[:len(history)] == history
  # The end-of-turn token the template closes every assistant turn with comes next.
  assert following.prompt_ids[len(history)] == tokenizer.eos_id
  expected = tokenizer.render_continuation(messages, 3, None)
  assert following.prompt_ids[len(history) + 1:] == tokenizer.encode(expected)


@pytest.mark.parametrize("where", ["proxy", "engine"])
def test_malformed_chat_shapes_are_400_naming_the_field(stack, where):
  proxy, _ = stack
  url = (proxy.session_url("shapes") if where == "proxy"
         else proxy.upstream.client.urls[0] + "/v1") + "/chat/completions"
  user = {"role": "user", "content": "hi"}

  def assistant(calls):
    return {"role": "assistant", "content": None, "tool_calls": calls}

  cases = [
    ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content: expected a string"),
    ([{"role": "user", "content": 42}], "messages[0].content: expected a string"),
    ([{"role": "user", "content": None}], "messages[0].content: expected a string"),
    ([user, assistant(["bash"])], "messages[1].tool_calls[0]: expected a tool call object"),
    ([user, assistant([{"type": "function", "function": "bash"}])],
     "messages[1].tool_calls[0].function: expected an object"),
    ([user, assistant([{"function": {"name": "", "arguments": "{}"}}])],
     "messages[1].tool_calls[0].function.name: expected a non-empty string"),
    ([user, assistant([{"function": {"name": "bash", "arguments": 5}}])],
     "messages[1].tool_calls[0].function.arguments"),
    ([user, assistant({"function": {"name": "bash"}})],
     "messages[1].tool_calls: expected a list"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}],
     "messages[0].content[0].text: expected a string"),
    ([{"role": "user", "content": [7]}], "messages[0].content[0]: expected a content part"),
    ([{"role": "tool", "content": "x", "tool_call_id": 12}],
     "messages[0].tool_call_id: expected a string"),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "only assistant messages"),
  ]
  with httpx.Client(timeout=120) as http:   # one keep-alive connection for all requests
    for messages, expected in cases:
      response = http.post(url, json={"model": "m", "messages": messages, "max_tokens": 2})
      assert response.status_code == 400, (messages, response.text)
      error = response.json()
      assert error["object"] == "error" and expected in error["message"], error["message"]
    bad_tool = http.post(url, json={"model": "m", "messages": [user], "tool_choice": {
      "type": "function", "function": {"name": "nope"}}})
    assert bad_tool.status_code == 400 and "tool_choice" in bad_tool.json()["message"]
    ok = http.post(url, json={"model": "m", "messages": [user], "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_malformed_call_reaches_the_harness_as_text_and_the_record_as_an_error(agent_engine,
                                                                              stack):
  """The trained agent's first call cut by a stop string before its closing tag: the harness
  gets the text it wrote (no tool call), and the record names the format error."""
  from agent_fixture import BASH_TOOL, SYSTEM, TASK

  proxy, store = stack
  client = _client(proxy, "cut-call")
  messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
  reply = client.chat.completions.create(model="m", messages=messages, tools=[BASH_TOOL],
                                         temperature=0, max_tokens=64, stop=["}}"])
  message = reply.choices[0].message
  assert message.tool_calls is None
  assert message.content.startswith("<tool_call>") and '"echo one"' in message.content
  proxy.end_session("cut-call")
  [record] = store.model_calls("cut-call")
  assert [e["kind"] for e in record.metadata["format_errors"]] == ["unterminated"]
  assert record.response["content"] == message.content
