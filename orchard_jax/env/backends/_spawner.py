"""The local backend's process spawner: one small single-threaded helper per orchestrator.

Why it exists: a command must run inside a sandbox's existing namespaces and cgroups without
paying for a new sandbox, and the orchestrator (a multi-threaded asyncio process) cannot call
setns(2) or fork safely itself. This helper is started once, stays single-threaded, and forks
for every request; the forked child joins the sandbox's cgroups, enters its namespaces through
a pidfd (setns(2) with several CLONE_NEW* flags at once, Linux >= 5.8), forks once more so the
command is inside the sandbox's pid namespace, drops privileges and execs. That costs about one
fork + exec, which is what keeps an exec round trip in the low milliseconds (nsenter(1) would add
a second exec and cannot join cgroups before the command starts).

It is a standalone script (standard library only, run with `python -I -S`), so it starts fast and
never imports the service. Protocol: a SOCK_SEQPACKET socket; each request is one message with a
JSON body and the file descriptors it names in `fds` (SCM_RIGHTS). The helper never answers on
the socket itself; results travel on descriptors that came with the request:

- op "spawn", mode "direct" (used to start bubblewrap): fork + exec `argv` with the given fds
  as 0/1/2 and `extra` fds as 3, 4, ...; the helper stays the parent (so bwrap's
  --die-with-parent ties the sandbox to the helper, and the helper to the orchestrator) and
  writes JSON lines to the `status` fd: {"pid": N}, then {"exit": code} or {"signal": n}.
- op "spawn", mode "enter": a middle process enters the namespaces of the process behind
  `pidfd`, forks the command (new session, sandbox uid/gid, no_new_privs, `cwd`), and writes
  {"pid": N} then {"exit": code} | {"signal": n} | {"error": message} to `status`.
- op "forkserver": a child joins the sandbox's cgroups and enters its namespaces through
  `pidfd` once, hands the folders in `own` (the workspace) to the sandbox user, becomes that
  user (`creds`) under the seccomp filter, then serves
  "spawn" requests (mode "enter") on the `server` socket for the sandbox's lifetime, each with
  one posix_spawn (see _ForkServer). `status` gets {"pid": N} and then how the fork server
  ended, as for mode "direct".
- op "file": enters the mount (and user) namespace with the sandbox's credentials and performs
  one file operation (read, write, list, stat), writing a JSON header line and then any data
  on `reply`; a write reads its bytes from `data`.
- op "connect": enters the network (and user) namespace, connects a TCP socket to
  127.0.0.1:`port` and sends the connected socket back over the `reply` unix socket.
- op "listen": enters the network (and user) namespace, listens at `address` and sends the
  listening socket back over `reply` (egress relays: the service accepts on it).

When the orchestrator goes away (socket EOF or its death, via PR_SET_PDEATHSIG), the helper
exits, and every sandbox started with bwrap --die-with-parent dies with it.
"""
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_TIOCSCTTY = 0x540E
_MAX_FDS = 16


class _SpawnError(Exception):
  pass


_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _Filter:
  """The sandbox's seccomp program (classic BPF bytes from the service), ready to install."""

  def __init__(self, program: bytes):
    self.buffer = ctypes.create_string_buffer(program, len(program))
    self.prog = _SockFprog(len(program) // 8, ctypes.addressof(self.buffer))

  def install(self):
    """Installs the filter on the calling process (inherited by everything it starts)."""
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(self.prog), 0, 0),
           "installing the seccomp filter")


_FILTER = None   # set in main() from the service's program


def _exec_child(req, fds):
  """The command's own process, between fork and exec: a new session, the sandbox user, the
  working directory, standard streams 0-2 and nothing else, default signals, the seccomp
  filter, then exec. A failure before exec is written to the `status` descriptor (closed by
  the exec itself: the command never holds it). Never returns."""
  status = fds["status"]
  try:
    os.setsid()
    _drop_privileges(req.get("creds"))
    _enter_workdir(req)
    argv = _command_argv(req)
    env = req.get("env") or {}
    path = _which(argv[0], env)
    for target, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
      os.dup2(fds[name], target)
    os.closerange(3, status)
    os.closerange(status + 1, 1 << 20)
    for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, signal.SIG_DFL)
    if _FILTER is not None:
      _FILTER.install()
    try:
      os.execve(path, argv, env)
    except OSError as e:
      raise _SpawnError(f"cannot start {argv[0]!r}: {os.strerror(e.errno)}") from None
  except BaseException as e:  # noqa: BLE001 - reported to the service, then exit
    msg = str(e) if isinstance(e, _SpawnError) else f"cannot start {req['argv'][0]!r}: {e!r}"
    _write_json(status, {"error": msg})
  finally:
    os._exit(127)


def _check(ret, what):
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option, arg):
  _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _setns(fd, flags):
  _check(_libc.setns(fd, flags), "setns")


def _write_json(fd, obj):
  data = (json.dumps(obj) + "\n").encode()
  try:
    os.write(fd, data)
  except OSError:
    pass


def _join_cgroups(paths):
  pid = str(os.getpid()).encode()
  for path in paths:
    fd = os.open(path, os.O_WRONLY)
    try:
      os.write(fd, pid)
    finally:
      os.close(fd)


def _enter(req, fds):
  """Joins cgroups and namespaces of the sandbox; after this, / is the sandbox's root."""
  _join_cgroups(req.get("cgroups", ()))
  flags = req["ns_flags"]
  if flags:
    _setns(fds["pidfd"], flags)
  os.chdir("/")


def _drop_privileges(creds):
  if not creds:
    return
  uid, gid = creds["uid"], creds["gid"]
  try:
    os.setgroups([])
  except OSError:   # user namespaces created by an unprivileged user deny setgroups
    pass
  os.setresgid(gid, gid, gid)
  os.setresuid(uid, uid, uid)


def _exec_command(req, fds, err_w):
  """Runs in the command process (inside the pid namespace when entered). Never returns."""
  try:
    os.setsid()
    if req.get("tty"):
      import fcntl
      fcntl.ioctl(fds["stdin"], _TIOCSCTTY, 0)
    _drop_privileges(req.get("creds"))
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _enter_workdir(req)
    argv = _command_argv(req)
    os.dup2(fds["stdin"], 0)
    os.dup2(fds["stdout"], 1)
    os.dup2(fds["stderr"], 2)
    for i, fd in enumerate(fds.get("extra", ())):
      os.dup2(fd, 3 + i)
    _keep_only({*range(3 + len(fds.get("extra", ()))), err_w})
    for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, signal.SIG_DFL)
    os.set_inheritable(err_w, False)
    if req.get("mode") != "direct" and _FILTER is not None:
      _FILTER.install()
    os.execvpe(argv[0], argv, req.get("env") or {})
  except BaseException as e:  # noqa: BLE001 - reported to the orchestrator, then exit
    if isinstance(e, _SpawnError):
      msg = str(e)
    elif isinstance(e, OSError) and e.errno:
      msg = f"cannot start {req['argv'][0]!r}: {os.strerror(e.errno)}"
    else:
      msg = f"cannot start {req['argv'][0]!r}: {e!r}"
    try:
      if req.get("mode") == "direct":
        _write_json(err_w, {"error": msg})
      else:
        os.write(err_w, msg.encode()[:4000])
    finally:
      os._exit(127)


def _keep_only(keep):
  """Closes every descriptor of this process but those in `keep`: one close_range(2) per gap
  between them, so the cost does not grow with how many descriptors the helper holds (two per
  live sandbox; listing /proc/self/fd and closing each took milliseconds at a thousand)."""
  low = 0
  for fd in sorted(keep):
    if fd > low:
      os.closerange(low, fd)
    low = max(low, fd + 1)
  os.closerange(low, max(low, os.sysconf("SC_OPEN_MAX")))


def _request_fds(fds):
  """Every descriptor that came with a request (see _receive)."""
  return {fd for name, fd in fds.items() if name != "extra"} | set(fds.get("extra", ()))


def _status_of(wait_status):
  if os.WIFSIGNALED(wait_status):
    return {"signal": os.WTERMSIG(wait_status)}
  return {"exit": os.waitstatus_to_exitcode(wait_status)}


def _enter_workdir(req):
  """Changes to the request's working directory ('/' when none is given).

  Raises:
    _SpawnError: the folder does not exist or cannot be entered, naming it and why."""
  cwd = req.get("cwd") or "/"
  try:
    os.chdir(cwd)
  except OSError as e:
    raise _SpawnError(f"working directory {cwd!r} is not usable in the sandbox: "
                      f"{os.strerror(e.errno)}") from None


def _command_argv(req):
  argv = list(req["argv"])
  if req.get("shell") is not None:   # a command string: run it with the image's shell
    shell = req["shell"]
    if shell == "auto":
      shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    argv = [shell, "-c", argv[0]]
  return argv


def _which(name, env):
  if "/" in name:
    return name
  for folder in (env.get("PATH") or os.defpath).split(":"):
    path = os.path.join(folder or ".", name)
    if os.access(path, os.X_OK) and not os.path.isdir(path):
      return path
  raise _SpawnError(f"cannot start {name!r}: command not found in PATH")


def _fork_command(req, fds):
  """Runs in the middle process (outside the sandbox's pid namespace after entering it):
  forks the command, which lands in the namespace (see _exec_child), reports its pid, waits
  for it and reports how it ended."""
  status_fd = fds["status"]
  if req.get("tty"):
    return _fork_tty_command(req, fds)
  pid = os.fork()
  if pid == 0:
    _exec_child(req, fds)
  _write_json(status_fd, {"pid": pid})
  for name in ("stdin", "stdout", "stderr"):
    try:
      os.close(fds[name])
    except (KeyError, OSError):
      pass
  while True:
    try:
      _, wait_status = os.waitpid(pid, 0)
      break
    except InterruptedError:
      continue
  _write_json(status_fd, _status_of(wait_status))


def _fork_tty_command(req, fds):
  """Like _fork_command for a shell on a terminal (needs TIOCSCTTY in the child: a real fork)."""
  err_r, err_w = os.pipe2(os.O_CLOEXEC)
  pid = os.fork()
  if pid == 0:
    os.close(err_r)
    _exec_command(req, fds, err_w)
  os.close(err_w)
  chunks = []
  while True:
    chunk = os.read(err_r, 4096)
    if not chunk:
      break
    chunks.append(chunk)
  os.close(err_r)
  status_fd = fds["status"]
  if chunks:
    os.waitpid(pid, 0)
    _write_json(status_fd, {"error": b"".join(chunks).decode(errors="replace")})
    return
  _write_json(status_fd, {"pid": pid})
  os.close(fds["stdin"])
  while True:
    try:
      _, wait_status = os.waitpid(pid, 0)
      break
    except InterruptedError:
      continue
  _write_json(status_fd, _status_of(wait_status))


def _file_op(req, fds):
  """One file operation inside the sandbox, with the sandbox's own credentials."""
  reply = fds["reply"]
  path = req["path"]
  action = req["action"]
  try:
    if action == "read":
      # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below (a
      # socket cannot be opened at all: it is refused by its stat first).
      st = os.stat(path)
      if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.EINVAL, f"is a {_kind(st.st_mode)}, not a regular file: only "
                      f"regular files can be downloaded")
      fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
      st = os.fstat(fd)
      if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
          raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        raise OSError(errno.EINVAL, f"is a {_kind(st.st_mode)}, not a regular file: only "
                      f"regular files can be downloaded")
      os.set_blocking(fd, True)
      _write_json(reply, {"ok": True, "size": st.st_size})
      left = st.st_size   # no more than the size announced, even if the file grows
      while left > 0:
        chunk = os.read(fd, min(1 << 20, left))
        if not chunk:
          break
        left -= len(chunk)
        view = memoryview(chunk)
        while view:
          n = os.write(reply, view)
          view = view[n:]
      os.close(fd)
    elif action == "write":
      parent = os.path.dirname(path)
      if parent and req.get("make_parents", True):
        os.makedirs(parent, exist_ok=True)
      if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
      tmp = f"{path}.orchard-upload-{os.getpid()}"
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   req.get("mode", 0o644))
      total = 0
      try:
        while True:
          chunk = os.read(fds["data"], 1 << 20)
          if not chunk:
            break
          view = memoryview(chunk)
          while view:
            n = os.write(fd, view)
            view = view[n:]
          total += len(chunk)
        os.fchmod(fd, req.get("mode", 0o644))
        os.close(fd)
        fd = None
        # The service confirms the upload is whole by writing its byte count; a closed pipe
        # without it means the upload was cut (limit, client gone): nothing is kept.
        confirmed = os.read(fds["commit"], 64)
        if confirmed != str(total).encode():
          raise OSError(errno.ECANCELED, f"upload cut after {total} bytes")
        os.rename(tmp, path)
      except BaseException:
        if fd is not None:
          os.close(fd)
        try:
          os.unlink(tmp)
        except OSError:
          pass
        raise
      _write_json(reply, {"ok": True, "size": total})
    elif action in ("list", "stat"):
      st = os.lstat(path)
      entries = []
      if action == "list" and stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as it:
          for entry in it:
            entries.append(_describe(entry.path, entry.name, entry.stat(follow_symlinks=False)))
        entries.sort(key=lambda e: e["name"])
      else:
        entries.append(_describe(path, os.path.basename(path) or "/", st))
      _write_json(reply, {"ok": True, "entries": entries})
    else:
      raise ValueError(f"unknown file action {action!r}")
  except OSError as e:
    _write_json(reply, {"ok": False, "errno": e.errno, "error": f"{path}: {e.strerror or e}"})
  except Exception as e:  # noqa: BLE001 - reported to the orchestrator
    _write_json(reply, {"ok": False, "errno": None, "error": f"{path}: {e}"})


def _kind(mode):
  for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                     (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
    if test(mode):
      return name
  return "special file"


def _describe(path, name, st):
  if stat.S_ISDIR(st.st_mode):
    kind = "directory"
  elif stat.S_ISREG(st.st_mode):
    kind = "file"
  elif stat.S_ISLNK(st.st_mode):
    kind = "symlink"
  else:
    kind = "other"
  entry = {"name": name, "path": path, "type": kind, "size": st.st_size,
           "mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime}
  if kind == "symlink":
    try:
      entry["target"] = os.readlink(path)
    except OSError:
      pass
  return entry


def _listen(req, fds):
  """A TCP socket listening at `address` ([ip, port]) in the entered network namespace, sent
  back over the `reply` unix socket (it keeps its namespace wherever its descriptor goes)."""
  host, port = req["address"]
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  sock.bind((host, port))
  sock.listen(128)
  socket.socket(fileno=os.dup(fds["reply"])).sendmsg(
      [b"ok"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", sock.fileno()))])


def _connect(req, fds):
  sock = socket.create_connection((req.get("host", "127.0.0.1"), req["port"]), timeout=10)
  sock.setblocking(True)
  socket.socket(fileno=os.dup(fds["reply"])).sendmsg(
      [b"ok"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", sock.fileno()))])


class _ForkServer:
  """A sandbox's fork server: a child of the helper that has joined the sandbox's cgroups and
  entered its namespaces once (the pid namespace for its children: it stays outside, invisible
  to the sandbox), and starts each command from there. Joining cgroups per command takes the
  kernel's cgroup threadgroup lock for writing, which waits for an RCU grace period
  (milliseconds, tens under load).

  It then takes on, once, what every command gets: the sandbox user (no groups), no_new_privs
  and the seccomp filter, all inherited by what it starts. It has only descriptors it opened
  itself, every one close-on-exec. A command is then posix_spawn(3) (a vfork: no copy of this
  Python process's page tables, which a fork and the exec after it pay for) with the request's
  stdin/stdout/stderr as 0-2, a new session, default signal dispositions, in its `cwd`.

  It serves only mode "enter", non-terminal "spawn" requests, reports {"pid": N} and then how
  the command ended on the request's `status`, and exits when the service closes its socket or
  the sandbox's init process ends. Everything else (terminals, files, sockets) goes through
  the helper."""

  # Python ignores SIGPIPE and SIGXFSZ, the helper SIGINT: a command starts with the defaults.
  # (glibc's posix_spawn leaves its two internal signals, 32 and 33, ignored, as for any
  # program it starts; the C library of the command installs its own handlers for them.)
  _DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD,
                      signal.SIGTERM)

  def __init__(self, sock, init_pidfd, creds):
    self.sock, self.init = sock, init_pidfd
    self.running = {}   # pid -> status fd of commands still running
    self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _drop_privileges(creds)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if _FILTER is not None:
      _FILTER.install()

  def serve(self):
    """Never returns."""
    sel = selectors.DefaultSelector()
    sel.register(self.sock, selectors.EVENT_READ)
    sel.register(self.wake_r, selectors.EVENT_READ)
    sel.register(self.init, selectors.EVENT_READ)   # a pidfd is readable once it has exited
    self.sock.send(b"ready")
    while True:
      for key, _ in sel.select():
        if key.fileobj is self.sock:
          self._request()
        elif key.fileobj == self.init:
          os._exit(0)
        else:
          _reap_children(self.wake_r, self.running)

  def _request(self):
    try:
      req, fds, fdlist = _receive(self.sock)
    except (InterruptedError, BlockingIOError):
      return
    except (EOFError, OSError):
      os._exit(0)
    try:
      if req is None:
        return
      if req["op"] != "spawn" or req.get("mode") != "enter" or req.get("tty"):
        _report_failure(req, fds, "the fork server only starts commands without a terminal")
        return
      try:
        pid = self._spawn(req, fds)
      except _SpawnError as e:
        _write_json(fds["status"], {"error": str(e)})
        return
      _write_json(fds["status"], {"pid": pid})
      self.running[pid] = fds["status"]   # kept (not closed below) until the command ends
      fdlist.remove(fds["status"])
    except Exception as e:  # noqa: BLE001 - one bad request never ends the fork server
      _report_failure(req, fds, f"{type(e).__name__}: {e}")
    finally:
      for fd in fdlist:
        try:
          os.close(fd)
        except OSError:
          pass

  def _spawn(self, req, fds):
    """Starts the command; returns its pid. Raises _SpawnError saying why it did not start."""
    _enter_workdir(req)
    argv = _command_argv(req)
    env = req.get("env") or {}
    path = _which(argv[0], env)
    actions = [(os.POSIX_SPAWN_DUP2, fds[name], target)
               for target, name in enumerate(("stdin", "stdout", "stderr"))]
    try:
      return os.posix_spawn(path, argv, env, file_actions=actions, setsid=True,
                            setsigdef=self._DEFAULT_SIGNALS, setsigmask=())
    except OSError as e:
      if e.errno == errno.EAGAIN:
        raise _SpawnError(f"cannot start a process in the sandbox: {os.strerror(e.errno)} "
                          f"(its pids limit may be reached)") from None
      raise _SpawnError(f"cannot start {argv[0]!r}: {os.strerror(e.errno)}") from None


def _reap_children(wake_r, waited):
  """After SIGCHLD (its byte on `wake_r`): reaps every ended child and writes how it ended to
  its status fd in `waited` ({pid: fd}, closed and removed)."""
  try:
    while os.read(wake_r, 4096):
      pass
  except BlockingIOError:
    pass
  while True:
    try:
      pid, wait_status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    status_fd = waited.pop(pid, None)
    if status_fd is not None:
      _write_json(status_fd, _status_of(wait_status))
      os.close(status_fd)


def _child(req, fds):
  """Runs in a forked child of the helper; always ends with os._exit."""
  code = 0
  try:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    op = req["op"]
    if op == "spawn" and req.get("mode") == "direct":
      _join_cgroups(req.get("cgroups", ()))
      _exec_command(req, fds, fds["status"])
    try:
      _enter(req, fds)
      if op == "spawn":
        _fork_command(req, fds)
      elif op == "file":
        _drop_privileges(req.get("creds"))
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _file_op(req, fds)
      elif op == "connect":
        _connect(req, fds)
      elif op == "listen":
        _listen(req, fds)
      elif op == "forkserver":
        creds = req.get("creds")
        for path in req.get("own") or ():   # the workspace, handed over before "ready"
          os.chown(path, creds["uid"], creds["gid"])
        os.close(fds["status"])   # the helper reports how it ends
        _ForkServer(socket.socket(fileno=fds["server"]), fds["pidfd"], req.get("creds")).serve()
      elif op == "own":   # hand folders (the workspace) to the sandbox user, then report
        creds = req["creds"]
        for path in req["paths"]:
          os.chown(path, creds["uid"], creds["gid"])
        _write_json(fds["reply"], {"ok": True})
    except OSError as e:
      target = fds.get("status", fds.get("reply"))
      if target is not None:
        if op in ("file", "own"):
          _write_json(target, {"ok": False, "errno": e.errno, "error": str(e)})
        else:
          _write_json(target, {"error": f"cannot enter the sandbox: {e}"})
      code = 1
  except BaseException:  # noqa: BLE001 - a child must never return into the helper loop
    code = 2
  os._exit(code)


class _InPlace:
  """Root-only fast path: the helper itself joins the sandbox's cgroups and namespaces, drops to
  the sandbox user (keeping a saved uid of 0), posix_spawns the command (a vfork-style clone:
  the child lands in the sandbox's pid namespace and cgroups), then returns to its own
  namespaces, cgroups and credentials. No fork of the helper, no middle process.

  Only used when no user namespace is involved (a process cannot re-enter an ancestor user
  namespace). If returning fails, the helper exits rather than keep a wrong identity."""

  _ORDER = ("net", "ipc", "uts", "cgroup", "pid", "mnt")
  _FLAGS = {"mnt": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000,
            "pid": 0x20000000, "net": 0x40000000}

  def __init__(self):
    self.home = {name: os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
                 for name in self._ORDER}
    self.groups = os.getgroups()
    self.cwd = os.getcwd()
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)   # harmless for the helper, inherited by every command

  def spawn(self, req, fds):
    """Returns the command's pid (its process reports its own start-up failure on the
    status descriptor); raises _SpawnError when nothing was started (state restored)."""
    entered = False
    try:
      _join_cgroups(req.get("cgroups", ()))
      if req["ns_flags"]:
        _setns(fds["pidfd"], req["ns_flags"])
        entered = True
      os.chdir("/")
      try:
        pid = os.fork()
      except OSError as e:
        raise _SpawnError(f"cannot start a process in the sandbox: {os.strerror(e.errno)} "
                          f"(its pids limit may be reached)") from None
      if pid == 0:
        _exec_child(req, fds)
      return pid
    except OSError as e:
      raise _SpawnError(f"cannot enter the sandbox: {e}") from None
    finally:
      self._return(req, entered)

  def own(self, req, fds):
    """Chowns folders of the sandbox (its workspace) to the sandbox user, in place."""
    flags = req["ns_flags"] & self._FLAGS["mnt"]
    entered = False
    try:
      if flags:
        _setns(fds["pidfd"], flags)
        entered = True
      creds = req["creds"]
      for path in req["paths"]:
        os.chown(path, creds["uid"], creds["gid"])
      _write_json(fds["reply"], {"ok": True})
    except OSError as e:
      _write_json(fds["reply"], {"ok": False, "errno": e.errno, "error": str(e)})
    finally:
      self._return(dict(req, ns_flags=flags), entered)

  def _return(self, req, entered):
    try:
      os.setresuid(0, 0, 0)
      os.setresgid(0, 0, 0)
      os.setgroups(self.groups)
      if entered:
        for name in self._ORDER:
          if req["ns_flags"] & self._FLAGS[name]:
            _setns(self.home[name], self._FLAGS[name])
      os.chdir(self.cwd)
      _join_cgroups(req.get("home_cgroups", ()))
    except OSError as e:
      sys.stderr.write(f"orchard-env spawner: cannot return to its own namespaces ({e}); "
                       f"exiting\n")
      os._exit(3)


_RECEIVE_BUFFER = bytearray(1 << 20)   # a request's JSON is far smaller (MSG_TRUNC if not)


def _receive(sock):
  """The next request as (dict, {name: fd}, [all fds]); every descriptor received is
  close-on-exec. (None, None, fds) for a message that is not a valid request (its fds are
  then closed by the caller); raises EOFError when the service has gone."""
  # recvmsg itself with MSG_CMSG_CLOEXEC (socket.recv_fds drops its flags before 3.12): the
  # kernel installs every descriptor close-on-exec, so none is ever inheritable, not even
  # for an instant (no FIOCLEX per descriptor after it).
  # Into one buffer kept for the process's life: recvmsg(1 << 20) maps and unmaps a fresh
  # megabyte for every request.
  size, ancdata, flags, _ = sock.recvmsg_into([_RECEIVE_BUFFER], socket.CMSG_SPACE(_MAX_FDS * 4),
                                              socket.MSG_CMSG_CLOEXEC)
  msg = _RECEIVE_BUFFER[:size]
  fdlist = []
  for level, kind, data in ancdata:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
      fdlist += list(struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4]))
  if not msg and not fdlist:
    raise EOFError
  if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
    return None, None, fdlist
  try:
    req = json.loads(msg)
    names = req.pop("fds")
    if not isinstance(req.get("op"), str) or len(names) != len(fdlist):
      return None, None, fdlist
  except (ValueError, TypeError, KeyError, AttributeError):
    return None, None, fdlist
  fds, extra = {}, []
  for name, fd in zip(names, fdlist):
    if name == "extra":
      extra.append(fd)
    else:
      fds[name] = fd
  fds["extra"] = extra
  return req, fds, fdlist


def _serve(req, fds, sock, in_place, direct):
  """Handles one request. Whatever goes wrong stays with this request: it is reported on the
  request's own status or reply descriptor, never taken out on the helper."""
  op = req["op"]
  userns = req.get("ns_flags", 0) & _CLONE_NEWUSER
  if in_place is not None and op == "own" and not userns:
    in_place.own(req, fds)
    return
  if (in_place is not None and op == "spawn" and req.get("mode") == "enter"
      and not req.get("tty") and not userns):
    try:
      pid = in_place.spawn(req, fds)
      _write_json(fds["status"], {"pid": pid})
      direct[pid] = os.dup(fds["status"])
    except _SpawnError as e:
      _write_json(fds["status"], {"error": str(e)})
    return
  pid = os.fork()
  if pid == 0:
    # The child holds only its request's descriptors (and 0-2): never the helper's socket,
    # its wake-up pipe or another process's status.
    sock.close()
    signal.set_wakeup_fd(-1)
    _keep_only({0, 1, 2, *_request_fds(fds)})
    _child(req, fds)
  if op == "forkserver" or (op == "spawn" and req.get("mode") == "direct"):
    _write_json(fds["status"], {"pid": pid})
    direct[pid] = os.dup(fds["status"])


def _report_failure(req, fds, error):
  target = fds.get("status", fds.get("reply"))
  if target is None:
    return
  if req.get("op") in ("file", "own"):
    _write_json(target, {"ok": False, "errno": None, "error": f"spawner: {error}"})
  else:
    _write_json(target, {"error": f"cannot start: {error}"})


def main():
  global _FILTER
  sock = socket.socket(fileno=int(sys.argv[1]))
  os.set_inheritable(sock.fileno(), False)
  if len(sys.argv) > 2 and sys.argv[2]:
    _FILTER = _Filter(bytes.fromhex(sys.argv[2]))
  parent = os.getppid()
  _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  if os.getppid() != parent:
    os._exit(0)
  wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
  signal.set_wakeup_fd(wake_w)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C goes to the orchestrator, not here
  direct = {}   # pid -> status fd of children the helper waits for itself
  in_place = _InPlace() if os.geteuid() == 0 else None
  sel = selectors.DefaultSelector()
  sel.register(sock, selectors.EVENT_READ)
  sel.register(wake_r, selectors.EVENT_READ)
  while True:
    for key, _ in sel.select():
      if key.fileobj is sock:
        try:
          req, fds, fdlist = _receive(sock)
        except (InterruptedError, BlockingIOError):
          continue
        except EOFError:
          os._exit(0)
        except OSError:
          continue
        try:
          if req is not None:
            _serve(req, fds, sock, in_place, direct)
        except Exception as e:  # noqa: BLE001 - one bad request never ends the helper
          _report_failure(req, fds, f"{type(e).__name__}: {e}")
        finally:
          for fd in fdlist:
            try:
              os.close(fd)
            except OSError:
              pass
      else:
        _reap_children(wake_r, direct)


if __name__ == "__main__":
  main()
