"""The agent's HTTP API (FastAPI), served inside a sandbox pod.

| method and path | what |
| --- | --- |
| GET /health | liveness/readiness (no token) |
| POST /jobs | start a command (body: jobs.JobSpec fields; stdin as stdin_b64) -> {"id"} |
| POST /jobs/{id}/wait?timeout=s | the job's result, or {"status": "running"} after timeout |
| POST /jobs/{id}/cancel | kill the job's process tree |
| GET /files?path= / PUT /files?path=&mode= / GET /files/list?path= | files, binary safe |
| GET /stats | memory and process count of the container |

Every route but /health needs `Authorization: Bearer <token>` with the token from
$ORCHARD_AGENT_TOKEN (removed from the environment commands see).
"""
import asyncio
import base64
import contextlib
import dataclasses
import hmac
import os
import secrets
import signal
import stat
import subprocess
import time
from typing import Optional

import fastapi
from fastapi import responses

from orchard_jax.env import jobs as _jobs
from orchard_jax.env.backends import _pipes
from orchard_jax.env.errors import close_reason

TOKEN_ENV = "ORCHARD_AGENT_TOKEN"


class _Child:
  """A command started by the agent, watched through a pidfd (no asyncio child watcher, so the
  agent can also reap orphans when it is the container's pid 1)."""

  def __init__(self, popen: subprocess.Popen):
    self.popen = popen
    self.pid = popen.pid
    self.done = asyncio.Event()
    self.returncode = None
    loop = asyncio.get_running_loop()
    self._pidfd = os.pidfd_open(self.pid)
    loop.add_reader(self._pidfd, self._on_exit)

  def _on_exit(self):
    loop = asyncio.get_running_loop()
    loop.remove_reader(self._pidfd)
    os.close(self._pidfd)
    try:
      _, status = os.waitpid(self.pid, 0)
      self.returncode = status
    except ChildProcessError:
      self.returncode = None
    self.done.set()

  async def wait(self):
    await self.done.wait()
    status = self.returncode
    if status is None:
      return None, None, "the command's exit status was lost"
    if os.WIFSIGNALED(status):
      return None, os.WTERMSIG(status), None
    return os.waitstatus_to_exitcode(status), None, None

  async def kill_tree(self):
    _jobs.kill_process_tree(self.pid)


_CGROUP_FILES = (("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory.max"),     # v2
                 ("/sys/fs/cgroup/memory/memory.oom_control",                      # v1
                  "/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def _cgroup_count(paths, key):
  """The integer after `key` in the first readable flat keyed cgroup file of `paths`
  ("oom_kill 3"), or None where none is readable (no cgroup shown to the container)."""
  for path in paths:
    try:
      with open(path) as f:
        for line in f:
          name, _, value = line.partition(" ")
          if name == key:
            return int(value)
      return 0
    except (OSError, ValueError):
      continue
  return None


def _oom_kills():
  """The container's OOM-kill count (its memory cgroup's oom_kill), or None."""
  return _cgroup_count([events for events, _ in _CGROUP_FILES], "oom_kill")


def _pids_limit_hits():
  """How many forks failed at the container's pids limit, or None."""
  return _cgroup_count(("/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids/pids.events"), "max")


async def _reclaim(sessions, result=None):
  """Kills the processes left running by finished commands (their session ids)."""
  left = set()
  for session in sessions:
    left.update(p for p in _jobs.process_tree(session) if p != session and p != os.getpid())
  if not left:
    return
  for session in sessions:   # no thread: at the pids limit none could be started
    _jobs.kill_process_tree(session, belongs=lambda pid: pid != os.getpid())
  if result is not None:
    note = (f"{len(left)} processes it left running held the sandbox's pids limit and were "
            f"killed")
    result.error = note if not result.error else f"{result.error}; {note}"


def _memory_limit():
  for _, limit in _CGROUP_FILES:
    try:
      with open(limit) as f:
        text = f.read().strip()
      return None if text == "max" else int(text)
    except (OSError, ValueError):
      continue
  return None


def _reap_orphans():
  """As pid 1, collect exited processes that are not ours (daemons left by commands)."""
  while True:
    try:
      info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
      return
    if info is None:
      return
    if info.si_pid in _OURS:
      return   # ours: its pidfd reader collects it
    try:
      os.waitpid(info.si_pid, os.WNOHANG)
    except ChildProcessError:
      pass


_OURS = set()


def build_app(token: str, workdir: str = "/") -> fastapi.FastAPI:
  app = fastapi.FastAPI(title="Orchard Env agent")
  running = {}    # job id -> asyncio.Task[JobResult]
  finished = []   # session ids (= pids) of finished commands, newest last
  cancels = {}
  base_env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}

  async def auth(authorization: Optional[str] = fastapi.Header(None)):
    if not authorization or not hmac.compare_digest(authorization.encode(),
                                                    f"Bearer {token}".encode()):
      raise fastapi.HTTPException(401, "missing or wrong agent token")

  @app.get("/health")
  async def health():
    return {"status": "ok", "pid": os.getpid()}

  router = fastapi.APIRouter(dependencies=[fastapi.Depends(auth)])

  async def _run(spec: _jobs.JobSpec, cancel: asyncio.Event) -> _jobs.JobResult:
    started = time.monotonic()
    argv = spec.argv
    if isinstance(spec.command, str):
      shell = spec.shell or ("/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh")
      argv = [shell, "-c", spec.command]
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = (None, out_w) if spec.merge_stderr else os.pipe2(os.O_CLOEXEC)
    stdin = subprocess.PIPE if spec.stdin is not None else subprocess.DEVNULL
    env = dict(base_env)
    env.update(spec.env)
    try:
      popen = subprocess.Popen(argv, stdin=stdin, stdout=out_w, stderr=err_w,
                               cwd=spec.cwd or workdir, env=env, start_new_session=True)
    except OSError as e:
      for fd in {out_r, out_w, err_r, err_w} - {None}:
        os.close(fd)
      cwd = spec.cwd or workdir
      what = (f"working directory {cwd!r} is not usable in the sandbox" if not os.path.isdir(cwd)
              else f"cannot start {argv[0]!r}: {e.strerror}")
      return _jobs.JobResult(status=_jobs.FAILED, error=what)
    for fd in {out_w, err_w}:
      os.close(fd)
    _OURS.add(popen.pid)
    if spec.stdin is not None:
      asyncio.ensure_future(_feed(popen, spec.stdin))
    oom_before = _oom_kills()
    hits_before = _pids_limit_hits()
    try:
      result = await _jobs.collect(_Child(popen), out_r, err_r, spec, cancel_event=cancel,
                                   started=started)
    finally:
      _OURS.discard(popen.pid)
    if oom_before is not None and (_oom_kills() or 0) > oom_before:
      _jobs.oom_reason(result, _memory_limit())
    finished.append(popen.pid)
    del finished[:-256]
    if hits_before is not None and (_pids_limit_hits() or 0) > hits_before:
      await _reclaim([popen.pid], result)
    return result

  async def _police():
    """Every second: if the container hit its pids limit, kill what finished commands left
    running (a fork bomb whose shell returned at once)."""
    seen = _pids_limit_hits()
    while seen is not None:
      await asyncio.sleep(1)
      hits = _pids_limit_hits() or 0
      if hits > seen:
        seen = hits
        await _reclaim(list(finished))

  @app.on_event("startup")
  async def _start_police():
    app.state.police = asyncio.ensure_future(_police())

  async def _run_safely(spec, cancel):
    """_run, with anything unexpected (e.g. no thread or process can be started at the pids
    limit) a failed job instead of an error answer."""
    try:
      return await _run(spec, cancel)
    except Exception as e:  # noqa: BLE001 - reported in the job's result
      return _jobs.JobResult(status=_jobs.FAILED, error=f"the agent could not run the command: "
                                                        f"{type(e).__name__}: {e}")

  @router.post("/jobs")
  async def start_job(body: dict):
    stdin = body.pop("stdin_b64", None)
    spec = _jobs.JobSpec(**body)
    if stdin is not None:
      spec.stdin = base64.b64decode(stdin)
    job_id = "ajob-" + secrets.token_hex(8)
    cancels[job_id] = asyncio.Event()
    running[job_id] = asyncio.ensure_future(_run_safely(spec, cancels[job_id]))
    return {"id": job_id}

  @router.post("/jobs/{job_id}/wait")
  async def wait_job(job_id: str, timeout: float = 60):
    task = running.get(job_id)
    if task is None:
      raise fastapi.HTTPException(404, f"job {job_id} not found")
    try:
      result = await asyncio.wait_for(asyncio.shield(task), timeout)
    except asyncio.TimeoutError:
      return {"status": _jobs.RUNNING}
    out = dataclasses.asdict(result)
    out["stdout"] = base64.b64encode(result.stdout).decode()
    out["stderr"] = base64.b64encode(result.stderr).decode()
    return out

  @router.post("/jobs/{job_id}/cancel")
  async def cancel_job(job_id: str):
    if job_id not in cancels:
      raise fastapi.HTTPException(404, f"job {job_id} not found")
    cancels[job_id].set()
    return {"cancelled": True}

  @router.get("/files")
  async def read_file(path: str):
    """The file's bytes, streamed, with its size in Content-Length; anything but a regular
    file (a FIFO, device, socket, or a symlink to one) is refused at once."""
    try:
      if not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode):
        raise fastapi.HTTPException(422, f"{path}: is not a regular file; only regular files "
                                         f"can be downloaded")
      fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
      raise fastapi.HTTPException(404, f"{path} does not exist") from None
    except OSError as e:
      raise fastapi.HTTPException(422, f"{path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      os.close(fd)
      what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
      raise fastapi.HTTPException(422, f"{path}: is {what}; only regular files can be "
                                       f"downloaded")
    os.set_blocking(fd, True)

    def chunks():
      left = st.st_size   # no more than announced, even if the file grows
      try:
        while left > 0:
          chunk = os.read(fd, min(1 << 20, left))
          if not chunk:
            return
          left -= len(chunk)
          yield chunk
      finally:
        os.close(fd)
    return responses.StreamingResponse(chunks(), media_type="application/octet-stream",
                                       headers={"Content-Length": str(st.st_size)})

  @router.put("/files")
  async def write_file(path: str, request: fastapi.Request, mode: str = "644"):
    """Streams the body into a temporary file beside `path`, renamed over it only once the
    whole body has arrived; an upload cut short leaves nothing."""
    tmp = f"{path}.orchard-upload-{secrets.token_hex(4)}"
    total = 0
    try:
      bits = int(mode, 8)
      os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   bits)
      try:
        async for chunk in request.stream():
          view = memoryview(chunk)
          while view:
            view = view[os.write(fd, view):]
          total += len(chunk)
        os.fchmod(fd, bits)
      finally:
        os.close(fd)
      os.rename(tmp, path)
    except (OSError, ValueError) as e:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise fastapi.HTTPException(422, f"{path}: {getattr(e, 'strerror', None) or e}") from None
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise
    return {"path": path, "size": total}

  @router.get("/files/list")
  async def list_files(path: str):
    try:
      st = os.lstat(path)
      if stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as it:
          entries = [_describe(e.path, e.name, e.stat(follow_symlinks=False)) for e in it]
      else:
        entries = [_describe(path, os.path.basename(path), st)]
    except FileNotFoundError:
      raise fastapi.HTTPException(404, f"{path} does not exist") from None
    except OSError as e:
      raise fastapi.HTTPException(422, f"{path}: {e.strerror}") from None
    return {"entries": sorted(entries, key=lambda e: e["name"])}

  @router.get("/stats")
  async def stats():
    out = {}
    for name, key in (("/sys/fs/cgroup/memory.current", "memory_bytes"),
                      ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "memory_bytes"),
                      ("/sys/fs/cgroup/pids.current", "pids"),
                      ("/sys/fs/cgroup/pids/pids.current", "pids")):
      try:
        with open(name) as f:
          out.setdefault(key, int(f.read().split()[0]))
      except (OSError, ValueError):
        pass
    return out

  @app.websocket("/pty")
  async def pty(websocket: fastapi.WebSocket, rows: int = 24, cols: int = 80,
                argv: Optional[str] = None):
    """A shell on a pseudo-terminal: binary frames carry bytes both ways; text frames are JSON
    {"type": "resize", "rows", "cols"}. Authenticated like the other routes. `argv`: the
    command as a JSON list (default: bash, else sh, interactive); one that cannot start
    closes the socket with 4422 and a reason naming it."""
    given = websocket.headers.get("authorization") or ""
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
      await websocket.close(code=4401)
      return
    import fcntl
    import json
    import struct
    import termios
    try:
      command = json.loads(argv) if argv else [
        "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh", "-i"]
      if not (isinstance(command, list) and command
              and all(isinstance(a, str) and "\0" not in a for a in command)):
        raise ValueError
    except ValueError:
      await websocket.accept()
      await websocket.close(code=4422, reason="argv must be a JSON list of strings")
      return
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(base_env, TERM="xterm-256color")
    try:
      process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave,
                                 cwd=workdir, env=env, start_new_session=True,
                                 preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    except OSError as e:   # the spawner's wording (local backend), cut to a close reason
      os.close(master)
      os.close(slave)
      await websocket.accept()
      await websocket.close(code=4422, reason=close_reason(
        f"cannot start {command[0]!r}: {os.strerror(e.errno) if e.errno else e}"))
      return
    os.close(slave)
    _OURS.add(process.pid)
    child = _Child(process)
    await websocket.accept()
    loop = asyncio.get_running_loop()
    os.set_blocking(master, False)
    readable = asyncio.Event()
    loop.add_reader(master, readable.set)

    async def pump_out():
      while True:
        await readable.wait()
        readable.clear()
        try:
          data = os.read(master, 65536)
        except BlockingIOError:
          continue
        except OSError:
          return
        if not data:
          return
        await websocket.send_bytes(data)

    async def pump_in():
      while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
          return
        if message.get("bytes"):
          os.write(master, message["bytes"])
        elif message.get("text"):
          control = json.loads(message["text"])
          if control.get("type") == "resize":
            fcntl.ioctl(master, termios.TIOCSWINSZ,
                        struct.pack("HHHH", int(control["rows"]), int(control["cols"]), 0, 0))
    tasks = [asyncio.ensure_future(pump_out()), asyncio.ensure_future(pump_in())]
    try:
      await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
      for task in tasks:
        task.cancel()
      loop.remove_reader(master)
      await child.kill_tree()
      os.close(master)
      _OURS.discard(process.pid)
      try:
        await websocket.close()
      except Exception:  # noqa: BLE001 - already closed by the client
        pass

  app.include_router(router)
  if os.getpid() == 1:
    signal.signal(signal.SIGCHLD, lambda *_: _reap_orphans())
  return app


async def _feed(popen, data):
  """Writes `data` to the command's stdin on the event loop (no thread), then closes it."""
  async def one():
    yield data
  try:
    await _pipes.write_all(popen.stdin.fileno(), one())
  finally:
    try:
      popen.stdin.close()
    except OSError:
      pass


def _describe(path, name, st):
  kind = ("directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
          else "symlink" if stat.S_ISLNK(st.st_mode) else "other")
  entry = {"name": name, "path": path, "type": kind, "size": st.st_size,
           "mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime}
  if kind == "symlink":
    try:
      entry["target"] = os.readlink(path)
    except OSError:
      pass
  return entry
