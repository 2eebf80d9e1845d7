"""The recording proxy: recorded ids are the sampled ids, prompts extend the recorded history
(docs/cases.md 1 and 2), divergent histories start a new segment, text-only upstreams."""
import json

import fastapi
import openai
import pytest
from hypothesis import given, settings, strategies as st

from agent_fixture import BASH_TOOL, COMMANDS, OUTPUTS, SYSTEM, TASK
from orchard_jax.data import TextOnlyRecordError, TrajectoryStore, sequences_from_model_calls
from orchard_jax.rollout import (
  BackgroundServer, InferenceServer, OpenAIUpstream, RecordingProxy, SGLangUpstream,
  new_session_id)


class _CapturingUpstream(SGLangUpstream):
  """The real engine upstream, also keeping each response as the engine returned it (the
  reference the records are checked against)."""

  def __init__(self, url):
    super().__init__(url)
    self.responses = []

  async def generate(self, prompt_ids, params, **kwargs):
    out = await super().generate(prompt_ids, params, **kwargs)
    self.responses.append((list(prompt_ids), out))
    return out

  async def generate_stream(self, prompt_ids, params, **kwargs):
    async for out in super().generate_stream(prompt_ids, params, **kwargs):
      if out.meta_info.finish_reason is not None:
        self.responses.append((list(prompt_ids), out))
      yield out


@pytest.fixture
def stack(engine, tokenizer, tmp_path):
  with InferenceServer(engine) as server, TrajectoryStore(tmp_path / "store") as store:
    upstream = _CapturingUpstream(server.url)
    with RecordingProxy(upstream, tokenizer=tokenizer, store=store,
                        served_model_name="tiny-policy") as proxy:
      yield proxy, store, upstream


def _client(proxy, session):
  return openai.OpenAI(base_url=proxy.session_url(session), api_key="none", max_retries=0)


def _assert_records_are_the_sampled_ids(proxy, store, upstream, session):
  proxy.end_session(session)  # records are appended right after each response; wait for them
  records = store.model_calls(session)
  assert len(records) == len(upstream.responses)
  for record, (prompt, out) in zip(records, upstream.responses):
    assert record.prompt_ids == prompt
    assert record.output_ids == out.output_ids
    assert record.output_logprobs == out.output_logprobs
  return records


def test_agent_session_with_tool_calls_records_sampled_ids(agent_engine, stack, tokenizer):
  proxy, store, upstream = stack
  client = _client(proxy, "agent-1")
  messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
  for i, command in enumerate(COMMANDS):
    response = client.chat.completions.create(model="tiny-policy", messages=messages,
                                              tools=[BASH_TOOL], temperature=0, max_tokens=64)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {
      "command": command}
    messages.append(choice.message.model_dump(exclude_none=True))
    if i < len(OUTPUTS):  # tool results end with a newline (docs/cases.md 1)
      messages.append({"role": "tool", "tool_call_id": call.id, "content": OUTPUTS[i]})
  records = _assert_records_are_the_sampled_ids(proxy, store, upstream, "agent-1")
  assert [r.call_index for r in records] == [0, 1, 2]
  assert [r.segment_index for r in records] == [0, 0, 0]
  for previous, record in zip(records, records[1:]):
    history = previous.prompt_ids + previous.output_ids
    assert record.prompt_ids[:len(history)] == history  # extended, never re-rendered
    assert record.metadata["reused_prompt_ids"] == len(history)
  assert all(r.output_ids[-1] == tokenizer.eos_id for r in records)
  assert records[0].prompt_ids == tokenizer.render_chat(messages[:2], [BASH_TOOL])
  assert records[2].response["tool_calls"][0]["function"]["name"] == "bash"
  assert records[2].finish_reason == "tool_calls" and records[2].policy_version is None
  assert records[1].messages[-1] == {"role": "tool", "tool_call_id": messages[3]["tool_call_id"],
                                     "content": "one\n"}
  # The RL path joins the session into one sequence whose sampled tokens carry the recorded
  # log-probs.
  [sequence] = sequences_from_model_calls(records, mode="rl")
  assert list(sequence.input_ids) == records[2].prompt_ids + records[2].output_ids
  assert sequence.num_loss_tokens == sum(len(r.output_ids) for r in records)


def test_random_policy_session_never_retokenises(stack, tokenizer):
  """With a random policy at temperature 1 the sampled ids are arbitrary: decoding then
  re-encoding them, or re-rendering the history, gives other ids (docs/cases.md 1 and 2); the records
  keep the ids as sampled."""
  proxy, store, upstream = stack
  client = _client(proxy, "random-1")
  messages = [{"role": "system", "content": "Answer briefly.\n"},
              {"role": "user", "content": "First question?\n"}]
  for turn in range(3):
    response = client.chat.completions.create(model="tiny-policy", messages=messages,
                                              temperature=1.0, seed=turn, max_tokens=24,
                                              logprobs=True)
    message = response.choices[0].message
    assert len(response.choices[0].logprobs.content) == response.usage.completion_tokens
    messages.append({"role": "assistant", "content": message.content})
    messages.append({"role": "user", "content": f"Output of step {turn}:\nok\n"})
  records = _assert_records_are_the_sampled_ids(proxy, store, upstream, "random-1")
  assert [r.segment_index for r in records] == [0, 0, 0]
  reencoded_differs = [tokenizer.encode(tokenizer.decode(r.output_ids)) != r.output_ids
                       for r in records]
  assert any(reencoded_differs), "no sampled sequence changed under decode/encode"
  # Re-templating the recorded history (what a naive proxy does) changes the ids.
  last = records[-1]
  naive = tokenizer.render_chat(messages[:5], None, add_generation_prompt=False)
  history = records[-2].prompt_ids + records[-2].output_ids
  assert naive[:len(history)] != history
  for previous, record in zip(records, records[1:]):
    history = previous.prompt_ids + previous.output_ids
    assert record.prompt_ids[:len(history)] == history
  assert last.metadata["timing_s"]["total"] >= last.metadata["timing_s"]["upstream"]


def test_edited_history_starts_a_new_segment(stack, tokenizer):
  proxy, store, upstream = stack
  client = _client(proxy, "edit-1")
  messages = [{"role": "user", "content": "Step one.\n"}]
  reply = client.chat.completions.create(model="tiny-policy", messages=messages, max_tokens=8,
                                         temperature=0, extra_body={"ignore_eos": True})
  messages += [{"role": "assistant", "content": reply.choices[0].message.content},
               {"role": "user", "content": "Step two.\n"}]
  client.chat.completions.create(model="tiny-policy", messages=messages, max_tokens=8,
                                 temperature=0, extra_body={"ignore_eos": True})
  # The harness compacts its history: the first exchange is summarised away.
  compacted = [{"role": "user", "content": "Summary of earlier steps.\n"},
               {"role": "user", "content": "Step two.\n"}]
  third = client.chat.completions.create(model="tiny-policy", messages=compacted, max_tokens=8,
                                         temperature=0, extra_body={"ignore_eos": True})
  compacted += [{"role": "assistant", "content": third.choices[0].message.content},
                {"role": "user", "content": "Step three.\n"}]
  client.chat.completions.create(model="tiny-policy", messages=compacted, max_tokens=8,
                                 temperature=0, extra_body={"ignore_eos": True})
  # A retry of the same request reuses its recorded prompt.
  client.chat.completions.create(model="tiny-policy", messages=compacted, max_tokens=8,
                                 temperature=0, extra_body={"ignore_eos": True})
  records = _assert_records_are_the_sampled_ids(proxy, store, upstream, "edit-1")
  assert [r.segment_index for r in records] == [0, 0, 1, 1, 2]
  assert records[2].metadata["reused_prompt_ids"] == 0
  assert records[2].prompt_ids == tokenizer.render_chat(compacted[:2], None)
  history = records[2].prompt_ids + records[2].output_ids
  assert records[3].prompt_ids[:len(history)] == history
  assert records[4].prompt_ids == records[3].prompt_ids
  # Length-capped turns (no end-of-turn sampled) are closed by the template's <|im_end|>.
  assert records[1].prompt_ids[len(records[0].prompt_ids) + 8] == tokenizer.eos_id
  sequences = sequences_from_model_calls(records, mode="rl")
  assert [s.segment_index for s in sequences] == [0, 1, 2]


def _text_only_api():
  app = fastapi.FastAPI()
  app.state.requests = []

  @app.post("/v1/chat/completions")
  async def chat(request: fastapi.Request):
    body = await request.json()
    app.state.requests.append(body)
    n = len(body["messages"])
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
            "model": body["model"], "choices": [{
              "index": 0, "finish_reason": "stop",
              "message": {"role": "assistant", "content": f"Reply to {n} messages.\n"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

  return app


def test_text_only_upstream_records_messages_for_sft_not_rl(tokenizer, tmp_path, monkeypatch):
  monkeypatch.setenv("TEACHER_KEY", "secret")
  api = _text_only_api()
  with BackgroundServer(api) as teacher, TrajectoryStore(tmp_path / "store") as store:
    upstream = OpenAIUpstream(teacher.url + "/v1", "teacher-model", api_key_env="TEACHER_KEY")
    with RecordingProxy(upstream, tokenizer=tokenizer, store=store) as proxy:
      client = _client(proxy, "teacher-1")
      messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
      first = client.chat.completions.create(model="student", messages=messages, temperature=0.3)
      messages += [first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "user", "content": "Again\n"}]
      client.chat.completions.create(model="student", messages=messages, temperature=0.3)
    records = store.model_calls("teacher-1")
  assert first.choices[0].message.content == "Reply to 2 messages.\n"
  assert api.state.requests[0]["model"] == "teacher-model"
  assert api.state.requests[0]["temperature"] == 0.3
  assert [r.text_only for r in records] == [True, True]
  assert records[1].response["content"] == "Reply to 4 messages.\n"
  assert records[0].prompt_ids == [] and records[0].output_ids == []
  sft = sequences_from_model_calls(records, mode="sft", tokenizer=tokenizer)
  assert sft and all(not s.logprobs_known for s in sft)
  trained = tokenizer.decode([int(t) for t, w in zip(sft[-1].input_ids, sft[-1].loss_weights)
                              if w > 0])
  assert "Reply to 4 messages." in trained
  with pytest.raises(TextOnlyRecordError):
    sequences_from_model_calls(records, mode="rl")


def test_concurrent_sessions_are_recorded_independently(stack, tokenizer):
  """Sessions running at once share the engine's batch; each one's records extend only its
  own ids."""
  import threading

  proxy, store, upstream = stack
  errors = []

  def run(name):
    try:
      client = _client(proxy, name)
      messages = [{"role": "user", "content": f"Task {name}.\n"}]
      for turn in range(3):
        reply = client.chat.completions.create(model="tiny-policy", messages=messages,
                                               max_tokens=6, temperature=1.0, seed=turn)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": f"Observation {turn}\n"}]
    except Exception as e:  # noqa: BLE001 - reported below
      errors.append(e)

  names = [f"par-{i}" for i in range(3)]
  threads = [threading.Thread(target=run, args=(n,)) for n in names]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
  sampled = {tuple(prompt): out.output_ids for prompt, out in upstream.responses}
  for name in names:
    proxy.end_session(name)
    records = store.model_calls(name)
    assert [r.call_index for r in records] == [0, 1, 2]
    assert tokenizer.decode(records[0].prompt_ids).count(f"Task {name}.") == 1
    for previous, record in zip(records, records[1:]):
      history = previous.prompt_ids + previous.output_ids
      assert record.prompt_ids[:len(history)] == history
    for record in records:
      assert record.output_ids == sampled[tuple(record.prompt_ids)]


def test_invalid_requests_get_400_naming_the_field(tokenizer):
  # Validation happens before the upstream is called; nothing listens on the upstream's port.
  import httpx
  with RecordingProxy(SGLangUpstream("http://127.0.0.1:9", max_retries=0),
                      tokenizer=tokenizer, freeze_gc=False) as proxy, httpx.Client() as http:
    url = proxy.session_url("bad") + "/chat/completions"
    cases = [
      (json.dumps({"model": "m", "messages": []}), "messages: Value error, messages is empty"),
      (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}),
       "messages[0].role is 'wizard'"),
      (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "temperature": -1}), "temperature: Input should be greater than or equal"),
      ("{not json", "Invalid JSON"),
      # The chat template keeps text parts only: an image part or a tool without a function
      # schema used to be dropped silently and the call answered (found by a walkthrough).
      (json.dumps({"model": "m", "messages": [{"role": "user", "content": [
          {"type": "text", "text": "what is this?"},
          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
       "messages[0].content[1] has type 'image_url'; this model reads text only"),
      (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "function"}]}),
       "tools[0] is {'type': 'function'}; expected an OpenAI function tool"),
    ]
    for body, expected in cases:
      response = http.post(url, content=body, headers={"content-type": "application/json"})
      assert response.status_code == 400, response.text
      error = response.json()
      assert error["object"] == "error" and error["type"] == "BadRequestError"
      assert expected in error["message"], error["message"]
    assert "bad" not in proxy.sessions                 # nothing was recorded for the session


def _rewriting_tokenizer(tokenizer):
  import copy

  from orchard_jax.data import Tokenizer

  # Like Qwen3's official template: only the last assistant turn shows its reasoning, so a
  # turn's rendering changes once more turns follow.
  hf = copy.deepcopy(tokenizer.hf)
  hf.chat_template = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if loop.last -%}{{ '<think>\\n' ~ (m.reasoning_content or '') ~ '\\n</think>\\n\\n' }}"
    "{%- endif -%}{{ m.content ~ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' ~ m.content ~ '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")
  return Tokenizer(hf, name="rewriting")


@pytest.mark.parametrize("template", ["tiny", "history-rewriting"])
def test_prepared_continuation_equals_the_rendered_one(tokenizer, template):
  """The proxy renders the returned turn after answering (`PromptBuilder.prepare`) so the next
  call renders once; the text it appends must be what the chat template gives."""
  from orchard_jax.rollout.proxy import PromptBuilder, _Checkpoint

  tok = tokenizer if template == "tiny" else _rewriting_tokenizer(tokenizer)
  builder = PromptBuilder(tok)
  tools = [BASH_TOOL] if template == "tiny" else None
  call = {"id": "call_1", "type": "function",
          "function": {"name": "bash", "arguments": json.dumps({"command": "ls\n"})}}
  chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK},
          {"role": "assistant", "content": "Looking.\n", "reasoning_content": "think",
           "tool_calls": [call] if tools else None},
          {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py\n"},
          {"role": "user", "content": "Go on.\n"}]
  chat = [{k: v for k, v in m.items() if v is not None} for m in chat]
  eos = tok.id_to_token(tok.eos_id)
  if template == "tiny":   # prefix-stable: the whole chat's text after the recorded turn's
    recorded = tok.render_chat_text(chat[:3], tools, add_generation_prompt=False)
    expected = tok.render_chat_text(chat, tools)[recorded.rfind(eos) + len(eos):]
  else:                    # the reasoning is gone once the turn is not the last
    expected = ("\n<|im_start|>user\n<tool_response>\na.py\nb.py\n\n</tool_response><|im_end|>"
                "\n<|im_start|>user\nGo on.\n<|im_end|>\n<|im_start|>assistant\n")
  checkpoint = _Checkpoint(key=(), ids=[], assistant=True, closed=True, call_index=0)
  builder.prepare(checkpoint, [chat[0], chat[2]], tools, {})
  assert checkpoint.prepared is not None and checkpoint.prepared[1].endswith(eos)
  assert builder._new_text(chat, 3, tools, {}, True, checkpoint.prepared) == expected
  assert builder._new_text(chat, 3, tools, {}, True) == expected     # unprepared: two renders
  assert builder._new_text(chat, 3, tools, {}, False, checkpoint.prepared) == eos + expected


def test_streamed_call_is_answered_and_recorded(stack):
  proxy, store, upstream = stack
  client = _client(proxy, "stream-1")
  messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
  chunks = list(client.chat.completions.create(model="tiny-policy", messages=messages,
                                               max_tokens=8, temperature=0, stream=True))
  text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  assert chunks[-1].choices[0].finish_reason in ("stop", "length")
  [record] = _assert_records_are_the_sampled_ids(proxy, store, upstream, "stream-1")
  assert (record.response.get("content") or "") == text



_JSON_VALUES = st.recursive(
  st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4),
  lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                              max_size=3),
  max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(a=_JSON_VALUES, b=_JSON_VALUES)
def test_context_key_is_equal_exactly_when_the_json_is(a, b):
  """Recorded ids are reused only within one context (tools and template arguments): the key
  of two contexts is equal exactly when their canonical JSON texts (the standard library's,
  sorted keys) are, whatever the values hold (null, NaN and infinities, integers past 64 bits,
  1 against 1.0 against true)."""
  from orchard_jax.rollout.proxy import _context_key

  def reference(tools, kwargs):
    return json.dumps([tools or [], kwargs], sort_keys=True, ensure_ascii=False)

  for tools_a, tools_b in (([a], [b]), ([{"x": a}], [{"x": b}])):
    same = reference(tools_a, {"k": a}) == reference(tools_b, {"k": b})
    assert (_context_key(tools_a, {"k": a}) == _context_key(tools_b, {"k": b})) == same


@settings(max_examples=20, deadline=None)
@given(prefix=st.text(st.characters(blacklist_characters="/", blacklist_categories=("Cs",)),
                      max_size=40))
def test_session_ids_end_with_128_random_bits(prefix):
  # The id is the session's only credential (any sandbox that reaches the proxy can call any
  # session it can name): its random tail must be unguessable, and two ids never repeat.
  a, b = new_session_id(prefix), new_session_id(prefix)
  assert a.startswith(prefix + "-") and a != b
  tail = a[len(prefix) + 1:]
  assert len(tail) == 32 and int(tail, 16) >= 0
  with pytest.raises(ValueError, match="/"):
    new_session_id(prefix + "/x")


def test_rollout_sessions_are_named_with_unguessable_ids():
  # The loop's rollout sessions put readable, guessable parts first (experiment, iteration,
  # task, attempt); what follows them is the 128-bit secret.
  from types import SimpleNamespace

  from orchard_jax.recipes.agentic.rollouts import RolloutRequest, RolloutRunner
  domain = SimpleNamespace(task_id=lambda task: "task-1", aborted_statuses=(),
                           truncated_statuses=(), submitted_statuses=())
  runner = RolloutRunner(domain, service=None, env=None, store=None, sampling={},
                         experiment="exp")
  request = RolloutRequest(task=object(), attempt=2, seed=None)
  ids = {runner.session_id(request, 3) for _ in range(50)}
  assert len(ids) == 50
  for session in ids:
    assert session.startswith("exp-3-task-1-a2-")
    assert len(session.rsplit("-", 1)[1]) == 32
