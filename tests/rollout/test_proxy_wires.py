"""The proxy's Responses and Messages wires against the embedded engine, driven by the real
`openai` and `anthropic` Python clients, streamed and not.

The small policy trained on the bash-agent conversation (agent_fixture.py) answers the same
chat whatever the wire, since each wire maps onto the same chat messages and tools: three tool
calls, each after the previous call's output. Every call must be recorded with the ids as the
engine sampled them, and each prompt must extend the previous prompt plus its sampled ids.
The property-based tests send arbitrary Responses / Messages bodies: never a 500.
"""
import json

import anthropic
import httpx
import openai
import pytest
from agent_fixture import BASH_TOOL, COMMANDS, OUTPUTS, SYSTEM, TASK
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchard_jax.data import TrajectoryStore
from orchard_jax.rollout import InferenceServer, RecordingProxy, SGLangUpstream

RESPONSES_TOOL = {"type": "function", "name": "bash",
                  "description": BASH_TOOL["function"]["description"],
                  "parameters": BASH_TOOL["function"]["parameters"]}
MESSAGES_TOOL = {"name": "bash", "description": BASH_TOOL["function"]["description"],
                 "input_schema": BASH_TOOL["function"]["parameters"]}


class _CapturingUpstream(SGLangUpstream):
  """The real engine upstream, keeping each finished result as the engine returned it."""

  def __init__(self, url):
    super().__init__(url)
    self.responses = []

  async def generate(self, prompt_ids, params, **kwargs):
    out = await super().generate(prompt_ids, params, **kwargs)
    self.responses.append((list(prompt_ids), out))
    return out

  async def generate_stream(self, prompt_ids, params, **kwargs):
    steps = 0
    async for out in super().generate_stream(prompt_ids, params, **kwargs):
      steps += 1
      if out.meta_info.finish_reason is not None:
        self.responses.append((list(prompt_ids), out, steps))
      yield out


@pytest.fixture
def stack(engine, tokenizer, tmp_path):
  with InferenceServer(engine) as server, TrajectoryStore(tmp_path / "store") as store:
    upstream = _CapturingUpstream(server.url)
    with RecordingProxy(upstream, tokenizer=tokenizer, store=store,
                        served_model_name="tiny-policy") as proxy:
      yield proxy, store, upstream


def _check_records(proxy, store, upstream, session, wire, tokenizer):
  proxy.end_session(session)
  records = store.model_calls(session)
  assert len(records) == len(upstream.responses) == len(COMMANDS)
  for record, (prompt, out, *_) in zip(records, upstream.responses):
    assert record.prompt_ids == prompt
    assert record.output_ids == out.output_ids
    assert record.output_logprobs == out.output_logprobs
    assert record.metadata["wire"] == wire
  for previous, record in zip(records, records[1:]):
    history = previous.prompt_ids + previous.output_ids
    assert record.prompt_ids[:len(history)] == history
    assert record.metadata["reused_prompt_ids"] == len(history)
  assert [r.segment_index for r in records] == [0, 0, 0]
  assert all(r.output_ids[-1] == tokenizer.eos_id for r in records)
  # The same chat as the chat-completions wire: the first prompt is the template's rendering.
  first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
  assert records[0].prompt_ids == tokenizer.render_chat(first, [BASH_TOOL])
  return records


@pytest.mark.parametrize("stream", [False, True])
def test_responses_wire_agent_session(agent_engine, stack, tokenizer, stream):
  proxy, store, upstream = stack
  session = f"responses-{stream}"
  client = openai.OpenAI(base_url=proxy.session_url(session), api_key="none", max_retries=0)
  items = [{"role": "user", "content": TASK}]
  for i, command in enumerate(COMMANDS):
    kwargs = dict(model="tiny-policy", instructions=SYSTEM, input=items, tools=[RESPONSES_TOOL],
                  temperature=0, max_output_tokens=64, store=False)
    if stream:
      with client.responses.stream(**kwargs) as events:
        kinds = [event.type for event in events]
        response = events.get_final_response()
      assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
      assert "response.function_call_arguments.delta" in kinds
    else:
      response = client.responses.create(**kwargs)
    assert response.status == "completed"
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "bash" and json.loads(call.arguments) == {"command": command}
    items += [item.model_dump(exclude_none=True) for item in response.output]
    if i < len(OUTPUTS):
      items.append({"type": "function_call_output", "call_id": call.call_id,
                    "output": OUTPUTS[i]})
  records = _check_records(proxy, store, upstream, session, "responses", tokenizer)
  assert records[1].messages[-1]["role"] == "tool"
  assert response.usage.input_tokens == len(records[-1].prompt_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_wire_agent_session(agent_engine, stack, tokenizer, stream):
  proxy, store, upstream = stack
  session = f"messages-{stream}"
  base_url = proxy.session_url(session).removesuffix("/v1")
  client = anthropic.Anthropic(base_url=base_url, api_key="none", max_retries=0)
  messages = [{"role": "user", "content": TASK}]
  for i, command in enumerate(COMMANDS):
    # This anthropic client version has no temperature argument: sent as an extra field.
    kwargs = dict(model="tiny-policy", system=SYSTEM, messages=messages, tools=[MESSAGES_TOOL],
                  max_tokens=64, extra_body={"temperature": 0})
    if stream:
      with client.messages.stream(**kwargs) as events:
        kinds = [event.type for event in events]
        message = events.get_final_message()
      assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    else:
      message = client.messages.create(**kwargs)
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "bash" and call.input == {"command": command}
    messages.append({"role": "assistant",
                     "content": [block.model_dump(exclude_none=True) for block in message.content]})
    if i < len(OUTPUTS):
      messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": OUTPUTS[i]}]})
  records = _check_records(proxy, store, upstream, session, "messages", tokenizer)
  assert message.usage.input_tokens == len(records[-1].prompt_ids)


def test_stream_sends_text_as_it_is_generated(stack):
  """A streamed answer of many engine steps arrives as many deltas, the first before the
  last step (real streaming, not the finished turn cut into chunks)."""
  proxy, store, upstream = stack
  client = anthropic.Anthropic(base_url=proxy.session_url("live").removesuffix("/v1"),
                               api_key="none", max_retries=0)
  deltas = []
  with client.messages.stream(model="m", max_tokens=48, extra_body={"temperature": 1.0},
                              messages=[{"role": "user", "content": "Say a lot."}]) as events:
    for event in events:
      if event.type == "content_block_delta":
        deltas.append(event.delta)
    message = events.get_final_message()
  proxy.end_session("live")
  [(_, out, steps)] = upstream.responses
  assert steps > 2   # the engine decoded in several steps
  text = "".join(d.text for d in deltas if d.type == "text_delta")
  thinking = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
  assert len([d for d in deltas if d.type in ("text_delta", "thinking_delta")]) > 1
  assert text == "".join(b.text for b in message.content if b.type == "text")
  assert thinking == "".join(b.thinking for b in message.content if b.type == "thinking")
  [record] = store.model_calls("live")
  assert record.output_ids == out.output_ids and record.metadata["stream"] is True


def test_wire_errors_have_the_wire_shape(stack):
  proxy, _, _ = stack
  with httpx.Client(timeout=30) as http:
    bad = http.post(proxy.session_url("e") + "/messages",
                    json={"messages": [{"role": "user", "content": [{"type": "image"}]}]})
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert "image" in bad.json()["error"]["message"]
    bad = http.post(proxy.session_url("e") + "/responses",
                    json={"input": "x", "tools": [{"type": "web_search"}]})
    assert bad.status_code == 400 and "web_search" in bad.json()["error"]["message"]
    bad = http.post(proxy.session_url("e") + "/responses", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["message"]
    # A streamed call the engine refuses (prompt beyond max_seq_len) is an HTTP error too.
    long = {"role": "user", "content": "word " * 1500}
    for path, body in (("messages", {"messages": [long], "stream": True, "max_tokens": 4}),
                       ("responses", {"input": [long], "stream": True}),
                       ("chat/completions", {"messages": [long], "stream": True})):
      refused = http.post(f"{proxy.session_url('e')}/{path}", json=body)
      assert refused.status_code == 400, (path, refused.text[:300])
      assert "max_seq_len" in refused.text
    counted = http.post(proxy.session_url("e") + "/messages/count_tokens",
                        json={"messages": [{"role": "user", "content": "hello"}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


# ----------------------------------------------------------------------------- no 500s

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
_TEXT = st.text(max_size=12)


def _maybe(strategy):
  """Mostly `strategy`, sometimes null or any JSON (about one value in eight)."""
  return st.integers(0, 7).flatmap(lambda k: strategy if k else st.one_of(st.none(), _JSON))


_RESPONSES_PART = st.fixed_dictionaries(
  {"type": st.sampled_from(["input_text", "output_text", "input_image", "refusal", "x"])},
  optional={"text": _maybe(_TEXT), "refusal": _TEXT})
_RESPONSES_ITEM = st.one_of(
  st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer",
                                                  "tool", "x"])},
                        optional={"type": st.just("message"),
                                  "content": _maybe(st.one_of(_TEXT, st.lists(_RESPONSES_PART,
                                                                             max_size=3)))}),
  st.fixed_dictionaries({"type": st.just("function_call")},
                        optional={"name": _maybe(_TEXT), "arguments": _maybe(_TEXT),
                                  "call_id": _maybe(_TEXT)}),
  st.fixed_dictionaries({"type": st.just("function_call_output")},
                        optional={"call_id": _maybe(_TEXT), "output": _maybe(_TEXT)}),
  st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference", "compaction",
                                                  "local_shell_call"])},
                        optional={"content": _JSON, "summary": _JSON}))
_RESPONSES_BODY = st.fixed_dictionaries(
  {"input": _maybe(st.one_of(_TEXT, st.lists(_RESPONSES_ITEM, min_size=1, max_size=4)))},
  optional={"instructions": _maybe(_TEXT), "stream": st.booleans(),
            "tools": _maybe(st.lists(st.one_of(
              st.just(RESPONSES_TOOL), st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "web_search", "custom"])},
                optional={"name": _maybe(_TEXT), "parameters": _JSON})), max_size=2)),
            "tool_choice": _maybe(st.sampled_from(["auto", "none", "required"])),
            "max_output_tokens": _maybe(st.integers(-1, 3)),
            "temperature": _maybe(st.floats(-1, 3, allow_nan=False)),
            "top_p": _maybe(st.floats(-1, 2, allow_nan=False)),
            "previous_response_id": st.one_of(st.none(), _TEXT),
            "reasoning": _maybe(st.fixed_dictionaries({}, optional={"effort": st.sampled_from(
              ["none", "low", "high"]), "summary": st.sampled_from(["auto", "none"])})),
            "store": _maybe(st.booleans()),
            "top_logprobs": _maybe(st.integers(-1, 3))})

_MESSAGES_BLOCK = st.fixed_dictionaries(
  {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image",
                            "redacted_thinking", "x"])},
  optional={"text": _maybe(_TEXT), "id": _maybe(_TEXT), "name": _maybe(_TEXT),
            "input": _JSON, "tool_use_id": _maybe(_TEXT), "thinking": _maybe(_TEXT),
            "content": _maybe(st.one_of(_TEXT, st.lists(st.fixed_dictionaries(
              {"type": st.sampled_from(["text", "image"])}, optional={"text": _TEXT}),
              max_size=2))), "is_error": _JSON})
_MESSAGES_BODY = st.fixed_dictionaries(
  {"messages": _maybe(st.lists(st.one_of(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "user", "assistant", "system", "tool"]),
     "content": _maybe(st.one_of(_TEXT, _TEXT, st.lists(_MESSAGES_BLOCK, max_size=2)))})),
    min_size=1, max_size=4))},
  optional={"system": _maybe(st.one_of(_TEXT, st.lists(_MESSAGES_BLOCK, max_size=2))),
            "stream": st.booleans(), "max_tokens": _maybe(st.integers(1, 3)),
            "tools": _maybe(st.lists(st.one_of(st.just(MESSAGES_TOOL), st.fixed_dictionaries(
              {}, optional={"type": _maybe(st.sampled_from(["custom", "bash_20250124"])),
                            "name": _maybe(_TEXT), "input_schema": _JSON,
                            "defer_loading": st.booleans()})), max_size=2)),
            "tool_choice": _maybe(st.fixed_dictionaries({"type": st.sampled_from(
              ["auto", "any", "none", "tool"])}, optional={"name": _TEXT})),
            "thinking": _maybe(st.fixed_dictionaries({"type": st.sampled_from(
              ["enabled", "adaptive", "disabled"])})),
            "stop_sequences": _maybe(st.lists(_TEXT, max_size=2)),
            "temperature": _maybe(st.floats(0, 2, allow_nan=False)),
            "top_k": _maybe(st.integers(-1, 3)), "mcp_servers": _maybe(st.just([]))})


@pytest.fixture(scope="module")
def short_proxy(engine, tokenizer, tmp_path_factory):
  """A proxy that generates at most 2 tokens a call (the bodies are what is under test)."""
  with InferenceServer(engine) as server, \
       TrajectoryStore(tmp_path_factory.mktemp("store")) as store, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=tokenizer, store=store,
                      sampling_overrides={"max_new_tokens": 2}) as proxy:
    yield proxy


def _post_never_500(proxy, path, body, counter=[0]):
  counter[0] += 1
  session = f"prop-{counter[0] % 7}"   # sessions are reused: history matching runs too
  with httpx.Client(timeout=60) as http:
    response = http.post(f"{proxy.session_url(session)}/{path}", json=body)
  assert response.status_code in (200, 400), (response.status_code, response.text[:500])
  event(f"HTTP {response.status_code}")
  if response.status_code == 400:
    data = response.json()
    message = (data.get("error") or {}).get("message") if isinstance(data.get("error"), dict) \
        else data.get("message")
    assert message, data
  elif body.get("stream"):
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "error" not in response.text.split("\n\n")[-2][:30] or "response.failed" not in \
        response.text
  return response


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(body=_RESPONSES_BODY)
def test_responses_bodies_never_500(short_proxy, body):
  _post_never_500(short_proxy, "responses", body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(body=_MESSAGES_BODY)
def test_messages_bodies_never_500(short_proxy, body):
  _post_never_500(short_proxy, "messages", body)


_HUGE = 2**64          # one past what a 64-bit JSON integer holds
_USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, field", [
    ("chat/completions", {"messages": _USER, "max_tokens": _HUGE}, "max_new_tokens"),
    ("chat/completions", {"messages": _USER, "max_completion_tokens": _HUGE}, "max_new_tokens"),
    ("chat/completions", {"messages": _USER, "seed": _HUGE}, "sampling_seed"),
    ("chat/completions", {"messages": _USER, "seed": -2**63 - 1}, "sampling_seed"),
    ("chat/completions", {"messages": _USER, "top_k": _HUGE}, "top_k"),
    ("chat/completions", {"messages": _USER, "stop_token_ids": [_HUGE]}, "stop_token_ids"),
    ("responses", {"input": "hi", "max_output_tokens": _HUGE}, "max_new_tokens"),
    ("messages", {"messages": _USER, "max_tokens": _HUGE}, "max_new_tokens"),
])
def test_integers_beyond_64_bits_are_a_400_naming_the_field(short_proxy, path, body, field):
  """Every wire: an integer no 64-bit JSON integer holds is the caller's 400 naming the field
  (the proxy's upstream call could not encode it: each was a 500), and the session goes on."""
  session = "huge-ints"
  with httpx.Client(timeout=60) as http:
    response = http.post(f"{short_proxy.session_url(session)}/{path}",
                         json={"model": "m", **body})
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert field in response.text and "internal error" not in response.text
    fine = http.post(f"{short_proxy.session_url(session)}/chat/completions",
                     json={"model": "m", "messages": _USER, "seed": 2**64 - 1})
    assert fine.status_code == 200, fine.text[:300]           # an unsigned 64-bit seed fits
