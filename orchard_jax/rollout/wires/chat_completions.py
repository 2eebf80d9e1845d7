"""OpenAI chat completions streamed as the turn is generated (`chat.completion.chunk` events).

The non-streamed body is `ChatCompletionResponse` itself (rollout/openai_protocol.py); this
module adds the stream: a role chunk, reasoning_content and content deltas as the engine
produces them, each tool call as one chunk once the turn is parsed, a final chunk with
finish_reason and usage, then `data: [DONE]`.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import orjson

from orchard_jax.rollout.openai_protocol import ChatCompletionResponse, _new_id


class ChatStream:
  """Server-sent events of one streamed chat completion.

  Call `open()` first, `delta()` for each (reasoning, content) piece as it is generated, then
  `close()` with the parsed turn, or `fail()`. Each returns the SSE text to send.
  """

  def __init__(self, model: str, include_usage: bool = True):
    self.base = {"id": _new_id("chatcmpl"), "object": "chat.completion.chunk",
                 "created": int(time.time()), "model": model}
    self.include_usage = include_usage

  def _chunk(self, delta: dict, finish: Optional[str] = None,
             usage: Optional[dict] = None) -> str:
    body: dict[str, Any] = {**self.base, "choices": [
      {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
      body["usage"] = usage
    return f"data: {orjson.dumps(body).decode()}\n\n"

  def open(self, input_tokens: int = 0) -> str:
    del input_tokens
    return self._chunk({"role": "assistant", "content": ""})

  def delta(self, reasoning: str, content: str) -> str:
    out = ""
    if reasoning:
      out += self._chunk({"reasoning_content": reasoning})
    if content:
      out += self._chunk({"content": content})
    return out

  def close(self, chat: ChatCompletionResponse, remainder: tuple[str, str] = ("", "")) -> str:
    choice = chat.choices[0]
    out = [self.delta(*remainder)]
    for i, call in enumerate(choice.message.tool_calls or ()):
      out.append(self._chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                              "function": call.function.model_dump()}]}))
    usage = chat.usage.model_dump() if self.include_usage else None
    out.append(self._chunk({}, finish=choice.finish_reason, usage=usage))
    out.append("data: [DONE]\n\n")
    return "".join(out)

  def fail(self, message: str, status: int = 500) -> str:
    error = {"error": {"message": message, "type": "InternalServerError"
                       if status >= 500 else "BadRequestError", "code": status}}
    return f"data: {orjson.dumps(error).decode()}\n\ndata: [DONE]\n\n"
