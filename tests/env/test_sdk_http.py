"""The SDK clients' request plumbing (orchard_jax.env._http): the request URLs they keep for
reuse are the URLs httpx itself builds from the base URL, for any path (hypothesis); cookies a
server sets still come back on the next request, through both clients (the standard library's
HTTP server is the other side).
"""
import asyncio
import http.server
import json
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax.env import AsyncSandboxClient, SandboxClient, _http

_PATHS = st.one_of(
    st.builds(lambda parts: "/" + "/".join(parts),
              st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                             blacklist_characters="?#"), max_size=12),
                       max_size=5)),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))


_CLIENTS = {}


def _client(base):
  """An httpx client with `base` as its base URL (one per base URL: making one loads TLS
  certificates; no request is sent)."""
  if base not in _CLIENTS:
    _CLIENTS[base] = httpx.Client(base_url=base,
                                  transport=httpx.MockTransport(lambda r: httpx.Response(200)))
  return _CLIENTS[base]


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(["http://127.0.0.1:8080", "http://127.0.0.1:8080/prefix",
                             "http://svc.local/a/b/", "https://example.org"]),
       paths=st.lists(_PATHS, min_size=1, max_size=6))
def test_kept_urls_are_the_urls_httpx_builds(base, paths):
  reference = _client(base)   # builds every URL afresh
  urls = _http.RequestURLs(_client(base), size=3)
  for path in paths + paths:                # again: now from what was kept (or rebuilt)
    try:
      expected = reference.build_request("GET", path).url
    except httpx.InvalidURL:
      with pytest.raises(httpx.InvalidURL):
        urls(path)
      continue
    assert urls(path) == expected
    assert str(urls(path)) == str(expected)
  assert len(urls._urls) <= 3


class _CookieServer(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"

  def log_message(self, *args):
    pass

  def do_GET(self):
    body = json.dumps({"path": self.path, "cookie": self.headers.get("Cookie")}).encode()
    self.send_response(200)
    if self.path.startswith("/set"):
      self.send_header("Set-Cookie", "affinity=replica-2; Path=/")
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)


@pytest.fixture
def cookie_server():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CookieServer)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{server.server_address[1]}"
  server.shutdown()
  server.server_close()


def test_cookies_a_server_sets_come_back(cookie_server):
  with SandboxClient(cookie_server, "key") as client:
    assert client._json("GET", "/plain")["cookie"] is None
    assert client._json("GET", "/plain")["cookie"] is None   # no cookie, nothing kept
    client._json("GET", "/set")
    assert client._json("GET", "/plain")["cookie"] == "affinity=replica-2"


def test_async_cookies_a_server_sets_come_back(cookie_server):
  async def scenario():
    client = AsyncSandboxClient(cookie_server, "key")
    try:
      assert (await client._json("GET", "/plain"))["cookie"] is None
      await client._json("GET", "/set")
      return (await client._json("GET", "/plain"))["cookie"]
    finally:
      await client.aclose()
  assert asyncio.run(scenario()) == "affinity=replica-2"
