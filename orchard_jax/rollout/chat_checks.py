"""Shape checks of a chat before this project renders it: messages, content parts, tool calls,
tools and tool_choice in OpenAI's chat-completions form.

Every route that renders a chat with the policy's chat template calls `check_chat` on the
request's messages first: the engine's `/v1/chat/completions`, the recording proxy in front of a
token-level upstream, and any other wire the proxy serves once it has turned its request into
chat messages (Responses, Messages). A malformed shape is a `RequestError` naming the field by
its path (`messages[2].tool_calls[0].function`), what was expected and what was seen, which the
servers answer with HTTP 400; it never reaches the template (where it was a 500, or was dropped
silently) or the engine's batch.

Content parts are checked by type through `CONTENT_PART_CHECKS` (parts of type "text"); a
vision-language policy's routes pass `images=True`, which also accepts "image_url" parts
({"type": "image_url", "image_url": {"url": "data:image/png;base64,..." or a file path}}) and
Qwen3-VL's "image" parts ({"type": "image", "image": ...}); the image itself is read later
(data.images), where a bad one is a 400 too.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from orchard_jax.rollout.errors import RequestError

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
_SEEN_LIMIT = 80


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= _SEEN_LIMIT else text[:_SEEN_LIMIT] + "..."


def _seen(value: Any) -> str:
  """What was seen, for an error message: the type and a short repr."""
  return f"{type(value).__name__} {_short(value)}"


def _fail(where: str, expected: str, value: Any) -> None:
  raise RequestError(f"{where}: expected {expected}, got {_seen(value)}")


def _check_text_part(where: str, part: dict) -> None:
  if not isinstance(part.get("text"), str):
    _fail(f"{where}.text", "a string", part.get("text"))


def _check_image_part(where: str, part: dict) -> None:
  key = "image_url" if part.get("type") == "image_url" else "image"
  value = part.get(key)
  url = value.get("url") if isinstance(value, dict) else value
  if not isinstance(url, str) or not url:
    _fail(f"{where}.{key}" + (".url" if isinstance(value, dict) else ""),
          "an image: a data URL 'data:image/png;base64,...' or a file path", url)


# Content part type -> check(where, part). Parts of other types are refused: the text-only chat
# template would drop them silently.
CONTENT_PART_CHECKS: dict[str, Callable[[str, dict], None]] = {"text": _check_text_part}
IMAGE_PART_CHECKS: dict[str, Callable[[str, dict], None]] = {"image_url": _check_image_part,
                                                             "image": _check_image_part}


def check_content(where: str, content: Any, *, optional: bool, images: bool = False) -> None:
  """A message's content: a string, a list of parts, or (when optional) None; with images,
  image parts are accepted too (module docstring).

  Raises:
    RequestError: another type, a part that is not an object with a known "type" (a bare
      string part counts as text), or a part whose fields do not fit its type.
  """
  if content is None:
    if not optional:
      _fail(where, "a string or a list of content parts", content)
    return
  if isinstance(content, str):
    return
  if not isinstance(content, list):
    _fail(where, "a string or a list of content parts" + (" or null" if optional else ""),
          content)
  for j, part in enumerate(content):
    if isinstance(part, str):
      continue
    if not isinstance(part, dict):
      _fail(f"{where}[{j}]", "a content part object {'type': 'text', 'text': ...}", part)
    kind = part.get("type")
    checks = {**CONTENT_PART_CHECKS, **IMAGE_PART_CHECKS} if images else CONTENT_PART_CHECKS
    check = checks.get(kind) if isinstance(kind, str) else None
    if check is None:
      reads = "text and images" if images else "text only"
      raise RequestError(
        f"{where}[{j}] has type {kind!r}; this model reads {reads} (parts of type "
        f"{sorted(checks)})")
    check(f"{where}[{j}]", part)


def check_tool_call(where: str, call: Any) -> None:
  """An assistant message's tool call: {"id"?, "type"?: "function", "function": {"name",
  "arguments"}} with a non-empty name and arguments given as a JSON text or an object.

  Raises:
    RequestError: naming the part of the call that does not fit.
  """
  if not isinstance(call, dict):
    _fail(where, "a tool call object {'type': 'function', 'function': {...}}", call)
  if call.get("type", "function") != "function":
    _fail(f"{where}.type", "'function'", call.get("type"))
  if "id" in call and call["id"] is not None and not isinstance(call["id"], str):
    _fail(f"{where}.id", "a string", call["id"])
  function = call.get("function")
  if not isinstance(function, dict):
    _fail(f"{where}.function", "an object {'name': ..., 'arguments': ...}", function)
  name = function.get("name")
  if not isinstance(name, str) or not name:
    _fail(f"{where}.function.name", "a non-empty string", name)
  arguments = function.get("arguments", "{}")
  if not isinstance(arguments, (str, dict)):
    _fail(f"{where}.function.arguments", "a JSON object as text (or an object)", arguments)


def check_messages(messages: Any, *, field: str = "messages", images: bool = False) -> None:
  """Every message of a chat (see the module docstring).

  A message is an object with a role in ROLES; content is a string or a list of parts (null is
  allowed on an assistant message); an assistant message may carry tool_calls (a list of tool
  calls) and reasoning_content (a string); a tool message's tool_call_id and any message's name
  are strings. Other keys (a harness's own, such as "extra") are not rendered and not checked.

  Raises:
    RequestError: the first field that does not fit, by its path.
  """
  if not isinstance(messages, list) or not messages:
    _fail(field, "a non-empty list of messages", messages)
  for i, message in enumerate(messages):
    where = f"{field}[{i}]"
    if not isinstance(message, dict):
      _fail(where, "a message object {'role': ..., 'content': ...}", message)
    role = message.get("role")
    if role not in ROLES:
      raise RequestError(f"{where}.role is {role!r}; expected one of {ROLES}")
    assistant = role == "assistant"
    check_content(f"{where}.content", message.get("content"), optional=assistant, images=images)
    for key in ("name", "tool_call_id", "reasoning_content"):
      value = message.get(key)
      if value is not None and not isinstance(value, str):
        _fail(f"{where}.{key}", "a string", value)
    calls = message.get("tool_calls")
    if calls is None:
      continue
    if not assistant:
      raise RequestError(f"{where}.tool_calls: only assistant messages carry tool calls; this "
                         f"message has role {role!r}")
    if not isinstance(calls, list):
      _fail(f"{where}.tool_calls", "a list of tool calls", calls)
    for j, call in enumerate(calls):
      check_tool_call(f"{where}.tool_calls[{j}]", call)


def check_tools(tools: Any, *, field: str = "tools") -> None:
  """OpenAI function tools: [{"type": "function", "function": {"name", "description"?,
  "parameters"?: a JSON schema object}}].

  Raises:
    RequestError: naming the tool and the field that does not fit.
  """
  if tools is None:
    return
  if not isinstance(tools, list):
    _fail(field, "a list of tools", tools)
  for i, tool in enumerate(tools):
    function = tool.get("function") if isinstance(tool, dict) else None
    if not (isinstance(tool, dict) and tool.get("type", "function") == "function"
            and isinstance(function, dict) and isinstance(function.get("name"), str)
            and function["name"]):
      raise RequestError(f"{field}[{i}] is {_short(tool)}; expected an OpenAI function tool "
                         "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")
    if function.get("description") is not None and not isinstance(function["description"], str):
      _fail(f"{field}[{i}].function.description", "a string", function["description"])
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
      _fail(f"{field}[{i}].function.parameters", "a JSON schema object", parameters)
    properties = (parameters or {}).get("properties")
    if properties is not None and not isinstance(properties, dict):
      _fail(f"{field}[{i}].function.parameters.properties", "an object of parameter schemas",
            properties)


def check_tool_choice(tool_choice: Any, tools: Optional[Sequence[dict]], *,
                      field: str = "tool_choice") -> None:
  """"none", "auto", "required", or {"type": "function", "function": {"name": a tool's name}}.

  Raises:
    RequestError: another value, or a named tool that is not among `tools`.
  """
  if tool_choice is None or tool_choice in TOOL_CHOICES:
    return
  if isinstance(tool_choice, str):
    _fail(field, f"one of {TOOL_CHOICES} or a named function", tool_choice)
  function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
  name = function.get("name") if isinstance(function, dict) else None
  if not isinstance(name, str):
    _fail(field, "{'type': 'function', 'function': {'name': ...}}", tool_choice)
  names = [t["function"]["name"] for t in tools or ()]
  if name not in names:
    raise RequestError(f"{field} names the function {name!r}; the request's tools are {names}")


def check_chat(messages: Any, tools: Any = None, tool_choice: Any = None,
               chat_template_kwargs: Any = None, *, images: bool = False) -> None:
  """Everything of a chat the chat template reads (see the module docstring); images: the
  policy reads image parts.

  Raises:
    RequestError: the first field that does not fit, by its path.
  """
  check_messages(messages, images=images)
  check_tools(tools)
  check_tool_choice(tool_choice, tools)
  if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
    _fail("chat_template_kwargs", "an object of template variables", chat_template_kwargs)
