"""The Kubernetes backend: one pod per sandbox, created through the official `kubernetes` client.

- Creation is throttled (creation_qps, max_concurrent_creates). Readiness comes from one watch
  on the sandbox pods (a background thread), not from polling: `create` waits for the pod's
  Ready condition (the agent's readiness probe) and fails early on errors the kubelet reports
  (image cannot be pulled, container exits).
- Exec, file and port traffic go straight to the pod's agent at its pod IP (see
  orchard_jax.env.agent), authenticated with a per-sandbox token; the API server only sees
  pod creation and deletion. Job state lives in the agent, so any orchestrator replica can
  wait for any job.
- Network: a namespace-wide deny-egress NetworkPolicy (created at start if missing) and, for
  network=True sandboxes or an egress allow-list, a per-pod policy opening the internet or
  exactly the allowed endpoints (see k8s_manifests); host names of endpoints are resolved here
  at creation and pinned in the pod's /etc/hosts.
"""
import asyncio
import base64
import logging
import re
import secrets
import socket
import threading
import time
from typing import Optional

import httpx

from orchard_jax.env import egress as _egress
from orchard_jax.env import images as _images
from orchard_jax.env import seccomp as _seccomp
from orchard_jax.env import jobs as _jobs
from orchard_jax.env.backends import k8s_manifests as _m
from orchard_jax.env.backends.base import Backend, PtySession, SandboxSpec
from orchard_jax.env.errors import (BackendUnavailable, FileOperationError, ImageError,
                                    InvalidRequest, LimitNotEnforceable, PayloadTooLarge,
                                    SandboxFailed, SandboxFileNotFound)

_log = logging.getLogger("orchard_jax.env.kubernetes")
KubernetesConfig = _m.KubernetesConfig
_SERVICE_NAME = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)"
                           r"\.svc(?:\.cluster\.local)?")
_FATAL_WAITING = {"ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError",
                  "CreateContainerError", "RunContainerError"}


class KubernetesBackend(Backend):
  """Sandboxes as pods.

  Args:
    config: KubernetesConfig.
    api_client: a configured kubernetes.client.ApiClient (default: from kubeconfig or the
      in-cluster service account).
    kubeconfig: kubeconfig file to load when api_client is None.
    in_cluster: load the in-cluster configuration instead of a kubeconfig.
  """

  name = "kubernetes"

  def __init__(self, config: Optional[KubernetesConfig] = None, *, api_client=None,
               kubeconfig: Optional[str] = None, in_cluster: bool = False):
    self.config = config or KubernetesConfig()
    self._api_client = api_client
    self._kubeconfig, self._in_cluster = kubeconfig, in_cluster
    self._pods = {}            # pod name -> latest V1Pod seen by the watch
    self._synced = False
    self._waiters = {}         # pod name -> asyncio.Event (set on every event of that pod)
    self._watch = None
    self._watch_thread = None
    self._stopping = False
    self._loop = None
    self._http = None
    self._create_slots = None
    self._next_create = 0.0
    self._rate_lock = None

  # ------------------------------------------------------------------ lifecycle
  async def start(self) -> None:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    if self._api_client is None:
      try:
        if self._in_cluster:
          k8s_config.load_incluster_config()
        else:
          k8s_config.load_kube_config(config_file=self._kubeconfig)
      except Exception as e:  # noqa: BLE001
        raise BackendUnavailable(f"cannot load the Kubernetes configuration: {e}") from None
      self._api_client = k8s.ApiClient()
    self.core = k8s.CoreV1Api(self._api_client)
    self.networking = k8s.NetworkingV1Api(self._api_client)
    self._loop = asyncio.get_running_loop()
    self._http = httpx.AsyncClient(timeout=self.config.agent_request_timeout,
                                   limits=httpx.Limits(max_connections=1024,
                                                       max_keepalive_connections=256))
    self._create_slots = asyncio.Semaphore(self.config.max_concurrent_creates)
    self._rate_lock = asyncio.Lock()
    await self._ensure_deny_policy()
    self._watch_thread = threading.Thread(target=self._watch_loop, name="orchard-k8s-watch",
                                          daemon=True)
    self._watch_thread.start()

  async def _ensure_deny_policy(self):
    from kubernetes.client.exceptions import ApiException
    body = _m.render_deny_egress_policy(self.config)
    try:
      await asyncio.to_thread(self.networking.create_namespaced_network_policy,
                              self.config.namespace, body)
    except ApiException as e:
      if e.status != 409:   # 409: it exists already
        raise BackendUnavailable(f"cannot create the deny-egress NetworkPolicy in namespace "
                                 f"{self.config.namespace!r}: {e.status} {e.reason}") from None
    except Exception as e:  # noqa: BLE001 - unreachable API server
      raise BackendUnavailable(f"the Kubernetes API server is unreachable: {e}") from None

  async def stop(self) -> None:
    self._stopping = True
    if self._watch is not None:
      self._watch.stop()
    if self._http is not None:
      await self._http.aclose()

  def describe(self) -> dict:
    return {"backend": self.name, "namespace": self.config.namespace,
            "limits": {"cpu": True, "memory": True, "disk": True,
                       "pids": self.config.node_pids_limit is not None},
            "isolation": {"pod": True, "capabilities": "none (drop ALL)",
                          "no_new_privs": True},
            "seccomp": {"pod_profile": _m.seccomp_profile(self.config),
                        "profile": _seccomp.describe()},
            "network": {"network_true": "NetworkPolicy: internet and cluster DNS, no private "
                                        "ranges", "egress": "NetworkPolicy rules to the "
                                        "endpoints' addresses and ports; names pinned with "
                                        "hostAliases"}}

  # ------------------------------------------------------------------ watch
  def _watch_loop(self):
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException
    selector = f"{_m.LABEL_MANAGED}={_m.MANAGED_BY}"
    version = None
    while not self._stopping:
      try:
        if version is None:
          listing = self.core.list_namespaced_pod(self.config.namespace, label_selector=selector)
          version = listing.metadata.resource_version
          snapshot = {p.metadata.name: p for p in listing.items}
          self._loop.call_soon_threadsafe(self._replace, snapshot)
        self._watch = watch.Watch()
        for event in self._watch.stream(self.core.list_namespaced_pod, self.config.namespace,
                                        label_selector=selector, resource_version=version,
                                        timeout_seconds=60):
          pod = event["object"]
          version = pod.metadata.resource_version
          self._loop.call_soon_threadsafe(self._on_event, event["type"], pod)
          if self._stopping:
            break
      except ApiException as e:
        if e.status == 410:   # our resourceVersion is too old: list again
          version = None
        else:
          time.sleep(0.5)
      except Exception:  # noqa: BLE001 - reconnect
        if self._stopping:
          return
        time.sleep(0.5)
        version = None

  def _replace(self, snapshot):
    self._pods = snapshot
    self._synced = True
    for name in list(self._waiters):
      self._waiters[name].set()

  def _on_event(self, kind, pod):
    name = pod.metadata.name
    if kind == "DELETED":
      self._pods.pop(name, None)
    else:
      self._pods[name] = pod
    event = self._waiters.get(name)
    if event is not None:
      event.set()

  # ------------------------------------------------------------------ sandboxes
  def _image(self, spec: SandboxSpec) -> str:
    resolved = _images.resolve_image(spec.image, allowed_roots=[], allow_container=True) \
        if not spec.image.startswith("/") else None
    if resolved is None:
      raise ImageError(f"image {spec.image!r} is a directory on this machine; the kubernetes "
                       f"backend runs container images (e.g. 'python:3.11-slim')")
    return self.config.default_image if resolved.kind == "host" else spec.image

  def validate(self, spec: SandboxSpec) -> dict:
    self._image(spec)
    node = self.config.node_pids_limit
    if spec.pids is not None and (node is None or spec.pids < node):
      raise LimitNotEnforceable(
          f"pids={spec.pids} cannot be enforced per pod on Kubernetes; the nodes' podPidsLimit "
          f"is {node if node is not None else 'not configured (node_pids_limit)'}; ask for "
          f"pids >= that or none", details={"missing": ["pids"]})
    try:
      endpoints = _egress.parse_endpoints(spec.egress)
    except ValueError as e:
      raise InvalidRequest(f"egress: {e}", details={"field": "egress"}) from None
    return {"workdir": spec.workdir or self.config.workdir, "env": {},
            "egress": [{"endpoint": e.origin, "url": e.origin} for e in endpoints]}

  async def _resolve(self, spec: SandboxSpec) -> list:
    """The egress endpoints with the addresses their hosts have now. A cluster Service named
    `<service>.<namespace>.svc[.cluster.local]` is read from the API server: its ClusterIP is
    the address (pinned in the pod's /etc/hosts), and its pods (selector, target port) are
    the policy's peer too, since most CNIs apply policies after the Service's address
    translation."""
    out = []
    for endpoint in _egress.parse_endpoints(spec.egress):
      service = _SERVICE_NAME.fullmatch(endpoint.host)
      if service is not None:
        out.append(await self._service_endpoint(endpoint, *service.group(1, 3)))
        continue
      if endpoint.address is not None:
        addresses = [str(endpoint.address)]
      else:
        try:
          infos = await asyncio.to_thread(socket.getaddrinfo, endpoint.host, endpoint.port,
                                          type=socket.SOCK_STREAM)
        except OSError as e:
          raise SandboxFailed(f"egress endpoint {endpoint.origin}: cannot resolve "
                              f"{endpoint.host!r}: {e}") from None
        addresses = sorted({info[4][0] for info in infos})
      out.append({"host": endpoint.host, "port": endpoint.port, "addresses": addresses})
    return out

  async def _service_endpoint(self, endpoint, name: str, namespace: str) -> dict:
    from kubernetes.client.exceptions import ApiException
    try:
      service = await asyncio.to_thread(self.core.read_namespaced_service, name, namespace)
    except ApiException as e:
      raise SandboxFailed(f"egress endpoint {endpoint.origin}: cannot read Service {name!r} "
                          f"in namespace {namespace!r}: {e.status} {e.reason}") from None
    ports = [p for p in service.spec.ports or () if p.port == endpoint.port]
    if not ports:
      raise SandboxFailed(f"egress endpoint {endpoint.origin}: Service {namespace}/{name} has "
                          f"no port {endpoint.port}")
    cluster_ip = service.spec.cluster_ip
    addresses = [cluster_ip] if cluster_ip and cluster_ip != "None" else []
    target = ports[0].target_port if ports[0].target_port is not None else endpoint.port
    return {"host": endpoint.host, "port": endpoint.port, "addresses": addresses,
            "service": {"namespace": namespace, "selector": dict(service.spec.selector or {}),
                        "target_port": target}}

  async def _throttle(self):
    async with self._rate_lock:
      now = time.monotonic()
      wait = self._next_create - now
      self._next_create = max(now, self._next_create) + 1.0 / self.config.creation_qps
    if wait > 0:
      await asyncio.sleep(wait)

  async def create(self, sandbox_id: str, spec: SandboxSpec) -> dict:
    from kubernetes.client.exceptions import ApiException
    token = secrets.token_urlsafe(24)
    workdir = spec.workdir or self.config.workdir
    egress = await self._resolve(spec)
    pod = _m.render_pod(sandbox_id, image=self._image(spec), token=token, config=self.config,
                        cpu=spec.cpu, memory=spec.memory, disk=spec.disk, env=spec.env,
                        labels=spec.labels, workdir=workdir, network=spec.network,
                        egress=egress, tenant=spec.tenant)
    name = pod["metadata"]["name"]
    event = self._waiters.setdefault(name, asyncio.Event())
    try:
      async with self._create_slots:
        await self._throttle()
        if spec.network or egress:
          await asyncio.to_thread(self.networking.create_namespaced_network_policy,
                                  self.config.namespace,
                                  _m.render_allow_egress_policy(sandbox_id, self.config,
                                                                network=spec.network,
                                                                egress=egress))
        await asyncio.to_thread(self.core.create_namespaced_pod, self.config.namespace, pod)
      ip = await self._wait_ready(name, event)
    except ApiException as e:
      self._waiters.pop(name, None)
      await self.delete(sandbox_id, None)
      raise SandboxFailed(f"the API server refused pod {name}: {e.status} {e.reason} "
                          f"{(e.body or '')[:500]}") from None
    except BaseException:
      self._waiters.pop(name, None)
      await asyncio.shield(self.delete(sandbox_id, None))
      raise
    self._waiters.pop(name, None)
    return {"pod": name, "ip": ip, "port": self.config.agent_port, "token": token,
            "workdir": workdir, "env": {}}

  async def _wait_ready(self, name, event) -> str:
    while True:
      pod = self._pods.get(name)
      if pod is not None:
        state = _pod_state(pod)
        if state == "ready":
          return pod.status.pod_ip
        if state is not None:
          raise SandboxFailed(f"pod {name} failed: {state}")
      event.clear()
      await event.wait()

  async def delete(self, sandbox_id: str, ref: Optional[dict]) -> None:
    from kubernetes.client.exceptions import ApiException
    name = _m.pod_name(sandbox_id)
    for call, args in ((self.core.delete_namespaced_pod, (name, self.config.namespace)),
                       (self.networking.delete_namespaced_network_policy,
                        (_m.egress_policy_name(sandbox_id), self.config.namespace))):
      try:
        await asyncio.to_thread(call, *args, grace_period_seconds=0)
      except ApiException as e:
        if e.status != 404:
          raise

  async def list_sandboxes(self) -> set:
    listing = await asyncio.to_thread(
        self.core.list_namespaced_pod, self.config.namespace,
        label_selector=f"{_m.LABEL_MANAGED}={_m.MANAGED_BY}")
    return {p.metadata.labels.get(_m.LABEL_SANDBOX) for p in listing.items
            if p.metadata.labels.get(_m.LABEL_SANDBOX)}

  async def is_alive(self, sandbox_id: str, ref: dict) -> bool:
    if not self._synced:
      return True   # no knowledge yet: never reap on ignorance
    pod = self._pods.get(ref["pod"] if ref else _m.pod_name(sandbox_id))
    return pod is not None and _pod_state(pod) == "ready"

  # ------------------------------------------------------------------ agent traffic
  def _agent(self, ref, path):
    return f"http://{ref['ip']}:{ref['port']}{path}"

  async def _call(self, ref, method, path, *, timeout=None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ref['token']}"}
    try:
      return await self._http.request(method, self._agent(ref, path), headers=headers,
                                      timeout=timeout or self.config.agent_request_timeout,
                                      **kwargs)
    except httpx.TransportError as e:
      raise SandboxFailed(f"the agent of pod {ref['pod']} did not answer: {e!r}") from None

  async def start_job(self, sandbox_id, ref, job_id, spec: _jobs.JobSpec) -> dict:
    body = {"command": spec.command, "shell": spec.shell, "cwd": spec.cwd, "env": spec.env,
            "timeout": spec.timeout, "merge_stderr": spec.merge_stderr,
            "max_output_bytes": spec.max_output_bytes}
    if spec.stdin is not None:
      body["stdin_b64"] = base64.b64encode(spec.stdin).decode()
    response = await self._call(ref, "POST", "/jobs", json=body)
    _raise_agent(response, "start a command")
    return {"agent_job": response.json()["id"]}

  async def wait_job(self, sandbox_id, ref, job_id, job_ref, timeout):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      step = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
      try:
        response = await self._call(ref, "POST", f"/jobs/{job_ref['agent_job']}/wait",
                                    params={"timeout": step}, timeout=step + 30)
      except SandboxFailed as e:
        return _jobs.JobResult(status=_jobs.FAILED, error=e.message)
      if response.status_code == 404:
        return _jobs.JobResult(status=_jobs.FAILED, error="the agent no longer knows this job "
                               "(the sandbox restarted)")
      _raise_agent(response, "wait for a command")
      out = response.json()
      if out["status"] != _jobs.RUNNING:
        out["stdout"] = base64.b64decode(out["stdout"])
        out["stderr"] = base64.b64decode(out["stderr"])
        return _jobs.JobResult(**out)
      if deadline is not None and time.monotonic() >= deadline:
        return None

  async def cancel_job(self, sandbox_id, ref, job_id, job_ref):
    response = await self._call(ref, "POST", f"/jobs/{job_ref['agent_job']}/cancel")
    if response.status_code != 404:
      _raise_agent(response, "cancel a command")

  async def read_file(self, sandbox_id, ref, path, limit=None):
    """(size, async iterator of the bytes), streamed from the agent; refused before any byte
    if the agent refuses it (not a regular file) or it is over `limit` bytes."""
    request = self._http.build_request(
        "GET", self._agent(ref, "/files"), params={"path": path},
        headers={"Authorization": f"Bearer {ref['token']}"}, timeout=300)
    try:
      response = await self._http.send(request, stream=True)
    except httpx.TransportError as e:
      raise SandboxFailed(f"the agent of pod {ref['pod']} did not answer: {e!r}") from None
    if response.status_code >= 400:
      await response.aread()
      await response.aclose()
      _raise_agent(response, f"read {path!r}")
    size = int(response.headers.get("content-length", -1))
    if size < 0 or (limit is not None and size > limit):
      await response.aclose()
      if size < 0:
        raise FileOperationError(f"read {path!r}: the agent did not say the file's size")
      raise PayloadTooLarge(f"{path!r} in sandbox {sandbox_id!r} is {size} bytes; the "
                            f"service's max_file_bytes is {limit}")

    async def chunks():
      left = size
      try:
        async for chunk in response.aiter_raw():
          chunk = chunk[:left]
          left -= len(chunk)
          if chunk:
            yield chunk
          if left <= 0:
            break
      finally:
        await response.aclose()
    return size, chunks()

  async def write_file(self, sandbox_id, ref, path, chunks, mode):
    """Streams `chunks` to the agent, which keeps the file only if the upload completes."""
    sent = 0

    async def body():
      nonlocal sent
      if isinstance(chunks, (bytes, bytearray)):
        sent += len(chunks)
        yield bytes(chunks)
        return
      async for chunk in chunks:
        sent += len(chunk)
        yield chunk
    response = await self._call(ref, "PUT", "/files", params={"path": path,
                                "mode": format(mode, "o")}, content=body(), timeout=300)
    _raise_agent(response, f"write {path!r}")
    return response.json().get("size", sent)

  async def list_files(self, sandbox_id, ref, path):
    response = await self._call(ref, "GET", "/files/list", params={"path": path})
    _raise_agent(response, f"list {path!r}")
    return response.json()["entries"]

  async def stats(self, sandbox_id, ref):
    response = await self._call(ref, "GET", "/stats")
    _raise_agent(response, "read stats")
    return response.json()

  async def open_pty(self, sandbox_id, ref, spec):
    import json
    import urllib.parse

    from websockets.asyncio.client import connect
    url = (f"ws://{ref['ip']}:{ref['port']}/pty?"
           + urllib.parse.urlencode({"argv": json.dumps(spec.argv)}))
    try:
      ws = await connect(url, additional_headers={"Authorization": f"Bearer {ref['token']}"},
                         max_size=None, ping_interval=None)
    except (OSError, Exception) as e:  # noqa: BLE001 - any handshake failure
      raise SandboxFailed(f"cannot open a terminal in pod {ref['pod']}: {e!r}") from None
    return _AgentPty(ws)

  async def open_port(self, sandbox_id, ref, port):
    try:
      return await asyncio.wait_for(asyncio.open_connection(ref["ip"], port), 10)
    except (OSError, asyncio.TimeoutError) as e:
      raise FileOperationError(f"nothing accepts connections on port {port} of pod "
                               f"{ref['pod']}: {e!r}") from None


class _AgentPty(PtySession):
  """A terminal served by the pod's agent over a WebSocket."""

  def __init__(self, ws):
    self.ws = ws

  async def read(self) -> bytes:
    try:
      message = await self.ws.recv()
    except Exception:  # noqa: BLE001 - closed: the shell has exited
      return b""
    return message if isinstance(message, bytes) else message.encode()

  async def write(self, data: bytes) -> None:
    await self._send(data)

  async def resize(self, rows: int, cols: int) -> None:
    import json
    await self._send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

  async def _send(self, message) -> None:
    from websockets.exceptions import ConnectionClosed
    try:
      await self.ws.send(message)
    except ConnectionClosed:   # the shell ended (or never started): `read` and `failure` say so
      pass

  async def failure(self):
    # The agent closes with 4422 and the reason when the shell cannot start.
    return self.ws.close_reason if self.ws.close_code == 4422 else None

  async def close(self) -> None:
    await self.ws.close()


def _raise_agent(response: httpx.Response, what: str) -> None:
  if response.status_code < 400:
    return
  try:
    detail = response.json().get("detail")
  except ValueError:
    detail = response.text
  if response.status_code == 404:
    raise SandboxFileNotFound(f"cannot {what}: {detail}")
  raise FileOperationError(f"cannot {what}: agent answered {response.status_code}: {detail}")


def _pod_state(pod) -> Optional[str]:
  """"ready", None (still starting), or a text saying why the pod failed."""
  status = pod.status
  if status is None:
    return None
  if status.phase in ("Failed", "Succeeded"):
    why = [status.reason or "", status.message or ""]
    for cs in (status.init_container_statuses or []) + (status.container_statuses or []):
      ended = cs.state.terminated if cs.state is not None else None
      if ended is not None:
        why.append(f"container {cs.name} exited with {ended.exit_code}: "
                   f"{ended.reason or ''} {(ended.message or '').strip()[-300:]}")
    return f"phase {status.phase}: " + "; ".join(w.strip() for w in why if w.strip())
  for cs in (status.init_container_statuses or []) + (status.container_statuses or []):
    state = cs.state
    if state is not None and state.waiting is not None and state.waiting.reason in _FATAL_WAITING:
      return f"container {cs.name}: {state.waiting.reason}: {state.waiting.message or ''}"
    if state is not None and state.terminated is not None and cs.name == "sandbox":
      return (f"container {cs.name} exited with {state.terminated.exit_code}: "
              f"{state.terminated.reason or ''}")
  if status.phase == "Running" and status.pod_ip:
    for cond in status.conditions or []:
      if cond.type == "Ready" and cond.status == "True":
        return "ready"
  return None
