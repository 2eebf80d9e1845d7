"""The local backend: every sandbox is a bubblewrap sandbox on this machine.

A sandbox is `bwrap` with new pid, mount, ipc, uts, cgroup (and, unless network is allowed,
network) namespaces, a read-only view of its image, a private size-limited tmpfs workspace and
/tmp, and cgroups for cpu, memory and process count. Its long-lived processes are
bubblewrap's two, a `sh -c 'read _'` placeholder, and its fork server (below).

Commands do not create sandboxes. Each sandbox has a fork server: a child of the spawner helper
(`_spawner.py`) that joined the sandbox's cgroups and entered its namespaces through a pidfd
once, at creation, and stays outside its pid namespace (the sandbox cannot see or signal it);
then it became the sandbox user (uid 65534 when the service runs as root; the caller's uid
mapped into a user namespace otherwise) with no_new_privs, no capabilities and the seccomp
filter, which every command inherits. A command is one posix_spawn of it (vfork + exec) with
only its standard streams. Joining cgroups per command would cost an RCU grace period each
time (the kernel's cgroup threadgroup lock). Terminals, file operations and
sockets, and commands of a sandbox whose fork server is gone, are done by the helper itself,
which joins and enters per request.

Ties to the service, so nothing outlives it: bwrap runs with --die-with-parent under the
spawner, which has PR_SET_PDEATHSIG on the service; the placeholder's stdin is a pipe held by
the service (EOF ends the sandbox); mounts live only in the sandbox's mount namespace; and a
small JSON file per sandbox in the state directory names its pids and cgroups, so a restart
after SIGKILL finds and removes whatever is left (see `list_sandboxes`, `delete`).
"""
import asyncio
import json
import logging
import os
import resource
import shutil
import signal
import socket
import sys
import time
import typing
import hashlib
from typing import Optional, Sequence

from orchard_jax.env import egress as _egress
from orchard_jax.env import jobs as _jobs
from orchard_jax.env import images as _images
from orchard_jax.env import seccomp as _seccomp
from orchard_jax.env.backends import _cgroups
from orchard_jax.env.backends import _network
from orchard_jax.env.backends import _pipes
from orchard_jax.env.backends._local_process import (_LocalPty, _SpawnedProcess, _StatusReader,
                                                     _as_async, _data_fd, _feed, _read_all,
                                                     _read_available, _recv_fds)
from orchard_jax.env.backends.base import Backend, SandboxSpec
from orchard_jax.env.errors import (BackendUnavailable, EnvError, FileOperationError,
                                    InvalidRequest, LimitNotEnforceable, PayloadTooLarge,
                                    SandboxFailed, SandboxFileNotFound)

_log = logging.getLogger("orchard_jax.env.local")
_SPAWNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_spawner.py")
_NS = {"mnt": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000,
       "user": 0x10000000, "pid": 0x20000000, "net": 0x40000000}
_HOST_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
_SEED_MOUNT = "/.orchard/seed"
_SECCOMP_FILE = "<seccomp>"   # in the `files` of _bwrap_argv: the filter, not a file
_INSTALL_HINT = ("bubblewrap is not installed: install it with `sudo apt-get install -y "
                 "bubblewrap` (Debian/Ubuntu) or `sudo dnf install bubblewrap` (Fedora)")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _start_time(pid: int) -> Optional[int]:
  """The process's start time in clock ticks (tells a pid from a reused one)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[19])
  except (OSError, ValueError, IndexError):
    return None


class LocalBackend(Backend):
  """Sandboxes as bubblewrap namespaces on this machine.

  Args:
    state_dir: folder for one small JSON file per sandbox (pids, cgroups) so a restarted
      service can remove leftovers; default `<cache>/env/local/state`. Use one per service.
    image_roots: folders under which image directories may be used (default: the orchard_jax
      cache folder). A path outside all of them is refused (ImageNotAllowed).
    strict_limits: True (default) refuses a requested cpu/memory/pids limit that no cgroup
      controller here can enforce (LimitNotEnforceable); False creates the sandbox anyway and
      reports the limit as not enforced.
    default_pids: process-count limit applied when a request gives none (fork-bomb guard; not
      an error when it cannot be enforced).
    default_disk: bytes of the workspace and of /tmp when a request gives none.
    sandbox_uid, sandbox_gid: host ids commands run as when the service runs as root.
    user_namespace: None picks automatically (used when not root); True forces one.
    shared_paths: host folders shown read-only at the same path in every sandbox, whatever
      its image (host, layer or rootfs): tools the sandboxes run, such as the agent harness
      CLIs installed by `python -m orchard_jax.harness install`.
    host_paths: extra host folders shown read-only in "host" images (e.g. a Python prefix
      outside /usr; the running interpreter's prefix is added automatically).
    bwrap: the bubblewrap executable.
    start_timeout: seconds a sandbox may take to come up.
    seccomp: install the default seccomp profile (orchard_jax.env.seccomp) on every sandbox
      and command; False only where the filter cannot be built (it is reported by /health).
  Raises (from start):
    BackendUnavailable: bubblewrap missing or unusable here, with the command to install it.
  """

  name = "local"

  def __init__(self, *, state_dir: Optional[str] = None, image_roots: Optional[Sequence[str]] = None,
               strict_limits: bool = True, default_pids: Optional[int] = 4096,
               default_disk: int = 4 << 30, sandbox_uid: int = 65534, sandbox_gid: int = 65534,
               user_namespace: Optional[bool] = None, host_paths: Sequence[str] = (),
               shared_paths: Sequence[str] = (),
               bwrap: str = "bwrap", start_timeout: float = 30.0, seccomp: bool = True):
    cache = _images.default_cache_dir()
    self.state_dir = os.path.abspath(state_dir or os.path.join(cache, "env", "local", "state"))
    self.image_roots = list(image_roots) if image_roots is not None else [cache]
    self.strict_limits = strict_limits
    self.default_pids = default_pids
    self.default_disk = default_disk
    self.is_root = os.geteuid() == 0
    self.user_namespace = (not self.is_root) if user_namespace is None else user_namespace
    self.creds = None if self.user_namespace else {"uid": sandbox_uid, "gid": sandbox_gid}
    self.host_paths = list(host_paths)
    self.shared_paths = [os.path.abspath(p) for p in shared_paths]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == d or prefix.startswith(d + "/") for d in _HOST_DIRS):
      self.host_paths.append(prefix)
    self.bwrap = bwrap
    self.start_timeout = start_timeout
    self.seccomp = seccomp
    self._filter = b""        # the seccomp program (classic BPF), built at start
    self._slirp = _network.slirp4netns()   # "" when network=True cannot be offered
    self._cgroups = None
    self._spawner = None
    self._owner = None        # (pid, start time) of this process, for the state files
    self._sock = None
    self._boxes = {}          # sandbox id -> _Box (this process's handles)
    self._jobs = {}           # job id -> asyncio.Task giving a JobResult
    self._cancels = {}        # job id -> asyncio.Event

  # ------------------------------------------------------------------ lifecycle
  async def start(self) -> None:
    path = shutil.which(self.bwrap)
    if path is None:
      raise BackendUnavailable(_INSTALL_HINT)
    self.bwrap = path
    os.makedirs(os.path.join(self.state_dir, "sandboxes"), exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
      resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if self.seccomp:
      try:
        self._filter = _seccomp.compile_bpf()
      except RuntimeError as e:
        raise BackendUnavailable(f"{e}; install them (launch/install.sh) or build the "
                                 f"backend with seccomp=False") from None
    root_name = "orchard-env-" + hashlib.sha1(self.state_dir.encode()).hexdigest()[:12]
    self._cgroups = _cgroups.CgroupManager(root_name)
    self._start_spawner()
    probe = await self._probe()
    if probe:
      raise BackendUnavailable(f"bubblewrap cannot create a sandbox here: {probe}. "
                               + ("" if self.is_root else "Unprivileged use needs user "
                                  "namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
                                  "an AppArmor profile allowing bwrap)."))

  def _start_spawner(self):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self._spawner = _popen_spawner(child, self._filter)
    child.close()
    parent.setblocking(True)
    self._sock = parent

  async def _probe(self) -> Optional[str]:
    """Starts and removes one tiny sandbox; returns an error text, or None if it works."""
    try:
      ref = await self.create("probe-" + os.urandom(4).hex(), SandboxSpec(disk=1 << 20, pids=None))
    except EnvError as e:
      return e.message
    await self.delete(ref["id"], ref)
    return None

  async def stop(self) -> None:
    for sandbox_id in list(self._boxes):
      await self.delete(sandbox_id, None)
    if self._sock is not None:
      self._sock.close()
      self._sock = None
    if self._cgroups is not None:
      self._cgroups.close()
    if self._spawner is not None:
      try:
        self._spawner.wait(timeout=5)
      except Exception:  # noqa: BLE001
        self._spawner.kill()
      self._spawner = None

  def describe(self) -> dict:
    available = self._cgroups.available if self._cgroups else {c: False for c in _cgroups.CONTROLLERS}
    return {"backend": self.name, "limits": dict(available, disk=True),
            "default_disk": self.default_disk,
            "disk": "the workspace and /tmp are each a tmpfs of `disk` bytes; their pages count "
                    "toward `memory`",
            "spawner_alive": self._spawner is not None and self._spawner.poll() is None,
            "limit_problems": dict(self._cgroups.problems) if self._cgroups else {},
            "isolation": {"namespaces": ["pid", "mount", "ipc", "uts", "cgroup", "net"] +
                          (["user"] if self.user_namespace else []),
                          "sandbox_uid": None if self.creds is None else self.creds["uid"]},
            "network": {"network_true": ("slirp4netns, host loopback unreachable"
                                         if self._slirp else "unavailable "
                                         "(slirp4netns is not installed)"),
                        "egress": "allow-listed endpoints relayed by the service"},
            "strict_limits": self.strict_limits,
            "seccomp": (dict(_seccomp.describe(), applied_by="bubblewrap (--seccomp) and the "
                             "spawner, on every command") if self._filter else None)}

  # ------------------------------------------------------------------ sandboxes
  def validate(self, spec: SandboxSpec) -> dict:
    image = _images.resolve_image(spec.image, allowed_roots=self.image_roots)
    available = self._cgroups.available if self._cgroups else {}
    missing = [name for name, value in (("cpu", spec.cpu), ("memory", spec.memory),
                                        ("pids", spec.pids))
               if value is not None and not available.get(name)]
    if missing and self.strict_limits:
      why = "; ".join(f"{m}: {self._cgroups.problems.get(m, 'unavailable')}" for m in missing)
      raise LimitNotEnforceable(
          f"requested limits {missing} cannot be enforced on this machine ({why}); run the "
          f"service as root or in a delegated cgroup, or start it with strict_limits=False "
          f"to accept unenforced limits", details={"missing": missing})
    if spec.network and not self._slirp:
      raise LimitNotEnforceable(
          "network=True needs slirp4netns here (the sandbox's own network namespace with "
          "outbound access that cannot reach the host's loopback): install it with "
          "`apt-get install slirp4netns`, or use egress=[...] for single endpoints",
          details={"missing": ["network"]})
    try:
      egress = _egress.local_inside(_egress.parse_endpoints(spec.egress))
    except ValueError as e:
      raise InvalidRequest(f"egress: {e}", details={"field": "egress"}) from None
    workdir = spec.workdir or image.workdir
    return {"workdir": workdir, "env": image.env_dict, "image_kind": image.kind,
            "egress": [{"endpoint": e["endpoint"], "url": e["url"]} for e in egress]}

  def _bwrap_argv(self, sandbox_id, spec, image, workdir, disk, files=()):
    """bubblewrap's command line. `files`: (path, fd) pairs of files shown read-only over the
    image's (their fds are 4, 5, ... in bwrap)."""
    argv = [self.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
            "--unshare-cgroup-try", "--die-with-parent", "--hostname", sandbox_id[:63],
            "--info-fd", "3"]
    if self.user_namespace:
      argv += ["--unshare-user", "--uid", "1000", "--gid", "1000", "--disable-userns"]
    else:
      argv += ["--cap-drop", "ALL"]
    # Every folder on the way to a mount point is rebuilt in the sandbox's root tmpfs (its
    # entries bound one by one), so bwrap can create mount points below read-only folders.
    overridden = frozenset(path for path, _ in files if path != _SECCOMP_FILE)
    points = [p for _, p in image.binds] + [workdir] + list(overridden) + self.shared_paths
    exploded = {os.path.dirname(p) for p in points}
    for p in list(exploded):
      while p not in ("/", ""):
        exploded.add(p)
        p = os.path.dirname(p)
    if image.kind in ("host", "layer"):
      argv += self._host_view(frozenset(exploded), overridden)
    else:
      for entry in sorted(os.listdir(image.root)):
        if entry in ("proc", "dev", "tmp", _images.IMAGE_MANIFEST):
          continue
        argv += _mirror(os.path.join(image.root, entry), "/" + entry, exploded, overridden)
    base = image.root if image.kind == "rootfs" else "/"
    for p in sorted(exploded, key=lambda x: x.count("/")):   # folders the host lacks
      if not os.path.lexists(os.path.join(base, p.lstrip("/"))):
        argv += ["--perms", "0755", "--dir", p]
    for src, point in image.binds:
      argv += ["--ro-bind", src, point]
    for path in self.shared_paths:   # parents rebuilt above; made traversable here
      argv += _open_parents(path, every=True) + ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(disk), "--tmpfs", "/tmp",
             "--perms", "0777", "--size", str(disk), "--tmpfs", workdir]
    if image.workspace_seed:
      argv += ["--perms", "0755", "--dir", os.path.dirname(_SEED_MOUNT),
               "--ro-bind", image.workspace_seed, _SEED_MOUNT]
    for i, (path, _) in enumerate(files):
      if path == _SECCOMP_FILE:
        argv += ["--seccomp", str(4 + i)]
      else:
        argv += ["--perms", "0644", "--ro-bind-data", str(4 + i), path]
    # The placeholder says "ready" once bubblewrap has finished the mounts and exec'd it, then
    # waits on stdin (a pipe the service holds: EOF ends the sandbox).
    argv += ["--chdir", "/", "--", "/bin/sh", "-c", "echo ready; read _"]
    return argv

  def _host_view(self, exploded: frozenset, overridden: frozenset = frozenset()) -> list:
    """bwrap arguments of the read-only host view (cached: the host's folders do not change
    while the service runs). Paths in `overridden` are left out (mounted separately)."""
    cache = self.__dict__.setdefault("_host_view_cache", {})
    key = (exploded, overridden)
    if key not in cache:
      args = []
      for d in _HOST_DIRS + tuple(self.host_paths):
        args += _open_parents(d) + _mirror(d, d, exploded, overridden)
      args += ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", "/var"]
      cache[key] = args
    return list(cache[key])

  async def create(self, sandbox_id: str, spec: SandboxSpec) -> dict:
    image = _images.resolve_image(spec.image, allowed_roots=self.image_roots)
    workdir = spec.workdir or image.workdir
    disk = spec.disk if spec.disk is not None else self.default_disk
    pids = spec.pids if spec.pids is not None else self.default_pids
    self._write_meta(sandbox_id, {})   # first, so other services see who owns what follows
    try:
      # One pid more than asked: the sandbox's fork server is counted in its pids cgroup.
      procs = self._cgroups.create(sandbox_id, cpu=spec.cpu, memory=spec.memory,
                                   pids=None if pids is None else pids + 1)
    except OSError as e:
      self._cgroups.remove(sandbox_id)
      raise SandboxFailed(f"cannot set the limits of sandbox {sandbox_id!r}: {e}") from None
    box = _Box(sandbox_id, procs)
    box.memory = spec.memory
    box.counters = self._cgroups.counters(sandbox_id)
    self._boxes[sandbox_id] = box
    keep_r, box.keepalive = os.pipe2(os.O_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    egress = _egress.local_inside(_egress.parse_endpoints(spec.egress))
    files = []
    names = {e["hosts_name"]: e["listen"][0] for e in egress if e["hosts_name"]}
    if names:
      files.append(("/etc/hosts", _data_fd(_network.hosts_file(sandbox_id, names))))
    if spec.network:
      files.append(("/etc/resolv.conf", _data_fd(_network.resolv_conf())))
    if self._filter:
      files.append((_SECCOMP_FILE, _data_fd(self._filter)))
    argv = self._bwrap_argv(sandbox_id, spec, image, workdir, disk, files)
    try:
      self._send({"op": "spawn", "mode": "direct", "cgroups": procs, "argv": argv,
                  "env": {"PATH": DEFAULT_PATH}, "cwd": "/"},
                 [("stdin", keep_r), ("stdout", ready_w), ("stderr", err_w),
                  ("status", status_w), ("extra", info_w)] + [("extra", fd) for _, fd in files])
    finally:
      for fd in (keep_r, info_w, err_w, status_w, ready_w, *(fd for _, fd in files)):
        os.close(fd)
    box.status = _StatusReader(status_r)
    try:
      info = await asyncio.wait_for(self._read_until(info_r, box, b"}"), self.start_timeout)
      info = json.loads(info)
      ready = await asyncio.wait_for(self._read_until(ready_r, box, b"\n"), self.start_timeout)
      if ready.strip() != b"ready":
        raise SandboxFailed(f"the placeholder said {ready!r}")
    except (asyncio.TimeoutError, EnvError, OSError, ValueError) as e:
      err = _read_available(err_r)
      os.close(err_r)
      await self.delete(sandbox_id, None)
      what = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e)
      raise SandboxFailed(f"sandbox {sandbox_id!r} did not start ({what}); bubblewrap said: "
                          f"{err.decode(errors='replace').strip() or '(nothing)'}") from None
    finally:
      os.close(info_r)
      os.close(ready_r)
    os.close(err_r)
    box.init_pid = info["child-pid"]
    box.pidfd = os.pidfd_open(box.init_pid)
    box.pidns = os.readlink(f"/proc/{box.init_pid}/ns/pid")
    box.ns_flags = _ns_flags(box.init_pid, self.user_namespace)
    box.bwrap_pid = box.status.pid
    await self._start_fork_server(box, own=[workdir] if self.creds is not None else [])
    self._write_meta(sandbox_id, {"bwrap_pid": box.bwrap_pid, "init_pid": box.init_pid,
                                  "init_start": _start_time(box.init_pid)})
    ref = {"id": sandbox_id, "init_pid": box.init_pid, "workdir": workdir,
           "env": image.env_dict, "network": spec.network}
    try:
      if spec.network:
        await self._start_slirp(box)
      if egress:
        await self._start_egress(box, egress)
    except EnvError:
      await self.delete(sandbox_id, None)
      raise
    # The workspace belongs to the sandbox user (git wants that): the fork server hands it
    # over as it starts; without one, the helper does.
    if self.creds is not None and box.server is None:
      reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
      try:
        self._send({"op": "own", "paths": [workdir], "creds": self.creds, "cgroups": [],
                    "ns_flags": box.ns_flags}, [("reply", reply_w), ("pidfd", box.pidfd)])
      finally:
        os.close(reply_w)
      answer = await _read_all(reply_r)
      if not answer.startswith(b'{"ok": true'):
        await self.delete(sandbox_id, None)
        raise SandboxFailed(f"cannot hand the workspace of {sandbox_id!r} to the sandbox user: "
                            f"{answer.decode(errors='replace')}")
    if image.workspace_seed:
      result = await self._run(box, _jobs.JobSpec(
          command=["cp", "-a", _SEED_MOUNT + "/.", workdir + "/"], env={"PATH": DEFAULT_PATH},
          timeout=self.start_timeout, cwd="/"))
      if result.status != _jobs.FINISHED or result.exit_code != 0:
        await self.delete(sandbox_id, None)
        raise SandboxFailed(f"seeding the workspace of {sandbox_id!r} from "
                            f"{image.workspace_seed!r} failed: {result.error or ''} "
                            f"{result.stderr.decode(errors='replace')[-2000:]}")
    return ref

  async def _start_fork_server(self, box, own: Sequence[str] = ()) -> None:
    """Starts the sandbox's fork server (see the module docstring) and waits until it has
    entered the sandbox and chowned the folders `own` to the sandbox user. If it cannot, the
    sandbox works without one (commands then go through the helper, slower), and the reason
    is logged."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    try:
      self._send({"op": "forkserver", "cgroups": box.procs, "ns_flags": box.ns_flags,
                  "creds": self.creds, "own": list(own)},
                 [("status", status_w), ("pidfd", box.pidfd), ("server", theirs.fileno())])
    except OSError as e:
      mine.close()
      os.close(status_r)
      _log.warning("sandbox %s: no fork server (%s); commands go through the helper", box.id, e)
      return
    finally:
      theirs.close()
      os.close(status_w)
    status = _StatusReader(status_r)
    mine.setblocking(False)
    try:
      hello = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(mine, 64),
                                     self.start_timeout)
    except (asyncio.TimeoutError, OSError):
      hello = b""
    if hello != b"ready":
      mine.close()   # it exits on EOF; the sandbox's cgroups removal kills it otherwise
      _log.warning("sandbox %s: no fork server (%s); commands go through the helper", box.id,
                   status.describe_end() if status.ended.is_set() else "it did not answer")
      status.close()
      return
    box.server, box.server_status = mine, status

  def _send_to_fork_server(self, box, request: dict, fds: list) -> bool:
    """Hands a command to the sandbox's fork server; False if the helper must take it (no
    fork server, or its socket is full right now).

    Raises:
      OSError: the request cannot be sent at all (e.g. too large), as the helper would.
    """
    if box.server is None:
      return False
    if not box.server_status.ended.is_set():
      message = json.dumps(dict(request, fds=[name for name, _ in fds])).encode()
      try:
        socket.send_fds(box.server, [message], [fd for _, fd in fds])
        return True
      except BlockingIOError:
        return False
      except (BrokenPipeError, ConnectionError) as e:
        _log.warning("sandbox %s: its fork server is gone (%s); commands go through the "
                     "helper", box.id, e)
    box.close_fork_server()
    return False

  async def _start_slirp(self, box) -> None:
    """Gives the sandbox's network namespace outbound access through slirp4netns (in the
    sandbox's cgroups, so it dies with the sandbox; its exit pipe is held by the service)."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    exit_r, box.slirp_exit = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    argv = _network.slirp_argv(self._slirp, box.init_pid,
                               userns=self.user_namespace, sandboxed=not self.user_namespace)
    try:
      self._send({"op": "spawn", "mode": "direct", "cgroups": box.procs, "argv": argv,
                  "env": {"PATH": DEFAULT_PATH}, "cwd": "/"},
                 [("stdin", null), ("stdout", null), ("stderr", err_w), ("status", status_w),
                  ("extra", ready_w), ("extra", exit_r)])
    finally:
      _network.close_quietly(ready_w, exit_r, status_w, err_w, null)
    box.slirp = _StatusReader(status_r)
    try:
      answer = await asyncio.wait_for(self._read_until(ready_r, box, b"1", box.slirp),
                                      self.start_timeout)
      if not answer:
        raise SandboxFailed("slirp4netns ended before the network was ready")
    except (asyncio.TimeoutError, EnvError, OSError) as e:
      said = _read_available(err_r).decode(errors="replace").strip()
      raise SandboxFailed(f"the network of sandbox {box.id!r} did not start "
                          f"({'timed out' if isinstance(e, asyncio.TimeoutError) else e}); "
                          f"slirp4netns said: {said[-1000:] or '(nothing)'}") from None
    finally:
      _network.close_quietly(ready_r, err_r)

  async def _start_egress(self, box, egress: list) -> None:
    """Listens inside the sandbox's network namespace at each endpoint's inside address and
    relays what connects there to the endpoint."""
    box.relay = _network.EgressRelay(box.id)
    net_flags = _NS["net"] | (box.ns_flags & _NS["user"])
    for entry in egress:
      listener = await self._socket_in(box, {"op": "listen", "address": entry["listen"],
                                             "ns_flags": net_flags, "cgroups": []})
      if listener is None:
        raise SandboxFailed(f"cannot listen at {entry['url']} inside sandbox {box.id!r} for "
                            f"egress to {entry['endpoint']}")
      await box.relay.add(listener, tuple(entry["target"]))

  async def _socket_in(self, box, request) -> Optional[socket.socket]:
    """A socket the spawner made inside the sandbox's network namespace ("listen",
    "connect"), or None if it could not."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
      self._send(request, [("reply", theirs.fileno()), ("pidfd", box.pidfd)])
    finally:
      theirs.close()
    mine.setblocking(False)
    try:
      _, fds, _, _ = await asyncio.wait_for(_recv_fds(asyncio.get_running_loop(), mine), 15)
    except asyncio.TimeoutError:
      fds = []
    finally:
      mine.close()
    if not fds:
      return None
    sock = socket.socket(fileno=fds[0])
    sock.setblocking(False)
    return sock

  async def _read_until(self, fd, box, end: bytes, status=None) -> bytes:
    """Reads a pipe until `end` arrives; raises SandboxFailed if the process behind `status`
    (default: bwrap) ends first."""
    status = status or box.status
    os.set_blocking(fd, False)
    loop = asyncio.get_running_loop()
    data = b""
    while True:
      readable = asyncio.Event()
      loop.add_reader(fd, readable.set)
      status_task = asyncio.ensure_future(status.ended.wait())
      try:
        await asyncio.wait([asyncio.ensure_future(readable.wait()), status_task],
                           return_when=asyncio.FIRST_COMPLETED)
      finally:
        loop.remove_reader(fd)
        status_task.cancel()
      try:
        chunk = os.read(fd, 65536)
      except BlockingIOError:
        chunk = None
      if chunk:
        data += chunk
        if end in data:
          return data
        continue
      if status.ended.is_set() or chunk == b"":
        raise SandboxFailed(status.describe_end())

  def _write_meta(self, sandbox_id, fields):
    """Writes (atomically) the sandbox's small state file: its owner (this process, with its
    start time, read once: /proc/<pid>/stat of the busy service could hold the event loop
    half a millisecond per read under load), creation time and `fields`."""
    pid = os.getpid()
    if self._owner is None or self._owner[0] != pid:
      self._owner = (pid, _start_time(pid))
    meta = {"id": sandbox_id, "owner_pid": pid, "owner_start": self._owner[1],
            "created": time.time(), **fields}
    tmp = self._meta_path(sandbox_id) + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
      os.write(fd, json.dumps(meta).encode())
    finally:
      os.close(fd)
    os.replace(tmp, self._meta_path(sandbox_id))

  def _meta_path(self, sandbox_id):
    return os.path.join(self.state_dir, "sandboxes", sandbox_id + ".json")

  async def delete(self, sandbox_id: str, ref: Optional[dict]) -> None:
    box = self._boxes.pop(sandbox_id, None)
    if box is not None:
      box.close_keepalive()
      box.close_fork_server()
      box.counters.close()
      if box.relay is not None:
        await box.relay.close()
      if box.slirp is not None:
        box.slirp.close()
      if box.pidfd is not None:
        try:
          signal.pidfd_send_signal(box.pidfd, signal.SIGKILL)
        except OSError:
          pass
      if box.status is not None:
        try:
          await asyncio.wait_for(box.status.ended.wait(), 5)
        except asyncio.TimeoutError:
          pass
        box.status.close()
      if box.pidfd is not None:
        os.close(box.pidfd)
        box.pidfd = None
      for job_id in list(box.jobs):
        self._cancels.get(job_id, asyncio.Event()).set()
    else:
      self._kill_leftover(sandbox_id)
    await asyncio.to_thread(self._cgroups.remove, sandbox_id)
    try:
      os.unlink(self._meta_path(sandbox_id))
    except FileNotFoundError:
      pass

  def _kill_leftover(self, sandbox_id):
    """Kills the processes of a sandbox this process did not start (a killed run's leftover)."""
    try:
      with open(self._meta_path(sandbox_id)) as f:
        meta = json.load(f)
    except (OSError, ValueError):
      return
    for key, start_key in (("init_pid", "init_start"), ("bwrap_pid", None)):
      pid = meta.get(key)
      if not pid:
        continue
      if start_key is not None and _start_time(pid) != meta.get(start_key):
        continue
      if start_key is None:
        try:
          with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "bwrap":
              continue
        except OSError:
          continue
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass

  async def list_sandboxes(self) -> set:
    """This service's sandboxes and the leftovers of services that are gone. Sandboxes of
    another live service sharing the state directory are not listed (never reaped here)."""
    folder = os.path.join(self.state_dir, "sandboxes")
    ids, others = set(), set()
    for name in os.listdir(folder):
      if not name.endswith(".json"):
        continue
      sandbox_id = name[:-5]
      try:
        with open(os.path.join(folder, name)) as f:
          meta = json.load(f)
      except (OSError, ValueError):
        ids.add(sandbox_id)
        continue
      owner = meta.get("owner_pid")
      if (owner and owner != os.getpid() and meta.get("owner_start") is not None
          and _start_time(owner) == meta["owner_start"]):
        others.add(sandbox_id)   # owned by another running service
      else:
        ids.add(sandbox_id)
    return (ids | set(self._boxes) | self._cgroups.list()) - others

  async def is_alive(self, sandbox_id: str, ref: dict) -> bool:
    box = self._boxes.get(sandbox_id)
    return box is not None and box.status is not None and not box.status.ended.is_set()

  def _box(self, sandbox_id) -> "_Box":
    box = self._boxes.get(sandbox_id)
    if box is None or box.init_pid is None:
      raise SandboxFailed(f"sandbox {sandbox_id!r} is not running in this service process")
    if box.status.ended.is_set():
      raise SandboxFailed(f"sandbox {sandbox_id!r} has died: {box.status.describe_end()}")
    return box

  # ------------------------------------------------------------------ spawner protocol
  def _send(self, request: dict, fds: list) -> None:
    request = dict(request, fds=[name for name, _ in fds])
    message = [json.dumps(request).encode()]
    try:
      socket.send_fds(self._sock, message, [fd for _, fd in fds])
    except OSError:
      if self._spawner is None or self._spawner.poll() is None:
        raise
      # The spawner died (its sandboxes died with it): start a new one for what comes next.
      _log.error("the spawner exited with %s; starting a new one", self._spawner.returncode)
      self._sock.close()
      self._start_spawner()
      socket.send_fds(self._sock, message, [fd for _, fd in fds])

  def _spawn_in(self, box, spec: _jobs.JobSpec, stdin_fd, stdout_fd, stderr_fd, status_w):
    shell = None
    if isinstance(spec.command, str):
      shell = spec.shell or "auto"
    request = {"op": "spawn", "mode": "enter", "creds": self.creds, "argv": spec.argv,
               "shell": shell, "env": spec.env, "cwd": spec.cwd or "/", "tty": spec.tty}
    fds = [("stdin", stdin_fd), ("stdout", stdout_fd), ("stderr", stderr_fd),
           ("status", status_w)]
    if not spec.tty and self._send_to_fork_server(box, request, fds):
      return
    self._send(dict(request, cgroups=box.procs, home_cgroups=self._cgroups.home_procs(),
                    ns_flags=box.ns_flags), fds + [("pidfd", box.pidfd)])

  async def _run(self, box, spec: _jobs.JobSpec, cancel_event=None) -> _jobs.JobResult:
    """Runs one command to its end (see _launch and _complete)."""
    return await self._complete(box, spec, self._launch(box, spec), cancel_event)

  async def _complete(self, box, spec: _jobs.JobSpec, launched: "_Launched",
                      cancel_event=None) -> _jobs.JobResult:
    """Collects a launched command's output and end. Says so when the OOM killer struck
    during it, and kills what the command left behind if that hit the sandbox's pids limit
    (a fork bomb whose shell returned at once)."""
    process = launched.process
    if process.pid is not None:   # running while collected: counted as running by reclaim
      box.running_pids.add(process.pid)
    process.status.on_pid = box.running_pids.add   # (no task waiting for the pid per command)
    try:
      result = await _jobs.collect(process, launched.stdout, launched.stderr, spec,
                                   cancel_event=cancel_event, started=launched.started)
    finally:
      process.status.on_pid = None
      box.running_pids.discard(process.pid)
    result.pid = process.pid
    if launched.oom_kills is not None and (box.counters.oom_kills() or 0) > launched.oom_kills:
      _jobs.oom_reason(result, box.memory)
    if result.pid is not None:
      box.sessions.append(result.pid)
      del box.sessions[:-256]
      hits = launched.pids_limit_hits
      if hits is not None and (box.counters.pids_limit_hits() or 0) > hits:
        await self._reclaim(box, [result.pid], result)
    return result

  async def _reclaim(self, box, sessions, result=None) -> int:
    """Kills the processes left by finished commands `sessions` (their session ids), e.g. a
    fork bomb holding the sandbox's pids limit. Returns how many were alive."""
    cgroups = self._cgroups
    members = cgroups.pids(box.id) if cgroups.available.get("pids") else None
    left = set()
    for session in sessions:
      left.update(p for p in _jobs.process_tree(session, members) if p != session)
    if not left:
      return 0
    for session in sessions:
      await asyncio.to_thread(_jobs.kill_process_tree, session,
                              (lambda: cgroups.pids(box.id)) if members is not None else None,
                              belongs=box.owns)
    note = (f"{len(left)} processes it left running held the sandbox's pids limit and were "
            f"killed")
    _log.info("sandbox %s: %s", box.id, note)
    if result is not None:
      result.error = note if not result.error else f"{result.error}; {note}"
    return len(left)

  async def reclaim(self) -> dict:
    """For each sandbox whose pids limit was hit since the last call, kills the processes
    left by its finished commands ({sandbox id: processes killed}). The service calls this
    every reap interval."""
    out = {}
    for box in list(self._boxes.values()):
      hits = box.counters.pids_limit_hits()
      if hits is None or hits <= box.pids_hits or box.status is None:
        continue
      box.pids_hits = hits
      running = {job_pid for job_pid in box.running_pids}
      finished = [s for s in box.sessions if s not in running]
      killed = await self._reclaim(box, finished)
      if killed:
        out[box.id] = killed
    return out

  def _launch(self, box, spec: _jobs.JobSpec) -> "_Launched":
    """Hands one command to the sandbox's fork server (or the spawner) now, without waiting:
    start_job calls it before the service's bookkeeping, which then overlaps the command's
    start. Reads the OOM and pids-limit counters first, for _complete.

    Raises:
      SandboxFailed: the spawner cannot be reached.
    """
    oom_kills, pids_limit_hits = box.counters.oom_kills(), box.counters.pids_limit_hits()
    started = time.monotonic()
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    if spec.merge_stderr:
      err_r, err_w = None, out_w
    else:
      err_r, err_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    if spec.stdin is not None:
      in_r, in_w = os.pipe2(os.O_CLOEXEC)
    else:
      in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None
    try:
      self._spawn_in(box, spec, in_r, out_w, err_w, status_w)
    except OSError as e:
      for fd in {out_r, out_w, err_r, err_w, status_r, status_w, in_r, in_w} - {None}:
        os.close(fd)
      raise SandboxFailed(f"cannot reach the spawner: {e}") from None
    for fd in {in_r, out_w, err_w, status_w}:
      os.close(fd)
    if in_w is not None:
      asyncio.ensure_future(_feed(in_w, spec.stdin))
    return _Launched(_SpawnedProcess(_StatusReader(status_r), self, box), out_r, err_r,
                     started, oom_kills, pids_limit_hits)

  # ------------------------------------------------------------------ jobs
  async def start_job(self, sandbox_id, ref, job_id, spec):
    box = self._box(sandbox_id)
    cancel = asyncio.Event()
    self._cancels[job_id] = cancel
    try:
      launched = self._launch(box, spec)
    except Exception as e:  # noqa: BLE001 - the job reports it, as a failure in its task would
      task = asyncio.ensure_future(_raise(e))
    else:
      task = asyncio.ensure_future(self._complete(box, spec, launched, cancel))
    self._jobs[job_id] = task
    box.jobs.add(job_id)

    def _done(_):
      box.jobs.discard(job_id)
    task.add_done_callback(_done)
    return {"local": True}

  async def wait_job(self, sandbox_id, ref, job_id, job_ref, timeout):
    task = self._jobs.get(job_id)
    if task is None:
      return _jobs.JobResult(status=_jobs.FAILED, error="the job's service process is gone "
                             "(the local backend keeps running jobs in the process that started them)")
    try:
      result = await asyncio.wait_for(asyncio.shield(task), timeout)
    except asyncio.TimeoutError:
      return None
    except EnvError as e:
      result = _jobs.JobResult(status=_jobs.FAILED, error=e.message)
    self._jobs.pop(job_id, None)
    self._cancels.pop(job_id, None)
    return result

  async def cancel_job(self, sandbox_id, ref, job_id, job_ref):
    event = self._cancels.get(job_id)
    if event is not None:
      event.set()

  async def run(self, sandbox_id: str, spec: _jobs.JobSpec) -> _jobs.JobResult:
    """Runs one command to its end (used by the service for patches and seeding)."""
    return await self._run(self._box(sandbox_id), spec)

  # ------------------------------------------------------------------ files
  def _start_file_op(self, box, request, *, data: bool = False):
    """Sends one file operation to the spawner; returns (PipeReader of the reply, the write
    end of the data pipe or None, the write end of the commit pipe or None)."""
    reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
    fds = [("reply", reply_w), ("pidfd", box.pidfd)]
    data_r = data_w = commit_r = commit_w = None
    if data:
      data_r, data_w = os.pipe2(os.O_CLOEXEC)
      commit_r, commit_w = os.pipe2(os.O_CLOEXEC)
      fds += [("data", data_r), ("commit", commit_r)]
    try:
      self._send(dict(request, op="file", cgroups=box.procs, ns_flags=box.ns_flags,
                      creds=self.creds), fds)
    except OSError as e:
      _network.close_quietly(reply_r, data_w, commit_w)
      raise SandboxFailed(f"cannot reach the spawner: {e}") from None
    finally:
      _network.close_quietly(reply_w, data_r, commit_r)
    return _pipes.PipeReader(reply_r), data_w, commit_w

  async def _file_answer(self, box, request, reply) -> dict:
    """The JSON header of a file operation's reply, or the EnvError it reports."""
    header = await reply.readline()
    try:
      head = json.loads(header)
    except ValueError:
      reply.close()
      raise FileOperationError(f"file operation on {request['path']!r} in {box.id!r} failed "
                               f"without an answer (the sandbox may have died)") from None
    if not head.get("ok"):
      reply.close()
      if head.get("errno") == 2:
        raise SandboxFileNotFound(f"{request['path']!r} does not exist in sandbox {box.id!r}")
      raise FileOperationError(f"{request['action']} {request['path']!r} in sandbox "
                               f"{box.id!r} failed: {head.get('error')}")
    return head

  async def read_file(self, sandbox_id, ref, path, limit=None):
    """(size, async iterator of the file's bytes); refuses anything but a regular file at
    once, and a file over `limit` bytes (PayloadTooLarge) before sending any of it."""
    box = self._box(sandbox_id)
    request = {"action": "read", "path": path}
    reply, _, _ = self._start_file_op(box, request)
    head = await self._file_answer(box, request, reply)
    size = head["size"]
    if limit is not None and size > limit:
      reply.close()
      raise PayloadTooLarge(f"{path!r} in sandbox {sandbox_id!r} is {size} bytes; the "
                            f"service's max_file_bytes is {limit}")
    return size, reply.chunks(size)

  async def write_file(self, sandbox_id, ref, path, chunks, mode):
    """Streams `chunks` (an async iterable of bytes) into `path`, atomically: the file
    appears only once every byte arrived (an error or a limit raised while iterating leaves
    nothing behind). Returns the bytes written."""
    box = self._box(sandbox_id)
    request = {"action": "write", "path": path, "mode": mode}
    reply, data_w, commit_w = self._start_file_op(box, request, data=True)
    try:
      total = await _pipes.write_all(data_w, _as_async(chunks))
      os.close(data_w)
      data_w = None
      try:
        os.write(commit_w, str(total).encode())
      except BrokenPipeError:   # the spawner refused the write and left: its answer says why
        pass
    except BaseException:
      reply.close()
      raise
    finally:
      _network.close_quietly(data_w, commit_w)
    head = await self._file_answer(box, request, reply)
    reply.close()
    if head.get("size") != total:
      raise FileOperationError(f"write {path!r} in sandbox {sandbox_id!r}: {head.get('size')} "
                               f"of {total} bytes arrived")
    return total

  async def list_files(self, sandbox_id, ref, path):
    box = self._box(sandbox_id)
    request = {"action": "list", "path": path}
    reply, _, _ = self._start_file_op(box, request)
    head = await self._file_answer(box, request, reply)
    reply.close()
    return head["entries"]

  async def stats(self, sandbox_id, ref):
    return self._cgroups.stats(sandbox_id)

  # ------------------------------------------------------------------ pty and ports
  async def open_pty(self, sandbox_id, ref, spec):
    box = self._box(sandbox_id)
    master, slave = os.openpty()
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    spec.tty = True
    try:
      self._spawn_in(box, spec, slave, slave, slave, status_w)
    finally:
      os.close(slave)
      os.close(status_w)
    return _LocalPty(master, _SpawnedProcess(_StatusReader(status_r), self, box))

  async def open_port(self, sandbox_id, ref, port):
    box = self._box(sandbox_id)
    net_flags = _NS["net"] | (box.ns_flags & _NS["user"])
    sock = await self._socket_in(box, {"op": "connect", "port": port, "ns_flags": net_flags,
                                       "cgroups": []})
    if sock is None:
      raise FileOperationError(f"nothing accepts connections on port {port} in sandbox "
                               f"{sandbox_id!r}")
    return await asyncio.open_connection(sock=sock)


class _Launched(typing.NamedTuple):
  """A command handed to the spawner: its process, output pipes' read ends (stderr None when
  merged), time.monotonic() at launch and the sandbox's counters just before it."""
  process: _SpawnedProcess
  stdout: int
  stderr: Optional[int]
  started: float
  oom_kills: Optional[int]
  pids_limit_hits: Optional[int]


async def _raise(error: BaseException):
  raise error


class _Box:
  """This process's handles on one running sandbox."""

  def __init__(self, sandbox_id, procs):
    self.id = sandbox_id
    self.procs = procs
    self.keepalive = None
    self.status = None
    self.init_pid = None
    self.bwrap_pid = None
    self.pidfd = None
    self.ns_flags = 0
    self.jobs = set()
    self.pidns = None         # the sandbox's pid namespace ("pid:[inode]")
    self.memory = None        # its memory limit in bytes (for OOM messages)
    self.counters = _cgroups.EventCounters({})   # its OOM and pids-limit counters
    self.sessions = []        # session ids (= pids) of its last commands, newest last
    self.running_pids = set() # pids of its commands still running
    self.pids_hits = 0        # pids.events "max" already handled by reclaim()
    self.slirp = None         # _StatusReader of slirp4netns (network=True)
    self.slirp_exit = None    # write end of slirp4netns's exit pipe
    self.relay = None         # _network.EgressRelay (egress=[...])
    self.server = None        # socket to its fork server (None: commands go via the helper)
    self.server_status = None # _StatusReader of the fork server

  def owns(self, pid: int) -> bool:
    """True if `pid` is a process inside this sandbox (its pid namespace)."""
    try:
      return self.pidns is not None and os.readlink(f"/proc/{pid}/ns/pid") == self.pidns
    except OSError:
      return False

  def close_fork_server(self):
    """Closes the socket to the fork server, which then exits."""
    if self.server is not None:
      self.server.close()
      self.server = None
    if self.server_status is not None:
      self.server_status.close()
      self.server_status = None

  def close_keepalive(self):
    if self.keepalive is not None:
      os.close(self.keepalive)
      self.keepalive = None
    if self.slirp_exit is not None:   # slirp4netns exits when this pipe closes
      os.close(self.slirp_exit)
      self.slirp_exit = None


def _open_parents(path: str, every: bool = False) -> list:
  """bwrap arguments making the folders above a host path shown in the sandbox traversable
  (0755) when no host folder is mirrored there (`every`: all of them, each being a folder of
  the root tmpfs): a host path under a private home folder (/root is 0700) would otherwise
  sit below a folder the sandbox user cannot enter."""
  parents = []
  p = os.path.dirname(path)
  while p not in ("/", ""):
    if not every and any(p == d or p.startswith(d + "/") for d in _HOST_DIRS):
      break
    parents.append(p)
    p = os.path.dirname(p)
  args = []
  for p in reversed(parents):
    args += ["--perms", "0755", "--dir", p]
  return args


def _mirror(host_path, target, exploded=frozenset(), skip=frozenset()):
  """bwrap arguments that show `host_path` read-only at `target` (symlinks stay symlinks).
  Targets in `exploded` become folders of the root tmpfs holding their entries' binds;
  targets in `skip` are left out."""
  if target in skip:
    return []
  if os.path.islink(host_path):
    return ["--symlink", os.readlink(host_path), target]
  if target in exploded and os.path.isdir(host_path):
    args = ["--perms", "0755", "--dir", target]
    for entry in sorted(os.listdir(host_path)):
      args += _mirror(os.path.join(host_path, entry), os.path.join(target, entry), exploded,
                      skip)
    return args
  if os.path.exists(host_path):
    return ["--ro-bind", host_path, target]
  return []


def _ns_flags(pid, user_namespace):
  """The CLONE_NEW* flags of the namespaces `pid` does not share with us."""
  flags = 0
  for name, flag in _NS.items():
    try:
      if os.readlink(f"/proc/{pid}/ns/{name}") != os.readlink(f"/proc/self/ns/{name}"):
        flags |= flag
    except OSError:
      pass
  if not user_namespace:
    flags &= ~_NS["user"]
  return flags


def _popen_spawner(child_sock, program: bytes = b""):
  import subprocess
  return subprocess.Popen([sys.executable, "-I", "-S", _SPAWNER, str(child_sock.fileno()),
                           program.hex()],
                          pass_fds=[child_sock.fileno()], stdin=subprocess.DEVNULL,
                          start_new_session=True)
