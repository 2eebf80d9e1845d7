"""`rollout.http1.HTTP1Client` against real servers on the loopback: a raw asyncio server that
answers exactly the bytes a case needs (framings, closes, garbage), and uvicorn (the server the
embedded engine and SGLang run), whose parsing of our requests is the reference."""
import asyncio

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from orchard_jax.rollout.background import BackgroundServer
from orchard_jax.rollout.http1 import HTTP1Client, HTTPTransportError


class RawServer:
  """Answers each request with `answer(request_head, body, index)` -> bytes (None: close
  without answering; (bytes, "close"): close after them); records each request and how many
  connections were accepted."""

  def __init__(self, answer):
    self.answer, self.requests, self.connections, self.closed = answer, [], 0, asyncio.Event()

  async def handle(self, reader, writer):
    self.connections += 1
    try:
      while True:
        try:
          head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
          return
        length = 0
        for line in head.split(b"\r\n"):
          if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append((head, body))
        reply = self.answer(head, body, len(self.requests) - 1)
        if reply is None:
          return
        close = isinstance(reply, tuple)    # (bytes, "close"): close after writing them
        writer.write(reply[0] if close else reply)
        await writer.drain()
        if close:
          return
    finally:
      writer.close()
      self.closed.set()

  async def __aenter__(self):
    self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
    self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
    return self

  async def __aexit__(self, *exc):
    self.server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
  return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunked(parts: list[bytes]) -> bytes:
  out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
  for part in parts:
    if part:
      out += b"%x\r\n%s\r\n" % (len(part), part)
  return out + b"0\r\n\r\n"


def run(coro):
  return asyncio.run(coro)


def test_requests_reuse_one_kept_alive_connection_and_send_what_uvicorn_reads():
  import fastapi

  app = fastapi.FastAPI()

  @app.post("/echo")
  async def echo(request: fastapi.Request):
    return {"body": (await request.body()).decode(), "type": request.headers["content-type"],
            "auth": request.headers.get("authorization"), "port": request.client.port}

  @app.get("/empty")
  async def empty():
    return {"ok": True}

  async def main(url):
    client = HTTP1Client({"Authorization": "Bearer k"})
    outs = [await client.request("POST", url, "/echo", b'{"a": %d}' % i) for i in range(3)]
    got = await client.request("GET", url, "/empty")
    await client.aclose()
    return outs, got

  with BackgroundServer(app) as server:
    outs, got = run(main(server.url))
  import json
  bodies = [json.loads(body) for status, body in outs]
  assert [s for s, _ in outs] == [200, 200, 200] and got == (200, b'{"ok":true}')
  assert [b["body"] for b in bodies] == ['{"a": 0}', '{"a": 1}', '{"a": 2}']
  assert {b["type"] for b in bodies} == {"application/json"}
  assert {b["auth"] for b in bodies} == {"Bearer k"}
  assert len({b["port"] for b in bodies}) == 1     # one connection, kept alive


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=6),
       framing=st.sampled_from(["length", "chunked", "close"]))
def test_any_body_arrives_whole_in_every_framing(body, cuts, framing):
  """Content-Length, chunked (cut anywhere) and close-delimited bodies, read whole and as
  chunks, are the bytes the server sent."""
  points = sorted({0, len(body), *[min(c, len(body)) for c in cuts]})
  parts = [body[a:b] for a, b in zip(points, points[1:])]

  def answer(head, request_body, index):
    if framing == "length":
      return ok(body)
    if framing == "chunked":
      return chunked(parts)
    return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body, "close"

  async def main():
    async with RawServer(answer) as server:
      client = HTTP1Client()
      whole = await client.request("POST", server.url, "/x", b"{}")
      async with await client.open("POST", server.url, "/x", b"{}") as response:
        pieces = [c async for c in response.chunks()]
      await client.aclose()
      return whole, b"".join(pieces), server.connections

  (status, whole), streamed, connections = run(main())
  assert status == 200 and whole == body and streamed == body
  assert connections == (2 if framing == "close" else 1)


def test_a_kept_alive_connection_the_server_closed_is_not_reused():
  async def main():
    async with RawServer(lambda h, b, i: ok(b"x", b"Connection: close\r\n")) as server:
      client = HTTP1Client()
      for _ in range(3):
        assert await client.request("GET", server.url, "/") == (200, b"x")
      await client.aclose()
      return server.connections

  assert run(main()) == 3


def test_a_request_the_server_dropped_on_a_kept_alive_connection_is_sent_once_more():
  """The server takes the second request and closes without a byte (an idle close racing the
  request): it is resent on a new connection. On a new connection, the same is an error."""
  def answer(head, body, index):
    return None if index == 1 else ok(b"%d" % index)

  async def main():
    async with RawServer(answer) as server:
      client = HTTP1Client()
      first = await client.request("POST", server.url, "/", b"1")
      second = await client.request("POST", server.url, "/", b"2")
      await client.aclose()
    async with RawServer(lambda h, b, i: None) as server:
      client = HTTP1Client()
      with pytest.raises(HTTPTransportError, match="without answering"):
        await client.request("POST", server.url, "/", b"1")
      await client.aclose()
      return first, second, len(server.requests)

  first, second, attempts = run(main())
  assert first == (200, b"0") and second == (200, b"2") and attempts == 1


def test_failures_are_transport_errors_or_timeouts_and_close_the_connection():
  async def main():
    client = HTTP1Client()
    # Nothing listens: refused before anything was sent.
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(HTTPTransportError) as refused:
      await client.request("GET", f"http://127.0.0.1:{port}", "/")
    assert refused.value.sent is False
    # Not HTTP.
    async with RawServer(lambda h, b, i: b"SSH-2.0-OpenSSH\r\n\r\n") as server:
      with pytest.raises(HTTPTransportError, match="not HTTP"):
        await client.request("GET", server.url, "/")
    # Cut in the middle of the body.
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    async with RawServer(lambda h, b, i: (cut, "close")) as server:
      with pytest.raises(HTTPTransportError, match="middle"):
        await client.request("GET", server.url, "/")
    # Too slow: the deadline covers the whole exchange; the server sees the connection close.
    async with RawServer(lambda h, b, i: cut) as server:
      with pytest.raises(TimeoutError):
        await client.request("GET", server.url, "/", timeout_s=0.2)
      await asyncio.wait_for(server.closed.wait(), 5)
    await client.aclose()

  run(main())


def test_a_cancelled_request_closes_its_connection_so_the_server_can_abort():
  async def main():
    async with RawServer(lambda h, b, i: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
                                         b"\r\n\r\n3\r\nabc\r\n") as server:
      client = HTTP1Client()
      task = asyncio.ensure_future(client.request("POST", server.url, "/generate", b"{}"))
      while not server.requests:
        await asyncio.sleep(0.01)
      await asyncio.sleep(0.05)
      task.cancel()
      with pytest.raises(asyncio.CancelledError):
        await task
      await asyncio.wait_for(server.closed.wait(), 5)   # the server saw the close
      # A streamed response left unread closes its connection too.
      server.closed.clear()
      async with await client.open("POST", server.url, "/generate", b"{}") as response:
        assert await response.chunks().__anext__() == b"abc"
      await asyncio.wait_for(server.closed.wait(), 5)
      await client.aclose()

  run(main())


def test_a_large_body_streams_through_the_read_pause():
  body = bytes(range(256)) * (3 << 12)   # 3 MiB: reading pauses and resumes

  async def main():
    async with RawServer(lambda h, b, i: ok(body)) as server:
      client = HTTP1Client()
      async with await client.open("GET", server.url, "/") as response:
        await asyncio.sleep(0.2)          # let more than the high-water mark arrive unread
        got = b"".join([c async for c in response.chunks()])
      again = await client.request("GET", server.url, "/")
      await client.aclose()
      return got, again, server.connections

  got, again, connections = run(main())
  assert got == body and again == (200, body) and connections == 1


@pytest.mark.parametrize("url", ["ftp://h", "http://", "127.0.0.1:80"])
def test_a_url_that_is_not_http_is_refused(url):
  async def main():
    with pytest.raises(ValueError, match="http"):
      await HTTP1Client().request("GET", url, "/")

  run(main())
