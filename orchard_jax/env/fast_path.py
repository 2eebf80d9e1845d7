"""The exec fast path: `POST /v1/sandboxes/{id}/exec` answered without FastAPI's per-request
machinery, for the requests that machinery would accept.

Running a command is the service's hot path (an agent's every tool call, every test run of an
RL rollout), and a short command's round trip is a few milliseconds, of which FastAPI's routing
through every route, dependency resolution, body handling and response encoding took about a
fifth. This ASGI middleware sits inside the service's body limit and answers a request itself
only when all of these hold:

- POST to exactly `/v1/sandboxes/{id}/exec` (no root path, no trailing slash);
- an `X-API-Key` header naming a key the service accepts (the first such header, as FastAPI
  reads it);
- a `Content-Type` of `application/json` (parameters such as a charset allowed) and a
  non-empty body that `json.loads` parses into a valid `api.Exec` (validated in Python mode
  from the parsed JSON, as FastAPI validates a body model).

Everything else is handed, with the body replayed, to the FastAPI route, which gives the same
401, 403, 422 and every other answer it always has. Past those checks the two paths run the same
code: `SandboxManager.exec` with the key's principal (tenancy included), EnvErrors as the
service's JSON errors with their status, the job record through Starlette's JSONResponse.
"""
import json
import re
from typing import Optional

from starlette import responses

from orchard_jax.env import api as _api
from orchard_jax.env import tenants as _tenants
from orchard_jax.env.errors import EnvError

_EXEC_PATH = re.compile(r"/v1/sandboxes/([^/]+)/exec")


def _json_content_type(value: Optional[bytes]) -> bool:
  if value is None:
    return False
  media_type = value.split(b";", 1)[0].strip().lower()
  return media_type == b"application/json"


class ExecFastPath:
  """ASGI middleware answering well-formed, authorised exec requests directly (see the module).

  Args:
    app: the rest of the application (every other request goes there unchanged).
    manager: the service's SandboxManager.
    tenants: the keys the service accepts.
  Attributes:
    served: how many requests this path answered itself (the rest went to `app`).
  """

  def __init__(self, app, manager, tenants: _tenants.Tenants):
    self.app, self.manager, self.tenants = app, manager, tenants
    self.served = 0

  async def __call__(self, scope, receive, send):
    if (scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path")):
      return await self.app(scope, receive, send)
    match = _EXEC_PATH.fullmatch(scope["path"])
    if match is None:
      return await self.app(scope, receive, send)
    key = content_type = None
    for name, value in scope["headers"]:
      if name == b"x-api-key" and key is None:
        key = value
      elif name == b"content-type" and content_type is None:
        content_type = value
    principal = self.tenants.lookup(key.decode("latin-1")) if key else None
    if principal is None or not _json_content_type(content_type):
      return await self.app(scope, receive, send)
    chunks, more = [], True
    while more:
      message = await receive()
      if message["type"] != "http.request":   # the client went away: let the app see it
        return await self.app(scope, _replay(b"".join(chunks), receive, message), send)
      chunks.append(message.get("body", b""))
      more = message.get("more_body", False)
    body = b"".join(chunks)
    try:
      request = _api.Exec.model_validate(json.loads(body)) if body else None
    except Exception:  # noqa: BLE001 - any refusal (422, 400, ...) is the route's to give
      request = None
    if request is None:
      return await self.app(scope, _replay(body, receive), send)
    self.served += 1
    try:
      answer, status = await self.manager.exec(match.group(1), request, principal), 200
    except EnvError as e:
      answer, status = e.to_json(), e.status_code
    await responses.JSONResponse(answer, status_code=status)(scope, receive, send)


def _replay(body: bytes, receive, then=None):
  """An ASGI `receive` giving `body` as the whole request, then `then` (if given) or whatever
  the connection says next (a disconnect)."""
  replayed = False

  async def replay():
    nonlocal replayed
    if not replayed:
      replayed = True
      return {"type": "http.request", "body": body, "more_body": False}
    if then is not None:
      return then
    return await receive()
  return replay
