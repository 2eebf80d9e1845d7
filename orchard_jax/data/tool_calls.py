"""Parsing tool calls and reasoning out of generated assistant text.

A parser turns the text a model generated for one assistant turn into an OpenAI-style assistant
message: content, reasoning_content and tool_calls. Parsers share one interface,
`ToolCallParser.parse(text, tools) -> ParsedResponse`, and are looked up by name in
`TOOL_CALL_PARSERS`, so a new model family's format is one class and one registry line:
- "hermes" / "qwen3": Qwen2.5/Qwen3 and Hermes style, a JSON object per call,
    <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>
- "qwen3_xml" / "qwen3_coder": Qwen3-Coder and Qwen3.5 style, XML-like blocks,
    <tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>

Problems are reported, never raised and never dropped:
- a block that cannot be parsed ("unterminated", "invalid_json", "invalid_structure") or that
  passes a parameter its tool does not declare ("undeclared_parameter") is no tool call: its
  text stays in `content`, where the harness sees what the model wrote, and the error says why;
- a `<think>` that never closes ("unclosed_think") leaves the turn's text as reasoning (or as
  content when the tag is not at the start), and tool-call markup inside it is not parsed;
- a call naming a tool that is not among `tools` is kept and also reported ("undefined_tool").
A block ends at the first `</tool_call>` after which its body is complete (a JSON object, or a
`</function>`), so the closing tag written inside an argument does not cut the call; where the
text after it completes the body again before the next `<tool_call>` (an XML value holding a
call's whole closing markup), the block runs to the last such `</tool_call>`. In the XML
format a parameter's value ends at `</parameter>` only where the next parameter or the end of
the function follows; a literal `</parameter>` inside a value is a format error, never a cut
value with an extra parameter. The proxy records the errors with each call, and training-data
filters count them (Orchard drops trajectories with unparsable actions or undefined tool calls).
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

ERROR_KINDS = ("unterminated", "invalid_json", "invalid_structure", "undeclared_parameter",
               "unclosed_think", "undefined_tool")


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
    content: text outside reasoning and parsed tool-call blocks (blocks that did not parse
      stay in it), stripped ("" when none).
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
  makes everything after it reasoning. No think tag -> (None, text). `parse_reasoning` also
  reports the unclosed block.
  """
  return _split_think(text)[:2]


def _split_think(text: str) -> tuple[str | None, str, ToolCallError | None]:
  """`split_reasoning` plus the "unclosed_think" error of a <think> that never closes.

  Reasoning comes first in a turn: a turn that opens with <think> reasons until the first
  </think>; otherwise only a think tag before the first <tool_call> counts (a "</think>" or
  "<think>" inside a call's arguments is text)."""
  opened = text.find(_THINK_OPEN)
  if opened < 0 or text[:opened].strip():
    calls_at = text.find(_CALL_OPEN)
    limit = len(text) if calls_at < 0 else calls_at
    close = text.find(_THINK_CLOSE, 0, limit)
    if close >= 0:
      head = text[:close]
      opened = head.find(_THINK_OPEN)
      reasoning = head[opened + len(_THINK_OPEN):] if opened >= 0 else head
      return reasoning.strip("\n"), text[close + len(_THINK_CLOSE):].lstrip("\n"), None
    opened = text.find(_THINK_OPEN, 0, limit)
    if opened < 0:
      return None, text, None
  else:
    close = text.find(_THINK_CLOSE, opened)
    if close >= 0:
      reasoning = text[opened + len(_THINK_OPEN):close]
      return reasoning.strip("\n"), text[close + len(_THINK_CLOSE):].lstrip("\n"), None
  inside = text[opened + len(_THINK_OPEN):]
  calls = inside.count(_CALL_OPEN)
  error = ToolCallError(
    "unclosed_think", text,
    f"expected {_THINK_CLOSE} after {_THINK_OPEN}; the turn ended first"
    + (f", and the {calls} tool-call block(s) inside the reasoning were not parsed" if calls
       else ""))
  if not text[:opened].strip():
    return inside.strip("\n"), "", error
  return None, text, error


def parse_reasoning(text: str) -> ParsedResponse:
  """A turn without tools: (reasoning, content) as `split_reasoning`, with an unclosed think
  block reported."""
  reasoning, rest, error = _split_think(text)
  return ParsedResponse(rest.strip(), reasoning, (), (error,) if error else ())


def _tool_names(tools: Sequence[dict] | None) -> set[str] | None:
  if tools is None:
    return None
  names = set()
  for tool in tools:
    fn = tool.get("function", tool)
    if isinstance(fn, dict) and "name" in fn:
      names.add(fn["name"])
  return names


def _tool_schema(tools: Sequence[dict] | None, name: str) -> dict[str, Any] | None:
  for tool in tools or ():
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if isinstance(fn, dict) and fn.get("name") == name:
      parameters = fn.get("parameters")
      return parameters if isinstance(parameters, dict) else {}
  return None


def _declared_parameters(tools: Sequence[dict] | None, name: str) -> set[str] | None:
  """Names of the parameters the tool declares, or None when any name is allowed (the tool
  is unknown, declares no "properties", or allows additional properties)."""
  schema = _tool_schema(tools, name)
  if schema is None or not isinstance(schema.get("properties"), dict):
    return None
  if schema.get("additionalProperties", False) not in (False, None):
    return None
  return set(schema["properties"])


def _undeclared(call: ToolCall, tools: Sequence[dict] | None) -> ToolCallError | None:
  declared = _declared_parameters(tools, call.name)
  extra = sorted(set(call.arguments) - declared) if declared is not None else []
  if not extra:
    return None
  return ToolCallError("undeclared_parameter", "",
                       f"tool {call.name!r} declares the parameters {sorted(declared)}; the call "
                       f"passes {extra}")


class _BlockParser:
  """Shared driver: reasoning split, block scan, undefined-tool and undeclared-parameter
  checks; subclasses parse a block's body and say when a body is complete."""
  name = ""

  def parse(self, text: str, tools: Sequence[dict] | None = None) -> ParsedResponse:
    reasoning, rest, think_error = _split_think(text)
    tail = ""
    if think_error is not None and reasoning is None:   # unclosed mid-turn: the rest is in it
      at = rest.find(_THINK_OPEN)
      rest, tail = rest[:at], rest[at:]
    names = _tool_names(tools)
    pieces, calls, errors = [], [], [think_error] if think_error else []
    for chunk, body, terminated in self._scan(rest):
      if body is None:
        if _CALL_CLOSE in chunk:
          errors.append(ToolCallError(
            "invalid_structure", chunk, f"a {_CALL_CLOSE} without its {_CALL_OPEN} (a call cut "
            "by markup before it, or stray markup)"))
        pieces.append(chunk)
        continue
      if not terminated:
        errors.append(ToolCallError(
          "unterminated", chunk, f"expected {_CALL_CLOSE} after {_CALL_OPEN}; the text ended "
          "first"))
        pieces.append(chunk)
        continue
      call, error = self._parse_body(body.strip(), tools)
      if error is None and call is not None:
        error = _undeclared(call, tools)
      if error is not None:
        errors.append(dataclasses.replace(error, raw=chunk))
        pieces.append(chunk)      # not a call: the harness sees the text the model wrote
        continue
      calls.append(call)
      if names is not None and call.name not in names:
        errors.append(ToolCallError(
          "undefined_tool", chunk,
          f"tool {call.name!r} is not among the tools offered ({sorted(names)})"))
    return ParsedResponse(("".join(pieces) + tail).strip(), reasoning, tuple(calls),
                          tuple(errors))

  def _scan(self, text: str):
    """(chunk, block body or None, terminated) in order: text outside blocks (body None) and
    each block with its raw chunk. A block ends at the first </tool_call> after which its body
    is complete (`_complete`), else at the first one; but where markup after that one completes
    the body again before the next <tool_call>, at the last such </tool_call>: the earlier one
    was written inside an argument (a value holding `</parameter></function></tool_call>`), and
    cutting there would return a call with the value cut short and leave its tail as stray
    markup. The whole block then goes to `_parse_body`, which parses it or reports it."""
    pos = 0
    while True:
      start = text.find(_CALL_OPEN, pos)
      if start < 0:
        yield text[pos:], None, True
        return
      yield text[pos:start], None, True
      body_at = start + len(_CALL_OPEN)
      ends = [m.start() for m in re.finditer(re.escape(_CALL_CLOSE), text[body_at:])]
      if not ends:
        yield text[start:], text[body_at:], False
        return
      complete = [e for e in ends if self._complete(text[body_at:body_at + e])]
      if not complete:
        end = ends[0]
      else:
        following = text.find(_CALL_OPEN, body_at + complete[0] + len(_CALL_CLOSE))
        end = max(e for e in complete
                  if following < 0 or body_at + e + len(_CALL_CLOSE) <= following)
      close = body_at + end + len(_CALL_CLOSE)
      yield text[start:close], text[body_at:body_at + end], True
      pos = close

  def _complete(self, body: str) -> bool:
    raise NotImplementedError

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

  def _complete(self, body: str) -> bool:
    try:
      return isinstance(json.loads(body), dict)
    except ValueError:
      return False

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


_FUNCTION_OPEN_RE = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER_OPEN_RE = re.compile(r"\s*<parameter=([^>\n]+)>")
_FUNCTION_CLOSE, _PARAMETER_CLOSE = "</function>", "</parameter>"


class Qwen3XMLToolCallParser(_BlockParser):
  """Qwen3-Coder / Qwen3.5 format: <function=NAME> with one <parameter=ARG> block per argument.

  The block's body is `<function=NAME>`, parameter blocks, `</function>` (whitespace between).
  A parameter's value runs to the `</parameter>` that is followed by the next `<parameter=`
  or by the end of the function; a `</parameter>` followed by anything else (a literal one in
  the value) makes the call a format error. Values are text, one leading and one trailing
  newline removed, converted by the tool's JSON schema type when the tool is known (integer,
  number, boolean, object, array: JSON-decoded, and a value that does not decode to its type
  is a format error; null for "null"); without a schema, JSON-looking values (objects, arrays,
  numbers, true/false/null) are decoded and the rest stay strings. Reference: the qwen3_coder
  tool parser of vLLM/SGLang.

  The format itself cannot tell a value holding `</parameter>` followed by a parameter tag
  (`...</parameter>\\n<parameter=x>...`) from two parameters; such a call parses as the
  parameters its tags say (and an undeclared one among them is a format error); nor a value
  holding a call's closing markup and then a `<tool_call>` (`...</function></tool_call>
  <tool_call>...`) from a block that ends there and a block after it: such text parses as the
  blocks its tags say.
  """
  name = "qwen3_xml"

  def _complete(self, body: str) -> bool:
    return body.rstrip().endswith(_FUNCTION_CLOSE)

  def _parse_body(self, body, tools):
    opened = _FUNCTION_OPEN_RE.match(body)
    end = body.rfind(_FUNCTION_CLOSE)
    if opened is None or end < opened.end() or body[end + len(_FUNCTION_CLOSE):].strip():
      return None, ToolCallError(
        "invalid_structure", body,
        f"expected <function=NAME> ... </function> in the tool call, got {body[:80]!r}")
    name = opened.group(1).strip()
    inner = body[opened.end():end]
    properties = (_tool_schema(tools, name) or {}).get("properties")
    properties = properties if isinstance(properties, dict) else {}
    args, pos = {}, 0
    while inner[pos:].strip():
      start = _PARAMETER_OPEN_RE.match(inner, pos)
      if start is None:
        return None, ToolCallError(
          "invalid_structure", body,
          f"expected <parameter=NAME> or </function> in function {name!r}, got "
          f"{inner[pos:pos + 80].strip()!r}")
      key = start.group(1).strip()
      close = inner.find(_PARAMETER_CLOSE, start.end())
      if close < 0:
        return None, ToolCallError(
          "invalid_structure", body, f"parameter {key!r} of function {name!r} has no "
          f"{_PARAMETER_CLOSE}")
      after = close + len(_PARAMETER_CLOSE)
      if inner[after:].strip() and _PARAMETER_OPEN_RE.match(inner, after) is None:
        return None, ToolCallError(
          "invalid_structure", body,
          f"the value of parameter {key!r} of function {name!r} holds a literal "
          f"{_PARAMETER_CLOSE} (followed by {inner[after:after + 40]!r}); the call is ambiguous")
      if key in args:
        return None, ToolCallError(
          "invalid_structure", body, f"parameter {key!r} of function {name!r} is given twice")
      value = inner[start.end():close]
      value = value[1:] if value.startswith("\n") else value
      value = value[:-1] if value.endswith("\n") else value
      converted = _convert_parameter(value, properties.get(key))
      expected = _type_mismatch(converted, properties.get(key))
      if expected:
        return None, ToolCallError(
          "invalid_structure", body, f"parameter {key!r} of function {name!r} is declared "
          f"{expected}; its value {value[:40]!r} is not")
      args[key] = converted
      pos = after
    return ToolCall(name, args), None


_JSON_TYPES = {"integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,),
               "array": (list,)}


def _type_mismatch(value: Any, schema: dict | None) -> str | None:
  """The declared JSON type a converted parameter value fails to have, or None (null and
  undeclared or other types pass)."""
  kind = schema.get("type") if isinstance(schema, dict) else None
  types = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
  if types is None or value is None:
    return None
  ok = isinstance(value, types) and not (kind in ("integer", "number") and isinstance(value, bool))
  return None if ok else kind


def _convert_parameter(value: str, schema: dict | None) -> Any:
  kind = (schema or {}).get("type") if isinstance(schema, dict) else None
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
