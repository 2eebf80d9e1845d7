"""The async SDK's HTTP/1.1 transport to the service: httpx's AsyncClient API over an asyncio
protocol, h11 for HTTP/1.1 framing and a plain last-in-first-out keep-alive pool.

httpx stays the SDK's interface (requests, responses, timeouts, exceptions, retries); only the
wire below it changes. httpx's own async transport (httpcore's pool over anyio) re-examines
every pooled connection twice per request, and each idle one against all the others
(`is_idle`, readability probes through anyio's typed attributes): with AsyncSandboxClient's 32
connections that was about 1,500 checks, half of the caller's CPU per request in a fan-out of
sandbox creations (3.2 ms of CPU per create). Here taking and returning a connection is a list
pop and append, and a small request goes out in one write.

Used, like the synchronous client's StdlibTransport, for plain http:// service URLs without a
proxy configured in the environment (`_transport.mounts_for(url, asynchronous=True)`).
Behaviour as httpx's own transport gives it: keep-alive connections are pooled (one the server
closed or wrote to while idle is dropped, not reused), request bodies stream with flow control,
response bodies stream (reading pauses while 1 MiB waits unread), and failures raise httpx's
exceptions: ConnectError / ConnectTimeout before anything was sent (safe to retry), WriteError
/ WriteTimeout, ReadError / ReadTimeout and RemoteProtocolError after. A server that answers
before reading the whole body (a refusal, a 413) has its answer returned. A request whose
kept-alive connection the server closed without answering a byte is sent once more on a new
connection (the server never handled it).
"""
import asyncio
import select
import socket
from typing import Optional

import h11
import httpx

_HIGH_WATER = 1 << 20   # bytes received and unread before reading from the socket pauses
_COALESCE = 1 << 16     # request bytes gathered into one write


class _Protocol(asyncio.Protocol):
  """One TCP connection: received bytes queue here until read; writes wait while the
  transport's buffer is full."""

  def __init__(self):
    self.transport = None
    self.chunks, self.buffered = [], 0
    self.eof, self.error = False, None
    self.received = False      # bytes arrived since the connection was last taken for a request
    self._waiter = None        # a read waiting for data
    self._paused = False       # reading paused (too much unread)
    self._drained = None       # a write waiting for the buffer to drain (None: may write)

  def connection_made(self, transport):
    self.transport = transport

  def data_received(self, data):
    self.received = True
    self.chunks.append(data)
    self.buffered += len(data)
    if self.buffered > _HIGH_WATER and not self._paused:
      self._paused = True
      self.transport.pause_reading()
    self._wake()

  def eof_received(self):
    self.eof = True
    self._wake()
    return False   # close the transport

  def connection_lost(self, exc):
    self.eof = True
    self.error = exc
    self._wake()
    if self._drained is not None and not self._drained.done():
      self._drained.set_result(None)

  def pause_writing(self):
    self._drained = asyncio.get_running_loop().create_future()

  def resume_writing(self):
    if self._drained is not None and not self._drained.done():
      self._drained.set_result(None)
    self._drained = None

  def _wake(self):
    if self._waiter is not None and not self._waiter.done():
      self._waiter.set_result(None)

  async def read(self) -> bytes:
    """What arrived since the last read; b"" once the server closed (or the connection broke,
    `error` then says how)."""
    while not self.chunks:
      if self.eof:
        return b""
      self._waiter = asyncio.get_running_loop().create_future()
      try:
        await self._waiter
      finally:
        self._waiter = None
    data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
    self.chunks.clear()
    self.buffered = 0
    if self._paused:
      self._paused = False
      self.transport.resume_reading()
    return data

  async def write(self, data: bytes) -> None:
    """Writes, then waits while the transport's buffer is over its high-water mark.

    Raises:
      ConnectionError: the connection is closed or broke."""
    if self.eof and self.error is not None:
      raise self.error
    if self.transport.is_closing():
      raise ConnectionResetError("the connection is closed")
    self.transport.write(data)
    if self._drained is not None:
      await self._drained
      if self.error is not None:
        raise self.error


class _Connection:
  """A pooled connection: its protocol and its h11 state machine."""

  __slots__ = ("protocol", "h11", "fd")

  def __init__(self, protocol: _Protocol, fd: int):
    self.protocol = protocol
    self.h11 = h11.Connection(h11.CLIENT)
    self.fd = fd

  def reusable(self) -> bool:
    """Idle and untouched: the server has neither closed it nor written to it since (also
    what the event loop has not yet read: a FIN that arrived since the last turn)."""
    p = self.protocol
    if (p.eof or p.chunks or p.transport.is_closing() or self.h11.our_state is not h11.IDLE
        or self.h11.their_state is not h11.IDLE):
      return False
    poller = select.poll()
    poller.register(self.fd, select.POLLIN)
    return not poller.poll(0)

  def close(self) -> None:
    self.protocol.transport.close()


class AsyncioTransport(httpx.AsyncBaseTransport):
  """An httpx async transport for plain HTTP/1.1 over asyncio, with a keep-alive pool.

  Args:
    max_idle: idle connections kept per origin.
  Use it from one event loop (as an httpx.AsyncClient is used).
  """

  def __init__(self, max_idle: int = 32):
    self.max_idle = max_idle
    self._idle = {}      # (host, port) -> [_Connection]

  async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
    if request.url.scheme != "http":
      raise httpx.UnsupportedProtocol(f"this transport speaks plain http; got {request.url}")
    timeouts = request.extensions.get("timeout") or {}
    origin = (request.url.host, request.url.port or 80)
    reused = self._take(origin)
    conn = reused or await self._connect(origin, timeouts.get("connect"), request)
    try:
      write_error = await _send(conn, request, timeouts.get("write"))
      head = await _receive_head(conn, request, timeouts.get("read"), write_error)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
      conn.close()
      if (reused is None or conn.protocol.received
          or not isinstance(request.stream, httpx.ByteStream)):
        raise
      # The server closed this kept-alive connection as the request went out on it and sent
      # not one byte back: it closed an idle connection and never handled the request (the
      # race the pool's readability check cannot close). Sent once more on a new connection,
      # as Go's net/http does for this case whatever the method.
      conn = await self._connect(origin, timeouts.get("connect"), request)
      try:
        write_error = await _send(conn, request, timeouts.get("write"))
        head = await _receive_head(conn, request, timeouts.get("read"), write_error)
      except BaseException:
        conn.close()
        raise
    except BaseException:
      conn.close()
      raise
    return httpx.Response(head.status_code, headers=head.headers,
                          stream=_Body(self, conn, origin, request, timeouts.get("read")),
                          extensions={"http_version": b"HTTP/1.1",
                                      "reason_phrase": bytes(head.reason)})

  async def _connect(self, origin, timeout: Optional[float], request) -> _Connection:
    loop = asyncio.get_running_loop()
    try:
      async with asyncio.timeout(timeout):
        transport, protocol = await loop.create_connection(_Protocol, *origin)
    except TimeoutError as e:
      raise httpx.ConnectTimeout(f"connecting to {origin[0]}:{origin[1]} timed out",
                                 request=request) from e
    except OSError as e:
      raise httpx.ConnectError(f"cannot connect to {origin[0]}:{origin[1]}: {e}",
                               request=request) from e
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _Connection(protocol, sock.fileno())

  def _take(self, origin) -> Optional[_Connection]:
    """The most recently used idle connection still fit for a request, or None."""
    pool = self._idle.get(origin)
    while pool:
      conn = pool.pop()
      if conn.reusable():
        conn.protocol.received = False
        return conn
      conn.close()
    return None

  def _give_back(self, origin, conn: _Connection) -> None:
    pool = self._idle.setdefault(origin, [])
    if len(pool) < self.max_idle and conn.reusable():
      pool.append(conn)
    else:
      conn.close()

  async def aclose(self) -> None:
    """Closes the idle connections."""
    pools, self._idle = list(self._idle.values()), {}
    for pool in pools:
      for conn in pool:
        conn.close()


async def _send(conn: _Connection, request: httpx.Request, timeout) -> Optional[Exception]:
  """Sends the request (small ones in one write). Returns the error that cut the body short,
  if the connection broke after the headers (the server may have answered already: a 413);
  raises WriteTimeout, or WriteError if not even the headers went out."""
  pending = [conn.h11.send(h11.Request(method=request.method, target=request.url.raw_path,
                                       headers=request.headers.raw))]
  size, sent_any = len(pending[0]), False
  try:
    async with asyncio.timeout(timeout):
      async for chunk in request.stream:
        if not chunk:
          continue
        pending.append(conn.h11.send(h11.Data(data=chunk)))
        size += len(pending[-1])
        if size >= _COALESCE:
          await conn.protocol.write(b"".join(pending))
          pending, size, sent_any = [], 0, True
      pending.append(conn.h11.send(h11.EndOfMessage()))
      await conn.protocol.write(b"".join(pending))
  except TimeoutError as e:
    raise httpx.WriteTimeout("write timed out", request=request) from e
  except (OSError, h11.LocalProtocolError) as e:
    if not sent_any:
      raise httpx.WriteError(str(e) or type(e).__name__, request=request) from e
    return e
  return None


async def _receive_head(conn: _Connection, request, timeout, write_error) -> h11.Response:
  """Reads up to the response's head (skipping 1xx)."""
  try:
    async with asyncio.timeout(timeout):
      while True:
        event = await _next_event(conn, request)
        if isinstance(event, h11.Response):
          return event
        if isinstance(event, h11.InformationalResponse):
          continue
        raise httpx.RemoteProtocolError("the server closed the connection without sending a "
                                        "response", request=request)
  except TimeoutError as e:
    if write_error is not None:
      raise httpx.WriteError(str(write_error), request=request) from write_error
    raise httpx.ReadTimeout("read timed out", request=request) from e
  except h11.RemoteProtocolError as e:
    raise httpx.RemoteProtocolError(str(e), request=request) from e
  except (httpx.RemoteProtocolError, httpx.ReadError):
    if write_error is not None:
      raise httpx.WriteError(str(write_error), request=request) from write_error
    raise


async def _next_event(conn: _Connection, request):
  """The next h11 event, reading from the connection as needed (an orderly EOF is given to
  h11, which then reports ConnectionClosed, or raises RemoteProtocolError mid-message).

  Raises:
    httpx.ReadError: the connection broke (reset, not closed)."""
  while True:
    event = conn.h11.next_event()
    if event is not h11.NEED_DATA:
      return event
    data = await conn.protocol.read()
    if not data and conn.protocol.error is not None:
      error = conn.protocol.error
      raise httpx.ReadError(str(error) or type(error).__name__, request=request) from error
    conn.h11.receive_data(data)


class _Body(httpx.AsyncByteStream):
  """A response's body as it arrives; closing it returns the connection to the pool when the
  exchange ended cleanly, and closes it otherwise."""

  def __init__(self, transport: AsyncioTransport, conn: _Connection, origin, request, timeout):
    self.transport, self.conn, self.origin = transport, conn, origin
    self.request, self.timeout = request, timeout
    self.done = self.closed = False

  async def __aiter__(self):
    try:
      while not self.done:
        async with asyncio.timeout(self.timeout):
          event = await _next_event(self.conn, self.request)
        if isinstance(event, h11.Data):
          yield bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
          self.done = True
        else:
          raise httpx.RemoteProtocolError("the server closed the connection mid-response",
                                          request=self.request)
    except TimeoutError as e:
      raise httpx.ReadTimeout("read timed out", request=self.request) from e
    except h11.RemoteProtocolError as e:
      raise httpx.RemoteProtocolError(str(e), request=self.request) from e

  async def aclose(self) -> None:
    if self.closed:
      return
    self.closed = True
    h = self.conn.h11
    if self.done and h.our_state is h11.DONE and h.their_state is h11.DONE:
      h.start_next_cycle()
      self.transport._give_back(self.origin, self.conn)
    else:
      self.conn.close()
