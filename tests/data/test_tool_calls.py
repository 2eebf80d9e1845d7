"""Tool-call parsing: hand-made model outputs, and calls rendered by the chat template."""
import json

import pytest

from orchard_jax.data import ToolCallParseError, get_tool_call_parser, parse_assistant_text

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
  assert parsed.content == ""
  assert parsed.to_message()["content"] is None
  # Without the tool list there is nothing to call undefined.
  assert "undefined_tool" not in [e.kind for e in parse_assistant_text(text).errors]


def test_plain_answer_and_open_think_block():
  assert parse_assistant_text("The answer is 4.").to_message() == {
    "role": "assistant", "content": "The answer is 4."}
  parsed = parse_assistant_text("<think>\nstill thinking when max_tokens hit")
  assert parsed.reasoning_content == "still thinking when max_tokens hit"
  assert parsed.content == ""
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
  assert parsed.content == "I'll run it."
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
    ("bash", {"command": "ls -la\ncd /tmp", "timeout": 30, "env": {"A": 1}}),
    ("other", {"n": 7, "s": "plain"})]
  assert [e.kind for e in parsed.errors] == ["undefined_tool", "invalid_structure"]


def test_unknown_parser_name():
  with pytest.raises(ToolCallParseError, match="expected one of"):
    get_tool_call_parser("nope")
