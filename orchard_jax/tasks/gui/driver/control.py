"""The driver's control API, the one port of a browser sandbox that Orchard Env exposes.

Every route needs the rollout's token in `X-Orchard-Token` (the browser never has it, so a page
or the agent's goto_url cannot drive the driver). Requests are JSON; answers are JSON with "ok":

  POST /open      {url, viewport, device_scale, screenshot, probe, setup, a11y, settle_ms}
                  -> {ok, observation}: a fresh browser context on the task's start page
  POST /act       {action: {name, ...pixel arguments}} -> {ok, done, observation}
  POST /observe   {} -> {ok, observation}
  POST /evaluate  {expression, tab} -> {ok, value}: the checker's and expert's view of the page
  POST /site      {site, op: "state" | "reset", fixtures} -> {ok, state}: a site's control route
  GET  /health    -> {ok, browser: {alive, dead, version, tabs}}

A failed action answers {ok: false, error} (the agent is told); a browser that is gone or a page
that stopped responding answers {ok: false, abort} (the episode ends as aborted). Malformed
requests are 400s naming what was expected. One request at a time (Playwright's sync API is
single-threaded), which is also the order a rollout acts in.

Standard library only besides the Playwright driver in `browser`.
"""
from __future__ import annotations

import hmac
import http.client
import http.server
import json
from typing import Any, Dict

from .browser import Abort, ActionError, Browser
from .pages import TOKEN_HEADER

MAX_REQUEST_BYTES = 4 << 20


class ControlServer(http.server.HTTPServer):
  """Serves the control API on an already-listening socket with one `Browser`."""

  def __init__(self, sock, browser: Browser, *, token: str, pages_port: int):
    super().__init__(sock.getsockname(), _Handler, bind_and_activate=False)
    self.socket.close()
    self.socket = sock
    self.browser, self.token, self.pages_port = browser, token.encode(), pages_port
    self.token_text = token


class _Handler(http.server.BaseHTTPRequestHandler):
  server: ControlServer
  protocol_version = "HTTP/1.1"

  def log_message(self, fmt, *args):
    pass

  def _reply(self, status: int, value: Dict[str, Any]) -> None:
    data = json.dumps(value).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def _authorised(self) -> bool:
    given = (self.headers.get(TOKEN_HEADER) or "").encode("latin-1", "replace")
    if hmac.compare_digest(given, self.server.token):
      return True
    self._reply(403, {"ok": False, "error": f"the control API needs this rollout's "
                      f"{TOKEN_HEADER} header"})
    return False

  def do_GET(self):
    if not self._authorised():
      return
    if self.path == "/health":
      return self._reply(200, {"ok": True, "browser": self.server.browser.health()})
    self._reply(404, {"ok": False, "error": f"no route GET {self.path}"})

  def do_POST(self):
    if not self._authorised():
      return
    try:
      body = json.loads(self._body() or b"{}")
      if not isinstance(body, dict):
        raise ValueError(f"a JSON object, got {type(body).__name__}")
    except ValueError as e:
      return self._reply(400, {"ok": False, "error": f"expected {e}"})
    route = {"/open": self._open, "/act": self._act, "/observe": self._observe,
             "/evaluate": self._evaluate, "/site": self._site}.get(self.path)
    if route is None:
      return self._reply(404, {"ok": False, "error": f"no route POST {self.path}"})
    try:
      self._reply(200, route(body))
    except Abort as e:
      self._reply(200, {"ok": False, "abort": str(e)})
    except ActionError as e:
      self._reply(200, {"ok": False, "error": str(e)})
    except (KeyError, TypeError, ValueError) as e:
      self._reply(400, {"ok": False, "error": f"bad request to {self.path}: "
                        f"{type(e).__name__}: {e}"})

  def _body(self) -> bytes:
    """The request body: Content-Length or chunked (RFC 9112 7.1; Orchard Env's exposed ports
    stream bodies through chunked), at most MAX_REQUEST_BYTES."""
    if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
      data = b""
      while True:
        line = self.rfile.readline(1024)
        try:
          size = int(line.split(b";")[0].strip(), 16)
        except ValueError:
          raise ValueError(f"a chunk size line, got {line[:40]!r}") from None
        if size == 0:
          while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
            pass   # trailer fields
          return data
        if len(data) + size > MAX_REQUEST_BYTES:
          raise ValueError(f"a body of at most {MAX_REQUEST_BYTES} bytes")
        data += self.rfile.read(size)
        self.rfile.readline(16)   # the CRLF after the chunk
    length = int(self.headers.get("Content-Length") or 0)
    if not 0 <= length <= MAX_REQUEST_BYTES:
      raise ValueError(f"a body of 0-{MAX_REQUEST_BYTES} bytes, got {length}")
    return self.rfile.read(length) if length else b""

  def _open(self, body):
    if not isinstance(body.get("url"), str):
      raise ValueError("'url' (a string) is required")
    return {"ok": True, "observation": self.server.browser.open(body)}

  def _act(self, body):
    action = body.get("action")
    if not isinstance(action, dict) or not isinstance(action.get("name"), str):
      raise ValueError("'action' must be an object with a 'name'")
    browser = self.server.browser
    done = browser.act(action)
    return {"ok": True, "done": done,
            "observation": browser.observe(screenshot=body.get("screenshot", True))}

  def _observe(self, body):
    return {"ok": True, "observation": self.server.browser.observe(
        screenshot=body.get("screenshot", True))}

  def _evaluate(self, body):
    if not isinstance(body.get("expression"), str):
      raise ValueError("'expression' (a string) is required")
    return {"ok": True, "value": self.server.browser.evaluate(body["expression"],
                                                              tab=body.get("tab"))}

  def _site(self, body):
    site, op = body.get("site"), body.get("op")
    if not isinstance(site, str) or op not in ("state", "reset"):
      raise ValueError("'site' (a name) and 'op' ('state' or 'reset') are required")
    connection = http.client.HTTPConnection("127.0.0.1", self.server.pages_port, timeout=30)
    try:
      headers = {"Host": f"{site}.test", TOKEN_HEADER: self.server.token_text,
                 "Content-Type": "application/json"}
      if op == "state":
        connection.request("GET", "/__orchard/state", headers=headers)
      else:
        connection.request("POST", "/__orchard/reset", headers=headers,
                           body=json.dumps(body.get("fixtures") or {}))
      response = connection.getresponse()
      answer = json.loads(response.read() or b"{}")
    except (OSError, ValueError) as e:
      raise Abort(f"the page server did not answer: {type(e).__name__}: {e}") from None
    finally:
      connection.close()
    if response.status != 200:
      return {"ok": False, "error": answer.get("error") or f"status {response.status}"}
    return {"ok": True, **answer}
