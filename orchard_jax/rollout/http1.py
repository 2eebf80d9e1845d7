"""A small asyncio HTTP/1.1 client: what `AsyncSGLangClient` sends to SGLang servers with.

Every model call the recording proxy serves makes one `/generate` request, so this client's CPU
is part of what the proxy adds to each call. Measured on the proxy's event loop (uvloop, one
`/generate` of a 900-id prompt to a local server): aiohttp 0.34-0.65 ms of CPU per request, an
httpx transport framed by h11 0.54 ms (h11's state machine and header validation alone are
~0.08 ms, building an `httpx.Request` ~0.02 ms), this client 0.11-0.18 ms. It writes the
request in one write and reads the response with httptools (llhttp, the C parser uvicorn
serves with), and keeps idle connections in a last-in-first-out pool per origin.

What it does: plain http:// and https:// (TLS with the system's trust store), requests with or
without a body, responses framed by Content-Length, chunked encoding or the connection's close,
keep-alive (a connection the server closed, wrote to while idle, or answered with
`Connection: close` is not reused), reading a response whole or as it arrives (reading pauses
while 1 MiB waits unread), a deadline per request (`timeout_s`, the whole exchange, as
aiohttp's total timeout). A request is sent once more on a new connection when the kept-alive
connection it went out on was closed without one byte of answer (the server closed an idle
connection as the request left, and never handled it). A request that is cancelled, times out
or whose response is left unread closes its connection, which is how a server (SGLang, the
embedded engine) learns that its caller gave up and aborts the generation.

What it does not: proxies from the environment, redirects, cookies, compression, 1xx
`Expect: 100-continue` exchanges, pipelining. Use one `HTTP1Client` per event loop.

Example:
  client = HTTP1Client({"Authorization": "Bearer k"})
  status, body = await client.request("POST", "http://127.0.0.1:30000", "/generate", b"{}")
  async with await client.open("POST", url, "/generate", payload, timeout_s=600) as response:
    async for chunk in response.chunks(): ...
  await client.aclose()
"""
from __future__ import annotations

import asyncio
import functools
import select
import socket
import ssl
import urllib.parse
from typing import AsyncIterator, Optional

import httptools

_HIGH_WATER = 1 << 20   # response bytes received and unread before reading pauses


class HTTPTransportError(Exception):
  """The exchange failed below HTTP: the server could not be reached (`sent` False: nothing
  was sent), or the connection broke or carried something that is not HTTP/1.1."""

  def __init__(self, message: str, *, sent: bool = True):
    super().__init__(message)
    self.sent = sent


@functools.lru_cache(maxsize=256)
def _origin(base_url: str) -> tuple[str, str, int, bytes]:
  """(scheme, host, port, Host header value) of "http(s)://host[:port]"."""
  parts = urllib.parse.urlsplit(base_url)
  if parts.scheme not in ("http", "https") or not parts.hostname:
    raise ValueError(f"expected an http:// or https:// URL with a host; got {base_url!r}")
  port = parts.port or (443 if parts.scheme == "https" else 80)
  return parts.scheme, parts.hostname, port, parts.netloc.rsplit("@", 1)[-1].encode("idna")


class _Connection(asyncio.Protocol):
  """One TCP connection and the response being read on it (httptools' callbacks land here)."""

  def __init__(self):
    self.transport: Optional[asyncio.Transport] = None
    self.fd = -1
    self.parser = None          # a response parser while a request is in flight
    self.status: Optional[int] = None
    self.chunks: list[bytes] = []
    self.buffered = 0
    self.framed = False         # Content-Length or Transfer-Encoding seen
    self.keep_alive = False
    self.complete = False       # the whole response was read from the connection
    self.received = False       # bytes arrived since the request went out (or while idle)
    self.eof = False
    self.error: Optional[BaseException] = None
    self._paused = False
    self._waiter: Optional[asyncio.Future] = None

  # -- asyncio.Protocol
  def connection_made(self, transport):
    self.transport = transport
    sock = transport.get_extra_info("socket")
    if sock is not None:
      self.fd = sock.fileno()
      if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

  def data_received(self, data: bytes) -> None:
    self.received = True
    if self.parser is None:      # written to while idle: never reused (`reusable`)
      return
    try:
      self.parser.feed_data(data)
    except httptools.HttpParserError as e:
      self.error = HTTPTransportError(f"the server's answer is not HTTP/1.1: {e}")
      self.transport.close()
    self._wake()

  def eof_received(self):
    self.eof = True
    self._wake()
    return False   # close the transport

  def connection_lost(self, exc):
    self.eof = True
    if exc is not None and self.error is None:
      self.error = exc
    self._wake()

  # -- httptools callbacks
  def on_header(self, name: bytes, value: bytes) -> None:
    if name.lower() in (b"content-length", b"transfer-encoding"):
      self.framed = True

  def on_headers_complete(self) -> None:
    self.status = self.parser.get_status_code()
    self.keep_alive = self.parser.should_keep_alive()

  def on_body(self, body: bytes) -> None:
    self.chunks.append(bytes(body))
    self.buffered += len(body)
    if self.buffered > _HIGH_WATER and not self._paused:
      self._paused = True
      self.transport.pause_reading()

  def on_message_complete(self) -> None:
    self.complete = True

  # -- used by the client
  def _wake(self) -> None:
    if self._waiter is not None and not self._waiter.done():
      self._waiter.set_result(None)

  async def _wait(self) -> None:
    self._waiter = asyncio.get_running_loop().create_future()
    try:
      await self._waiter
    finally:
      self._waiter = None

  def begin(self, data: bytes) -> None:
    """Send a request (all of `data` in one write) and expect its response."""
    if self.eof or self.transport.is_closing():
      raise HTTPTransportError("the connection is closed")
    self.parser = httptools.HttpResponseParser(self)
    self.status, self.chunks, self.buffered = None, [], 0
    self.framed = self.keep_alive = self.complete = self.received = False
    self.transport.write(data)

  def _broken(self, what: str) -> HTTPTransportError:
    if isinstance(self.error, HTTPTransportError):
      return self.error
    reason = f": {type(self.error).__name__}: {self.error}" if self.error is not None else ""
    return HTTPTransportError(f"the server closed the connection {what}{reason}")

  async def head(self) -> int:
    """The response's status, once its head arrived."""
    while self.status is None:
      if self.eof:
        raise self._broken("without answering")
      await self._wait()
    return self.status

  async def chunk(self) -> bytes:
    """The body bytes that arrived since the last call (waiting for some); b"" at its end."""
    while not self.chunks:
      if self.complete:
        return b""
      if self.eof:
        if self.error is None and self.status is not None and not self.framed:
          self.complete = True     # a body delimited by the connection's close
          return b""
        raise self._broken("in the middle of the answer")
      await self._wait()
    data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
    self.chunks, self.buffered = [], 0
    if self._paused:
      self._paused = False
      self.transport.resume_reading()
    return data

  def reusable(self) -> bool:
    """Idle, its last exchange complete and kept alive, and nothing arrived since (also what
    the event loop has not read yet: a close that arrived since its last turn)."""
    if (self.eof or self.received or not self.complete or not self.keep_alive
        or self.transport.is_closing()):
      return False
    if self.fd < 0:
      return True
    poller = select.poll()
    poller.register(self.fd, select.POLLIN)
    return not poller.poll(0)

  def close(self) -> None:
    if self.transport is not None:
      self.transport.close()


class Response:
  """A response being read: `status`, then the body whole (`read`) or as it arrives (`chunks`).
  Use it as an async context manager (or call `close`): the connection goes back to the pool
  when the body was read to its end, and is closed otherwise."""

  def __init__(self, client: "HTTP1Client", origin: tuple, conn: _Connection, status: int,
               deadline: Optional[float]):
    self._client, self._origin, self._conn = client, origin, conn
    self.status = status
    self._deadline = deadline
    self._closed = False

  async def _chunk(self) -> bytes:
    if self._deadline is None:
      return await self._conn.chunk()
    async with asyncio.timeout_at(self._deadline):
      return await self._conn.chunk()

  async def read(self) -> bytes:
    """The whole body (the rest of it, after chunks already read)."""
    parts = []
    while chunk := await self._chunk():
      parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)

  async def chunks(self) -> AsyncIterator[bytes]:
    """The body as it arrives, in the pieces the socket gave."""
    while chunk := await self._chunk():
      yield chunk

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      self._client._release(self._origin, self._conn)

  async def __aenter__(self) -> "Response":
    return self

  async def __aexit__(self, *exc) -> None:
    self.close()


class HTTP1Client:
  """HTTP/1.1 requests over pooled keep-alive connections (module docstring).

  Args:
    headers: sent with every request (e.g. Authorization).
    max_idle: idle connections kept per origin.
  Raises (from its methods):
    HTTPTransportError: unreachable server, broken connection, not HTTP/1.1.
    TimeoutError: the deadline passed.
    ValueError: a URL that is not http(s)://host[:port].
  """

  def __init__(self, headers: Optional[dict[str, str]] = None, max_idle: int = 64):
    self._headers = b"".join(f"{k}: {v}\r\n".encode("latin-1")
                             for k, v in (headers or {}).items())
    self.max_idle = max_idle
    self._idle: dict[tuple, list[_Connection]] = {}
    self._ssl: Optional[ssl.SSLContext] = None

  async def request(self, method: str, base_url: str, path: str, body: Optional[bytes] = None,
                    *, content_type: str = "application/json",
                    timeout_s: Optional[float] = None) -> tuple[int, bytes]:
    """(status, body) of one request; `timeout_s` bounds the whole exchange."""
    async with asyncio.timeout(timeout_s):
      origin = _origin(base_url)
      conn, status = await self._exchange(origin, self._head(method, origin, path, body,
                                                            content_type), body)
      try:
        data = await Response(self, origin, conn, status, None).read()
      except BaseException:
        conn.close()
        raise
      self._release(origin, conn)
      return status, data

  async def open(self, method: str, base_url: str, path: str, body: Optional[bytes] = None,
                 *, content_type: str = "application/json",
                 timeout_s: Optional[float] = None) -> Response:
    """A response whose head arrived, its body still to read; `timeout_s` bounds the whole
    exchange, body included."""
    deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
    async with asyncio.timeout_at(deadline):
      origin = _origin(base_url)
      conn, status = await self._exchange(origin, self._head(method, origin, path, body,
                                                            content_type), body)
    return Response(self, origin, conn, status, deadline)

  def _head(self, method: str, origin: tuple, path: str, body: Optional[bytes],
            content_type: str) -> bytes:
    head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method.encode(), path.encode(), origin[3],
                                                 self._headers)
    if body is not None:
      head += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type.encode(), len(body))
    elif method in ("POST", "PUT", "PATCH"):
      head += b"Content-Length: 0\r\n"
    return head + b"\r\n"

  async def _exchange(self, origin: tuple, head: bytes, body: Optional[bytes]
                      ) -> tuple[_Connection, int]:
    data = head + body if body else head
    conn = self._take(origin)
    reused = conn is not None
    if conn is None:
      conn = await self._connect(origin)
    try:
      conn.begin(data)
      return conn, await conn.head()
    except HTTPTransportError:
      conn.close()
      if not reused or conn.received:
        raise
    except BaseException:
      conn.close()
      raise
    # The kept-alive connection was closed without one byte of answer: the server closed it
    # as the request went out and never handled it. Sent once more, on a new connection.
    conn = await self._connect(origin)
    try:
      conn.begin(data)
      return conn, await conn.head()
    except BaseException:
      conn.close()
      raise

  async def _connect(self, origin: tuple) -> _Connection:
    scheme, host, port, _ = origin
    context = None
    if scheme == "https":
      if self._ssl is None:
        self._ssl = ssl.create_default_context()
      context = self._ssl
    try:
      _, conn = await asyncio.get_running_loop().create_connection(
        _Connection, host, port, ssl=context, server_hostname=host if context else None)
    except OSError as e:
      raise HTTPTransportError(f"cannot connect to {host}:{port}: {e}", sent=False) from e
    return conn

  def _take(self, origin: tuple) -> Optional[_Connection]:
    pool = self._idle.get(origin)
    while pool:
      conn = pool.pop()
      if conn.reusable():
        return conn
      conn.close()
    return None

  def _release(self, origin: tuple, conn: _Connection) -> None:
    """Back to the pool when its exchange ended cleanly and it may be reused; else closed."""
    conn.parser = None
    if conn.complete and not conn.chunks:
      conn.received = False      # from here on, bytes that arrive make it unfit (`reusable`)
    pool = self._idle.setdefault(origin, [])
    if len(pool) < self.max_idle and conn.reusable():
      pool.append(conn)
    else:
      conn.close()

  async def aclose(self) -> None:
    """Close the idle connections."""
    pools, self._idle = list(self._idle.values()), {}
    for pool in pools:
      for conn in pool:
        conn.close()
