"""The proxy's wire modules on their own: Responses / Messages requests mapped onto chat
requests, turns mapped back, and a turn's text split while it streams.

The reference for the mapping is written out by hand in each test (what OpenAI's and
Anthropic's API references say the items mean); the reference for the stream split is the
data room's tool-call parser run on the whole text.
"""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax.data import parse_assistant_text, split_reasoning
from orchard_jax.rollout.errors import RequestError
from orchard_jax.rollout.openai_protocol import (
  ChatChoice, ChatCompletionResponse, ChatMessageOut, ToolCallFunction, ToolCallOut, Usage)
from orchard_jax.rollout.proxy import message_key
from orchard_jax.rollout.wires import anthropic_messages as am
from orchard_jax.rollout.wires import responses_api as ra
from orchard_jax.rollout.wires.turn_stream import TurnSplitter

SHELL = {"type": "function", "name": "exec_command", "description": "run a command",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
BASH = {"name": "Bash", "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}


def _responses(body):
  return ra.to_chat_request(ra.parse_request(json.dumps(body).encode()))


def _messages(body):
  return am.to_chat_request(am.parse_request(json.dumps(body).encode()))


def _turn(content="", reasoning=None, calls=(), finish="stop", matched=None):
  tool_calls = [ToolCallOut(id=f"call_{i}", function=ToolCallFunction(
    name=name, arguments=json.dumps(args))) for i, (name, args) in enumerate(calls)] or None
  return ChatCompletionResponse(model="m", choices=[ChatChoice(
    message=ChatMessageOut(content=content or None, reasoning_content=reasoning,
                           tool_calls=tool_calls),
    finish_reason="tool_calls" if calls and finish == "stop" else finish, matched_stop=matched)],
    usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15))


def _events(sse):
  """[(event name, data)] of an SSE text with `event:` lines."""
  out = []
  for block in sse.strip().split("\n\n"):
    lines = dict(line.split(": ", 1) for line in block.split("\n"))
    out.append((lines["event"], json.loads(lines["data"])))
  return out


# ----------------------------------------------------------------------------- Responses


def test_responses_history_maps_onto_chat_messages():
  chat = _responses({
    "model": "m", "instructions": "be brief", "tools": [SHELL], "stream": True,
    "input": [
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "D"}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "U"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "message", "role": "assistant",
       "content": [{"type": "output_text", "text": "Looking."}]},
      {"type": "function_call", "call_id": "c1", "name": "exec_command",
       "arguments": '{"cmd": "ls"}'},
      {"type": "function_call", "call_id": "c2", "name": "exec_command",
       "arguments": '{"cmd": "pwd"}'},
      {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
      {"type": "function_call_output", "call_id": "c2", "output": "/repo"},
      {"role": "user", "content": "next"}]})
  assert chat.messages == [
    {"role": "system", "content": "be brief"},
    {"role": "system", "content": "D"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "Looking.", "reasoning_content": "think", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "exec_command",
                                                    "arguments": '{"cmd": "ls"}'}},
      {"id": "c2", "type": "function", "function": {"name": "exec_command",
                                                    "arguments": '{"cmd": "pwd"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    {"role": "tool", "tool_call_id": "c2", "content": "/repo"},
    {"role": "user", "content": "next"}]
  assert chat.tools == [{"type": "function", "function": {
    "name": "exec_command", "description": "run a command", "parameters": SHELL["parameters"]}}]
  assert chat.stream and chat.max_new_tokens is None


def test_responses_string_input_and_sampling_fields():
  chat = _responses({"input": "hi", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                     "reasoning": {"effort": "none"}})
  assert chat.messages == [{"role": "user", "content": "hi"}]
  assert (chat.max_new_tokens, chat.temperature, chat.top_p) == (7, 0.5, 0.9)
  assert chat.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("body, names", [
  ({"input": "x", "tools": [{"type": "web_search"}]}, "web_search"),
  ({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": []}]}, "namespace"),
  ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "custom"),
  ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
  ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
  ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
   "input_image"),
  ({"input": [{"type": "local_shell_call", "id": "x"}]}, "local_shell_call"),
  ({"input": "x", "background": True}, "background"),
  ({"input": [{"type": "function_call", "name": "f"}]}, "arguments"),
  ({"input": []}, "no message"),
])
def test_responses_refuses_what_it_cannot_serve(body, names):
  with pytest.raises(RequestError, match=names):
    _responses(body)


def test_responses_body_of_a_turn_with_tool_calls():
  request = ra.parse_request(b'{"input": "x"}')
  body = ra.response_body(request, _turn("Sure.", "R", [("exec_command", {"cmd": "ls"})]),
                          model="tiny")
  assert body["status"] == "completed" and body["model"] == "tiny"
  kinds = [item["type"] for item in body["output"]]
  assert kinds == ["reasoning", "message", "function_call"]
  assert body["output"][1]["content"][0]["text"] == "Sure."
  call = body["output"][2]
  assert (call["name"], json.loads(call["arguments"]), call["call_id"]) == (
    "exec_command", {"cmd": "ls"}, "call_0")
  assert body["usage"]["input_tokens"] == 10 and body["usage"]["output_tokens"] == 5
  cut = ra.response_body(request, _turn("So", finish="length"), model="tiny")
  assert cut["status"] == "incomplete"
  assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_output_fed_back_is_the_same_turn():
  """The items a harness sends back for a returned turn key-match the turn the proxy
  returned (so the next call extends the recorded ids)."""
  turn = _turn("Sure.", "R", [("exec_command", {"cmd": "ls"}), ("exec_command", {"cmd": "pwd"})])
  request = ra.parse_request(b'{"input": "x"}')
  output = ra.response_body(request, turn, model="m")["output"]
  chat = _responses({"input": [{"role": "user", "content": "x"}, *output]})
  returned = turn.choices[0].message.model_dump(exclude_none=True)
  assert message_key(chat.messages[-1]) == message_key(returned)


def test_responses_stream_events():
  request = ra.parse_request(b'{"input": "x", "stream": true}')
  stream = ra.ResponsesStream(request, "m")
  sse = stream.open() + stream.delta("thi", "") + stream.delta("nk", "He") + \
      stream.delta("", "llo") + stream.close(_turn("Hello", "think", [("f", {"a": 1})]))
  events = _events(sse)
  names = [name for name, _ in events]
  assert names == [
    "response.created", "response.in_progress",
    "response.output_item.added", "response.reasoning_text.delta",
    "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
    "response.output_item.added", "response.content_part.added",
    "response.output_text.delta", "response.output_text.delta",
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "response.output_item.added", "response.function_call_arguments.delta",
    "response.function_call_arguments.done", "response.output_item.done",
    "response.completed"]
  assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
  assert all(d["type"] == name for name, d in events)
  final = events[-1][1]["response"]
  assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
  assert final["output"][1]["content"][0]["text"] == "Hello"
  assert final["output"][0]["content"][0]["text"] == "think"
  assert json.loads(final["output"][2]["arguments"]) == {"a": 1}
  assert final["usage"]["total_tokens"] == 15


# ----------------------------------------------------------------------------- Messages


def test_messages_history_maps_onto_chat_messages():
  chat = _messages({
    "model": "m", "max_tokens": 64, "tools": [BASH, {**BASH, "name": "Later",
                                                      "defer_loading": True}],
    "system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2",
                                                "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "adaptive"}, "stop_sequences": ["END"],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
      {"role": "system", "content": [{"type": "text", "text": "env"}]},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "text", "text": "Running."},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a"}]},
        {"type": "text", "text": "go on"}]},
      {"role": "assistant", "content": "ok"},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                    "content": "boom", "is_error": True}]}]})
  assert chat.messages == [
    {"role": "system", "content": "S1\n\nS2"},
    {"role": "user", "content": "fix it"},
    {"role": "system", "content": "env"},
    {"role": "assistant", "content": "Running.", "reasoning_content": "hmm", "tool_calls": [
      {"id": "t1", "type": "function", "function": {"name": "Bash",
                                                    "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "t1", "content": "a"},
    {"role": "user", "content": "go on"},
    {"role": "assistant", "content": "ok"},
    {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"}]
  assert [t["function"]["name"] for t in chat.tools] == ["Bash"]
  assert chat.tools[0]["function"]["parameters"] == BASH["input_schema"]
  assert (chat.max_new_tokens, chat.stop, chat.chat_template_kwargs) == (64, ["END"], None)
  off = _messages({"messages": [{"role": "user", "content": "x"}],
                   "thinking": {"type": "disabled"}, "tool_choice": {"type": "any"}})
  assert off.chat_template_kwargs == {"enable_thinking": False}
  assert off.tool_choice == "required"


@pytest.mark.parametrize("body, names", [
  ({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
  ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
  ({"messages": [{"role": "user", "content": "x"}], "mcp_servers": [{"url": "u"}]},
   "mcp_servers"),
  ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f",
                                                    "input": "x"}]}]}, "input object"),
  ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
  ({"messages": []}, "empty"),
  ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "input_schema"),
])
def test_messages_refuses_what_it_cannot_serve(body, names):
  with pytest.raises(RequestError, match=names):
    _messages(body)


def test_messages_body_and_stop_reasons():
  request = am.parse_request(b'{"messages": [{"role": "user", "content": "x"}], '
                             b'"stop_sequences": ["END"]}')
  body = am.message_body(request, _turn("Sure.", "R", [("Bash", {"command": "ls"})]), model="m")
  assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
  assert body["content"][2]["input"] == {"command": "ls"}
  assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
  assert body["usage"] == {"input_tokens": 10, "output_tokens": 5,
                           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
  assert am.message_body(request, _turn("a"), model="m")["stop_reason"] == "end_turn"
  assert am.message_body(request, _turn("a", finish="length"), model="m")["stop_reason"] == \
      "max_tokens"
  stopped = am.message_body(request, _turn("a", matched="END"), model="m")
  assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")


def test_messages_output_fed_back_is_the_same_turn():
  turn = _turn("Sure.", "R", [("Bash", {"command": "ls"})])
  request = am.parse_request(b'{"messages": [{"role": "user", "content": "x"}]}')
  content = am.message_body(request, turn, model="m")["content"]
  chat = _messages({"messages": [{"role": "user", "content": "x"},
                                 {"role": "assistant", "content": content}]})
  returned = turn.choices[0].message.model_dump(exclude_none=True)
  assert message_key(chat.messages[-1]) == message_key(returned)


def test_messages_stream_events():
  request = am.parse_request(b'{"messages": [{"role": "user", "content": "x"}]}')
  stream = am.MessagesStream(request, "m")
  sse = stream.open(10) + stream.delta("hm", "") + stream.delta("", "Hi") + \
      stream.close(_turn("Hi", "hm", [("Bash", {"command": "ls"})]))
  events = _events(sse)
  assert [name for name, _ in events] == [
    "message_start", "content_block_start", "content_block_delta", "content_block_delta",
    "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
    "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
    "message_stop"]
  assert events[0][1]["message"]["usage"]["input_tokens"] == 10
  blocks = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
  assert blocks == ["thinking", "text", "tool_use"]
  deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
  assert deltas[0] == {"type": "thinking_delta", "thinking": "hm"}
  assert deltas[1]["type"] == "signature_delta"
  assert deltas[2] == {"type": "text_delta", "text": "Hi"}
  assert json.loads(deltas[3]["partial_json"]) == {"command": "ls"}
  assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
  assert events[-2][1]["usage"]["output_tokens"] == 5


# ----------------------------------------------------------------------------- turn stream

_PIECE = st.one_of(
  st.text(alphabet="ab \n<>/{}", max_size=6),
  st.sampled_from(["<think>", "</think>", "<tool_call>", "</tool_call>", "\n", " ",
                   '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>']))


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECE, max_size=10), cuts=st.lists(st.integers(0, 200), max_size=12),
       reasoning_open=st.booleans())
def test_streamed_deltas_are_prefixes_of_the_parsed_turn(pieces, cuts, reasoning_open):
  """Whatever the text and wherever the engine's steps cut it, the reasoning and content
  streamed are prefixes of what the parser makes of the whole turn, and with the remainder
  they are all of it (except the two cases the module names, where the parser decides after
  the fact what earlier text was)."""
  text = "".join(pieces)
  splitter = TurnSplitter(reasoning_open=reasoning_open)
  reasoning, content = "", ""
  for cut in sorted(c for c in cuts if c <= len(text)):
    r, c = splitter.feed(text[:cut])
    reasoning, content = reasoning + r, content + c
  r, c = splitter.finish(text)
  reasoning, content = reasoning + r, content + c
  parsed = parse_assistant_text(text, [{"type": "function", "function": {"name": "f"}}])
  # The think markup as models write it: one block, opened at the start (by the model, or by
  # the generation prompt when reasoning_open), closed at most once. A bare </think> after
  # content without reasoning_open is the one case the module says differs.
  leading = text.lstrip().startswith("<think>")
  well_formed = (text.count("</think>") <= 1
                 and text.count("<think>") == (1 if leading and not reasoning_open else 0)
                 if "<think>" in text else text.count("</think>") <= 1)
  bare_close = "</think>" in text and not leading and not reasoning_open
  # The other one: no leading <think> and a <tool_call> opened before the </think>, which the
  # parser then reads as text inside the block.
  close = text.find("</think>")
  call_first = not leading and close >= 0 and "<tool_call>" in text[:close]
  if well_formed and not bare_close and not call_first:
    parsed_reasoning = parsed.reasoning_content or ""
    if reasoning_open and "</think>" not in text:
      parsed_reasoning = ""    # unclosed: the parser reads it all as content
      reasoning = ""
      content = ""
    assert parsed_reasoning.startswith(reasoning)
    assert parsed.content.startswith(content)
    r, c = splitter.remainder(parsed.reasoning_content, parsed.content)
    assert reasoning + r == (parsed.reasoning_content or "") and content + c == parsed.content


def test_turn_stream_holds_back_markup_until_decided():
  splitter = TurnSplitter()
  assert splitter.feed("Hello <tool") == ("", "Hello")
  assert splitter.feed("Hello <tool_call>{\"na") == ("", "")
  # Whether the block is a call or stays in the content (here: no tool name, so it stays,
  # reported) is known once the turn is parsed; what follows it waits for the parsed message.
  assert splitter.feed("Hello <tool_call>{}</tool_call> bye") == ("", "")
  assert splitter.remainder(None, "Hello <tool_call>{}</tool_call> bye") == (
      "", " <tool_call>{}</tool_call> bye")
  opened = TurnSplitter(reasoning_open=True)
  assert opened.feed("let me see\n</thi") == ("let me see", "")
  assert opened.feed("let me see\n</think>\n\nDone") == ("", "Done")
  assert split_reasoning("let me see\n</think>\n\nDone") == ("let me see", "Done")
