"""A fake Kubernetes cluster for the env tests: an API server and a kubelet, written for the tests.

No Kubernetes cluster can run on the test machines, so this stands in for one, with just what
the Kubernetes backend uses: namespaced Pods (create, get, list with label selectors, watch
streams with resourceVersions, delete) and NetworkPolicies (create, delete). Every object
created through it is validated against the Kubernetes JSON schemas (kubernetes-validate), like
a real API server rejects malformed objects (422).

The kubelet part runs each pod for real: the init container's command and then the sandbox
container's command run inside bubblewrap with a host view of the filesystem (the "images"),
emptyDir volumes (the workspace as a tmpfs of its sizeLimit), the pod's env with fieldRef and
$(VAR) expansion, hostAliases in /etc/hosts, the memory limit and a node pids limit in a
cgroup, and a network namespace of its own. Pod IPs are 127.0.x.y; the agent is reached through
a unix socket relayed from <pod ip>:<port> on the host (the stand-in for a CNI). Egress follows
the NetworkPolicies that select the pod, as a CNI would enforce them: none by default; an
internet rule (0.0.0.0/0 with exceptions) gives the pod slirp4netns with the host's loopback
unreachable (the exceptions themselves are not enforced here); an ipBlock /32 rule with a TCP
port is relayed from that address and port inside the pod to the same address on the host.
The pod's seccomp profile (RuntimeDefault or Localhost) is applied to the sandbox container with
bubblewrap's --seccomp as orchard_jax.env.seccomp's profile, which refuses what the container
runtimes' default profiles refuse to a container without CAP_SYS_ADMIN.
The agent image is a folder holding the agent bundle (orchard_jax.env.agent.bundle). Services are stored and read back
(no proxying: a Service here is what the backend reads to allow egress to it).
"""
import asyncio
import contextlib
import copy
import datetime
import itertools
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time

import fastapi
import kubernetes_validate
import uvicorn
from fastapi import responses

from orchard_jax.env.agent.bundle import build_bundle
from orchard_jax.env import seccomp
from orchard_jax.env.backends import _network
from orchard_jax.env.backends._cgroups import CgroupManager
from orchard_jax.env.api import parse_bytes

K8S_VERSION = "1.30.0"
NODE_PIDS_LIMIT = 256
NEVER_READY_IMAGE = "never-ready:latest"
_INFO_FD = "<info fd>"
_SECCOMP_FD = "<seccomp fd>"
_HOST_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")


def _now():
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(reason, message, code):
  return responses.JSONResponse({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "reason": reason, "message": message, "code": code},
                                status_code=code)


def _selected(labels, selector):
  for term in filter(None, (selector or "").split(",")):
    key, _, value = term.partition("=")
    if labels.get(key) != value:
      return False
  return True


class _Pod:
  """The kubelet's handle on one running pod."""

  def __init__(self, name, ip):
    self.name, self.ip = name, ip
    self.process = None
    self.forwarder = None
    self.folder = None
    self.task = None
    self.slirp = None
    self.relay = None


class FakeCluster:
  """The fake API server + kubelet, as a context manager. `api_client()` gives a configured
  kubernetes.client.ApiClient; `fail_list` makes pod listings answer 500. `pod_ports`: ports
  the stand-in CNI also routes from <pod ip>:<port> to the pod's own loopback (a real CNI
  routes every port; Orchard Env's exposed ports connect to the pod IP)."""

  def __init__(self, folder: str, pod_ports=()):
    self.folder = folder
    self.pod_ports = tuple(pod_ports)
    self.objects = {"pods": {}, "networkpolicies": {}, "services": {}}
    self.version = itertools.count(1)
    self.events = []          # (resourceVersion, type, pod dict)
    self.changed = None
    self.running = {}         # pod name -> _Pod
    self.fail_list = False
    self.added_times = []     # time.monotonic() of each pod creation
    self.ips = itertools.count(2)
    self.agent_image_dir = os.path.join(folder, "agent-image")
    build_bundle(self.agent_image_dir, python=sys.executable)
    self.cgroups = CgroupManager("orchard-fake-kubelet-" + os.path.basename(folder))
    self.app = self._build_app()
    self._server = None
    self._thread = None
    self.loop = None

  # ------------------------------------------------------------------ server
  def __enter__(self):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
    started = threading.Event()

    def run():
      self.loop = asyncio.new_event_loop()
      asyncio.set_event_loop(self.loop)
      self.changed = asyncio.Condition()
      started.set()
      self.loop.run_until_complete(self._server.serve(sockets=[sock]))
    self._thread = threading.Thread(target=run, daemon=True)
    self._thread.start()
    started.wait()
    while not self._server.started:
      time.sleep(0.01)
    return self

  def __exit__(self, *exc):
    future = asyncio.run_coroutine_threadsafe(self._stop_all(), self.loop)
    future.result(60)
    self._server.should_exit = True
    self._thread.join(10)

  async def _stop_all(self):
    for name in list(self.running):
      await self._kill(name)

  def api_client(self):
    from kubernetes import client
    configuration = client.Configuration()
    configuration.host = self.url
    return client.ApiClient(configuration)

  def call(self, coro):
    return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

  async def _emit(self, kind, pod):
    version = next(self.version)
    pod["metadata"]["resourceVersion"] = str(version)
    self.events.append((version, kind, copy.deepcopy(pod)))
    async with self.changed:
      self.changed.notify_all()

  def _build_app(self):
    app = fastapi.FastAPI()

    def validate(obj):
      try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
      except kubernetes_validate.ValidationError as e:
        return _status("Invalid", f"{obj.get('kind')} is invalid: {e.message}", 422)
      return None

    @app.post("/api/v1/namespaces/{namespace}/pods", status_code=201)
    async def create_pod(namespace: str, request: fastapi.Request):
      pod = await request.json()
      problem = validate(pod)
      if problem is not None:
        return problem
      name = pod["metadata"]["name"]
      if name in self.objects["pods"]:
        return _status("AlreadyExists", f'pods "{name}" already exists', 409)
      n = next(self.ips)
      self.added_times.append(time.monotonic())
      pod["metadata"].update(namespace=namespace, uid=f"uid-{n}", creationTimestamp=_now())
      pod["status"] = {"phase": "Pending", "podIP": f"127.0.{n // 250}.{n % 250 + 2}",
                       "conditions": [{"type": "Ready", "status": "False"}]}
      self.objects["pods"][name] = pod
      await self._emit("ADDED", pod)
      handle = _Pod(name, pod["status"]["podIP"])
      self.running[name] = handle
      handle.task = asyncio.ensure_future(self._run_pod(pod, handle))
      return pod

    @app.get("/api/v1/namespaces/{namespace}/pods")
    async def list_pods(namespace: str, labelSelector: str = "", watch: bool = False,
                        resourceVersion: str = "", timeoutSeconds: int = 60):
      if self.fail_list:
        return _status("InternalError", "etcd is having a bad day", 500)
      if not watch:
        items = [p for p in self.objects["pods"].values()
                 if _selected(p["metadata"].get("labels", {}), labelSelector)]
        version = self.events[-1][0] if self.events else 0
        return {"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": str(version)}, "items": items}
      start = int(resourceVersion or 0)

      async def stream():
        deadline = time.monotonic() + timeoutSeconds
        seen = start
        while time.monotonic() < deadline:
          for version, kind, pod in list(self.events):
            if version > seen:
              seen = version
              if _selected(pod["metadata"].get("labels", {}), labelSelector):
                yield json.dumps({"type": kind, "object": pod}) + "\n"
          async with self.changed:
            try:
              await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
              pass
      return responses.StreamingResponse(stream(), media_type="application/json")

    @app.post("/api/v1/namespaces/{namespace}/services", status_code=201)
    async def create_service(namespace: str, request: fastapi.Request):
      service = await request.json()
      problem = validate(service)
      if problem is not None:
        return problem
      service["metadata"]["namespace"] = namespace
      self.objects["services"][(namespace, service["metadata"]["name"])] = service
      return service

    @app.get("/api/v1/namespaces/{namespace}/services/{name}")
    async def get_service(namespace: str, name: str):
      service = self.objects["services"].get((namespace, name))
      if service is None:
        return _status("NotFound", f'services "{name}" not found', 404)
      return service

    @app.get("/api/v1/namespaces/{namespace}/pods/{name}")
    async def get_pod(namespace: str, name: str):
      pod = self.objects["pods"].get(name)
      return pod if pod is not None else _status("NotFound", f'pods "{name}" not found', 404)

    @app.delete("/api/v1/namespaces/{namespace}/pods/{name}")
    async def delete_pod(namespace: str, name: str):
      pod = self.objects["pods"].pop(name, None)
      if pod is None:
        return _status("NotFound", f'pods "{name}" not found', 404)
      await self._kill(name)
      await self._emit("DELETED", pod)
      return pod

    @app.post("/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
              status_code=201)
    async def create_policy(namespace: str, request: fastapi.Request):
      policy = await request.json()
      problem = validate(policy)
      if problem is not None:
        return problem
      name = policy["metadata"]["name"]
      if name in self.objects["networkpolicies"]:
        return _status("AlreadyExists", f'networkpolicies "{name}" already exists', 409)
      self.objects["networkpolicies"][name] = policy
      return policy

    @app.delete("/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}")
    async def delete_policy(namespace: str, name: str):
      policy = self.objects["networkpolicies"].pop(name, None)
      return policy if policy is not None else _status("NotFound", "not found", 404)

    return app

  # ------------------------------------------------------------------ kubelet
  def _egress(self, labels):
    """NetworkPolicy semantics for egress: the union of the rules of the Egress policies that
    select the pod (everything when none does). Returns (internet: bool, [(ip, port)])."""
    selecting = [p for p in self.objects["networkpolicies"].values()
                 if "Egress" in p["spec"].get("policyTypes", [])
                 and _selected(labels, ",".join(f"{k}={v}" for k, v in
                                                p["spec"]["podSelector"].get("matchLabels", {}).items()))]
    if not selecting:
      return True, []
    internet, endpoints = False, []
    for policy in selecting:
      for rule in policy["spec"].get("egress") or []:
        peers = rule.get("to")
        if not peers:
          internet = True
          continue
        for peer in peers:
          cidr = peer.get("ipBlock", {}).get("cidr", "")
          if cidr in ("0.0.0.0/0", "::/0"):
            internet = True
          elif cidr.endswith(("/32", "/128")):
            for port in rule.get("ports", []):
              if port.get("protocol", "TCP") == "TCP":
                endpoints.append((cidr.rsplit("/", 1)[0], int(port["port"])))
    return internet, endpoints

  async def _set_status(self, pod, **status):
    if pod["metadata"]["name"] not in self.objects["pods"]:
      return
    pod["status"].update(status)
    await self._emit("MODIFIED", pod)

  def _argv(self, container, pod, handle, volumes, network):
    """bwrap for one container; `network` False gives it a network namespace of its own
    (the sandbox container always; the init container runs on the host's)."""
    argv = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
            "--cap-drop", "ALL", "--hostname", pod["metadata"]["name"][:63], "--info-fd", _INFO_FD]
    if not network:
      argv.append("--unshare-net")
    prefix = os.path.realpath(sys.base_prefix)
    agent_image = container["image"].startswith("orchard-agent")
    for d in _HOST_DIRS + (prefix,):
      if agent_image and d == "/opt":
        continue
      if os.path.islink(d):
        argv += ["--symlink", os.readlink(d), d]
      elif os.path.exists(d):
        argv += ["--ro-bind", d, d]
    if agent_image:
      argv += ["--ro-bind", self.agent_image_dir, "/opt/orchard-agent"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for controller, folder in self.cgroups._dirs(pod["metadata"]["name"]).items():
      if controller in ("memory", "pids"):   # as a runtime shows a container its own cgroup
        argv += ["--ro-bind", folder, f"/sys/fs/cgroup/{controller}"]
    hosts = "".join(f"{a['ip']}\t{' '.join(a['hostnames'])}\n"
                    for a in pod["spec"].get("hostAliases", []))
    if hosts:   # the kubelet writes hostAliases into the pod's /etc/hosts
      with open(os.path.join(handle.folder, "hosts"), "w") as f:
        f.write("127.0.0.1\tlocalhost\n" + hosts)
      argv += ["--ro-bind", os.path.join(handle.folder, "hosts"), "/etc/hosts"]
    profile = pod["spec"].get("securityContext", {}).get("seccompProfile", {}).get("type")
    if not network and profile in ("RuntimeDefault", "Localhost"):
      with open(os.path.join(handle.folder, "seccomp.bpf"), "wb") as f:
        f.write(seccomp.compile_bpf())
      argv += ["--seccomp", _SECCOMP_FD]
    if not network:
      with open(os.path.join(handle.folder, "resolv.conf"), "w") as f:
        f.write(f"nameserver {_network.SLIRP_DNS}\n")
      argv += ["--ro-bind", os.path.join(handle.folder, "resolv.conf"), "/etc/resolv.conf"]
    for mount in container.get("volumeMounts", []):
      volume = volumes[mount["name"]]
      if "emptyDir" in volume and volume["emptyDir"].get("sizeLimit"):
        argv += ["--size", str(parse_bytes(volume["emptyDir"]["sizeLimit"])), "--tmpfs",
                 mount["mountPath"]]
      else:
        folder = os.path.join(handle.folder, mount["name"])
        os.makedirs(folder, exist_ok=True)
        argv += ["--ro-bind" if mount.get("readOnly") else "--bind", folder, mount["mountPath"]]
    argv += ["--bind", handle.folder + "/run", "/run/orchard"]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": "/root"}
    for item in container.get("env", []):
      if "valueFrom" in item:
        env[item["name"]] = {"status.podIP": handle.ip}[item["valueFrom"]["fieldRef"]["fieldPath"]]
      else:
        env[item["name"]] = item["value"]
    if not network:
      env["ORCHARD_AGENT_UNIX_SOCKET"] = "/run/orchard/agent.sock"
    command = container.get("command", []) + [
        _expand(a, env) for a in container.get("args", [])]
    argv += ["--chdir", container.get("workingDir", "/"), "--clearenv"]
    for key, value in env.items():
      argv += ["--setenv", key, value]
    return argv + ["--"] + command

  async def _start(self, argv, cgroup_procs, seccomp_file=None):
    """Starts bwrap (with `seccomp_file` on the descriptor _argv marked); returns (process,
    pid of the container's first process)."""
    def join():
      for path in cgroup_procs:
        with open(path, "w") as f:
          f.write(str(os.getpid()))
    info_r, info_w = os.pipe()
    passed = [info_w]
    if _SECCOMP_FD in argv:
      passed.append(os.open(seccomp_file, os.O_RDONLY))
    fd_of = {_INFO_FD: str(info_w), _SECCOMP_FD: str(passed[-1])}
    try:
      process = await asyncio.create_subprocess_exec(
          *[fd_of.get(a, a) for a in argv], stdin=asyncio.subprocess.DEVNULL,
          stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
          preexec_fn=join, pass_fds=tuple(passed), start_new_session=True)
    finally:
      for fd in passed:
        os.close(fd)
    data = await asyncio.to_thread(_read_json, info_r)
    return process, data.get("child-pid")

  async def _run_pod(self, pod, handle):
    name = pod["metadata"]["name"]
    spec = pod["spec"]
    handle.folder = os.path.join(self.folder, "pods", name)
    os.makedirs(handle.folder + "/run", exist_ok=True)
    main = spec["containers"][0]
    if main["image"] == NEVER_READY_IMAGE:
      return   # an image that never pulls: the pod stays Pending
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    network = self._egress(pod["metadata"].get("labels", {}))
    limits = main.get("resources", {}).get("limits", {})
    memory = parse_bytes(limits["memory"]) if "memory" in limits else None
    procs = self.cgroups.create(name, cpu=None, memory=memory, pids=NODE_PIDS_LIMIT)
    for init in spec.get("initContainers", []):
      process, _ = await self._start(self._argv(init, pod, handle, volumes, True), procs)
      _, err = await process.communicate()
      if process.returncode != 0:
        await self._set_status(pod, phase="Failed", reason="InitContainerFailed",
                               message=err.decode(errors="replace")[-500:])
        return
    handle.process, child = await self._start(self._argv(main, pod, handle, volumes, False),
                                              procs, os.path.join(handle.folder, "seccomp.bpf"))
    port = main["ports"][0]["containerPort"]
    handle.forwarder = await asyncio.start_server(
        lambda r, w: _relay(r, w, handle.folder + "/run/agent.sock"), handle.ip, port)
    handle.pod_port_servers = []
    for pod_port in self.pod_ports if child else ():
      handle.pod_port_servers.append(await asyncio.start_server(
          lambda r, w, p=pod_port: _relay_into(r, w, child, p), handle.ip, pod_port))
    await self._set_status(pod, phase="Pending", containerStatuses=[
        {"name": "sandbox", "ready": False, "restartCount": 0, "image": main["image"],
         "imageID": "", "state": {"running": {"startedAt": _now()}}}])
    while handle.process.returncode is None:   # the readiness probe
      try:
        reader, writer = await asyncio.open_connection(handle.ip, port)
        writer.write(b"GET /health HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await reader.read(64)
        writer.close()
        if b" 200 " in answer:
          break
      except OSError:
        pass
      await asyncio.sleep(0.05)
    # The pod's network comes once the container is up (its agent answered): bwrap has set up
    # the namespace's loopback by then, which slirp4netns and the relays must not race.
    internet, endpoints = network
    if child and internet:   # the CNI: outbound access, the host's loopback unreachable
      ready_r, ready_w = os.pipe()
      log = open(os.path.join(handle.folder, "slirp.log"), "wb")
      try:
        handle.slirp = await asyncio.create_subprocess_exec(
            *_network.slirp_argv(_network.slirp4netns(), child, userns=False, sandboxed=False,
                                 ready_fd=ready_w, exit_fd=None),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=log,
            pass_fds=(ready_w,))
      finally:
        os.close(ready_w)
        log.close()
      await asyncio.to_thread(_read_json, ready_r)   # "1" once configured, or EOF
    if child and endpoints:
      handle.relay = _network.EgressRelay(name)
      for ip, endpoint_port in endpoints:
        sock = await asyncio.to_thread(_listen_in, child, ip, endpoint_port)
        await handle.relay.add(sock, (ip, endpoint_port))
    if handle.process.returncode is None:
      await self._set_status(pod, phase="Running", conditions=[{"type": "Ready", "status": "True"}],
                             containerStatuses=[{"name": "sandbox", "ready": True, "restartCount": 0,
                                                 "image": main["image"], "imageID": "",
                                                 "state": {"running": {"startedAt": _now()}}}])
    code = await handle.process.wait()
    err = await handle.process.stderr.read()
    await self._set_status(pod, phase="Failed" if code else "Succeeded", containerStatuses=[
        {"name": "sandbox", "ready": False, "restartCount": 0, "image": main["image"],
         "imageID": "", "state": {"terminated": {"exitCode": code, "reason": "Error",
                                                 "message": err.decode(errors="replace")[-300:]}}}])

  async def _kill(self, name):
    handle = self.running.pop(name, None)
    if handle is None:
      return
    if handle.task is not None:
      handle.task.cancel()
    if handle.process is not None and handle.process.returncode is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(handle.process.pid, signal.SIGKILL)
    if handle.forwarder is not None:
      handle.forwarder.close()
    for server in getattr(handle, "pod_port_servers", ()):
      server.close()
    if handle.relay is not None:
      await handle.relay.close()
    if handle.slirp is not None and handle.slirp.returncode is None:
      with contextlib.suppress(ProcessLookupError):
        handle.slirp.kill()
      await handle.slirp.wait()
    await asyncio.to_thread(self.cgroups.remove, name)
    if handle.folder:
      shutil.rmtree(handle.folder, ignore_errors=True)


def _read_json(fd):
  with os.fdopen(fd, "rb") as f:
    data = f.read()
  try:
    return json.loads(data) if data else {}
  except ValueError:
    return {}


def _listen_in(pid, host, port):
  """A socket listening at host:port in the network namespace of `pid` (made by a thread of
  its own that enters the namespace and leaves it again)."""
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  result = {}

  def run():
    target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
      if libc.setns(target, 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "setns")
      try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        result["sock"] = sock
      finally:
        if libc.setns(home, 0x40000000) != 0:
          os._exit(70)   # a thread stuck in a pod's namespace must not serve anything else
    except OSError as e:
      result["error"] = e
    finally:
      os.close(target)
      os.close(home)
  thread = threading.Thread(target=run)
  thread.start()
  thread.join()
  if "error" in result:
    raise result["error"]
  return result["sock"]


def _expand(arg, env):
  for key, value in env.items():
    arg = arg.replace(f"$({key})", value)
  return arg


def _connect_in(pid, port):
  """A socket connected to 127.0.0.1:port in the network namespace of `pid` (made by a thread
  of its own that enters the namespace and leaves it again)."""
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  result = {}

  def run():
    target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
      if libc.setns(target, 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "setns")
      try:
        sock = socket.socket()
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        result["sock"] = sock
      finally:
        if libc.setns(home, 0x40000000) != 0:
          os._exit(70)
    except OSError as e:
      result["error"] = e
    finally:
      os.close(target)
      os.close(home)
  thread = threading.Thread(target=run)
  thread.start()
  thread.join()
  if "error" in result:
    raise result["error"]
  return result["sock"]


async def _relay_into(reader, writer, pid, port):
  """Relays a connection to <pod ip>:port into the pod's 127.0.0.1:port."""
  try:
    sock = await asyncio.to_thread(_connect_in, pid, port)
    up = await asyncio.open_connection(sock=sock)
  except OSError:
    writer.close()
    return
  await _pipe_both(reader, writer, *up)


async def _relay(reader, writer, unix_path):
  try:
    up_reader, up_writer = await asyncio.open_unix_connection(unix_path)
  except OSError:
    writer.close()
    return
  await _pipe_both(reader, writer, up_reader, up_writer)


async def _pipe_both(reader, writer, up_reader, up_writer):

  async def pipe(src, dst):
    try:
      while True:
        data = await src.read(65536)
        if not data:
          break
        dst.write(data)
        await dst.drain()
    except (OSError, asyncio.CancelledError):
      pass
    finally:
      with contextlib.suppress(Exception):
        dst.close()
  await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
