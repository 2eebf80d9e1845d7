"""The synchronous SDK: SandboxClient, Sandbox and Job.

    with SandboxClient("http://127.0.0.1:8080", api_key) as env:
      with env.create_sandbox(image="host", memory="1Gi") as box:
        box.upload("main.py", b"print('hi')")
        result = box.exec("python main.py", timeout=60)
        print(result.exit_code, result.stdout)

The client deletes every sandbox it created when it is closed (leaving its `with` block,
also on an exception or Ctrl-C); a Sandbox used as a context manager deletes itself.
"""
import contextlib
import signal
import threading
import secrets
import time
from typing import Optional, Union, Sequence

import httpx

from orchard_jax.env import _http
from orchard_jax.env import _transport
from orchard_jax.env import egress as _egress
from orchard_jax.env.errors import EnvError, NotFound, PatchError, SandboxNotFound
from orchard_jax.env.results import ExecResult, PatchResult

_POLL_SECONDS = 60.0
_HTTP_MARGIN = 30.0


@contextlib.contextmanager
def _no_interrupts():
  """Defers Ctrl-C while clean-up runs (main thread only), then re-raises it."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  pending = []
  previous = signal.signal(signal.SIGINT, lambda *a: pending.append(a))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
    if pending:
      raise KeyboardInterrupt


class SandboxClient:
  """Talks to an Orchard Env service.

  Args:
    url: the service's base URL (default: $ORCHARD_ENV_URL).
    api_key: the X-API-Key (default: $ORCHARD_ENV_API_KEY).
    timeout: seconds for ordinary requests.
    retry: RetryPolicy for transient failures (connect errors, 503).
  """

  def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
               timeout: float = 60.0, retry: _http.RetryPolicy = _http.RetryPolicy()):
    self.url, self.api_key = _http.resolve(url, api_key)
    self.timeout = timeout
    self.retry = retry
    self._http = httpx.Client(base_url=self.url, headers={"X-API-Key": self.api_key},
                              timeout=timeout, limits=httpx.Limits(max_keepalive_connections=32),
                              mounts=_transport.mounts_for(self.url, max_idle=32),
                              cookies=_http.CookieJar())
    self._url = _http.RequestURLs(self._http)
    self._owned = {}
    self.client_id = secrets.token_hex(8)   # label of every sandbox this client creates
    self._created_any = False
    self._lock = threading.Lock()

  # ------------------------------------------------------------------ plumbing
  def request(self, method: str, path: str, *, idempotent: bool = False,
              timeout: Optional[float] = None, **kwargs) -> httpx.Response:
    """One HTTP call with the retry policy; raises the EnvError the service answered with."""
    if "json" in kwargs:
      kwargs.update(_http.json_body(kwargs.pop("json")))
    last = None
    for attempt in range(self.retry.attempts):
      response = exc = None
      try:
        response = self._http.request(method, self._url(path), timeout=timeout or self.timeout,
                                      **kwargs)
      except httpx.TransportError as e:
        exc = e
      if not _http.should_retry(exc, response, idempotent) or attempt == self.retry.attempts - 1:
        if exc is not None:
          if _http.should_retry(exc, None, idempotent):
            raise _http.unreachable(self.url, exc, attempt + 1) from exc
          raise exc
        _http.raise_for(response)
        return response
      last = exc or response
      time.sleep(self.retry.delay(attempt))
    raise _http.unreachable(self.url, last, self.retry.attempts)  # pragma: no cover

  def _json(self, method, path, **kwargs):
    return self.request(method, path, **kwargs).json()

  # ------------------------------------------------------------------ sandboxes
  def create_sandbox(self, image: str = "host", *, cpu=None, memory=None, disk=None,
                     pids: Optional[int] = None, timeout: Optional[float] = None,
                     heartbeat_timeout: Optional[float] = None, network: bool = False,
                     egress: Sequence[str] = (),
                     env: Optional[dict] = None, labels: Optional[dict] = None,
                     workdir: Optional[str] = None, wait: bool = True,
                     wait_timeout: float = 300.0) -> "Sandbox":
    """Creates a sandbox (deleted when this client closes).

    Args:
      image: "host", an image directory, or a container image (see orchard_jax.env.images).
      cpu: cores (1.5 or "500m"); memory, disk: bytes or quantities ("1Gi"); pids: processes.
      timeout: lifetime in seconds (TTL); heartbeat_timeout: delete after this much silence.
      network: True gives outbound network access (default: none). The host's loopback
        services are never reachable.
      egress: endpoints the sandbox may reach whatever `network` says (the allow-list), e.g.
        ["http://127.0.0.1:8123"] for a recording proxy on this host. `Sandbox.egress_url`
        then gives the URL to use inside the sandbox (see orchard_jax.env.egress).
      env: environment for every command; labels: string labels.
      workdir: the writable workspace path (default: the image's).
      wait: return only once the sandbox is ready (raises SandboxFailed if it fails).
    Raises:
      ImageError, ImageNotAllowed, LimitNotEnforceable, CapacityError, SandboxFailed.
    """
    labels = dict(labels or {}, **{_http.CLIENT_LABEL: self.client_id})
    self._created_any = True
    body = _http.create_body(image, cpu, memory, disk, pids, timeout, heartbeat_timeout,
                             network, env, labels, workdir, egress)
    if wait:   # the service waits up to _POLL_SECONDS in the same request
      body.update(wait=True, wait_timeout=min(_POLL_SECONDS, wait_timeout))
    info = self._json("POST", "/v1/sandboxes", json=body, timeout=_POLL_SECONDS + _HTTP_MARGIN)
    box = Sandbox(self, info, owned=True)
    with self._lock:
      self._owned[box.id] = box
    if wait and box.state != "ready":
      try:
        box.wait_ready(wait_timeout)
      except BaseException:
        self._forget_and_delete(box)
        raise
    return box

  def _forget_and_delete(self, box):
    with self._lock:
      self._owned.pop(box.id, None)
    try:
      self.request("DELETE", f"/v1/sandboxes/{box.id}", idempotent=True)
    except NotFound:
      pass

  def sandbox(self, sandbox_id: str) -> "Sandbox":
    """A handle on an existing sandbox (not deleted when this client closes)."""
    return Sandbox(self, self._json("GET", f"/v1/sandboxes/{sandbox_id}", idempotent=True),
                   owned=False)

  def list_sandboxes(self, labels: Optional[dict] = None) -> list:
    params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
    return self._json("GET", "/v1/sandboxes", params=params, idempotent=True)["sandboxes"]

  def delete_sandbox(self, sandbox_id: str) -> None:
    with self._lock:
      self._owned.pop(sandbox_id, None)
    self.request("DELETE", f"/v1/sandboxes/{sandbox_id}", idempotent=True)

  def health(self) -> dict:
    return self._json("GET", "/health", idempotent=True)

  def metrics(self) -> str:
    return self.request("GET", "/metrics", idempotent=True).text

  # ------------------------------------------------------------------ lifecycle
  def close(self) -> None:
    """Deletes the sandboxes this client created and closes its connections."""
    with _no_interrupts():
      with self._lock:
        ids = set(self._owned)
        self._owned.clear()
      errors = []
      if self._created_any:
        try:   # creations interrupted before their answer carry our label too
          ids |= {s["id"] for s in self.list_sandboxes({_http.CLIENT_LABEL: self.client_id})}
        except EnvError as e:
          errors.append(e)
      for sandbox_id in sorted(ids):
        try:
          self.request("DELETE", f"/v1/sandboxes/{sandbox_id}", idempotent=True)
        except NotFound:
          pass
        except EnvError as e:
          errors.append(e)
      self._http.close()
    if errors:
      raise errors[0]

  def __enter__(self) -> "SandboxClient":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class Sandbox:
  """A handle on one sandbox. Use as a context manager to delete it on leaving the block."""

  def __init__(self, client: SandboxClient, info: dict, owned: bool):
    self.client, self.info, self.owned = client, info, owned
    self.id = info["id"]

  @property
  def workdir(self) -> str:
    return self.info.get("workdir")

  @property
  def state(self) -> str:
    return self.info.get("state")

  @property
  def egress(self) -> list:
    """The allow-list: [{"endpoint": as given (canonical), "url": the same endpoint as
    reached from inside the sandbox}]."""
    return list(self.info.get("egress") or [])

  def egress_url(self, url: str) -> str:
    """The URL a program inside the sandbox uses to reach `url` (whose endpoint must be in
    the allow-list; path and query are kept). Raises ValueError otherwise."""
    return _egress.rewrite_url(url, self.egress)

  def __repr__(self):
    return f"Sandbox({self.id!r}, state={self.state!r}, image={self.info.get('image')!r})"

  def __enter__(self) -> "Sandbox":
    return self

  def __exit__(self, *exc) -> None:
    with _no_interrupts():
      self.delete()

  def _path(self, suffix=""):
    return f"/v1/sandboxes/{self.id}{suffix}"

  def refresh(self) -> dict:
    self.info = self.client._json("GET", self._path(), idempotent=True)
    return self.info

  def wait_ready(self, timeout: float = 300.0) -> dict:
    """Waits (server side) until ready; raises SandboxFailed if it failed, TimeoutError if late."""
    deadline = time.monotonic() + timeout
    while True:
      left = deadline - time.monotonic()
      step = max(0.1, min(left, _POLL_SECONDS))
      self.info = self.client._json("POST", self._path("/wait"), params={"timeout": step},
                                    idempotent=True, timeout=step + _HTTP_MARGIN)
      if self.info["state"] == "ready":
        return self.info
      if time.monotonic() >= deadline:
        raise TimeoutError(f"sandbox {self.id} not ready after {timeout:g} s "
                           f"(state {self.info['state']})")

  def delete(self) -> None:
    """Deletes the sandbox (no error if it is already gone)."""
    with self.client._lock:
      self.client._owned.pop(self.id, None)
    try:
      self.client.request("DELETE", self._path(), idempotent=True)
    except SandboxNotFound:
      pass

  def heartbeat(self) -> dict:
    self.info = self.client._json("POST", self._path("/heartbeat"), idempotent=True)
    return self.info

  # ------------------------------------------------------------------ commands
  def start(self, command: Union[str, list], *, cwd: Optional[str] = None,
            env: Optional[dict] = None, timeout: Optional[float] = None,
            merge_stderr: bool = False, max_output_bytes: Optional[int] = None,
            stdin: Union[str, bytes, None] = None, shell: Optional[str] = None) -> "Job":
    """Starts a command and returns its Job without waiting."""
    body = _http.exec_body(command, cwd, env, timeout, merge_stderr, max_output_bytes, stdin,
                           shell, wait=False)
    return Job(self, self.client._json("POST", self._path("/exec"), json=body))

  def exec(self, command: Union[str, list], *, cwd: Optional[str] = None,
           env: Optional[dict] = None, timeout: Optional[float] = None,
           merge_stderr: bool = False, max_output_bytes: Optional[int] = None,
           stdin: Union[str, bytes, None] = None, shell: Optional[str] = None,
           check: bool = False) -> ExecResult:
    """Runs a command to its end.

    Args:
      command: a shell string (bash if the image has it, else sh) or an argv list.
      cwd: working directory (default: the workspace); env: extra environment.
      timeout: seconds before the command's process tree is killed (status "timed_out").
      merge_stderr: interleave stderr into stdout.
      max_output_bytes: per-stream cap (head and tail kept, the rest reported as dropped).
      stdin: text or bytes for standard input.
      check: raise CommandFailed unless it exited 0.
    Returns:
      ExecResult; its `status` is never "running".
    """
    body = _http.exec_body(command, cwd, env, timeout, merge_stderr, max_output_bytes, stdin,
                           shell, wait=True)
    body["wait_timeout"] = _POLL_SECONDS
    job = self.client._json("POST", self._path("/exec"), json=body,
                            timeout=_POLL_SECONDS + _HTTP_MARGIN)
    result = Job(self, job).wait()
    return result.check() if check else result

  # ------------------------------------------------------------------ files
  def upload(self, path: str, data: Union[bytes, str], *, mode: int = 0o644) -> dict:
    """Writes a file (parents created; relative paths are under the workspace)."""
    data = _http.as_bytes(data, "upload data")
    return self.client._json("PUT", self._path("/files"), params={"path": path,
                             "mode": format(mode, "o")}, content=data)

  def upload_file(self, local_path: str, path: str, *, mode: Optional[int] = None) -> dict:
    import os
    with open(local_path, "rb") as f:
      data = f.read()
    return self.upload(path, data, mode=mode if mode is not None else
                       (os.stat(local_path).st_mode & 0o777))

  def download(self, path: str) -> bytes:
    """The exact bytes of a file (SandboxFileNotFound if missing)."""
    return self.client.request("GET", self._path("/files"), params={"path": path},
                               idempotent=True).content

  def list_files(self, path: str = ".") -> list:
    """Entries of a folder: dicts with name, path, type, size, mode, mtime."""
    return self.client._json("GET", self._path("/files/list"), params={"path": path},
                             idempotent=True)["entries"]

  def apply_patch(self, patch: Union[str, bytes], *, cwd: Optional[str] = None,
                  check: bool = True) -> PatchResult:
    """Applies a unified diff (git apply, then git apply --reject, then patch --fuzz=5).

    Raises:
      PatchError: when check and no method applied it (the result is in err.details).
    """
    out = self.client._json("POST", self._path("/patch"), json=_http.patch_body(patch, cwd),
                            timeout=300)
    result = PatchResult(**out)
    if check and not result.applied:
      raise PatchError(f"patch did not apply in {self.id}:{result.cwd}:\n{result.output[-3000:]}",
                       details=out)
    return result

  # ------------------------------------------------------------------ other
  def stats(self) -> dict:
    return self.client._json("GET", self._path("/stats"), idempotent=True)

  def expose_port(self, port: int, *, ttl: float = 3600) -> dict:
    """Publishes `port` of the sandbox at an unguessable URL ({"url", "expires_at", "id"})."""
    return self.client._json("POST", self._path("/ports"), json={"port": port, "ttl": ttl})

  def unexpose_port(self, exposure_id: str) -> None:
    self.client.request("DELETE", self._path(f"/ports/{exposure_id}"), idempotent=True)

  def pty_url(self) -> str:
    """The WebSocket URL of an interactive shell (send the X-API-Key header)."""
    return self.client.url.replace("http", "ws", 1) + self._path("/pty")


class Job:
  """A command started in a sandbox. `wait()` returns its ExecResult once it has ended."""

  def __init__(self, sandbox: Sandbox, info: dict):
    self.sandbox, self.info = sandbox, info
    self.id = info["id"]

  @property
  def status(self) -> str:
    return self.info["status"]

  def refresh(self) -> dict:
    self.info = self.sandbox.client._json("GET", self.sandbox._path(f"/jobs/{self.id}"),
                                          idempotent=True)
    return self.info

  def done(self) -> bool:
    return self.refresh()["status"] != "running"

  def wait(self, timeout: Optional[float] = None) -> ExecResult:
    """Waits for the end (TimeoutError if `timeout` seconds pass first; the job keeps running)."""
    _http.check_wait_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.info["status"] == "running":
      step = _POLL_SECONDS if deadline is None else max(0.0, min(_POLL_SECONDS,
                                                                 deadline - time.monotonic()))
      self.info = self.sandbox.client._json(
          "POST", self.sandbox._path(f"/jobs/{self.id}/wait"), params={"timeout": step},
          idempotent=True, timeout=step + _HTTP_MARGIN)
      if self.info["status"] == "running" and deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"job {self.id} still running after {timeout:g} s")
    return ExecResult.from_job(self.info)

  def cancel(self) -> ExecResult:
    self.info = self.sandbox.client._json("POST", self.sandbox._path(f"/jobs/{self.id}/cancel"),
                                          idempotent=True)
    return self.wait()
