"""The HTTP front of a service: routes tool calls, control routes and health onto `core.Service`.

Routes (see `core` for what each does): POST /<operation path> (tool call), GET /health,
GET /tools, and the control routes POST /reset, GET /audit, GET /state, which need the
`X-Claw-Control` header. Every answer is JSON with a Content-Length; an unexpected failure
while answering is a 500 naming it, never a dropped connection.

A small HTTP/1.1 server on `socketserver` (persistent connections, Content-Length or chunked
bodies) rather than `http.server`, whose imports (the email package, http.client) cost more than the
rest of a service's start-up; services start in each rollout's sandbox, so that time counts.
Malformed requests get 400/405/413/414/431 and the connection is closed. Standard library only.
"""
from __future__ import annotations

import hmac
import json
import os
import socket
import socketserver
from typing import Any, Dict, Optional, Tuple

from .core import CONTROL_HEADER, MAX_BODY_BYTES, Service, ServiceError

MAX_LINE = 8192
MAX_HEADERS = 100
IDLE_TIMEOUT_S = 600.0
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 411: "Length Required",
            413: "Content Too Large", 414: "URI Too Long", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}


def _error(status: int, type_: str, message: str) -> Tuple[int, Any, Dict[str, str]]:
  return status, {"error": {"type": type_, "message": message}}, {}


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
  daemon_threads = True
  allow_reuse_address = True
  request_queue_size = 64


class App:
  """Maps one request onto the service: (method, path, headers, body) -> (status, JSON, headers)."""

  def __init__(self, service: Service, control_token: str):
    self.service = service
    self.token = control_token.encode()

  def _control_ok(self, headers: Dict[str, str]) -> bool:
    given = headers.get(CONTROL_HEADER.lower(), "").encode("latin-1")
    return hmac.compare_digest(given, self.token)

  def handle(self, method: str, path: str, headers: Dict[str, str], body: bytes):
    service = self.service
    if path in ("/reset", "/audit", "/state") and not self._control_ok(headers):
      return _error(403, "forbidden", f"control route {path} needs the {CONTROL_HEADER} header "
                    "of this rollout")
    if method == "GET":
      if path == "/health":
        return 200, {"service": service.name, "ok": True, "pid": os.getpid()}, {}
      if path == "/tools":
        return 200, {"service": service.name,
                     "tools": [op.spec() for op in service.ops.values()]}, {}
      if path == "/audit":
        with service.lock:
          return 200, {"service": service.name, "entries": list(service.audit)}, {}
      if path == "/state":
        return 200, {"service": service.name, "now": service.now(),
                     "tables": service.snapshot()}, {}
      if path in service.routes or path == "/reset":
        return _error(405, "method_not_allowed", f"{path} takes POST with a JSON object body")
      return _error(404, "not_found", f"no route GET {path}")
    if method != "POST":
      return _error(405, "method_not_allowed", f"{method} is not served; tool calls are POST")
    if path == "/reset":
      try:
        parsed = json.loads(body.decode("utf-8")) if body.strip() else {}
      except (UnicodeDecodeError, ValueError) as e:
        return _error(400, "invalid_json", f"the reset body is not valid JSON: {e}")
      try:
        return 200, service.reset(parsed), {}
      except ServiceError as e:
        return _error(e.status, e.type, e.message)
    if path in ("/health", "/tools", "/audit", "/state"):
      return _error(405, "method_not_allowed", f"{path} takes GET")
    return service.call(path, body)


class _Handler(socketserver.StreamRequestHandler):
  app: App

  def setup(self):
    super().setup()
    self.connection.settimeout(IDLE_TIMEOUT_S)

  def _write(self, status: int, body: Any, headers: Dict[str, str], keep_alive: bool) -> None:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
             "Content-Type: application/json", f"Content-Length: {len(data)}",
             f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    self.wfile.flush()

  def _refuse(self, status: int, type_: str, message: str) -> None:
    _, body, headers = _error(status, type_, message)
    self._write(status, body, headers, keep_alive=False)

  def handle(self):
    try:
      while self._one_request():
        pass
    except (socket.timeout, ConnectionError, OSError):
      pass

  def _read_chunked(self) -> Optional[bytes]:
    """A chunked request body (RFC 9112 section 7.1), refused with 413 past MAX_BODY_BYTES as
    the chunks arrive, or 400 when malformed; None when refused or cut off."""
    parts, total = [], 0
    while True:
      line = self.rfile.readline(MAX_LINE + 1)
      if not line:
        return None
      size_text = line.split(b";", 1)[0].strip()
      try:
        size = int(size_text, 16)
      except ValueError:
        self._refuse(400, "bad_request", f"malformed chunk size {size_text[:20]!r}")
        return None
      if size < 0 or total + size > MAX_BODY_BYTES:
        self._refuse(413, "too_large", f"expected a body of at most {MAX_BODY_BYTES} bytes")
        return None
      if size == 0:
        while True:                       # trailer fields, then the blank line
          trailer = self.rfile.readline(MAX_LINE + 1)
          if trailer in (b"\r\n", b"\n", b""):
            return b"".join(parts)
      chunk = self.rfile.read(size)
      if len(chunk) < size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
        self._refuse(400, "bad_request", "a chunk is shorter than its size or not followed "
                     "by CRLF")
        return None
      parts.append(chunk)
      total += size

  def _one_request(self) -> bool:
    line = self.rfile.readline(MAX_LINE + 1)
    if not line:
      return False
    if len(line) > MAX_LINE:
      self._refuse(414, "too_long", f"the request line exceeds {MAX_LINE} bytes")
      return False
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
      self._refuse(400, "bad_request", f"expected 'METHOD /path HTTP/1.1', got "
                   f"{line[:80].decode('latin-1')!r}")
      return False
    method, target, version = parts
    headers: Dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
      raw = self.rfile.readline(MAX_LINE + 1)
      if raw in (b"\r\n", b"\n", b""):
        break
      if len(raw) > MAX_LINE or b":" not in raw:
        self._refuse(400, "bad_request", "a malformed or too long header line")
        return False
      name, _, value = raw.decode("latin-1").partition(":")
      headers[name.strip().lower()] = value.strip()
    else:
      self._refuse(431, "too_many_headers", f"more than {MAX_HEADERS} header lines")
      return False
    connection = headers.get("connection", "").lower()
    keep_alive = ("close" not in connection) if version == "HTTP/1.1" else \
        ("keep-alive" in connection)
    coding = headers.get("transfer-encoding", "").lower().strip()
    if coding:
      if coding != "chunked" or "content-length" in headers:
        self._refuse(400, "bad_request", f"unsupported Transfer-Encoding {coding!r} (chunked "
                     "alone, without Content-Length, is accepted)")
        return False
      body = self._read_chunked()
      if body is None:
        return False
    else:
      try:
        length = int(headers.get("content-length", "0"))
      except ValueError:
        length = -1
      if length < 0 or length > MAX_BODY_BYTES:
        self._refuse(413, "too_large", f"expected a body of at most {MAX_BODY_BYTES} bytes "
                     f"with a valid Content-Length, got {headers.get('content-length')!r}")
        return False
      body = self.rfile.read(length) if length else b""
      if len(body) < length:
        return False
    path = target.split("?", 1)[0]
    try:
      status, payload, extra = self.app.handle(method.upper(), path, headers, body)
    except Exception as e:  # noqa: BLE001 - a bug answers 500 naming it
      status, payload, extra = _error(500, "internal_error", f"{type(e).__name__}: {e}")
      keep_alive = False
    self._write(status, payload, extra, keep_alive)
    return keep_alive


def make_server(service: Service, control_token: str, *, host: str = "127.0.0.1",
                port: int = 0, sock: Optional[socket.socket] = None) -> socketserver.TCPServer:
  """A threaded HTTP server for `service`; call `serve_forever()`.

  Args:
    service: the service.
    control_token: the value of the X-Claw-Control header that control routes require.
    host, port: where to listen (port 0: any free port; `server.server_address` says which),
      unless `sock` is an already bound and listening socket to serve on.
  """
  handler = type("Handler", (_Handler,), {"app": App(service, control_token)})
  if sock is not None:
    server = _Server((host, 0), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()
    return server
  return _Server((host, port), handler)
