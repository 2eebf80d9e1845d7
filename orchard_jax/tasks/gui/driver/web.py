"""The small web framework the local sites are written in (standard library only).

A site is a `Site`: routes from (method, path pattern) to handlers taking a `Request` and
returning a `Response`; its state lives in the site object (one user per sandbox, so no
sessions). Pages are server-rendered HTML: `page()` wraps a body in the site's layout, `esc()`
escapes every value that reaches HTML (text and attributes alike). Forms post back with the
Post/Redirect/Get pattern (303), so reloading a page never repeats an order.
"""
from __future__ import annotations

import html
import re
import threading
import urllib.parse
from typing import Callable, Dict, List, Optional, Tuple


def esc(value) -> str:
  """`value` as HTML text or a quoted attribute value."""
  return html.escape(str(value), quote=True)


class Request:
  """One HTTP request as a handler sees it.

  Attributes:
    method: "GET" or "POST".
    path: the decoded path without the query.
    query: {name: [values]} of the query string.
    form: {name: [values]} of an application/x-www-form-urlencoded body.
    params: the route's named groups.
  """

  def __init__(self, method: str, path: str, query: Dict[str, List[str]],
               form: Dict[str, List[str]], params: Optional[Dict[str, str]] = None):
    self.method, self.path, self.query, self.form = method, path, query, form
    self.params = params or {}

  def arg(self, name: str, default: str = "") -> str:
    """The first value of `name` in the form, else the query, else `default` (stripped)."""
    for source in (self.form, self.query):
      if source.get(name):
        return source[name][0].strip()
    return default

  def args(self, name: str) -> List[str]:
    """Every value of `name` (checkbox groups), form first."""
    return [v.strip() for v in (self.form.get(name) or self.query.get(name) or [])]


class Response:
  """What a handler returns: status, body and headers."""

  def __init__(self, body: str = "", status: int = 200, headers: Optional[Dict[str, str]] = None,
               content_type: str = "text/html; charset=utf-8"):
    self.body = body.encode("utf-8") if isinstance(body, str) else body
    self.status = status
    self.headers = {"Content-Type": content_type, "Cache-Control": "no-store", **(headers or {})}


def redirect(location: str) -> Response:
  """303 See Other to `location` (after a form post)."""
  return Response("", 303, {"Location": location})


Handler = Callable[[Request], Response]


class Site:
  """A web application: `route()` handlers, state, and the control operations the checker
  and the task set-up use (`reset(fixtures)`, `state()`).

  Attributes:
    name: the site's host name without ".test" ("shop").
    title: the name shown in its header.
  """
  name = "site"
  title = "Site"
  nav: Tuple[Tuple[str, str], ...] = ()
  style = ""

  def __init__(self):
    self._routes: List[Tuple[str, re.Pattern, Handler]] = []
    self.flash: Optional[str] = None
    self.lock = threading.Lock()   # one request at a time: the state is plain objects

  def route(self, method: str, pattern: str, handler: Handler) -> None:
    """Adds a route; `pattern` is a regular expression matched against the whole path."""
    self._routes.append((method, re.compile(pattern + r"\Z"), handler))

  def handle(self, method: str, target: str, body: bytes) -> Response:
    """Dispatches one request (a 404 or 405 page when nothing matches)."""
    parts = urllib.parse.urlsplit(target)
    path = urllib.parse.unquote(parts.path) or "/"
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    form = (urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
            if method == "POST" else {})
    allowed = []
    for route_method, pattern, handler in self._routes:
      match = pattern.match(path)
      if match:
        if route_method == method:
          return handler(Request(method, path, query, form, match.groupdict()))
        allowed.append(route_method)
    if allowed:
      return Response(self.page("Not allowed", "<p>This page cannot be used that way.</p>"), 405,
                      {"Allow": ", ".join(sorted(set(allowed)))})
    return Response(self.page("Page not found", f"<h1>Page not found</h1><p>There is no page "
                              f"at {esc(path)}.</p><p><a href='/'>Back to the start page</a></p>"),
                    404)

  def take_flash(self) -> str:
    """The one-time message shown at the top of the next page ("Added to cart")."""
    message, self.flash = self.flash, None
    return f"<div class='flash' role='status'>{esc(message)}</div>" if message else ""

  def page(self, title: str, body: str, *, header_extra: str = "") -> str:
    """A whole HTML page in the site's layout."""
    nav = "".join(f"<a href='{esc(href)}'>{esc(label)}</a>" for label, href in self.nav)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(title)} - {esc(self.title)}</title><style>{BASE_STYLE}{self.style}"
            f"</style></head><body><header><a class='brand' href='/'>{esc(self.title)}</a>"
            f"<nav>{nav}</nav>{header_extra}</header><main>{self.take_flash()}{body}</main>"
            f"</body></html>")

  # The control operations (overridden by each site).
  def reset(self, fixtures: dict) -> None:
    raise NotImplementedError

  def state(self) -> dict:
    raise NotImplementedError


BASE_STYLE = """
*{box-sizing:border-box} body{margin:0;font:15px/1.4 sans-serif;color:#1d1d1f;background:#f5f5f7}
header{display:flex;align-items:center;gap:24px;padding:10px 20px;background:#233;color:#fff}
header a{color:#fff;text-decoration:none} .brand{font-weight:bold;font-size:20px}
header nav{display:flex;gap:16px} main{padding:16px 20px;max-width:1100px}
button,.button{font:inherit;padding:6px 14px;border:1px solid #345;border-radius:4px;
  background:#2a6df4;color:#fff;cursor:pointer;text-decoration:none;display:inline-block}
button.secondary{background:#fff;color:#233} input[type=text],input[type=email],input[type=number],
input[type=search],textarea{font:inherit;padding:5px 8px;border:1px solid #999;border-radius:4px}
.flash{background:#e6f4ea;border:1px solid #8c8;padding:8px 12px;margin-bottom:12px}
.error{color:#b00020} .card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:12px}
table{border-collapse:collapse;background:#fff} td,th{border:1px solid #ddd;padding:6px 10px;text-align:left}
label{display:block;margin:8px 0 2px} .muted{color:#667}
"""
