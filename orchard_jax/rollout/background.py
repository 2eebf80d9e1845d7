"""Run an ASGI app (FastAPI) with uvicorn in a background thread, as a context manager.

Recipes and tests start the engine's server and the recording proxy in-process this way; a
script that wants a separate process runs the same app with `uvicorn` directly.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Optional

import uvicorn

from orchard_jax.rollout.errors import RolloutError


class BackgroundServer:
  """Serves `app` on host:port from a daemon thread between __enter__ and __exit__.

  Args:
    app: an ASGI application.
    host: interface to bind; loopback by default.
    port: TCP port; 0 picks a free one (read it from `.port` / `.url` after entering).
    log_level: uvicorn's log level.
    startup_timeout_s: how long to wait for the server to accept connections.

  Raises:
    RolloutError: the server did not start within startup_timeout_s.
  """

  def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
               log_level: str = "warning", startup_timeout_s: float = 30.0):
    self.app = app
    self.host = host
    self._requested_port = port
    self.log_level = log_level
    self.startup_timeout_s = startup_timeout_s
    self._server: Optional[uvicorn.Server] = None
    self._thread: Optional[threading.Thread] = None
    self._socket: Optional[socket.socket] = None
    self.port: Optional[int] = None

  @property
  def url(self) -> str:
    """Base URL, e.g. "http://127.0.0.1:41234"."""
    if self.port is None:
      raise RolloutError("the server is not running; use it inside a `with` block")
    return f"http://{self.host}:{self.port}"

  def start(self) -> "BackgroundServer":
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((self.host, self._requested_port))
    self._socket = sock
    self.port = sock.getsockname()[1]
    config = uvicorn.Config(self.app, log_level=self.log_level, lifespan="on",
                            timeout_keep_alive=30, access_log=False)
    self._server = uvicorn.Server(config)
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                    name=f"uvicorn:{self.port}", daemon=True)
    self._thread.start()
    deadline = time.monotonic() + self.startup_timeout_s
    while not self._server.started:
      if not self._thread.is_alive():
        raise RolloutError(f"server on {self.host}:{self.port} exited during start-up")
      if time.monotonic() > deadline:
        self.stop()
        raise RolloutError(
          f"server on {self.host}:{self.port} did not start within {self.startup_timeout_s} s")
      time.sleep(0.01)
    return self

  def stop(self) -> None:
    if self._server is not None:
      self._server.should_exit = True
    if self._thread is not None:
      self._thread.join(timeout=30)
    if self._socket is not None:
      self._socket.close()
    self._server = self._thread = self._socket = None

  def __enter__(self) -> "BackgroundServer":
    return self.start()

  def __exit__(self, *exc: Any) -> None:
    self.stop()
