"""The wires the proxy serves, each as parse / body / stream / error functions.

A `Wire` is what `RecordingProxy` needs to serve one API on top of its chat turns: turn the
body into a chat-completions request (plus the wire's own request, for the answer), turn a
finished turn into the wire's response body, open the wire's event stream, and answer an
error in the wire's shape. `WIRES` maps the path after `/sessions/{id}/v1/` to its wire.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

import orjson
from starlette.responses import Response

from orchard_jax.rollout.errors import RequestError, validation_message
from orchard_jax.rollout.openai_protocol import ChatCompletionRequest, ChatCompletionResponse
from orchard_jax.rollout.wires import anthropic_messages, responses_api
from orchard_jax.rollout.wires.chat_completions import ChatStream


class Stream(Protocol):
  """One streamed answer's events (`ChatStream`, `ResponsesStream`, `MessagesStream`)."""

  def open(self, input_tokens: int = 0) -> str: ...
  def delta(self, reasoning: str, content: str) -> str: ...
  def close(self, chat: ChatCompletionResponse, remainder: tuple[str, str] = ("", "")) -> str: ...
  def fail(self, message: str, status: int = 500) -> str: ...


@dataclasses.dataclass(frozen=True)
class Wire:
  """One API served on the proxy's chat turns.

  Attributes:
    name: recorded in each ModelCall's metadata ("chat_completions", "responses", "messages").
    parse: JSON body -> (chat request, the wire's own request); raises RequestError.
    body: (wire request, finished turn, model name) -> the non-streamed response body (bytes).
    stream: (wire request, model name) -> a `Stream` for this answer.
    error: (message, HTTP status) -> the error response in the wire's shape.
  """
  name: str
  parse: Callable[[bytes], tuple[ChatCompletionRequest, Any]]
  body: Callable[[Any, ChatCompletionResponse, str], bytes]
  stream: Callable[[Any, str], Stream]
  error: Callable[[str, int], Response]


def _openai_error(message: str, status: int) -> Response:
  kind = ("BadRequestError" if status == 400 else "RequestTooLargeError" if status == 413
          else "UpstreamError" if status == 502
          else "ServiceUnavailableError" if status == 503 else "InternalServerError")
  return Response(orjson.dumps({"object": "error", "message": message, "type": kind,
                                "param": None, "code": status}),
                  status_code=status, media_type="application/json")


def _responses_error(message: str, status: int) -> Response:
  kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
  return Response(orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                          "code": kind}}),
                  status_code=status, media_type="application/json")


def _anthropic_error(message: str, status: int) -> Response:
  return Response(orjson.dumps(anthropic_messages.error_body(message, status)),
                  status_code=status, media_type="application/json")


def _parse_chat(body: bytes) -> tuple[ChatCompletionRequest, Any]:
  try:
    request = ChatCompletionRequest.model_validate_json(body)
  except ValueError as e:   # pydantic.ValidationError
    raise RequestError(validation_message(e.errors())) from None  # type: ignore[attr-defined]
  return request, request


def _parse_responses(body: bytes) -> tuple[ChatCompletionRequest, Any]:
  request = responses_api.parse_request(body)
  return responses_api.to_chat_request(request), request


def _parse_messages(body: bytes) -> tuple[ChatCompletionRequest, Any]:
  request = anthropic_messages.parse_request(body)
  return anthropic_messages.to_chat_request(request), request


def _chat_stream(request: ChatCompletionRequest, model: str) -> Stream:
  options = request.stream_options or {}
  return ChatStream(model, include_usage=options.get("include_usage", True) is not False)


CHAT = Wire("chat_completions", _parse_chat,
            lambda request, chat, model: chat.model_dump_json(exclude_none=True).encode(),
            _chat_stream, _openai_error)
RESPONSES = Wire("responses", _parse_responses,
                 lambda request, chat, model: orjson.dumps(
                   responses_api.response_body(request, chat, model=model)),
                 lambda request, model: responses_api.ResponsesStream(request, model),
                 _responses_error)
MESSAGES = Wire("messages", _parse_messages,
                lambda request, chat, model: orjson.dumps(
                  anthropic_messages.message_body(request, chat, model=model)),
                lambda request, model: anthropic_messages.MessagesStream(request, model),
                _anthropic_error)
WIRES = {"chat/completions": CHAT, "responses": RESPONSES, "messages": MESSAGES}
