"""The OpenAI Responses API (`POST /v1/responses`) on top of the proxy's chat turns.

Codex CLI speaks only this wire: every call resends the whole history (`store: false`) as
`input` items, and reads the answer as a stream of typed events. This module maps

- a request onto a chat-completions request (`to_chat_request`): `instructions` and
  `developer`/`system` messages become system messages; a run of assistant-side items
  (`reasoning`, an assistant `message`, `function_call`s) becomes one assistant message with
  reasoning_content, content and tool_calls, which is the turn the proxy returned, so history
  matching sees the same messages whatever the wire; `function_call_output` becomes a tool
  message; function tools become chat tools;
- a finished turn onto a response object (`response_body`), and a streamed turn onto the
  Responses events (`ResponsesStream`: `response.created`, `response.output_item.added`,
  `response.reasoning_text.delta`, `response.output_text.delta`,
  `response.function_call_arguments.delta`, `response.output_item.done`, and
  `response.completed` or `response.incomplete` with usage).

What the proxy cannot serve is refused with `RequestError` (a 400) naming it: hosted tools
(web_search, file_search, code_interpreter, computer_use, mcp, image_generation, local_shell,
custom and namespace tools), images and files, `previous_response_id` / `conversation` /
`item_reference` (the proxy stores no responses: resend the history), background mode, n > 1.
Reference: OpenAI's API reference for Responses (create, streaming events).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from orchard_jax.rollout.errors import RequestError
from orchard_jax.rollout.openai_protocol import ChatCompletionRequest, ChatCompletionResponse
from orchard_jax.rollout.wires.common import sse_event, validated

_ASSISTANT_ITEMS = ("reasoning", "function_call")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ResponsesRequest(BaseModel):
  """`POST /v1/responses` body (fields the proxy reads; others are accepted and ignored).

  Attributes:
    input: a string (one user message) or a list of input items.
    instructions: system text placed before the input.
    tools: function tools {"type": "function", "name", "description", "parameters"}.
    max_output_tokens: most tokens to generate (the proxy's default when absent).
    reasoning: {"effort", "summary"}; effort "none" turns the template's thinking off.
  """
  model_config = ConfigDict(extra="allow")

  model: str = "default"
  input: Union[str, list[Any]]
  instructions: Optional[str] = None
  tools: Optional[list[Any]] = None
  tool_choice: Optional[Union[str, dict[str, Any]]] = None
  parallel_tool_calls: Optional[bool] = None
  stream: bool = False
  store: Optional[bool] = None
  background: Optional[bool] = None
  previous_response_id: Optional[str] = None
  conversation: Optional[Any] = None
  max_output_tokens: Optional[int] = Field(None, ge=1)
  temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
  top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
  top_logprobs: Optional[int] = Field(None, ge=0, le=20)
  reasoning: Optional[dict[str, Any]] = None
  include: Optional[list[str]] = None
  metadata: Optional[dict[str, Any]] = None
  user: Optional[str] = None
  prompt: Optional[Any] = None


def parse_request(body: bytes) -> ResponsesRequest:
  """The body as a `ResponsesRequest`.

  Raises:
    RequestError: not JSON, or fields of the wrong type ("input: ...").
  """
  return validated(ResponsesRequest, body)


def to_chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
  """The chat-completions request that renders the same prompt (module docstring).

  Raises:
    RequestError: a feature the proxy cannot serve, or a malformed item; names the item.
  """
  if request.previous_response_id:
    raise RequestError("previous_response_id is not supported: the proxy stores no responses; "
                       "send the whole history in input (store: false)")
  if request.conversation is not None:
    raise RequestError("conversation is not supported: the proxy stores no conversations; "
                       "send the whole history in input")
  if request.background:
    raise RequestError("background: true is not supported; send the request in the foreground")
  if request.prompt is not None:
    raise RequestError("prompt (a stored prompt template) is not supported; send instructions "
                       "and input instead")
  messages: list[dict[str, Any]] = []
  if request.instructions:
    messages.append({"role": "system", "content": request.instructions})
  items = ([{"type": "message", "role": "user", "content": request.input}]
           if isinstance(request.input, str) else request.input)
  messages += _messages(items)
  if not messages:
    raise RequestError("input holds no message; expected at least one input item")
  effort = (request.reasoning or {}).get("effort") if isinstance(request.reasoning, dict) else None
  body: dict[str, Any] = {
    "model": request.model, "messages": messages, "tools": _tools(request.tools) or None,
    "tool_choice": _tool_choice(request.tool_choice), "max_tokens": request.max_output_tokens,
    "temperature": request.temperature, "top_p": request.top_p, "stream": request.stream,
    "parallel_tool_calls": request.parallel_tool_calls,
    "chat_template_kwargs": {"enable_thinking": False} if effort == "none" else None}
  if request.top_logprobs:
    body.update(logprobs=True, top_logprobs=request.top_logprobs)
  return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def _messages(items: list[Any]) -> list[dict[str, Any]]:
  """Chat messages for Responses input items (a run of assistant-side items is one turn)."""
  messages: list[dict[str, Any]] = []
  turn: Optional[dict[str, Any]] = None   # the assistant turn being assembled

  def open_turn() -> dict[str, Any]:
    nonlocal turn
    if turn is None:
      turn = {"role": "assistant", "content": ""}
      messages.append(turn)
    return turn

  for i, item in enumerate(items):
    where = f"input[{i}]"
    if not isinstance(item, dict):
      raise RequestError(f"{where} is {type(item).__name__}; expected an input item object")
    kind = item.get("type", "message")
    if kind == "message":
      role = item.get("role")
      if role not in ("user", "assistant", "system", "developer"):
        raise RequestError(f"{where}.role is {role!r}; expected user, assistant, system or "
                           "developer")
      text = _content_text(item.get("content"), where)
      if role == "assistant":
        current = open_turn()
        if current.get("tool_calls"):   # text after this turn's calls starts a new turn
          turn = None
          current = open_turn()
        current["content"] += text
        continue
      turn = None
      messages.append({"role": "system" if role == "developer" else role, "content": text})
    elif kind == "reasoning":
      current = open_turn()
      if current.get("tool_calls") or current["content"]:
        turn = None
        current = open_turn()
      current["reasoning_content"] = (current.get("reasoning_content") or "") + \
        _reasoning_text(item, where)
    elif kind == "function_call":
      name, arguments = item.get("name"), item.get("arguments")
      if not isinstance(name, str) or not name or not isinstance(arguments, str):
        raise RequestError(f"{where} is a function_call without a name and arguments string")
      call_id = item.get("call_id") or item.get("id") or f"call_{i}"
      open_turn().setdefault("tool_calls", []).append(
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    elif kind == "function_call_output":
      turn = None
      call_id = item.get("call_id")
      if not isinstance(call_id, str):
        raise RequestError(f"{where} is a function_call_output without a call_id string")
      messages.append({"role": "tool", "tool_call_id": call_id,
                       "content": _content_text(item.get("output"), where + ".output")})
    elif kind == "item_reference":
      raise RequestError(f"{where} is an item_reference; the proxy stores no items: send the "
                         "item itself")
    else:
      raise RequestError(f"{where} has type {kind!r}; this proxy serves message, reasoning, "
                         "function_call and function_call_output items")
  return messages


def _content_text(content: Any, where: str) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if not isinstance(content, list):
    raise RequestError(f"{where}.content is {type(content).__name__}; expected a string or a "
                       "list of content parts")
  texts = []
  for j, part in enumerate(content):
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _TEXT_PARTS:
      raise RequestError(f"{where}.content[{j}] has type {kind!r}; this model reads text only "
                         f"(parts of type {', '.join(_TEXT_PARTS[:2])})")
    text = part.get("refusal" if kind == "refusal" else "text")
    if not isinstance(text, str):
      raise RequestError(f"{where}.content[{j}] has no text string")
    texts.append(text)
  return "".join(texts)


def _reasoning_text(item: dict, where: str) -> str:
  parts = item.get("content") or item.get("summary") or []
  if not isinstance(parts, list):
    raise RequestError(f"{where} is a reasoning item whose content is not a list")
  return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def _tools(tools: Optional[list[Any]]) -> list[dict[str, Any]]:
  out = []
  for i, tool in enumerate(tools or ()):
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
      raise RequestError(
        f"tools[{i}] has type {kind!r}; the proxy serves function tools only (hosted tools "
        "such as web_search, and custom or namespace tools, are not available): turn them off "
        "in the harness")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
      raise RequestError(f"tools[{i}] is a function tool without a name")
    function = {"name": name}
    if tool.get("description") is not None:
      function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    out.append({"type": "function", "function": function})
  return out


def _tool_choice(choice: Any) -> Any:
  if choice is None or isinstance(choice, str):
    return choice
  if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
    return {"type": "function", "function": {"name": choice["name"]}}
  raise RequestError(f"tool_choice {choice!r} is not supported; expected 'auto', 'none', "
                     "'required' or {'type': 'function', 'name': ...}")


# ----------------------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
  return f"{prefix}_{uuid.uuid4().hex}"


def _usage(chat: ChatCompletionResponse, cached: int = 0) -> dict[str, Any]:
  u = chat.usage
  return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
          "output_tokens": u.completion_tokens,
          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": u.total_tokens}


def _status(finish_reason: Optional[str]) -> tuple[str, Optional[dict]]:
  if finish_reason == "length":
    return "incomplete", {"reason": "max_output_tokens"}
  if finish_reason == "abort":
    return "incomplete", {"reason": "aborted"}
  return "completed", None


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
  return {"id": item_id, "type": "reasoning", "summary": [],
          "content": [{"type": "reasoning_text", "text": text}], "status": status}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
  return {"id": item_id, "type": "message", "role": "assistant", "status": status,
          "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call: Any, status: str = "completed", arguments: Optional[str] = None
               ) -> dict[str, Any]:
  return {"id": new_id("fc"), "type": "function_call", "status": status, "call_id": call.id,
          "name": call.function.name,
          "arguments": call.function.arguments if arguments is None else arguments}


def _shell(request: ResponsesRequest, response_id: str, created_at: int, model: str
           ) -> dict[str, Any]:
  return {"id": response_id, "object": "response", "created_at": created_at,
          "status": "in_progress", "model": model, "output": [],
          "parallel_tool_calls": request.parallel_tool_calls is not False,
          "tool_choice": request.tool_choice or "auto", "tools": request.tools or [],
          "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
          "temperature": request.temperature, "top_p": request.top_p,
          "previous_response_id": None, "store": False, "metadata": request.metadata or {},
          "error": None, "incomplete_details": None, "usage": None}


def response_body(request: ResponsesRequest, chat: ChatCompletionResponse, *, model: str,
                  cached_tokens: int = 0) -> dict[str, Any]:
  """The response object of a finished (non-streamed) turn."""
  message, finish = chat.choices[0].message, chat.choices[0].finish_reason
  output = []
  if message.reasoning_content:
    output.append(_reasoning_item(new_id("rs"), message.reasoning_content))
  if message.content:
    output.append(_message_item(new_id("msg"), message.content))
  output += [_call_item(c) for c in message.tool_calls or ()]
  status, details = _status(finish)
  body = _shell(request, new_id("resp"), chat.created, model)
  body.update(status=status, incomplete_details=details, output=output,
              usage=_usage(chat, cached_tokens))
  return body


class ResponsesStream:
  """Server-sent events of one streamed response (see the module docstring).

  Call `open()` first, `delta()` for each (reasoning, content) piece as it is generated,
  then `close()` with the parsed turn, or `fail()`. Each returns the SSE text to send.
  """

  def __init__(self, request: ResponsesRequest, model: str):
    self.request = request
    self.response_id = new_id("resp")
    self.shell = _shell(request, self.response_id, int(time.time()), model)
    self.sequence = 0
    self.output: list[dict[str, Any]] = []
    self.reasoning: Optional[dict[str, Any]] = None    # open items: id, index, text
    self.message: Optional[dict[str, Any]] = None

  def _event(self, kind: str, **fields: Any) -> str:
    data = {"type": kind, "sequence_number": self.sequence, **fields}
    self.sequence += 1
    return sse_event(kind, data)

  def open(self, input_tokens: int = 0) -> str:
    del input_tokens
    return (self._event("response.created", response=self.shell)
            + self._event("response.in_progress", response=self.shell))

  def delta(self, reasoning: str, content: str) -> str:
    out = []
    if reasoning:
      if self.reasoning is None:
        self.reasoning = {"id": new_id("rs"), "index": len(self.output), "text": ""}
        self.output.append({})
        out.append(self._event("response.output_item.added", output_index=self.reasoning["index"],
                               item=_reasoning_item(self.reasoning["id"], "", "in_progress")))
      self.reasoning["text"] += reasoning
      out.append(self._event("response.reasoning_text.delta", item_id=self.reasoning["id"],
                             output_index=self.reasoning["index"], content_index=0,
                             delta=reasoning))
    if content:
      out.append(self._close_reasoning())
      if self.message is None:
        self.message = {"id": new_id("msg"), "index": len(self.output), "text": ""}
        self.output.append({})
        out.append(self._event("response.output_item.added", output_index=self.message["index"],
                               item={**_message_item(self.message["id"], "", "in_progress"),
                                     "content": []}))
        out.append(self._event("response.content_part.added", item_id=self.message["id"],
                               output_index=self.message["index"], content_index=0,
                               part={"type": "output_text", "text": "", "annotations": []}))
      self.message["text"] += content
      out.append(self._event("response.output_text.delta", item_id=self.message["id"],
                             output_index=self.message["index"], content_index=0,
                             delta=content, logprobs=[]))
    return "".join(out)

  def _close_reasoning(self) -> str:
    if self.reasoning is None or self.output[self.reasoning["index"]]:
      return ""
    r = self.reasoning
    item = _reasoning_item(r["id"], r["text"])
    self.output[r["index"]] = item
    return (self._event("response.reasoning_text.done", item_id=r["id"], output_index=r["index"],
                        content_index=0, text=r["text"])
            + self._event("response.output_item.done", output_index=r["index"], item=item))

  def _close_message(self) -> str:
    if self.message is None or self.output[self.message["index"]]:
      return ""
    m = self.message
    item = _message_item(m["id"], m["text"])
    self.output[m["index"]] = item
    part = item["content"][0]
    return (self._event("response.output_text.done", item_id=m["id"], output_index=m["index"],
                        content_index=0, text=m["text"], logprobs=[])
            + self._event("response.content_part.done", item_id=m["id"],
                          output_index=m["index"], content_index=0, part=part)
            + self._event("response.output_item.done", output_index=m["index"], item=item))

  def close(self, chat: ChatCompletionResponse, remainder: tuple[str, str] = ("", ""),
            cached_tokens: int = 0) -> str:
    """The closing events: what the parsed turn adds (`remainder`), the open items' done
    events, each tool call as one item, then `response.completed` (or `.incomplete`)."""
    out = [self.delta(*remainder), self._close_reasoning(), self._close_message()]
    message = chat.choices[0].message
    for call in message.tool_calls or ():
      index = len(self.output)
      item = _call_item(call)
      self.output.append(item)
      out.append(self._event("response.output_item.added", output_index=index,
                             item={**item, "status": "in_progress", "arguments": ""}))
      out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                             output_index=index, delta=item["arguments"]))
      out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                             output_index=index, arguments=item["arguments"]))
      out.append(self._event("response.output_item.done", output_index=index, item=item))
    status, details = _status(chat.choices[0].finish_reason)
    final = {**self.shell, "status": status, "incomplete_details": details,
             "output": self.output, "usage": _usage(chat, cached_tokens)}
    out.append(self._event(f"response.{status}", response=final))
    return "".join(out)

  def fail(self, message: str, status: int = 500) -> str:
    """A `response.failed` event (the stream's last)."""
    code = "invalid_request_error" if status == 400 else "server_error"
    final = {**self.shell, "status": "failed", "output": [o for o in self.output if o],
             "error": {"code": code, "message": message}}
    return self._event("response.failed", response=final)

