"""The page server inside the sandbox: the task's web pages, and nothing else the browser can reach.

Chromium maps every `*.test` host name to this server (--host-resolver-rules), which answers by
the Host header:
  miniwob.test        the MiniWoB++ task pages, read from the `miniwob` package's html folder
  <site>.test         a local web application (shop.test, mail.test, booking.test) with its state
Control routes, for the rollout's driver only (they need the rollout's token in
`X-Orchard-Token`; the browser never has it): POST /__orchard/reset (body: fixtures) and
GET /__orchard/state on a site's host.

Standard library only (runs inside the sandbox).
"""
from __future__ import annotations

import hmac
import http.server
import json
import mimetypes
import os
import posixpath
import socketserver
import urllib.parse
from typing import Dict, Optional

from . import booking, mail, shop, web

SITES = {cls.name: cls for cls in (shop.Shop, mail.Mail, booking.Booking)}
TOKEN_HEADER = "X-Orchard-Token"
MAX_BODY_BYTES = 1 << 20


def miniwob_html_dir(given: Optional[str] = None) -> Optional[str]:
  """The MiniWoB++ html folder: `given` when it exists here, else the `miniwob` package's of
  this interpreter (a container image has its own), else None."""
  if given and os.path.isdir(given):
    return given
  try:
    import importlib.util
    spec = importlib.util.find_spec("miniwob")
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  folder = os.path.join(list(spec.submodule_search_locations)[0], "html")
  return folder if os.path.isdir(folder) else None


class PageServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
  """Serves the pages on an already-listening socket (bound by the start command)."""
  daemon_threads = True

  def __init__(self, sock, *, token: str, miniwob_dir: Optional[str],
               sites: Dict[str, dict]):
    super().__init__(sock.getsockname(), _Handler, bind_and_activate=False)
    self.socket.close()
    self.socket = sock
    self.token = token.encode()
    self.miniwob_dir = os.path.realpath(miniwob_dir) if miniwob_dir else None
    self.sites: Dict[str, web.Site] = {}
    for name, fixtures in sites.items():
      site = SITES[name]()
      site.reset(fixtures or {})
      self.sites[name] = site


class _Handler(http.server.BaseHTTPRequestHandler):
  server: PageServer
  protocol_version = "HTTP/1.1"
  server_version = "orchard-pages"

  def log_message(self, fmt, *args):   # the sandbox's log stays small
    pass

  def do_GET(self):
    self._dispatch("GET")

  def do_POST(self):
    self._dispatch("POST")

  def do_HEAD(self):
    self._dispatch("HEAD")

  def _dispatch(self, method: str) -> None:
    try:
      length = int(self.headers.get("Content-Length") or 0)
    except ValueError:
      length = -1
    if length < 0 or length > MAX_BODY_BYTES:
      return self._send(web.Response("bad Content-Length", 400, content_type="text/plain"))
    body = self.rfile.read(length) if length else b""
    host = (self.headers.get("Host") or "").split(":")[0].lower()
    name = host[:-len(".test")] if host.endswith(".test") else host
    try:
      if self.path.startswith("/__orchard/"):
        response = self._control(method, name, body)
      elif name == "miniwob":
        response = self._static(self.path)
      elif name in self.server.sites:
        site = self.server.sites[name]
        with site.lock:
          response = site.handle("GET" if method == "HEAD" else method, self.path, body)
      else:
        response = web.Response(f"<h1>Server not found</h1><p>{web.esc(host)} is not a site "
                                "of this task.</p>", 404)
    except Exception as e:  # noqa: BLE001 - a page's bug is a 500 page, never a dropped connection
      response = web.Response(f"<h1>Internal error</h1><p>{web.esc(type(e).__name__)}</p>", 500)
    self._send(response, head=method == "HEAD")

  def _send(self, response: web.Response, head: bool = False) -> None:
    self.send_response(response.status)
    for key, value in response.headers.items():
      self.send_header(key, value)
    self.send_header("Content-Length", str(len(response.body)))
    self.end_headers()
    if not head:
      self.wfile.write(response.body)

  def _control(self, method: str, name: str, body: bytes) -> web.Response:
    given = (self.headers.get(TOKEN_HEADER) or "").encode("latin-1", "replace")
    if not hmac.compare_digest(given, self.server.token):
      return _json({"error": "forbidden"}, 403)
    site = self.server.sites.get(name)
    if site is None:
      return _json({"error": f"no site {name!r} in this sandbox; sites: "
                    f"{sorted(self.server.sites)}"}, 404)
    route = self.path.split("?")[0]
    with site.lock:
      if route == "/__orchard/state" and method == "GET":
        return _json({"state": site.state()})
      if route == "/__orchard/reset" and method == "POST":
        try:
          fixtures = json.loads(body or b"{}")
          site.reset(fixtures if isinstance(fixtures, dict) else {})
        except (ValueError, KeyError, TypeError) as e:
          return _json({"error": f"bad fixtures: {type(e).__name__}: {e}"}, 400)
        return _json({"ok": True})
    return _json({"error": f"no control route {method} {route}"}, 404)

  def _static(self, target: str) -> web.Response:
    root = self.server.miniwob_dir
    if root is None:
      return web.Response("MiniWoB++ pages are not installed in this sandbox", 404,
                          content_type="text/plain")
    path = posixpath.normpath(urllib.parse.unquote(urllib.parse.urlsplit(target).path))
    full = os.path.realpath(os.path.join(root, path.lstrip("/")))
    if not (full == root or full.startswith(root + os.sep)) or not os.path.isfile(full):
      return web.Response(f"<h1>Not found</h1><p>{web.esc(path)}</p>", 404)
    with open(full, "rb") as f:
      data = f.read()
    kind = mimetypes.guess_type(full)[0] or "application/octet-stream"
    if kind.startswith("text/") or kind.endswith("javascript"):
      kind += "; charset=utf-8"
    return web.Response(data, 200, {"Cache-Control": "max-age=3600"}, content_type=kind)


def _json(value, status: int = 200) -> web.Response:
  return web.Response(json.dumps(value), status, content_type="application/json")

