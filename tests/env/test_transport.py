"""The SDK's HTTP/1.1 transports (orchard_jax.env._transport's StdlibTransport for the sync
client, _async_transport's AsyncioTransport for the async one) against httpx's own: a recording
HTTP/1.1 server (the standard library's) sees the same requests and the client the same
responses through both, for any method, path, query and body (hypothesis); an idle connection
the server closed is replaced, not failed; failures are httpx's exceptions.
"""
import asyncio
import base64
import gzip
import http.server
import json
import socket
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax.env import _transport


class _Recorder(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"

  def log_message(self, *args):
    pass

  def _answer(self):
    length = int(self.headers.get("Content-Length") or 0)
    body = self.rfile.read(length) if length else b""
    seen = json.dumps({"method": self.command, "path": self.path,
                       "headers": sorted((k.lower(), v) for k, v in self.headers.items()
                                         if k.lower() not in ("user-agent",)),
                       "body": base64.b64encode(body).decode()}).encode()
    if self.path.startswith("/gzip"):
      payload = gzip.compress(seen)
      self.send_response(200)
      self.send_header("Content-Encoding", "gzip")
      self.send_header("Content-Length", str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)
    elif self.path.startswith("/chunked"):
      self.send_response(207)
      self.send_header("Transfer-Encoding", "chunked")
      self.send_header("X-Many", "a")
      self.send_header("X-Many", "b")
      self.end_headers()
      for i in range(0, len(seen), 7):
        piece = seen[i:i + 7]
        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
      self.wfile.write(b"0\r\n\r\n")
    else:
      status = 404 if self.path.startswith("/missing") else 200
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(seen)))
      self.end_headers()
      if self.command != "HEAD":
        self.wfile.write(seen)
    if self.path.startswith("/hang-up"):   # keep-alive answered, then the server closes it
      self.close_connection = True

  do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _answer


@pytest.fixture(scope="module")
def server():
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
  httpd.daemon_threads = True
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{httpd.server_address[1]}"
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture(scope="module")
def clients(server):
  """(httpx's own transport, StdlibTransport) clients of the server."""
  mounts = _transport.mounts_for(server)
  assert list(mounts) == [server]
  with httpx.Client(base_url=server, headers={"X-API-Key": "k"}) as stock, \
       httpx.Client(base_url=server, headers={"X-API-Key": "k"}, mounts=mounts) as ours:
    yield stock, ours


# How a request fails that went out on a kept-alive connection as the server closed it: a FIN
# before any answer (RemoteProtocolError), or a reset because the request's bytes reached the
# closed socket (ReadError, or WriteError if the reset came first); which one is a race. Our
# transports send such a request once more on a new connection; httpx's own raises, so after a
# /hang-up answer the stock client is asked again (see `_AsyncClients.outcomes`).
_CLOSED_UNDER_IT = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _outcome(client, method, path, params, body, stock=False):
  try:
    response = client.request(method, path, params=params, content=body)
  except _CLOSED_UNDER_IT:
    if not (stock and path.startswith("/hang-up")):
      raise
    response = client.request(method, path, params=params, content=body)
  headers = sorted((k, v) for k, v in response.headers.multi_items()
                   if k not in ("date", "server"))
  return response.status_code, response.reason_phrase, headers, response.content


_SEGMENT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
                   min_size=1, max_size=8)


# Requests both transports are sent: method, answer kind (the server's path prefix), path
# segments, query parameters and body.
_REQUESTS = dict(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]),
                 kind=st.sampled_from(["", "gzip", "chunked", "missing", "hang-up"]),
                 segments=st.lists(_SEGMENT, max_size=3),
                 params=st.dictionaries(_SEGMENT, _SEGMENT, max_size=2),
                 body=st.binary(max_size=3000))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(**_REQUESTS)
def test_requests_and_responses_are_as_through_httpx_own_transport(clients, method, kind,
                                                                    segments, params, body):
  if method == "HEAD" and kind in ("gzip", "chunked"):
    kind = ""
  path = "/" + "/".join([kind or "plain"] + segments)
  stock, ours = clients
  for _ in range(2):   # the second time on a kept-alive (or replaced) connection
    assert _outcome(ours, method, path, params, body) == _outcome(stock, method, path, params,
                                                                  body, stock=True)


def test_an_idle_connection_the_server_closed_is_replaced(server):
  transport = _transport.StdlibTransport()
  with httpx.Client(base_url=server, mounts={server: transport}) as client:
    assert client.get("/hang-up").status_code == 200     # the server closes it afterwards
    conn = transport._idle[("127.0.0.1", int(server.rsplit(":", 1)[1]))][0]
    conn.sock.recv(1, socket.MSG_PEEK)                   # wait for the server's FIN
    for _ in range(3):
      assert client.post("/again", content=b"x").status_code == 200


def test_failures_are_httpx_exceptions(server):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    free = f"http://127.0.0.1:{s.getsockname()[1]}"
  with httpx.Client(base_url=free, mounts=_transport.mounts_for(free)) as client:
    with pytest.raises(httpx.ConnectError):
      client.get("/")
  silent = socket.socket()
  silent.bind(("127.0.0.1", 0))
  silent.listen()
  url = f"http://127.0.0.1:{silent.getsockname()[1]}"
  try:
    with httpx.Client(base_url=url, mounts=_transport.mounts_for(url), timeout=0.3) as client:
      with pytest.raises(httpx.ReadTimeout):
        client.post("/", content=b"never answered")
  finally:
    silent.close()


def test_only_plain_http_without_a_proxy_uses_it(monkeypatch):
  for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
    monkeypatch.delenv(name, raising=False)
  assert list(_transport.mounts_for("http://user:pw@10.0.0.1:8080/")) == ["http://10.0.0.1:8080"]
  assert _transport.mounts_for("https://env.example:8443") == {}
  monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
  assert _transport.mounts_for("http://10.0.0.1:8080") == {}


class _AsyncClients:
  """httpx's own async transport and AsyncioTransport, clients of the server on one loop."""

  def __init__(self, server):
    self.loop = asyncio.new_event_loop()
    mounts = _transport.mounts_for(server, asynchronous=True)
    assert [type(t).__name__ for t in mounts.values()] == ["AsyncioTransport"]
    self.stock = httpx.AsyncClient(base_url=server, headers={"X-API-Key": "k"})
    self.ours = httpx.AsyncClient(base_url=server, headers={"X-API-Key": "k"}, mounts=mounts)

  def outcomes(self, method, path, params, body, repeats=2):
    """([outcome through httpx's own transport] * repeats, [through ours] * repeats)."""
    async def go(client):
      seen = []
      for _ in range(repeats):   # after the first, on a kept-alive (or replaced) connection
        try:
          response = await client.request(method, path, params=params, content=body)
        except _CLOSED_UNDER_IT:
          # After a /hang-up answer the server closes the kept-alive connection; a request that
          # goes out on it before the close arrives gets no answer. httpx's own transport
          # raises then, ours sends the request once more on a new connection (tested in
          # test_async_a_request_on_a_connection_closed_under_it_is_sent_again), so only the
          # stock client is asked again. (Catching RemoteProtocolError alone failed a
          # 300-example run: HEAD /hang-up/... twice, the second reset, a ReadError.)
          if client is not self.stock or not path.startswith("/hang-up"):
            raise
          response = await client.request(method, path, params=params, content=body)
        seen.append((response.status_code, response.reason_phrase,
                     sorted((k, v) for k, v in response.headers.multi_items()
                            if k not in ("date", "server")), response.content))
      return seen
    return self.loop.run_until_complete(go(self.stock)), self.loop.run_until_complete(go(self.ours))

  def close(self):
    self.loop.run_until_complete(self.stock.aclose())
    self.loop.run_until_complete(self.ours.aclose())
    self.loop.close()


@pytest.fixture(scope="module")
def async_clients(server):
  clients = _AsyncClients(server)
  yield clients
  clients.close()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(**_REQUESTS)
def test_async_requests_and_responses_are_as_through_httpx_own_transport(
    async_clients, method, kind, segments, params, body):
  if method == "HEAD" and kind in ("gzip", "chunked"):
    kind = ""
  path = "/" + "/".join([kind or "plain"] + segments)
  stock, ours = async_clients.outcomes(method, path, params, body)
  assert ours == stock


def test_async_large_bodies_and_streamed_responses(server, async_clients):
  body = bytes(range(256)) * 4096   # 1 MiB: several writes, flow control
  stock, ours = async_clients.outcomes("PUT", "/plain/big", {}, body, repeats=3)
  assert ours == stock
  assert base64.b64decode(json.loads(ours[0][3])["body"]) == body

  async def streamed():
    mounts = _transport.mounts_for(server, asynchronous=True)
    async with httpx.AsyncClient(base_url=server, mounts=mounts) as client:
      async with client.stream("POST", "/chunked/x", content=b"abc") as response:
        pieces = [piece async for piece in response.aiter_raw()]
      again = await client.get("/plain")   # the connection went back to the pool
      return response.status_code, response.headers.get_list("x-many"), pieces, again
  status, many, pieces, again = asyncio.run(streamed())
  assert status == 207 and many == ["a", "b"] and len(pieces) >= 1
  assert json.loads(b"".join(pieces))["body"] == base64.b64encode(b"abc").decode()
  assert again.status_code == 200


def test_async_idle_connection_the_server_closed_is_replaced(server):
  async def go():
    transport = _transport.mounts_for(server, asynchronous=True)[server]
    async with httpx.AsyncClient(base_url=server, mounts={server: transport}) as client:
      assert (await client.get("/hang-up")).status_code == 200   # the server closes it after
      await asyncio.sleep(0.2)                                    # its FIN arrives
      return [(await client.post("/again", content=b"x")).status_code for _ in range(3)]
  assert asyncio.run(go()) == [200, 200, 200]


def test_async_failures_are_httpx_exceptions(server):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    free = f"http://127.0.0.1:{s.getsockname()[1]}"
  silent = socket.socket()
  silent.bind(("127.0.0.1", 0))
  silent.listen()
  url = f"http://127.0.0.1:{silent.getsockname()[1]}"

  async def go():
    async with httpx.AsyncClient(base_url=free, mounts=_transport.mounts_for(
        free, asynchronous=True)) as client:
      with pytest.raises(httpx.ConnectError):
        await client.get("/")
    async with httpx.AsyncClient(base_url=url, timeout=0.3, mounts=_transport.mounts_for(
        url, asynchronous=True)) as client:
      with pytest.raises(httpx.ReadTimeout):
        await client.post("/", content=b"never answered")
  try:
    asyncio.run(go())
  finally:
    silent.close()


def test_async_a_request_on_a_connection_closed_under_it_is_sent_again():
  """A server that reads the next request on a kept-alive connection and closes it without a
  byte of answer (an idle-timeout close racing the request) never handled it: the transport
  sends it once more on a new connection. One that answered part of a head did handle it:
  that is an error, not sent again."""
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen()
  url = f"http://127.0.0.1:{listener.getsockname()[1]}"
  ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
  seen = []

  def serve(script):   # per connection: answers, where None closes without a byte
    for answers in script:
      conn, _ = listener.accept()
      with conn:
        for answer in answers:
          seen.append(conn.recv(65536).split(b" ")[1])
          if answer is None:
            break
          conn.sendall(answer)

  async def go(paths):
    transport = _transport.mounts_for(url, asynchronous=True)[url]
    async with httpx.AsyncClient(base_url=url, mounts={url: transport}) as client:
      return [(await client.post(path, content=b"x")).status_code for path in paths]

  thread = threading.Thread(target=serve, args=([[ok, None], [ok]],), daemon=True)
  thread.start()
  assert asyncio.run(go(["/a", "/b"])) == [200, 200]
  thread.join(5)
  assert seen == [b"/a", b"/b", b"/b"]

  seen.clear()
  thread = threading.Thread(target=serve, args=([[ok, b"HTTP/1.1 2"]],), daemon=True)
  thread.start()
  with pytest.raises(httpx.RemoteProtocolError):
    asyncio.run(go(["/a", "/b"]))
  thread.join(5)
  listener.close()
  assert seen == [b"/a", b"/b"]
