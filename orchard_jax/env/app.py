"""The REST service (FastAPI): routes over a SandboxManager, X-API-Key auth, metrics.

Routes (all under /v1 need the `X-API-Key` header: 401 when missing, 403 when wrong). A
sandbox belongs to the tenant of the key that created it; for any other tenant's key every
route naming it answers 404 as if it did not exist, and listings leave it out (admin keys see
all; see orchard_jax.env.tenants):

| method and path | what |
| --- | --- |
| POST /v1/sandboxes | create (body: api.CreateSandbox) -> sandbox, 201 |
| GET /v1/sandboxes?label=k=v | list |
| GET /v1/sandboxes/{id} | get |
| POST /v1/sandboxes/{id}/wait?timeout=s | wait until ready (server side) |
| DELETE /v1/sandboxes/{id} | delete |
| POST /v1/sandboxes/{id}/heartbeat | keep alive (heartbeat_timeout) |
| POST /v1/sandboxes/{id}/exec | run a command as a job (body: api.Exec) -> job |
| GET /v1/sandboxes/{id}/jobs[/{job}] | list jobs / get one |
| POST /v1/sandboxes/{id}/jobs/{job}/wait?timeout=s | wait for a job (returns it running at timeout) |
| POST /v1/sandboxes/{id}/jobs/{job}/cancel | kill a job's process tree |
| PUT /v1/sandboxes/{id}/files?path=&mode=644 | upload raw bytes |
| GET /v1/sandboxes/{id}/files?path= | download raw bytes |
| GET /v1/sandboxes/{id}/files/list?path= | list a folder |
| POST /v1/sandboxes/{id}/patch | apply a unified diff (body: api.Patch) |
| GET /v1/sandboxes/{id}/stats | resource usage |
| POST/GET /v1/sandboxes/{id}/ports, DELETE .../ports/{exposure} | expose a port at a URL |
| WS /v1/sandboxes/{id}/pty?rows=&cols= | interactive shell (binary frames = bytes; text frames = JSON {"type": "resize", "rows", "cols"}) |
| ANY /exposed/{token}/{path} | the exposed service (the token is the credential) |
| GET /health | public liveness and what the backend enforces |
| GET /metrics | Prometheus metrics (auth) |
"""
import asyncio
import json
import logging
from typing import Annotated, Optional

import fastapi
import httpcore
import prometheus_client
import pydantic
import starlette.exceptions
from fastapi import responses
from prometheus_client import core as prom_core

from orchard_jax.env import api as _api
from orchard_jax.env import fast_path as _fast_path
from orchard_jax.env import store as _store
from orchard_jax.env import tenants as _tenants
from orchard_jax.env.errors import (AuthenticationError, EnvError, InvalidRequest, NotFound,
                                    PayloadTooLarge, PermissionDenied, close_reason)
from orchard_jax.env.manager import SandboxManager, public_sandbox

_log = logging.getLogger("orchard_jax.env.app")
API_KEY_HEADER = "X-API-Key"
_HOP_HEADERS = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                "trailers", "transfer-encoding", "upgrade", "host", "content-length"}


MAX_REQUEST_BYTES = 96 << 20   # a JSON body: 64 MiB of stdin as base64, and the rest


class _BodyLimit:
  """ASGI middleware: a request body (other than a file upload, which streams under its own
  limit) is read at most `limit` bytes far; a longer one is answered 413 before any route
  sees it, whether or not it announced its length."""

  def __init__(self, app, limit: int):
    self.app, self.limit = app, limit

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http" or (scope["method"] == "PUT" and scope["path"].endswith("/files")):
      return await self.app(scope, receive, send)
    length = dict(scope.get("headers") or ()).get(b"content-length", b"")
    if length.isdigit() and int(length) > self.limit:
      return await self._refuse(send, int(length))
    chunks, total, more = [], 0, True
    while more:
      message = await receive()
      if message["type"] != "http.request":
        break
      chunks.append(message.get("body", b""))
      total += len(chunks[-1])
      more = message.get("more_body", False)
      if total > self.limit:
        return await self._refuse(send, total)
    body, replayed = b"".join(chunks), False

    async def replay():
      nonlocal replayed
      if not replayed:
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}
      return await receive()
    return await self.app(scope, replay, send)

  async def _refuse(self, send, seen):
    error = PayloadTooLarge(f"request body of {seen}+ bytes exceeds the service's limit of "
                            f"{self.limit} bytes (upload files with PUT .../files)")
    payload = json.dumps(error.to_json()).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _terminal_size(rows, cols) -> tuple:
  """(rows, cols) as ints of 1-1000; raises ValueError otherwise."""
  try:
    rows, cols = int(rows), int(cols)
  except (TypeError, ValueError):
    raise ValueError(f"rows and cols must be integers; got {rows!r}, {cols!r}") from None
  if not (1 <= rows <= 1000 and 1 <= cols <= 1000):
    raise ValueError(f"rows and cols must be 1-1000; got {rows}, {cols}")
  return rows, cols


_LOCATIONS = ("body", "query", "path", "header", "cookie")


def validation_error(errors, content_type: Optional[str] = None) -> InvalidRequest:
  """One InvalidRequest naming every field a request got wrong ("memory: ...; env: ...").

  Args:
    errors: pydantic / FastAPI validation errors; each one's `loc` starts with where the value
      came from ("body", "query", ...), which is dropped, so a query parameter named `path`
      is named `path`.
    content_type: the request's Content-Type: a body that is not an object because it was not
      sent as JSON (curl -d sends a form) is named as that, not as a shape error.
  """
  fields, problems = [], []
  for e in errors:
    loc = [str(p) for p in e.get("loc", ())]
    where = loc.pop(0) if loc and loc[0] in _LOCATIONS else None
    message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    if e.get("type") == "json_invalid":   # loc: ("body", character offset)
      reason = (e.get("ctx") or {}).get("error")
      at = f" at character {loc[0]}" if loc else ""
      loc, message = [], f"not valid JSON{at}" + (f" ({reason})" if reason else "")
    field = ".".join(loc) or (where if where == "body" else "")
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if (field == "body" and media_type and media_type != "application/json"
        and not media_type.endswith("+json")):
      message = (f"expected a JSON object sent with Content-Type: application/json; saw "
                 f"Content-Type {content_type!r} ({message})")
    if field and field not in fields:
      fields.append(field)
    problems.append(f"{field}: {message}" if field and not message.startswith(field) else message)
  return InvalidRequest("invalid request: " + "; ".join(problems), details={"fields": fields})


def _check_key(given: Optional[str], tenants: _tenants.Tenants) -> _tenants.Principal:
  if not given:
    raise AuthenticationError(f"missing {API_KEY_HEADER} header")
  principal = tenants.lookup(given)
  if principal is None:
    raise PermissionDenied(f"the {API_KEY_HEADER} given is not a valid key")
  return principal


class _Metrics:
  """Prometheus metrics of one service (its own registry, so several can share a process)."""

  def __init__(self, manager: SandboxManager):
    self.registry = prometheus_client.CollectorRegistry()
    self.manager = manager
    self.states = {}
    self.job_seconds = prometheus_client.Histogram(
        "orchard_env_job_duration_seconds", "Command run time", ["status"],
        buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600), registry=self.registry)
    self.create_seconds = prometheus_client.Histogram(
        "orchard_env_sandbox_create_seconds", "Time from create to ready",
        buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120), registry=self.registry)
    self.registry.register(self)
    manager.on_job_done = lambda job: self.job_seconds.labels(job["status"]).observe(
        job["duration"] or 0)
    manager.on_created = self.create_seconds.observe

  def collect(self):
    gauge = prom_core.GaugeMetricFamily("orchard_env_sandboxes", "Sandboxes by state",
                                        labels=["state"])
    for state, n in sorted(self.states.items()):
      gauge.add_metric([state], n)
    yield gauge
    for name, value in self.manager.counters.items():
      family = prom_core.CounterMetricFamily(f"orchard_env_{name}", f"Total {name}")
      family.add_metric([], value)
      yield family


class _SocketStream(httpcore.AsyncNetworkStream):
  """httpcore's view of a connection the backend opened into a sandbox."""

  def __init__(self, reader, writer):
    self.reader, self.writer = reader, writer

  async def read(self, max_bytes, timeout=None):
    return await asyncio.wait_for(self.reader.read(max_bytes), timeout)

  async def write(self, buffer, timeout=None):
    self.writer.write(buffer)
    await asyncio.wait_for(self.writer.drain(), timeout)

  async def aclose(self):
    self.writer.close()

  def get_extra_info(self, info):
    return None


class _SandboxNetwork(httpcore.AsyncNetworkBackend):
  """Connects httpcore to one port of one sandbox, whatever host it is asked for."""

  def __init__(self, open_port):
    self.open_port = open_port

  async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
    reader, writer = await asyncio.wait_for(self.open_port(), timeout)
    return _SocketStream(reader, writer)

  async def connect_unix_socket(self, *args, **kwargs):
    raise NotImplementedError

  async def sleep(self, seconds):
    await asyncio.sleep(seconds)


def build_app(manager: SandboxManager, api_keys, *, admin_keys=None,
              public_url: Optional[str] = None, lifespan=None,
              fast_exec: bool = True) -> fastapi.FastAPI:
  """The FastAPI application of the service.

  Args:
    manager: the logic (started and stopped by `lifespan`).
    api_keys: accepted X-API-Key values of tenants ("[tenant:]key" entries or a {tenant: key}
      dict; see orchard_jax.env.tenants), or a Tenants.
    admin_keys: keys that see and manage every tenant's sandboxes.
    public_url: base URL used in exposed-port URLs (default: the URL the request came to).
    fast_exec: answer well-formed exec requests on the fast path (orchard_jax.env.fast_path;
      the same answers, without FastAPI's per-request work). False: every request goes
      through its FastAPI route.
  """
  keys = (api_keys if isinstance(api_keys, _tenants.Tenants)
          else _tenants.Tenants(api_keys, admin_keys))
  app = fastapi.FastAPI(title="Orchard Env", version="1", lifespan=lifespan)
  if fast_exec:   # inside the body limit (middleware added first runs innermost)
    app.add_middleware(_fast_path.ExecFastPath, manager=manager, tenants=keys)
  app.add_middleware(_BodyLimit, limit=MAX_REQUEST_BYTES)
  metrics = _Metrics(manager)
  app.state.manager = manager

  async def auth(x_api_key: Optional[str] = fastapi.Header(None)) -> _tenants.Principal:
    return _check_key(x_api_key, keys)

  Who = Annotated[_tenants.Principal, fastapi.Depends(auth)]

  @app.exception_handler(EnvError)
  async def _env_error(request, exc: EnvError):
    return responses.JSONResponse(exc.to_json(), status_code=exc.status_code)

  @app.exception_handler(fastapi.exceptions.RequestValidationError)
  async def _validation_error(request, exc):
    error = validation_error(exc.errors(), request.headers.get("content-type"))
    return responses.JSONResponse(error.to_json(), status_code=422)

  @app.exception_handler(starlette.exceptions.HTTPException)
  async def _no_route(request, exc):   # the service's error shape for 404 / 405 too
    if exc.status_code == 404:
      error = NotFound(f"no route {request.method} {request.url.path}; the API is under "
                       f"/v1/sandboxes (routes: orchard_jax/env/app.py, or GET /docs)")
    elif exc.status_code == 405:
      error = EnvError(f"{request.method} is not allowed on {request.url.path}")
      error.status_code, error.code = 405, "method_not_allowed"
    else:
      error = EnvError(str(exc.detail))
      error.status_code, error.code = exc.status_code, "http_error"
    return responses.JSONResponse(error.to_json(), status_code=error.status_code,
                                  headers=getattr(exc, "headers", None))

  @app.get("/health")
  async def health():
    return {"status": "ok", "backend": manager.backend.describe(),
            "sandboxes": await manager.store.count(_store.SANDBOX)}

  v1 = fastapi.APIRouter(prefix="/v1")

  @app.get("/metrics", dependencies=[fastapi.Depends(auth)])   # aggregate counts only
  async def prometheus_metrics():
    states = {}
    for record in await manager.store.list(_store.SANDBOX):
      states[record["state"]] = states.get(record["state"], 0) + 1
    metrics.states = states
    return responses.Response(prometheus_client.generate_latest(metrics.registry),
                              media_type=prometheus_client.CONTENT_TYPE_LATEST)

  @v1.post("/sandboxes", status_code=201)
  async def create(body: _api.CreateSandbox, who: Who):
    # The record is JSON already: answered as is (jsonable_encoder's walk over it is most of
    # the route's own CPU), as the exec fast path answers job records.
    return responses.JSONResponse(await manager.create(body, who), status_code=201)

  @v1.get("/sandboxes")
  async def list_sandboxes(who: Who, label: list[str] = fastapi.Query([]),
                           include_deleted: bool = False):
    labels = {}
    for item in label:
      key, sep, value = item.partition("=")
      if not sep:
        raise InvalidRequest(f"label filter must be key=value; got {item!r}")
      labels[key] = value
    return {"sandboxes": await manager.list(labels, include_deleted, who)}

  @v1.get("/sandboxes/{sandbox_id}")
  async def get(sandbox_id: str, who: Who):
    return public_sandbox(await manager.get(sandbox_id, who))

  @v1.post("/sandboxes/{sandbox_id}/wait")
  async def wait(sandbox_id: str, who: Who,
                 timeout: float = fastapi.Query(60, gt=0, le=600, allow_inf_nan=False)):
    return await manager.wait_ready(sandbox_id, timeout, who)

  @v1.delete("/sandboxes/{sandbox_id}")
  async def delete(sandbox_id: str, who: Who):
    return await manager.delete(sandbox_id, who=who)

  @v1.post("/sandboxes/{sandbox_id}/heartbeat")
  async def heartbeat(sandbox_id: str, who: Who):
    return await manager.heartbeat(sandbox_id, who)

  @v1.post("/sandboxes/{sandbox_id}/exec")
  async def exec_(sandbox_id: str, body: _api.Exec, who: Who):
    # Records are plain JSON already: answer without FastAPI's generic encoder (hot path).
    return responses.JSONResponse(await manager.exec(sandbox_id, body, who))

  @v1.get("/sandboxes/{sandbox_id}/jobs")
  async def list_jobs(sandbox_id: str, who: Who):
    return {"jobs": await manager.list_jobs(sandbox_id, who)}

  @v1.get("/sandboxes/{sandbox_id}/jobs/{job_id}")
  async def get_job(sandbox_id: str, job_id: str, who: Who):
    return await manager.wait_job(sandbox_id, job_id, 0, who)

  @v1.post("/sandboxes/{sandbox_id}/jobs/{job_id}/wait")
  async def wait_job(sandbox_id: str, job_id: str, who: Who,
                     timeout: float = fastapi.Query(60, ge=0, le=600, allow_inf_nan=False)):
    return responses.JSONResponse(await manager.wait_job(sandbox_id, job_id, timeout, who))

  @v1.post("/sandboxes/{sandbox_id}/jobs/{job_id}/cancel")
  async def cancel_job(sandbox_id: str, job_id: str, who: Who):
    return await manager.cancel_job(sandbox_id, job_id, who)

  @v1.put("/sandboxes/{sandbox_id}/files")
  async def upload(sandbox_id: str, request: fastapi.Request, path: str, who: Who,
                   mode: str = "644"):
    try:
      mode_bits = int(mode, 8)
    except ValueError:
      raise InvalidRequest(f"mode must be octal like 644 or 755; got {mode!r}",
                           details={"fields": ["mode"]}) from None
    limit = manager.config.max_file_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
      raise PayloadTooLarge(f"upload of {length} bytes exceeds max_file_bytes {limit}")
    return await manager.write_file(sandbox_id, path, request.stream(), mode_bits, who)

  @v1.get("/sandboxes/{sandbox_id}/files")
  async def download(sandbox_id: str, path: str, who: Who):
    size, chunks = await manager.read_file(sandbox_id, path, who)
    return responses.StreamingResponse(chunks, media_type="application/octet-stream",
                                       headers={"Content-Length": str(size)})

  @v1.get("/sandboxes/{sandbox_id}/files/list")
  async def list_files(sandbox_id: str, who: Who, path: str = "."):
    return {"entries": await manager.list_files(sandbox_id, path, who)}

  @v1.post("/sandboxes/{sandbox_id}/patch")
  async def patch(sandbox_id: str, body: _api.Patch, who: Who):
    return await manager.apply_patch(sandbox_id, body, who)

  @v1.get("/sandboxes/{sandbox_id}/stats")
  async def stats(sandbox_id: str, who: Who):
    record = await manager.ready_record(sandbox_id, who)
    return await manager.backend.stats(sandbox_id, record["ref"])

  @v1.post("/sandboxes/{sandbox_id}/ports", status_code=201)
  async def expose(sandbox_id: str, body: _api.Expose, request: fastapi.Request, who: Who):
    base = public_url or str(request.base_url)
    return await manager.expose(sandbox_id, body, base, who)

  @v1.get("/sandboxes/{sandbox_id}/ports")
  async def list_ports(sandbox_id: str, who: Who):
    return {"ports": await manager.list_exposures(sandbox_id, who)}

  @v1.delete("/sandboxes/{sandbox_id}/ports/{exposure_id}")
  async def unexpose(sandbox_id: str, exposure_id: str, who: Who):
    await manager.unexpose(sandbox_id, exposure_id, who)
    return {"deleted": True}

  app.include_router(v1)

  @app.websocket("/v1/sandboxes/{sandbox_id}/pty")
  async def pty(websocket: fastapi.WebSocket, sandbox_id: str, rows: str = "24", cols: str = "80",
                shell: Optional[str] = None):
    # rows and cols are parsed by _terminal_size: a non-integer is a 4422 close naming them,
    # not FastAPI's refusal of the handshake (an HTTP 403 that reads as a bad key).
    given = websocket.headers.get(API_KEY_HEADER) or websocket.query_params.get("api_key")
    try:
      who = _check_key(given, keys)
      record = await manager.ready_record(sandbox_id, who)
    except EnvError as e:   # accepted first, so the client gets the code and the reason
      await websocket.accept()
      await websocket.close(code=4401 if isinstance(e, AuthenticationError) else 4404,
                            reason=close_reason(e.message))
      return
    try:
      rows, cols = _terminal_size(rows, cols)
      request = _api.Exec(command=[shell] if shell else ["/bin/sh", "-c",
                          "exec $(command -v bash || echo /bin/sh) -i"])
    except (ValueError, pydantic.ValidationError) as e:   # 4422: a bad parameter
      reason = (validation_error(e.errors()).message.removeprefix("invalid request: ")
                .replace("command", "shell") if isinstance(e, pydantic.ValidationError)
                else str(e))
      await websocket.accept()
      await websocket.close(code=4422, reason=close_reason(reason))
      return
    spec = manager.job_spec(record, request)
    spec.env["TERM"] = "xterm-256color"
    try:
      session = await manager.backend.open_pty(sandbox_id, record["ref"], spec)
    except (NotImplementedError, EnvError) as e:   # accepted first, as above
      await websocket.accept()
      await websocket.close(code=4501, reason=close_reason(str(e)))
      return
    await session.resize(rows, cols)
    await websocket.accept()

    async def pump_out():
      while True:
        data = await session.read()
        if not data:
          return
        await websocket.send_bytes(data)

    async def pump_in():
      while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
          return
        if message.get("bytes"):
          await session.write(message["bytes"])
        elif message.get("text"):
          try:
            control = json.loads(message["text"])
          except ValueError:
            await session.write(message["text"].encode())
            continue
          if not isinstance(control, dict):
            await session.write(message["text"].encode())
          elif control.get("type") == "resize":
            try:
              await session.resize(*_terminal_size(control.get("rows"), control.get("cols")))
            except ValueError:
              continue   # a bad resize is ignored; the session goes on
          elif control.get("type") == "input":
            await session.write(str(control.get("data", "")).encode())

    tasks = [asyncio.ensure_future(pump_out()), asyncio.ensure_future(pump_in())]
    failure = None
    try:
      done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
      if tasks[0] in done:   # the terminal closed: the shell exited, or never started
        failure = await session.failure()
    finally:
      for task in tasks:
        task.cancel()
      await session.close()
      try:   # 4422 as for any other shell that cannot be used; 1000 after a shell's own exit
        await (websocket.close(code=4422, reason=close_reason(failure)) if failure
               else websocket.close())
      except Exception:  # noqa: BLE001 - the client has already gone
        pass

  @app.api_route("/exposed/{token}/{path:path}",
                 methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
  async def exposed(token: str, path: str, request: fastapi.Request):
    record, exposure = await manager.resolve_exposure(token)
    network = _SandboxNetwork(lambda: manager.backend.open_port(
        record["id"], record["ref"], exposure["port"]))
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
    headers.append(("host", f"localhost:{exposure['port']}"))
    target = "/" + path + (("?" + request.url.query) if request.url.query else "")
    # Both bodies stream through (one chunk at a time): the service's memory does not grow
    # with what the client sends or the sandbox answers.
    pool = httpcore.AsyncConnectionPool(network_backend=network, retries=0)
    try:
      stream = pool.stream(request.method, f"http://localhost:{exposure['port']}{target}",
                           headers=headers, content=request.stream())
      response = await stream.__aenter__()
    except (OSError, EnvError, httpcore.NetworkError, httpcore.ProtocolError,
            httpcore.TimeoutException) as e:
      await pool.aclose()
      return responses.JSONResponse(
          {"error": {"code": "bad_gateway", "message": f"port {exposure['port']} of "
                     f"{record['id']} did not answer: {e}"}}, status_code=502)

    async def relay():
      try:
        async for chunk in response.aiter_stream():
          yield chunk
      except (OSError, httpcore.NetworkError, httpcore.ProtocolError,
              httpcore.TimeoutException):
        return
      finally:
        await stream.__aexit__(None, None, None)
        await pool.aclose()
    answer = responses.StreamingResponse(relay(), status_code=response.status)
    # The sandbox's header bytes as they came (any bytes HTTP allows, not only UTF-8; repeated
    # names such as Set-Cookie kept), less the hop-by-hop ones.
    answer.raw_headers = [(name.lower(), value) for name, value in response.headers
                          if name.decode("latin-1").lower() not in _HOP_HEADERS]
    return answer

  return app
