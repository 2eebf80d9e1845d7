"""The asyncio SDK: AsyncSandboxClient, AsyncSandbox and AsyncJob (same surface as the sync SDK).

    async with AsyncSandboxClient(url, api_key) as env:
      async with await env.create_sandbox(image="host") as box:
        result = await box.exec("echo hi")

Closing the client (leaving `async with`, also on an exception or cancellation) deletes every
sandbox it created.
"""
import asyncio
import os
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


class AsyncSandboxClient:
  """Async client of an Orchard Env service (arguments as SandboxClient's; `max_connections`
  bounds concurrent HTTP connections)."""

  def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
               timeout: float = 60.0, retry: _http.RetryPolicy = _http.RetryPolicy(),
               max_connections: int = 32):
    self.url, self.api_key = _http.resolve(url, api_key)
    self.timeout = timeout
    self.retry = retry
    self._http = httpx.AsyncClient(
        base_url=self.url, headers={"X-API-Key": self.api_key}, timeout=timeout,
        limits=httpx.Limits(max_connections=max_connections,
                            max_keepalive_connections=max_connections),
        mounts=_transport.mounts_for(self.url, max_idle=max_connections, asynchronous=True),
        cookies=_http.CookieJar())
    self._url = _http.RequestURLs(self._http)
    self._owned = {}
    self.client_id = secrets.token_hex(8)   # label of every sandbox this client creates
    self._created_any = False
    # Requests wait here, so at most max_connections are open (AsyncioTransport opens one per
    # request it cannot serve from its idle pool; httpx's own transport, used behind a proxy,
    # scans every queued request against every connection).
    self._in_flight = asyncio.Semaphore(max_connections)

  async def request(self, method: str, path: str, *, idempotent: bool = False,
                    timeout: Optional[float] = None, **kwargs) -> httpx.Response:
    """One HTTP call with the retry policy; raises the EnvError the service answered with."""
    if "json" in kwargs:
      kwargs.update(_http.json_body(kwargs.pop("json")))
    last = None
    for attempt in range(self.retry.attempts):
      response = exc = None
      try:
        async with self._in_flight:
          response = await self._http.request(method, self._url(path),
                                              timeout=timeout or self.timeout, **kwargs)
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
      await asyncio.sleep(self.retry.delay(attempt))
    raise _http.unreachable(self.url, last, self.retry.attempts)  # pragma: no cover

  async def _json(self, method, path, **kwargs):
    return (await self.request(method, path, **kwargs)).json()

  async def create_sandbox(self, image: str = "host", *, cpu=None, memory=None, disk=None,
                           pids: Optional[int] = None, timeout: Optional[float] = None,
                           heartbeat_timeout: Optional[float] = None, network: bool = False,
                           egress: Sequence[str] = (),
                           env: Optional[dict] = None, labels: Optional[dict] = None,
                           workdir: Optional[str] = None, wait: bool = True,
                           wait_timeout: float = 300.0) -> "AsyncSandbox":
    """Creates a sandbox; see SandboxClient.create_sandbox."""
    labels = dict(labels or {}, **{_http.CLIENT_LABEL: self.client_id})
    self._created_any = True
    body = _http.create_body(image, cpu, memory, disk, pids, timeout, heartbeat_timeout,
                             network, env, labels, workdir, egress)
    if wait:   # the service waits up to _POLL_SECONDS in the same request
      body.update(wait=True, wait_timeout=min(_POLL_SECONDS, wait_timeout))
    info = await self._json("POST", "/v1/sandboxes", json=body, timeout=_POLL_SECONDS + _HTTP_MARGIN)
    box = AsyncSandbox(self, info, owned=True)
    self._owned[box.id] = box
    if wait and box.state != "ready":
      try:
        await box.wait_ready(wait_timeout)
      except BaseException:
        await asyncio.shield(box.delete())
        raise
    return box

  async def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
    info = await self._json("GET", f"/v1/sandboxes/{sandbox_id}", idempotent=True)
    return AsyncSandbox(self, info, owned=False)

  async def list_sandboxes(self, labels: Optional[dict] = None) -> list:
    params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
    return (await self._json("GET", "/v1/sandboxes", params=params, idempotent=True))["sandboxes"]

  async def delete_sandbox(self, sandbox_id: str) -> None:
    self._owned.pop(sandbox_id, None)
    await self.request("DELETE", f"/v1/sandboxes/{sandbox_id}", idempotent=True)

  async def health(self) -> dict:
    return await self._json("GET", "/health", idempotent=True)

  async def aclose(self) -> None:
    """Deletes the sandboxes this client created (concurrently) and closes connections."""
    ids = set(self._owned)
    self._owned.clear()
    listing_error = None
    if self._created_any:
      try:   # creations interrupted before their answer carry our label too
        ids |= {s["id"] for s in await self.list_sandboxes({_http.CLIENT_LABEL: self.client_id})}
      except EnvError as e:
        listing_error = e

    async def _delete(sandbox_id):
      try:
        await self.request("DELETE", f"/v1/sandboxes/{sandbox_id}", idempotent=True)
      except NotFound:
        pass
    results = await asyncio.shield(asyncio.gather(*[_delete(i) for i in sorted(ids)],
                                                  return_exceptions=True))
    if listing_error is not None:
      results.append(listing_error)
    await self._http.aclose()
    errors = [r for r in results if isinstance(r, EnvError)]
    if errors:
      raise errors[0]

  async def __aenter__(self) -> "AsyncSandboxClient":
    return self

  async def __aexit__(self, *exc) -> None:
    await self.aclose()


class AsyncSandbox:
  """Async handle on one sandbox; `async with` deletes it on leaving the block."""

  def __init__(self, client: AsyncSandboxClient, info: dict, owned: bool):
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
    """The allow-list with each endpoint's address inside the sandbox (see Sandbox.egress)."""
    return list(self.info.get("egress") or [])

  def egress_url(self, url: str) -> str:
    """The URL to use inside the sandbox for `url` (see Sandbox.egress_url)."""
    return _egress.rewrite_url(url, self.egress)

  def __repr__(self):
    return f"AsyncSandbox({self.id!r}, state={self.state!r})"

  async def __aenter__(self) -> "AsyncSandbox":
    return self

  async def __aexit__(self, *exc) -> None:
    await asyncio.shield(self.delete())

  def _path(self, suffix=""):
    return f"/v1/sandboxes/{self.id}{suffix}"

  async def refresh(self) -> dict:
    self.info = await self.client._json("GET", self._path(), idempotent=True)
    return self.info

  async def wait_ready(self, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
      step = max(0.1, min(deadline - time.monotonic(), _POLL_SECONDS))
      self.info = await self.client._json("POST", self._path("/wait"), params={"timeout": step},
                                          idempotent=True, timeout=step + _HTTP_MARGIN)
      if self.info["state"] == "ready":
        return self.info
      if time.monotonic() >= deadline:
        raise TimeoutError(f"sandbox {self.id} not ready after {timeout:g} s "
                           f"(state {self.info['state']})")

  async def delete(self) -> None:
    self.client._owned.pop(self.id, None)
    try:
      await self.client.request("DELETE", self._path(), idempotent=True)
    except SandboxNotFound:
      pass

  async def heartbeat(self) -> dict:
    self.info = await self.client._json("POST", self._path("/heartbeat"), idempotent=True)
    return self.info

  async def start(self, command: Union[str, list], *, cwd=None, env=None, timeout=None,
                  merge_stderr=False, max_output_bytes=None, stdin=None,
                  shell=None) -> "AsyncJob":
    body = _http.exec_body(command, cwd, env, timeout, merge_stderr, max_output_bytes, stdin,
                           shell, wait=False)
    return AsyncJob(self, await self.client._json("POST", self._path("/exec"), json=body))

  async def exec(self, command: Union[str, list], *, cwd: Optional[str] = None,
                 env: Optional[dict] = None, timeout: Optional[float] = None,
                 merge_stderr: bool = False, max_output_bytes: Optional[int] = None,
                 stdin: Union[str, bytes, None] = None, shell: Optional[str] = None,
                 check: bool = False) -> ExecResult:
    """Runs a command to its end; see Sandbox.exec."""
    body = _http.exec_body(command, cwd, env, timeout, merge_stderr, max_output_bytes, stdin,
                           shell, wait=True)
    body["wait_timeout"] = _POLL_SECONDS
    job = await self.client._json("POST", self._path("/exec"), json=body,
                                  timeout=_POLL_SECONDS + _HTTP_MARGIN)
    result = await AsyncJob(self, job).wait()
    return result.check() if check else result

  async def upload(self, path: str, data: Union[bytes, str], *, mode: int = 0o644) -> dict:
    data = _http.as_bytes(data, "upload data")
    return await self.client._json("PUT", self._path("/files"),
                                   params={"path": path, "mode": format(mode, "o")}, content=data)

  async def upload_file(self, local_path: str, path: str, *, mode: Optional[int] = None) -> dict:
    with open(local_path, "rb") as f:
      data = f.read()
    return await self.upload(path, data, mode=mode if mode is not None else
                             (os.stat(local_path).st_mode & 0o777))

  async def download(self, path: str) -> bytes:
    return (await self.client.request("GET", self._path("/files"), params={"path": path},
                                      idempotent=True)).content

  async def list_files(self, path: str = ".") -> list:
    return (await self.client._json("GET", self._path("/files/list"), params={"path": path},
                                    idempotent=True))["entries"]

  async def apply_patch(self, patch: Union[str, bytes], *, cwd: Optional[str] = None,
                        check: bool = True) -> PatchResult:
    out = await self.client._json("POST", self._path("/patch"),
                                  json=_http.patch_body(patch, cwd), timeout=300)
    result = PatchResult(**out)
    if check and not result.applied:
      raise PatchError(f"patch did not apply in {self.id}:{result.cwd}:\n{result.output[-3000:]}",
                       details=out)
    return result

  async def stats(self) -> dict:
    return await self.client._json("GET", self._path("/stats"), idempotent=True)

  async def expose_port(self, port: int, *, ttl: float = 3600) -> dict:
    return await self.client._json("POST", self._path("/ports"), json={"port": port, "ttl": ttl})

  async def unexpose_port(self, exposure_id: str) -> None:
    await self.client.request("DELETE", self._path(f"/ports/{exposure_id}"), idempotent=True)


class AsyncJob:
  """A started command; `await job.wait()` gives its ExecResult once it has ended."""

  def __init__(self, sandbox: AsyncSandbox, info: dict):
    self.sandbox, self.info = sandbox, info
    self.id = info["id"]

  @property
  def status(self) -> str:
    return self.info["status"]

  async def refresh(self) -> dict:
    self.info = await self.sandbox.client._json("GET", self.sandbox._path(f"/jobs/{self.id}"),
                                                idempotent=True)
    return self.info

  async def wait(self, timeout: Optional[float] = None) -> ExecResult:
    _http.check_wait_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.info["status"] == "running":
      step = _POLL_SECONDS if deadline is None else max(0.0, min(_POLL_SECONDS,
                                                                 deadline - time.monotonic()))
      self.info = await self.sandbox.client._json(
          "POST", self.sandbox._path(f"/jobs/{self.id}/wait"), params={"timeout": step},
          idempotent=True, timeout=step + _HTTP_MARGIN)
      if self.info["status"] == "running" and deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"job {self.id} still running after {timeout:g} s")
    return ExecResult.from_job(self.info)

  async def cancel(self) -> ExecResult:
    self.info = await self.sandbox.client._json(
        "POST", self.sandbox._path(f"/jobs/{self.id}/cancel"), idempotent=True)
    return await self.wait()
