"""What every wire module shares: request validation into a 400, and server-sent events."""
from __future__ import annotations

from typing import Any, TypeVar

import orjson
import pydantic

from orchard_jax.rollout.errors import RequestError, validation_message

_Model = TypeVar("_Model", bound=pydantic.BaseModel)


def validated(model: type[_Model], body: bytes) -> _Model:
  """`body` (JSON bytes) validated as `model`.

  Raises:
    RequestError: not JSON, or invalid fields; the message names each ("input: ...").
  """
  try:
    return model.model_validate_json(body)
  except pydantic.ValidationError as e:
    raise RequestError(validation_message(e.errors())) from None


def sse_event(event: str, data: Any) -> str:
  """One server-sent event with an `event:` line (the Responses and Messages streams)."""
  return f"event: {event}\ndata: {orjson.dumps(data).decode()}\n\n"
