"""The synchronous SDK's HTTP/1.1 transport to the service: httpx's client API over the
standard library's http.client.

httpx stays the SDK's interface (requests, responses, timeouts, exceptions, retries); only the
wire below it changes. httpcore's pool and h11's pure-Python parser cost about 0.4 ms of the
caller's CPU per request (SandboxClient.exec at load 10: 1.42 -> 1.02 ms), on a round trip
whose target is 5 ms; http.client parses a response in C-backed code.

Used for plain http:// service URLs when no proxy is configured in the environment (otherwise
httpx's own transport, with its proxy and TLS handling, is kept): see `mounts_for`.

Behaviour as httpx's own transport gives it: keep-alive connections are pooled (an idle one the
server has closed is noticed before reuse and replaced), TCP_NODELAY is set, and failures raise
httpx's exceptions: ConnectError / ConnectTimeout before anything was sent (safe to retry),
WriteError / WriteTimeout, ReadError / ReadTimeout and RemoteProtocolError after.
"""
import http.client
import select
import socket
import threading
import urllib.parse
import urllib.request
from typing import Optional

import httpx


def mounts_for(url: str, max_idle: int = 32, asynchronous: bool = False) -> dict:
  """httpx `mounts` sending requests for `url`'s origin through StdlibTransport (for an
  httpx.Client) or, `asynchronous`, AsyncioTransport (for an httpx.AsyncClient); {} for an
  https URL or when the environment configures an HTTP proxy (httpx's transport then)."""
  parts = urllib.parse.urlsplit(url)
  proxies = urllib.request.getproxies()
  if parts.scheme != "http" or not parts.hostname or "http" in proxies or "all" in proxies:
    return {}
  origin = f"http://{parts.netloc.rsplit('@', 1)[-1]}"
  if asynchronous:
    from orchard_jax.env._async_transport import AsyncioTransport
    return {origin: AsyncioTransport(max_idle=max_idle)}
  return {origin: StdlibTransport(max_idle=max_idle)}


class StdlibTransport(httpx.BaseTransport):
  """An httpx transport for plain HTTP/1.1 over http.client, with a keep-alive pool.

  Args:
    max_idle: idle connections kept per origin.
  Thread-safe: each request holds its connection alone until its response is read.
  """

  def __init__(self, max_idle: int = 32):
    self.max_idle = max_idle
    self._idle = {}      # (host, port) -> [HTTPConnection]
    self._lock = threading.Lock()

  def handle_request(self, request: httpx.Request) -> httpx.Response:
    if request.url.scheme != "http":
      raise httpx.UnsupportedProtocol(f"this transport speaks plain http; got {request.url}")
    timeouts = request.extensions.get("timeout") or {}
    origin = (request.url.host, request.url.port or 80)
    body = request.read()
    headers = [(k, v) for k, v in request.headers.raw
               if k.lower() not in (b"transfer-encoding", b"content-length")]
    if body or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
      headers.append((b"Content-Length", str(len(body)).encode()))
    target = request.url.raw_path.decode("ascii")
    conn = self._take(origin) or self._connect(origin, timeouts.get("connect"), request)
    write_error = None
    try:
      try:
        conn.sock.settimeout(timeouts.get("write"))
        conn.putrequest(request.method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
          conn.putheader(name, value)
        conn.endheaders(body or None)
      except socket.timeout as e:
        raise httpx.WriteTimeout(str(e) or "write timed out", request=request) from e
      except OSError as e:
        # The server may have answered and closed before reading the whole body (a refusal,
        # 413): read its answer, as httpx's own transport does.
        write_error = e
      try:
        conn.sock.settimeout(timeouts.get("read"))
        response = conn.getresponse()
        content = response.read()
      except (socket.timeout, http.client.HTTPException, OSError) as e:
        if write_error is not None:
          raise httpx.WriteError(str(write_error) or type(write_error).__name__,
                                 request=request) from write_error
        if isinstance(e, socket.timeout):
          raise httpx.ReadTimeout(str(e) or "read timed out", request=request) from e
        if isinstance(e, http.client.HTTPException):   # incl. RemoteDisconnected
          raise httpx.RemoteProtocolError(f"{type(e).__name__}: {e}", request=request) from e
        raise httpx.ReadError(str(e) or type(e).__name__, request=request) from e
    except BaseException:
      conn.close()
      raise
    if response.will_close or write_error is not None:
      conn.close()
    else:
      self._give_back(origin, conn)
    return httpx.Response(response.status,
                          headers=[(k.encode("latin-1"), v.encode("latin-1"))
                                   for k, v in response.getheaders()],
                          stream=httpx.ByteStream(content),
                          extensions={"http_version": b"HTTP/1.1",
                                      "reason_phrase": response.reason.encode("latin-1")})

  def _connect(self, origin, timeout: Optional[float], request) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(*origin, timeout=timeout)
    try:
      conn.connect()
    except socket.timeout as e:
      raise httpx.ConnectTimeout(f"connecting to {origin[0]}:{origin[1]} timed out",
                                 request=request) from e
    except OSError as e:
      raise httpx.ConnectError(f"cannot connect to {origin[0]}:{origin[1]}: {e}",
                               request=request) from e
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn

  def _take(self, origin) -> Optional[http.client.HTTPConnection]:
    """An idle connection the server has not closed, or None."""
    while True:
      with self._lock:
        pool = self._idle.get(origin)
        if not pool:
          return None
        conn = pool.pop()
      # Readable while idle: the server closed it (EOF) or broke the protocol.
      if conn.sock is not None and not _readable(conn.sock):
        return conn
      conn.close()

  def _give_back(self, origin, conn) -> None:
    with self._lock:
      pool = self._idle.setdefault(origin, [])
      if len(pool) < self.max_idle:
        pool.append(conn)
        return
    conn.close()

  def close(self) -> None:
    """Closes the idle connections."""
    with self._lock:
      pools, self._idle = list(self._idle.values()), {}
    for pool in pools:
      for conn in pool:
        conn.close()


def _readable(sock) -> bool:
  poller = select.poll()
  poller.register(sock, select.POLLIN)
  return bool(poller.poll(0))
