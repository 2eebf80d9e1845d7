"""Parsing tool calls and reasoning out of generated assistant text.

A parser turns the text a model generated for one assistant turn into an OpenAI-style assistant
message: content, reasoning_content and tool_calls. Parsers share one interface,
`ToolCallParser.parse(text, tools) -> ParsedResponse`, and are looked up by name in
`TOOL_CALL_PARSERS`, so a new model family's format is one class and one registry line:
- "hermes" / "qwen3": Qwen2.5/Qwen3 and Hermes style, a JSON object per call,
    <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>
- "qwen3_xml" / "qwen3_coder": Qwen3-Coder and Qwen3.5 style, XML-like blocks,
    <tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>

Problems are reported, never raised: a block that cannot be parsed becomes a `ToolCallError`
(kinds: "unterminated", "invalid_json", "invalid_structure"), and a call naming a tool that is
not among `tools` is kept and also reported as "undefined_tool". Training-data filters count
these (Orchard drops trajectories with unparsable actions or undefined tool calls).
"""
from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Protocol, Sequence

from orchard_jax.data.errors import ToolCallParseError

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"

ERROR_KINDS = ("unterminated", "invalid_json", "invalid_structure", "undefined_tool")


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed tool call.

  Attributes:
    name: function name.
    arguments: the decoded arguments object.
    id: call id ("call_" + 24 hex digits unless given).
  """
  name: str
  arguments: dict[str, Any]
  id: str = dataclasses.field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

  def to_openai(self) -> dict[str, Any]:
    """OpenAI chat-completions form; `arguments` is a JSON string there."""
    return {"id": self.id, "type": "function",
            "function": {"name": self.name,
                         "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclasses.dataclass(frozen=True)
class ToolCallError:
  """A tool-call block that was rejected, or a call to a tool that was not offered.

  Attributes:
    kind: one of ERROR_KINDS.
    raw: the block's text.
    reason: a sentence saying what was expected and what was seen.
  """
  kind: str
  raw: str
  reason: str


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
  """One assistant turn's generated text, split into its parts.

  Attributes:
    content: text outside reasoning and tool-call blocks, stripped ("" when none).
    reasoning_content: text inside <think>...</think>, or None when there was no think block.
    tool_calls: calls whose structure parsed (undefined tools included, see `errors`).
    errors: problems found, in order of appearance.
  """
  content: str
  reasoning_content: str | None
  tool_calls: tuple[ToolCall, ...]
  errors: tuple[ToolCallError, ...]

  @property
  def has_unparsable_call(self) -> bool:
    return any(e.kind != "undefined_tool" for e in self.errors)

  @property
  def has_undefined_tool(self) -> bool:
    return any(e.kind == "undefined_tool" for e in self.errors)

  def to_message(self) -> dict[str, Any]:
    """OpenAI assistant message: role, content (None when empty and there are tool calls),
    reasoning_content when present, tool_calls when any."""
    message: dict[str, Any] = {
      "role": "assistant", "content": self.content or (None if self.tool_calls else "")}
    if self.reasoning_content is not None:
      message["reasoning_content"] = self.reasoning_content
    if self.tool_calls:
      message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
    return message


class ToolCallParser(Protocol):
  """Interface of every tool-call parser (see the module docstring for the formats)."""
  name: str

  def parse(self, text: str, tools: Sequence[dict] | None = None) -> ParsedResponse:
    """Split generated text into content, reasoning and tool calls.

    Args:
      text: the decoded assistant turn (markup tokens kept, i.e. decoded without skipping
        special tokens, or with Qwen's <tool_call>/<think> tags as non-special tokens).
      tools: OpenAI tool schemas offered to the model; calls to other names are reported as
        "undefined_tool". None skips that check.
    """
    ...


def split_reasoning(text: str) -> tuple[str | None, str]:
  """(reasoning, rest) of a turn that may open with a <think> block.

  "<think>\\nR\\n</think>\\n\\nC" -> ("R", "C"). A "</think>" without "<think>" (the generation
  prompt opened the block) counts too. An unclosed "<think>" (generation stopped mid-thought)
  makes everything after it reasoning. No think tag -> (None, text).
  """
  close = text.find(_THINK_CLOSE)
  if close >= 0:
    head = text[:close]
    opened = head.find(_THINK_OPEN)
    reasoning = head[opened + len(_THINK_OPEN):] if opened >= 0 else head
    return reasoning.strip("\n"), text[close + len(_THINK_CLOSE):].lstrip("\n")
  opened = text.find(_THINK_OPEN)
  if opened >= 0 and not text[:opened].strip():
    return text[opened + len(_THINK_OPEN):].strip("\n"), ""
  return None, text


def _tool_names(tools: Sequence[dict] | None) -> set[str] | None:
  if tools is None:
    return None
  names = set()
  for tool in tools:
    fn = tool.get("function", tool)
    if isinstance(fn, dict) and "name" in fn:
      names.add(fn["name"])
  return names


def _blocks(text: str) -> tuple[str, list[tuple[str, bool]]]:
  """(text outside blocks, [(block body, terminated)]) for <tool_call>...</tool_call> blocks."""
  outside, blocks, pos = [], [], 0
  while True:
    start = text.find(_CALL_OPEN, pos)
    if start < 0:
      outside.append(text[pos:])
      return "".join(outside), blocks
    outside.append(text[pos:start])
    end = text.find(_CALL_CLOSE, start)
    if end < 0:
      blocks.append((text[start + len(_CALL_OPEN):], False))
      return "".join(outside), blocks
    blocks.append((text[start + len(_CALL_OPEN):end], True))
    pos = end + len(_CALL_CLOSE)


class _BlockParser:
  """Shared driver: reasoning split, block scan, undefined-tool check; subclasses parse a body."""
  name = ""

  def parse(self, text: str, tools: Sequence[dict] | None = None) -> ParsedResponse:
    reasoning, rest = split_reasoning(text)
    outside, blocks = _blocks(rest)
    names = _tool_names(tools)
    calls, errors = [], []
    for body, terminated in blocks:
      raw = f"{_CALL_OPEN}{body}{_CALL_CLOSE if terminated else ''}"
      if not terminated:
        errors.append(ToolCallError(
          "unterminated", raw, f"expected {_CALL_CLOSE} after {_CALL_OPEN}; the text ended first"))
        continue
      call, error = self._parse_body(body.strip(), tools)
      if error is not None:
        errors.append(dataclasses.replace(error, raw=raw))
        continue
      calls.append(call)
      if names is not None and call.name not in names:
        errors.append(ToolCallError(
          "undefined_tool", raw,
          f"tool {call.name!r} is not among the tools offered ({sorted(names)})"))
    return ParsedResponse(outside.strip(), reasoning, tuple(calls), tuple(errors))

  def _parse_body(self, body: str, tools: Sequence[dict] | None
                  ) -> tuple[ToolCall | None, ToolCallError | None]:
    raise NotImplementedError


class HermesToolCallParser(_BlockParser):
  """Qwen2.5/Qwen3/Hermes format: each <tool_call> block holds {"name": ..., "arguments": {...}}.

  "arguments" may also be a JSON string holding an object (some models emit that), and
  "parameters" is accepted as a synonym of "arguments". Reference: Qwen3's chat template and
  the "hermes" tool parser of vLLM/SGLang.
  """
  name = "hermes"

  def _parse_body(self, body, tools):
    try:
      obj = json.loads(body)
    except ValueError as e:
      return None, ToolCallError("invalid_json", body, f"tool call is not valid JSON: {e}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
      return None, ToolCallError(
        "invalid_structure", body,
        f"expected a JSON object with a string 'name', got {type(obj).__name__} {body[:80]!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
      try:
        args = json.loads(args) if args.strip() else {}
      except ValueError as e:
        return None, ToolCallError(
          "invalid_json", body, f"'arguments' is a string that is not valid JSON: {e}")
    if not isinstance(args, dict):
      return None, ToolCallError(
        "invalid_structure", body,
        f"expected 'arguments' to be an object, got {type(args).__name__}")
    return ToolCall(obj["name"], args), None


_FUNCTION_RE = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)",
                           re.DOTALL)


class Qwen3XMLToolCallParser(_BlockParser):
  """Qwen3-Coder / Qwen3.5 format: <function=NAME> with one <parameter=ARG> block per argument.

  Parameter values are text, one leading and one trailing newline removed. A value is converted
  by the tool's JSON schema type when the tool is known (integer, number, boolean, object,
  array: JSON-decoded; null for "null"); without a schema, JSON-looking values (objects,
  arrays, numbers, true/false/null) are decoded and the rest stay strings. Reference: the
  qwen3_coder tool parser of vLLM/SGLang.
  """
  name = "qwen3_xml"

  def _parse_body(self, body, tools):
    match = _FUNCTION_RE.search(body)
    if match is None:
      return None, ToolCallError(
        "invalid_structure", body, f"expected <function=NAME> in the tool call, got {body[:80]!r}")
    name = match.group(1).strip()
    schema = _parameter_schema(tools, name)
    args = {}
    for key, value in _PARAMETER_RE.findall(match.group(2)):
      value = value[1:] if value.startswith("\n") else value
      value = value[:-1] if value.endswith("\n") else value
      args[key.strip()] = _convert_parameter(value, schema.get(key.strip()))
    return ToolCall(name, args), None


def _parameter_schema(tools: Sequence[dict] | None, name: str) -> dict[str, Any]:
  for tool in tools or ():
    fn = tool.get("function", tool)
    if isinstance(fn, dict) and fn.get("name") == name:
      props = (fn.get("parameters") or {}).get("properties") or {}
      return props if isinstance(props, dict) else {}
  return {}


def _convert_parameter(value: str, schema: dict | None) -> Any:
  kind = (schema or {}).get("type")
  if kind == "string":
    return value
  if value.strip() == "null":
    return None
  if kind is None or kind in ("integer", "number", "boolean", "object", "array"):
    try:
      decoded = json.loads(value)
    except ValueError:
      return value
    if kind is None and isinstance(decoded, str):
      return value
    return decoded
  return value


TOOL_CALL_PARSERS: dict[str, type] = {
  "hermes": HermesToolCallParser,
  "qwen3": HermesToolCallParser,
  "qwen3_xml": Qwen3XMLToolCallParser,
  "qwen3_coder": Qwen3XMLToolCallParser,
}


def get_tool_call_parser(name: str) -> ToolCallParser:
  """A parser instance by registry name ("hermes", "qwen3", "qwen3_xml", "qwen3_coder").

  Raises:
    ToolCallParseError: unknown name.
  """
  try:
    return TOOL_CALL_PARSERS[name]()
  except KeyError:
    raise ToolCallParseError(
      f"unknown tool-call parser {name!r}; expected one of {sorted(TOOL_CALL_PARSERS)}") from None


def parse_assistant_text(text: str, tools: Sequence[dict] | None = None, *,
                         parser: str = "hermes") -> ParsedResponse:
  """Parse one generated assistant turn with the named parser (see `ToolCallParser.parse`)."""
  return get_tool_call_parser(parser).parse(text, tools)
