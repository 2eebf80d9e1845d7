"""A request body read at most a set number of bytes far: the limit of the rollout room's HTTP
services (the inference server, the recording proxy).

Both are reached by code the trainer does not control (a harness, model-written code in a
sandbox, any client on the network), and both parse and tokenise a body whole. Without a bound,
one caller's 300 MB body grew the proxy by ~10 GB while it was parsed, and slowed every other
caller's requests meanwhile. A body over the limit is refused before it is parsed, whether its
Content-Length announced it (refused before one byte is read) or it arrives chunked (refused
as soon as the bytes read pass the limit); the connection stays usable for the next request.

`read_body` is the one implementation; `BodyLimit` is the same as ASGI middleware for an app
whose routes read the body themselves (FastAPI's).
"""
from __future__ import annotations

from typing import Any, Callable

from starlette.requests import ClientDisconnect

MAX_REQUEST_BYTES = 64 << 20   # the services' default: far above any context a policy reads


class BodyTooLarge(Exception):
  """A request body over its service's limit (answered 413 Content Too Large, RFC 9110 15.5.14).

  Attributes:
    seen: bytes known so far: the announced Content-Length, or a lower bound (`partial`).
    limit: the largest body accepted, in bytes.
    partial: whether more bytes were on their way when the body was refused.
  """

  def __init__(self, seen: int, limit: int, setting: str, *, partial: bool):
    self.seen, self.limit, self.partial = seen, limit, partial
    super().__init__(f"request body of {seen}{'+' if partial else ''} bytes exceeds the limit "
                     f"of {limit} bytes ({setting})")


def check_limit(limit: int, setting: str) -> int:
  """`limit`, checked to be a whole number of bytes >= 1; ValueError naming `setting` else."""
  if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
    raise ValueError(f"{setting} must be a whole number of bytes >= 1; got {limit!r}")
  return limit


async def read_body(scope: dict, receive: Callable, limit: int, *, setting: str) -> bytes:
  """The HTTP request's body, read from the ASGI `receive` at most `limit` bytes far.

  Args:
    scope: the ASGI HTTP scope (its `content-length` header is checked first).
    receive: the ASGI receive callable.
    limit: the largest body accepted, in bytes.
    setting: what sets the limit, named in the error (e.g. "InferenceServer max_request_bytes").
  Returns:
    The body's bytes.
  Raises:
    BodyTooLarge: the announced Content-Length, or the bytes arrived so far, exceed `limit`.
    ClientDisconnect: the caller went away before the body was complete.
  """
  length = next((value for name, value in scope["headers"] if name == b"content-length"), b"")
  if length.isdigit() and int(length) > limit:
    raise BodyTooLarge(int(length), limit, setting, partial=False)
  chunks, total = [], 0
  while True:
    message = await receive()
    if message["type"] != "http.request":
      raise ClientDisconnect()
    chunk = message.get("body", b"")
    total += len(chunk)
    more = message.get("more_body", False)
    if total > limit:
      raise BodyTooLarge(total, limit, setting, partial=more)
    chunks.append(chunk)
    if not more:
      return b"".join(chunks)


def replayed(body: bytes, receive: Callable) -> Callable:
  """An ASGI `receive` giving `body` as the whole request, then what the connection says
  (a later `http.disconnect`), for an app called after the body was read."""
  sent = False

  async def replay() -> dict:
    nonlocal sent
    if not sent:
      sent = True
      return {"type": "http.request", "body": body, "more_body": False}
    return await receive()
  return replay


class BodyLimit:
  """ASGI middleware: every HTTP request's body is read through `read_body` before `app` sees
  it; a body over `limit` is answered by `refuse(message)` (an ASGI app, e.g. a JSONResponse
  with status 413) and never reaches `app`.

  Args:
    app: the ASGI app.
    limit: the largest body accepted, in bytes (>= 1).
    setting: what sets the limit, named in the error message.
    refuse: message -> the ASGI app that answers a body over the limit.
  Raises:
    ValueError: `limit` is not a whole number >= 1.
  """

  def __init__(self, app: Any, *, limit: int, setting: str, refuse: Callable[[str], Any]):
    self.app, self.limit = app, check_limit(limit, setting)
    self.setting, self.refuse = setting, refuse

  async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    try:
      body = await read_body(scope, receive, self.limit, setting=self.setting)
    except ClientDisconnect:
      return
    except BodyTooLarge as e:
      return await self.refuse(str(e))(scope, receive, send)
    return await self.app(scope, replayed(body, receive), send)
