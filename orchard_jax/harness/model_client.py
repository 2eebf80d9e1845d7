"""A chat-completions client for any OpenAI-compatible base URL (the recording proxy, SGLang,
the embedded engine), over httpx.

The harness reaches its model only this way (docs/contracts.md "Model access from harnesses"), so
every call passes through the proxy, which records token ids and log-probs as sampled.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

import httpx

from orchard_jax.harness.errors import ModelCallError


# Message keys sent upstream: OpenAI chat format (harness-only keys such as "extra" stay local).
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")


@dataclasses.dataclass
class ChatResponse:
  """One completion: the text, why it stopped, token usage, and the raw JSON body.

  Attributes:
    content: the assistant's text ("" when none).
    finish_reason: "stop", "length", "tool_calls", ...
    usage: the body's usage object.
    raw: the whole JSON body.
    tool_calls: the assistant's tool calls in OpenAI form ({id, type, function: {name,
      arguments (JSON text)}}), [] when none.
    message: the assistant message as returned (role, content, tool_calls,
      reasoning_content): what a harness appends to its history and sends back next call.
  """
  content: str
  finish_reason: str
  usage: dict
  raw: dict
  tool_calls: list = dataclasses.field(default_factory=list)
  message: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def of_tool_call(cls, name: str, arguments: Any) -> "ChatResponse":
    """The reply a server gives for one call of tool `name` with `arguments` (JSON-encoded
    here), under a fresh call id: what scripted experts answer."""
    call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
    return cls("", "tool_calls", {}, {}, [call],
               {"role": "assistant", "content": None, "tool_calls": [call]})

  @classmethod
  def of_text(cls, text: str) -> "ChatResponse":
    """The reply a server gives for a final text answer."""
    return cls(text, "stop", {}, {}, [], {"role": "assistant", "content": text})


class ChatModel:
  """POSTs `{base_url}/chat/completions`; a context manager that owns its HTTP connection pool.

  Args:
    base_url: ends in `/v1`, e.g. `http://127.0.0.1:8000/sessions/abc/v1`.
    model: the `model` field of each request.
    api_key: sent as a bearer token if given.
    temperature, max_tokens, top_p: sampling parameters sent with each request.
    seed: sent as the request's `seed` (engines that honour it sample reproducibly).
    timeout_s: per-request timeout in seconds.
    retries: extra attempts after a connection error or a 5xx answer (1 s, 2 s, 4 s... apart).
  """

  def __init__(self, base_url: str, model: str = "default", *, api_key: str | None = None,
               temperature: float = 0.0, max_tokens: int | None = None, top_p: float | None = None,
               seed: int | None = None, timeout_s: float = 300.0, retries: int = 2):
    self.base_url = base_url.rstrip("/")
    self.model = model
    self.sampling = {"temperature": temperature}
    if max_tokens is not None:
      self.sampling["max_tokens"] = max_tokens
    if top_p is not None:
      self.sampling["top_p"] = top_p
    if seed is not None:
      self.sampling["seed"] = seed
    self.retries = retries
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    self._client = httpx.Client(timeout=timeout_s, headers=headers)
    self.calls = 0

  def __enter__(self) -> "ChatModel":
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    self._client.close()

  def complete(self, messages: list[dict], *, tools: list[dict] | None = None) -> ChatResponse:
    """Sends the chat and returns the first choice.

    Args:
      messages: OpenAI chat messages; only their role, content, tool_calls, tool_call_id,
        name and reasoning_content are sent.
      tools: OpenAI function tools offered to the model (sent as `tools`), or None.
    Raises:
      ModelCallError: the endpoint is unreachable after the retries, answers non-2xx, or the
        body has no choices (the message quotes what came back).
    """
    body = {"model": self.model, "messages": [{k: m[k] for k in _MESSAGE_KEYS if k in m}
                                              for m in messages], **self.sampling}
    if tools:
      body["tools"] = tools
    url = f"{self.base_url}/chat/completions"
    for attempt in range(self.retries + 1):
      try:
        response = self._client.post(url, json=body)
      except httpx.TransportError as e:
        if attempt == self.retries:
          raise ModelCallError(f"POST {url} failed after {attempt + 1} attempts: {e!r}") from e
        time.sleep(2 ** attempt)
        continue
      if response.status_code >= 500 and attempt < self.retries:
        time.sleep(2 ** attempt)
        continue
      break
    if response.status_code // 100 != 2:
      raise ModelCallError(f"POST {url} answered {response.status_code}: {response.text[:500]}")
    try:
      data = response.json()
      choice = data["choices"][0]
      message = dict(choice["message"])
      content = message.get("content") or ""
      tool_calls = list(message.get("tool_calls") or [])
    except (ValueError, KeyError, IndexError, TypeError) as e:
      raise ModelCallError(f"POST {url}: expected an OpenAI chat completion, got "
                           f"{response.text[:500]!r}") from e
    self.calls += 1
    message["role"] = "assistant"
    return ChatResponse(content, choice.get("finish_reason") or "", data.get("usage") or {}, data,
                        tool_calls=tool_calls,
                        message={k: message.get(k) for k in _MESSAGE_KEYS
                                 if k in ("role", "content") or message.get(k) is not None})
