"""The Anthropic Messages API (`POST /v1/messages`) on top of the proxy's chat turns.

Claude Code speaks this wire (it posts to `/v1/messages?beta=true` and reads the stream by
its `event:` lines). This module maps

- a request onto a chat-completions request (`to_chat_request`): `system` (a string or text
  blocks) becomes the leading system message and a `system`-role message inside `messages`
  stays a system message in place; an assistant message's `thinking`, `text` and `tool_use`
  blocks become one assistant message (reasoning_content, content, tool_calls), which is the
  turn the proxy returned, so history matching sees the same messages whatever the wire; a
  user message's `tool_result` blocks become tool messages, followed by its text as a user
  message; custom tools ({name, description, input_schema}) become chat function tools; tools
  marked `defer_loading` are left out of the prompt (the harness loads them on demand);
  `thinking: {"type": "disabled"}` turns the template's thinking off;
- a finished turn onto a message object (`message_body`), and a streamed turn onto the
  Messages events (`MessagesStream`: `message_start`, `content_block_start` /
  `content_block_delta` (thinking_delta, text_delta, input_json_delta) /
  `content_block_stop`, `message_delta` with stop_reason and usage, `message_stop`).

What the proxy cannot serve is refused with `RequestError` (a 400) naming it: server tools
(web_search, code_execution, bash_/text_editor_ types, mcp), images and documents,
`mcp_servers`, `container`. Errors are answered in Anthropic's shape
({"type": "error", "error": {"type", "message"}}) by `error_body`.
Reference: Anthropic's API reference for Messages (create, streaming).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from orchard_jax.rollout.errors import RequestError
from orchard_jax.rollout.openai_protocol import ChatCompletionRequest, ChatCompletionResponse
from orchard_jax.rollout.wires.common import sse_event, validated

_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                 "abort": "end_turn"}


class MessagesRequest(BaseModel):
  """`POST /v1/messages` body (fields the proxy reads; others are accepted and ignored).

  Attributes:
    messages: {"role": "user" | "assistant" | "system", "content": str | [blocks]}.
    system: system prompt, a string or a list of text blocks.
    max_tokens: most tokens to generate (required by Anthropic's API; optional here).
    tools: custom tools {"name", "description", "input_schema"}.
    tool_choice: {"type": "auto" | "any" | "tool" | "none", "name"?}.
    thinking: {"type": "enabled" | "adaptive" | "disabled", ...}.
  """
  model_config = ConfigDict(extra="allow")

  model: str = "default"
  messages: list[Any]
  system: Optional[Union[str, list[Any]]] = None
  max_tokens: Optional[int] = Field(None, ge=1)
  stop_sequences: Optional[list[str]] = None
  temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
  top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
  top_k: Optional[int] = Field(None, ge=-1)
  stream: bool = False
  tools: Optional[list[Any]] = None
  tool_choice: Optional[dict[str, Any]] = None
  thinking: Optional[dict[str, Any]] = None
  metadata: Optional[dict[str, Any]] = None
  mcp_servers: Optional[list[Any]] = None
  container: Optional[Any] = None


def parse_request(body: bytes) -> MessagesRequest:
  """The body as a `MessagesRequest`.

  Raises:
    RequestError: not JSON, or fields of the wrong type ("messages: ...").
  """
  return validated(MessagesRequest, body)


def to_chat_request(request: MessagesRequest) -> ChatCompletionRequest:
  """The chat-completions request that renders the same prompt (module docstring).

  Raises:
    RequestError: a feature the proxy cannot serve, or a malformed message; names it.
  """
  if request.mcp_servers:
    raise RequestError("mcp_servers is not supported: the proxy connects to no MCP server; "
                       "give the harness the tools itself")
  if request.container is not None:
    raise RequestError("container is not supported: the proxy runs no code-execution container")
  messages: list[dict[str, Any]] = []
  if request.system:
    messages.append({"role": "system", "content": _text(request.system, "system")})
  for i, message in enumerate(request.messages):
    messages += _convert(message, f"messages[{i}]")
  if not messages:
    raise RequestError("messages is empty; expected at least one message")
  thinking = request.thinking if isinstance(request.thinking, dict) else {}
  tools = _tools(request.tools)
  body: dict[str, Any] = {
    "model": request.model, "messages": messages, "tools": tools or None,
    "tool_choice": _tool_choice(request.tool_choice), "max_tokens": request.max_tokens,
    "temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
    "stop": request.stop_sequences or None, "stream": request.stream,
    "chat_template_kwargs": ({"enable_thinking": False} if thinking.get("type") == "disabled"
                             else None)}
  return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def _convert(message: Any, where: str) -> list[dict[str, Any]]:
  if not isinstance(message, dict):
    raise RequestError(f"{where} is {type(message).__name__}; expected a message object")
  role, content = message.get("role"), message.get("content")
  if role not in ("user", "assistant", "system"):
    raise RequestError(f"{where}.role is {role!r}; expected user or assistant")
  if isinstance(content, str):
    return [{"role": role, "content": content}]
  if not isinstance(content, list):
    raise RequestError(f"{where}.content is {type(content).__name__}; expected a string or a "
                       "list of content blocks")
  if role == "assistant":
    return [_assistant(content, where)]
  out, texts = [], []
  for j, block in enumerate(content):
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "tool_result" and role == "user":
      tool_use_id = block.get("tool_use_id")
      if not isinstance(tool_use_id, str):
        raise RequestError(f"{where}.content[{j}] is a tool_result without a tool_use_id")
      text = _text(block.get("content"), f"{where}.content[{j}].content")
      if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
      out.append({"role": "tool", "tool_call_id": tool_use_id, "content": text})
    elif kind == "text":
      texts.append(_block_text(block, f"{where}.content[{j}]"))
    else:
      raise RequestError(f"{where}.content[{j}] has type {kind!r}; a {role} message here holds "
                         "text" + (" and tool_result blocks" if role == "user" else " blocks")
                         + " (this model reads text only)")
  if texts or not out:
    out.append({"role": role, "content": "".join(texts)})
  return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
  message: dict[str, Any] = {"role": "assistant", "content": ""}
  for j, block in enumerate(blocks):
    kind = block.get("type") if isinstance(block, dict) else None
    at = f"{where}.content[{j}]"
    if kind == "text":
      message["content"] += _block_text(block, at)
    elif kind == "thinking":
      thought = block.get("thinking")
      if not isinstance(thought, str):
        raise RequestError(f"{at} is a thinking block without a thinking string")
      message["reasoning_content"] = (message.get("reasoning_content") or "") + thought
    elif kind == "redacted_thinking":
      continue   # encrypted by another provider: no text for this model
    elif kind == "tool_use":
      name, arguments = block.get("name"), block.get("input", {})
      if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        raise RequestError(f"{at} is a tool_use block without a name and an input object")
      message.setdefault("tool_calls", []).append({
        "id": block.get("id") or f"toolu_{j}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    else:
      raise RequestError(f"{at} has type {kind!r}; an assistant message here holds text, "
                         "thinking and tool_use blocks")
  return message


def _block_text(block: dict, where: str) -> str:
  text = block.get("text")
  if not isinstance(text, str):
    raise RequestError(f"{where} is a text block without a text string")
  return text


def _text(content: Any, where: str) -> str:
  """Text of a string or a list of text blocks."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if not isinstance(content, list):
    raise RequestError(f"{where} is {type(content).__name__}; expected a string or text blocks")
  parts = []
  for j, block in enumerate(content):
    kind = block.get("type") if isinstance(block, dict) else None
    if kind != "text":
      raise RequestError(f"{where}[{j}] has type {kind!r}; expected text blocks (this model "
                         "reads text only)")
    parts.append(_block_text(block, f"{where}[{j}]"))
  return "\n\n".join(parts) if where == "system" else "".join(parts)


def _tools(tools: Optional[list[Any]]) -> list[dict[str, Any]]:
  out = []
  for i, tool in enumerate(tools or ()):
    if not isinstance(tool, dict):
      raise RequestError(f"tools[{i}] is {type(tool).__name__}; expected a tool object")
    kind = tool.get("type")
    if kind not in (None, "custom"):
      raise RequestError(f"tools[{i}] has type {kind!r}; the proxy serves custom tools only "
                         "({name, description, input_schema}); server tools are not available")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name or not isinstance(schema, dict):
      raise RequestError(f"tools[{i}] needs a name and an input_schema object")
    if tool.get("defer_loading"):
      continue
    function = {"name": name}
    if tool.get("description") is not None:
      function["description"] = tool["description"]
    function["parameters"] = schema
    out.append({"type": "function", "function": function})
  return out


def _tool_choice(choice: Optional[dict[str, Any]]) -> Any:
  if choice is None:
    return None
  kind = choice.get("type")
  if kind in ("auto", "none"):
    return kind
  if kind == "any":
    return "required"
  if kind == "tool" and isinstance(choice.get("name"), str):
    return {"type": "function", "function": {"name": choice["name"]}}
  raise RequestError(f"tool_choice {choice!r} is not supported; expected type auto, any, "
                     "tool (with a name) or none")


# ----------------------------------------------------------------------------- responses


def _new_id(prefix: str) -> str:
  return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _stop(chat: ChatCompletionResponse, stop_sequences: Optional[list[str]]
          ) -> tuple[str, Optional[str]]:
  choice = chat.choices[0]
  matched = choice.matched_stop
  if (choice.finish_reason == "stop" and isinstance(matched, str)
      and matched in (stop_sequences or ())):
    return "stop_sequence", matched
  return _STOP_REASONS.get(choice.finish_reason or "stop", "end_turn"), None


def _tool_input(arguments: str) -> dict[str, Any]:
  value = json.loads(arguments)
  return value if isinstance(value, dict) else {"value": value}


def message_body(request: MessagesRequest, chat: ChatCompletionResponse, *, model: str,
                 cached_tokens: int = 0) -> dict[str, Any]:
  """The message object of a finished (non-streamed) turn."""
  message = chat.choices[0].message
  content: list[dict[str, Any]] = []
  if message.reasoning_content:
    content.append({"type": "thinking", "thinking": message.reasoning_content, "signature": ""})
  if message.content:
    content.append({"type": "text", "text": message.content})
  for call in message.tool_calls or ():
    content.append({"type": "tool_use", "id": call.id, "name": call.function.name,
                    "input": _tool_input(call.function.arguments)})
  reason, sequence = _stop(chat, request.stop_sequences)
  return {"id": _new_id("msg"), "type": "message", "role": "assistant", "model": model,
          "content": content, "stop_reason": reason, "stop_sequence": sequence,
          "usage": {"input_tokens": chat.usage.prompt_tokens,
                    "output_tokens": chat.usage.completion_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": cached_tokens}}


def error_body(message: str, status: int) -> dict[str, Any]:
  """Anthropic's error object for an HTTP status."""
  kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
  return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesStream:
  """Server-sent events of one streamed message (see the module docstring).

  Call `open(input_tokens)` first, `delta()` for each (reasoning, content) piece as it is
  generated, then `close()` with the parsed turn, or `fail()`. Each returns SSE text.
  """

  def __init__(self, request: MessagesRequest, model: str):
    self.request = request
    self.model = model
    self.index = -1
    self.open_kind: Optional[str] = None   # "thinking" or "text": the block being streamed

  def open(self, input_tokens: int) -> str:
    message = {"id": _new_id("msg"), "type": "message", "role": "assistant",
               "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": input_tokens, "output_tokens": 0,
                         "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
    return sse_event("message_start", {"type": "message_start", "message": message})

  def _start(self, block: dict[str, Any]) -> str:
    out = self._stop_block()
    self.index += 1
    self.open_kind = block["type"]
    return out + sse_event("content_block_start", {"type": "content_block_start",
                                                   "index": self.index, "content_block": block})

  def _stop_block(self) -> str:
    if self.open_kind is None:
      return ""
    out = ""
    if self.open_kind == "thinking":
      out = sse_event("content_block_delta", {
        "type": "content_block_delta", "index": self.index,
        "delta": {"type": "signature_delta", "signature": ""}})
    self.open_kind = None
    return out + sse_event("content_block_stop", {"type": "content_block_stop",
                                                  "index": self.index})

  def delta(self, reasoning: str, content: str) -> str:
    out = []
    if reasoning:
      if self.open_kind != "thinking":
        out.append(self._start({"type": "thinking", "thinking": "", "signature": ""}))
      out.append(sse_event("content_block_delta", {
        "type": "content_block_delta", "index": self.index,
        "delta": {"type": "thinking_delta", "thinking": reasoning}}))
    if content:
      if self.open_kind != "text":
        out.append(self._start({"type": "text", "text": ""}))
      out.append(sse_event("content_block_delta", {
        "type": "content_block_delta", "index": self.index,
        "delta": {"type": "text_delta", "text": content}}))
    return "".join(out)

  def close(self, chat: ChatCompletionResponse, remainder: tuple[str, str] = ("", "")) -> str:
    """The closing events: what the parsed turn adds (`remainder`), each tool call as a
    tool_use block with its input as one input_json_delta, then message_delta and
    message_stop."""
    out = [self.delta(*remainder)]
    for call in chat.choices[0].message.tool_calls or ():
      out.append(self._start({"type": "tool_use", "id": call.id, "name": call.function.name,
                              "input": {}}))
      out.append(sse_event("content_block_delta", {
        "type": "content_block_delta", "index": self.index,
        "delta": {"type": "input_json_delta",
                  "partial_json": json.dumps(_tool_input(call.function.arguments),
                                             ensure_ascii=False)}}))
    out.append(self._stop_block())
    reason, sequence = _stop(chat, self.request.stop_sequences)
    out.append(sse_event("message_delta", {
      "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
      "usage": {"output_tokens": chat.usage.completion_tokens}}))
    out.append(sse_event("message_stop", {"type": "message_stop"}))
    return "".join(out)

  def fail(self, message: str, status: int = 500) -> str:
    """An `error` event (the stream's last)."""
    return sse_event("error", error_body(message, status))

