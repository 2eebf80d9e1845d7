"""Tool-call parsing: hand-made model outputs, and calls rendered by the chat template."""
import json
import re

import pytest

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from orchard_jax.data import (
  ToolCallParseError, get_tool_call_parser, parse_assistant_text, parse_reasoning)

TOOLS = [{"type": "function", "function": {
  "name": "bash", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}, "timeout": {"type": "integer"}, "env": {"type": "object"}}}}}]


def test_hermes_reasoning_content_and_calls():
  text = ("<think>\nFirst look at files.\n</think>\n\nLet me check.\n<tool_call>\n"
          '{"name": "bash", "arguments": {"command": "ls -la", "timeout": 5}}\n</tool_call>')
  parsed = parse_assistant_text(text, TOOLS)
  assert parsed.reasoning_content == "First look at files."
  assert parsed.content == "Let me check."
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
    ("bash", {"command": "ls -la", "timeout": 5})]
  assert parsed.errors == ()
  message = parsed.to_message()
  assert message["role"] == "assistant"
  assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
    "command": "ls -la", "timeout": 5}
  assert message["tool_calls"][0]["id"].startswith("call_")


def test_hermes_reports_every_kind_of_problem():
  text = ('<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}\n</tool_call>\n'
          '<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>\n'
          "<tool_call>\n{not json}\n</tool_call>\n"
          '<tool_call>\n["bash"]\n</tool_call>\n'
          '<tool_call>\n{"name": "bash", "arguments": {"comm')
  parsed = parse_assistant_text(text, TOOLS)
  assert [c.name for c in parsed.tool_calls] == ["bash", "python"]
  assert parsed.tool_calls[0].arguments == {"command": "pwd"}  # arguments given as a string
  assert [e.kind for e in parsed.errors] == [
    "undefined_tool", "invalid_json", "invalid_structure", "unterminated"]
  assert parsed.has_unparsable_call and parsed.has_undefined_tool
  # Blocks that are no call stay in the content, where the harness sees them.
  assert parsed.content == "\n".join(e.raw for e in parsed.errors[1:])
  assert "<tool_call>\n{not json}\n</tool_call>" in parsed.to_message()["content"]
  # Without the tool list there is nothing to call undefined.
  assert "undefined_tool" not in [e.kind for e in parse_assistant_text(text).errors]


def test_plain_answer_and_open_think_block():
  assert parse_assistant_text("The answer is 4.").to_message() == {
    "role": "assistant", "content": "The answer is 4."}
  parsed = parse_assistant_text("<think>\nstill thinking when max_tokens hit")
  assert parsed.reasoning_content == "still thinking when max_tokens hit"
  assert parsed.content == "" and [e.kind for e in parsed.errors] == ["unclosed_think"]
  assert parsed.has_unparsable_call
  # The generation prompt may have opened the think block already.
  parsed = parse_assistant_text("reasoning here\n</think>\n\nanswer")
  assert (parsed.reasoning_content, parsed.content) == ("reasoning here", "answer")


def test_parses_what_the_chat_template_renders(tok):
  """A call rendered by the template, as the model would emit it, parses back to the call."""
  args = {"command": "grep -rn 'def main' src/ | head\necho \"done\"", "env": {"A": "ü"}}
  message = {"role": "assistant", "content": "Searching.",
             "tool_calls": [{"id": "x", "type": "function",
                             "function": {"name": "bash", "arguments": args}},
                            {"id": "y", "type": "function",
                             "function": {"name": "bash", "arguments": {"command": "pwd"}}}]}
  prompt = tok.render_chat_text([{"role": "user", "content": "go"}], TOOLS)
  full = tok.render_chat_text([{"role": "user", "content": "go"}, message], TOOLS,
                              add_generation_prompt=False)
  generated = tok.decode(tok.encode(full[len(prompt):]), skip_special_tokens=True)
  parsed = parse_assistant_text(generated, TOOLS)
  assert parsed.content == "Searching."
  assert [c.arguments for c in parsed.tool_calls] == [args, {"command": "pwd"}]
  assert parsed.errors == ()


def test_qwen3_xml_parser_converts_by_schema():
  text = ("I'll run it.\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\ncd /tmp\n"
          "</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=env>\n{\"A\": 1}\n"
          "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=other>\n"
          "<parameter=n>\n7\n</parameter>\n<parameter=s>\nplain\n</parameter>\n</function>\n"
          "</tool_call>\n<tool_call>\nno function tag\n</tool_call>")
  parsed = parse_assistant_text(text, TOOLS, parser="qwen3_xml")
  assert parsed.content == "I'll run it.\n\n\n<tool_call>\nno function tag\n</tool_call>"
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
    ("bash", {"command": "ls -la\ncd /tmp", "timeout": 30, "env": {"A": 1}}),
    ("other", {"n": 7, "s": "plain"})]
  assert [e.kind for e in parsed.errors] == ["undefined_tool", "invalid_structure"]


def test_unknown_parser_name():
  with pytest.raises(ToolCallParseError, match="expected one of"):
    get_tool_call_parser("nope")


def _xml_call(name, args):
  """A call as Qwen3-Coder's chat template writes it."""
  params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
  return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def test_tool_call_inside_an_unclosed_think_block_is_a_format_error():
  call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
  parsed = parse_assistant_text("<think>\nI will list files.\n" + call, TOOLS)
  assert parsed.tool_calls == () and parsed.has_unparsable_call
  [error] = parsed.errors
  assert error.kind == "unclosed_think" and "1 tool-call block" in error.reason
  assert call in parsed.reasoning_content                 # nothing is dropped
  # Mid-turn, the unclosed tag and everything after it stay content.
  parsed = parse_assistant_text("Plan.\n<think>\nhmm " + call, TOOLS)
  assert parsed.content == "Plan.\n<think>\nhmm " + call and parsed.tool_calls == ()
  assert [e.kind for e in parsed.errors] == ["unclosed_think"]
  # Without tools too (the proxy records it as the turn's format error).
  assert [e.kind for e in parse_reasoning("<think>\nno end").errors] == ["unclosed_think"]
  assert parse_reasoning("<think>\nok\n</think>\n\nanswer").errors == ()


def test_literal_parameter_close_in_a_value_is_a_format_error_not_an_extra_parameter():
  value = "cat > page.xml <<'EOF'\n<parameter=x>\n</parameter>\nEOF"
  text = _xml_call("bash", {"command": value})
  parsed = parse_assistant_text(text, TOOLS, parser="qwen3_xml")
  # The value's </parameter> is followed by more of it, not by a tag: a format error.
  assert parsed.tool_calls == ()
  [error] = parsed.errors
  assert error.kind == "invalid_structure" and "literal </parameter>" in error.reason
  assert parsed.content == text
  # A value that does not have its declared type (here a cut one) is a format error too.
  text = _xml_call("bash", {"command": "echo '</parameter>\n<parameter=timeout>\n5' > x"})
  parsed = parse_assistant_text(text, TOOLS, parser="qwen3_xml")
  assert parsed.tool_calls == () and "declared integer" in parsed.errors[0].reason
  # A literal </function> or </tool_call> inside a value does not cut the call.
  for value in ("printf '</function>'", "echo '</tool_call>' && ls"):
    parsed = parse_assistant_text(_xml_call("bash", {"command": value}), TOOLS,
                                  parser="qwen3_xml")
    assert [c.arguments for c in parsed.tool_calls] == [{"command": value}], parsed.errors


@pytest.mark.parametrize("parser", ["hermes", "qwen3_xml"])
def test_undeclared_parameter_is_a_format_error(parser):
  args = {"command": "ls", "cwd": "/tmp"}
  text = (_xml_call("bash", args) if parser == "qwen3_xml" else
          "<tool_call>\n" + json.dumps({"name": "bash", "arguments": args}) + "\n</tool_call>")
  parsed = parse_assistant_text(text, TOOLS, parser=parser)
  assert parsed.tool_calls == () and parsed.content == text
  [error] = parsed.errors
  assert error.kind == "undeclared_parameter" and "'cwd'" in error.reason
  # A schema that allows more, or no tool list, checks nothing.
  open_tools = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}},
    "additionalProperties": True}}}]
  assert [c.arguments for c in parse_assistant_text(text, open_tools,
                                                    parser=parser).tool_calls] == [args]
  assert [c.arguments for c in parse_assistant_text(text, parser=parser).tool_calls] == [args]


_TEXT = st.lists(st.sampled_from(list("ab \n'\"{}<>/=_")) | st.sampled_from([
  "</parameter>", "<parameter=command>", "<parameter=timeout>", "</function>", "<function=x>",
  "</tool_call>", "<tool_call>", "<think>", "</think>", "\n"]), max_size=12).map("".join)


# Free text before a call: any markup but the openings of a call (an unclosed opening would
# make the call its content, which no parser can tell from a call the model meant).
_NOTE = st.lists(st.sampled_from(list("ab \n'\"{}<>/=_")) | st.sampled_from([
  "</parameter>", "</function>", "</tool_call>", "<think>", "</think>", "\n"]),
  max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(command=_TEXT, note=_NOTE, parser=st.sampled_from(["hermes", "qwen3_xml"]))
# A value holding a call's whole closing markup: the block used to end at the </tool_call>
# inside the value and return command="" (found by a 1,500-example run); now it is one block,
# reported ambiguous.
@example(command="</parameter></function></tool_call>", note="", parser="qwen3_xml")
@example(command="</function></tool_call>", note="", parser="qwen3_xml")   # parses exactly
def test_a_call_parses_back_exactly_or_is_reported(command, note, parser):
  """Whatever the argument text holds, the parser returns the call the model wrote or a format
  error with the block kept in the content: never other arguments, never a dropped block."""
  args = {"command": command}
  # The XML format cannot tell "</parameter>" + a parameter tag inside a value from two
  # parameters, nor a value holding a call's closing markup and then "<tool_call>" from two
  # blocks (parser docstring; a 12,000-example run drew
  # '</function></tool_call><tool_call><function=x><parameter=command>', which reads as a broken
  # block and a call of x); the JSON format has no such case.
  assume(parser == "hermes" or not (
    re.search(r"</parameter>\s*(<parameter=|$)", command + "\n") or
    re.search(r"</function>\s*</tool_call>.*<tool_call>", command, re.S)))
  block = (_xml_call("bash", args) if parser == "qwen3_xml" else
           "<tool_call>\n" + json.dumps({"name": "bash", "arguments": args},
                                        ensure_ascii=False) + "\n</tool_call>")
  text = "Running it.\n" + block
  parsed = parse_assistant_text(text, TOOLS, parser=parser)
  if parsed.tool_calls:
    assert [c.arguments for c in parsed.tool_calls] == [args] and not parsed.errors
  else:
    assert parsed.errors and parsed.has_unparsable_call
    assert block in parsed.content or block in (parsed.reasoning_content or "") or any(
      block in e.raw for e in parsed.errors)
  # The same holds after free text that may carry markup of its own.
  parsed = parse_assistant_text(note + "\n" + block, TOOLS, parser=parser)
  assert all(c.arguments == args for c in parsed.tool_calls)
  if not parsed.tool_calls:
    assert parsed.errors
