"""Running the service: in this process (`Orchestrator`), in a child process (`ServiceProcess`),
or from the command line (`python -m orchard_jax.env serve`).

    with Orchestrator(LocalBackend(), api_keys=[key]) as service, \\
         SandboxClient(service.url, key) as env:
      with env.create_sandbox(image="host") as box:
        print(box.exec("echo hi").stdout)

Leaving the block stops the service and deletes every sandbox it holds, on success, on error
and on Ctrl-C.
"""
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

import httpx
import uvicorn

from orchard_jax.env import app as _app
from orchard_jax.env import store as _store
from orchard_jax.env import tenants as _tenants
from orchard_jax.env.backends.base import Backend
from orchard_jax.env.errors import BackendUnavailable, EnvError
from orchard_jax.env.manager import SandboxManager, ServiceConfig

_log = logging.getLogger("orchard_jax.env")
API_KEYS_ENV = "ORCHARD_ENV_API_KEYS"
ADMIN_KEYS_ENV = "ORCHARD_ENV_ADMIN_KEYS"
_KEEP_ALIVE_SECONDS = 65


def load_api_keys(path: Optional[str] = None, env_var: str = API_KEYS_ENV) -> list:
  """API keys from a file (one "[tenant:]key" per line, '#' comments) and/or an environment
  variable (comma-separated entries). Returns [] when neither gives any."""
  keys = []
  if path:
    with open(path) as f:
      keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
  keys += [k.strip() for k in os.environ.get(env_var, "").split(",") if k.strip()]
  return keys


def new_event_loop() -> asyncio.AbstractEventLoop:
  """The service's event loop: uvloop's when it is installed (it comes with uvicorn[standard];
  about half the per-request overhead of asyncio's own), else asyncio's."""
  try:
    import uvloop
    return uvloop.new_event_loop()
  except ImportError:
    return asyncio.new_event_loop()


class Orchestrator:
  """The Orchard Env service running in a background thread of this process.

  Args:
    backend: where sandboxes run (e.g. LocalBackend(), KubernetesBackend(...)).
    api_keys: tenants' X-API-Key values, as "[tenant:]key" entries or a {tenant: key or
      [keys]} dict (see orchard_jax.env.tenants); None generates one key (see `api_key`).
    admin_keys: keys that see and manage every tenant's sandboxes (same forms).
    host, port: where to listen (port 0 picks a free port; see `url`).
    store: record store (default MemoryStore).
    config: ServiceConfig policy.
    public_url: base URL written into exposed-port URLs.
    log_level: uvicorn's log level.
  Raises (on enter):
    BackendUnavailable or another EnvError if the backend cannot start; OSError if the
    address cannot be bound.
  """

  def __init__(self, backend: Backend, *, api_keys=None, admin_keys=None,
               host: str = "127.0.0.1", port: int = 0, store: Optional[_store.Store] = None,
               config: Optional[ServiceConfig] = None, public_url: Optional[str] = None,
               log_level: str = "warning"):
    self.api_keys = api_keys if api_keys else [secrets.token_urlsafe(24)]
    self.admin_keys = admin_keys
    self.tenants = _tenants.Tenants(self.api_keys, admin_keys)   # checks the keys now
    self.manager = SandboxManager(backend, store or _store.MemoryStore(), config or ServiceConfig())
    self.host, self.port = host, port
    self.public_url = public_url
    self.log_level = log_level
    self._thread = None
    self._server = None
    self._loop = None
    self._startup_error = None
    self._started = threading.Event()

  @property
  def api_key(self) -> str:
    """The first tenant key (without its "tenant:" prefix)."""
    return _tenants.first_key(self.api_keys)

  @property
  def url(self) -> str:
    host = self.host if self.host not in ("0.0.0.0", "::") else "127.0.0.1"
    return f"http://{host}:{self.port}"

  def _lifespan(self, start: bool = True):
    @contextlib.asynccontextmanager
    async def lifespan(_app_):
      if start:
        await self.manager.start()
      try:
        yield
      finally:
        await self.manager.stop()
    return lifespan

  def build(self, *, start: bool = True):
    """The FastAPI app; its lifespan stops the manager (deleting its sandboxes) at shutdown,
    and starts it first unless `start` is False (`serve` starts it before serving, so a
    backend that cannot start is one error, not a server that fails mid-start)."""
    return _app.build_app(self.manager, self.tenants, public_url=self.public_url,
                          lifespan=self._lifespan(start))

  def bind(self) -> socket.socket:
    """The listening socket at host:port (port 0: a free one, written back to `port`).

    Its protocol is given as IPPROTO_TCP, which accepted connections inherit: asyncio sets
    TCP_NODELAY only on sockets that say so. Without it every response (headers and body are
    two writes) waits out the client's delayed ACK, about 40 ms per request."""
    sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      sock.bind((self.host, self.port))
    except OSError:
      sock.close()
      raise
    self.port = sock.getsockname()[1]
    return sock

  async def serve(self, sock: socket.socket, on_ready=None) -> None:
    """Starts the manager, then serves on `sock` until told to exit (SIGINT or SIGTERM in the
    main thread, `close()`); the app's lifespan stops the manager (deleting its sandboxes) on
    the way out. `on_ready()` runs once requests are served."""
    await self.manager.start()
    # Idle keep-alive connections are kept longer than clients keep them (httpx: 5 s), so a
    # client never sends a request on a connection the server is closing at that moment (a
    # ReadError the client cannot retry for a non-idempotent POST).
    config = uvicorn.Config(self.build(start=False), log_level=self.log_level,
                            lifespan="on", timeout_graceful_shutdown=5, ws_ping_interval=None,
                            timeout_keep_alive=_KEEP_ALIVE_SECONDS)
    self._server = uvicorn.Server(config)
    serving = asyncio.ensure_future(self._server.serve(sockets=[sock]))
    while not self._server.started and not serving.done():
      await asyncio.sleep(0.005)
    if self._server.started and on_ready is not None:
      on_ready()
    await serving

  def __enter__(self) -> "Orchestrator":
    sock = self.bind()

    def run():
      self._loop = new_event_loop()
      asyncio.set_event_loop(self._loop)
      try:
        self._loop.run_until_complete(self.serve(sock, self._started.set))
      except BaseException as e:  # noqa: BLE001 - reported to __enter__
        if self._startup_error is None:
          self._startup_error = e
      finally:
        self._started.set()
        sock.close()
        self._loop.close()

    self._thread = threading.Thread(target=run, name="orchard-env", daemon=True)
    self._thread.start()
    self._started.wait()
    if self._startup_error is not None or self._server is None or not self._server.started:
      self._thread.join(10)
      err = self._startup_error
      if isinstance(err, EnvError):
        raise err
      raise BackendUnavailable(f"Orchard Env did not start: {err!r}")
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the server and deletes every sandbox (idempotent)."""
    if self._server is not None:
      self._server.should_exit = True
    if self._thread is not None:
      self._thread.join(60)
      self._thread = None

  def call(self, coro, timeout: float = 60):
    """Runs a coroutine on the service's event loop (tests, maintenance) and returns its result."""
    return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


class ServiceProcess:
  """The service in a child process (`python -m orchard_jax.env serve ...`), as a context manager.

  Args:
    args: extra command-line arguments for `serve` (e.g. ["--state-dir", path]).
    api_keys: keys passed through the ORCHARD_ENV_API_KEYS environment variable.
    port: 0 picks a free port.
    startup_timeout: seconds to wait for /health.
  """

  def __init__(self, args: Sequence[str] = (), *, api_keys: Optional[Sequence[str]] = None,
               admin_keys: Optional[Sequence[str]] = None, port: int = 0,
               startup_timeout: float = 60.0, env: Optional[dict] = None):
    self.api_keys = list(api_keys) if api_keys else [secrets.token_urlsafe(24)]
    self.admin_keys = list(admin_keys or [])
    self.args, self.port, self.startup_timeout = list(args), port, startup_timeout
    self.extra_env = env or {}
    self.process = None

  @property
  def api_key(self) -> str:
    return _tenants.first_key(self.api_keys)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  def __enter__(self) -> "ServiceProcess":
    if self.port == 0:
      with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
    env = dict(os.environ, **self.extra_env)
    env[API_KEYS_ENV] = ",".join(self.api_keys)
    if self.admin_keys:
      env[ADMIN_KEYS_ENV] = ",".join(self.admin_keys)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    self.process = subprocess.Popen(
        [sys.executable, "-m", "orchard_jax.env", "serve", "--host", "127.0.0.1",
         "--port", str(self.port), *self.args], env=env, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + self.startup_timeout
    while time.monotonic() < deadline:
      if self.process.poll() is not None:
        raise BackendUnavailable(f"the service process exited with {self.process.returncode} "
                                 f"during start-up")
      try:
        if httpx.get(self.url + "/health", timeout=1).status_code == 200:
          return self
      except httpx.HTTPError:
        pass
      time.sleep(0.05)
    self.kill()
    raise BackendUnavailable(f"the service did not answer on {self.url} within "
                             f"{self.startup_timeout:g} s")

  def __exit__(self, *exc) -> None:
    self.stop()

  def stop(self, timeout: float = 60) -> None:
    """SIGTERM (graceful: sandboxes are deleted), then SIGKILL after `timeout`."""
    if self.process is not None and self.process.poll() is None:
      self.process.send_signal(signal.SIGTERM)
      try:
        self.process.wait(timeout)
      except subprocess.TimeoutExpired:
        self.kill()

  def kill(self) -> None:
    """SIGKILL, no clean-up (what a crash looks like)."""
    if self.process is not None and self.process.poll() is None:
      self.process.kill()
      self.process.wait()
