"""Exec semantics shared by every backend (and the in-sandbox agent): one command = one job.

A job runs one command with its stdout and stderr read concurrently into capped buffers that
keep the head and the tail (the cap and the dropped byte count are reported), a timeout that
kills the command's whole process tree, and a result that is only final once the command's
main process has exited. Bytes are kept as bytes end to end; decoding happens at the edges
with replacement characters, so output that is not UTF-8 never raises.

Standard library only: the Kubernetes agent imports this module inside arbitrary images.
"""
import asyncio
import dataclasses
import os
import signal
import time
from typing import Optional, Protocol, Union

# Job statuses. "running" is the only non-final one.
RUNNING = "running"
FINISHED = "finished"      # the command exited (exit_code says how)
TIMED_OUT = "timed_out"    # the timeout fired; the process tree was killed
CANCELLED = "cancelled"    # cancelled by a client; the process tree was killed
FAILED = "failed"          # the command could not start, or the sandbox went away under it
FINAL_STATUSES = (FINISHED, TIMED_OUT, CANCELLED, FAILED)

DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
_MARKER = b"\n[... orchard-env: %d bytes omitted ...]\n"


@dataclasses.dataclass
class JobSpec:
  """What to run.

  Attributes:
    command: a shell command string (run with `shell`), or an argv list (run as is).
    shell: the shell for a string command; None picks /bin/bash if the image has it, else /bin/sh.
    cwd: working directory inside the sandbox (None: the image's workdir).
    env: the complete environment of the command.
    timeout: seconds before the process tree is killed (None: no timeout).
    merge_stderr: True sends stderr into stdout (one interleaved stream).
    max_output_bytes: cap per stream; the first half and the last half are kept.
    stdin: bytes fed to the command's standard input (None: /dev/null).
    tty: run under a pseudo-terminal (interactive shells only).
  """
  command: Union[str, list]
  shell: Optional[str] = None
  cwd: Optional[str] = None
  env: dict = dataclasses.field(default_factory=dict)
  timeout: Optional[float] = None
  merge_stderr: bool = False
  max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
  stdin: Optional[bytes] = None
  tty: bool = False

  @property
  def argv(self) -> list:
    return [self.command] if isinstance(self.command, str) else list(self.command)


@dataclasses.dataclass
class JobResult:
  """How a job ended.

  Attributes:
    status: one of FINAL_STATUSES.
    exit_code: the exit status when the command exited by itself, else None.
    signal: the signal number that ended it, if one did.
    stdout, stderr: captured bytes (capped: head + marker + tail when over the cap).
    stdout_total_bytes, stderr_total_bytes: bytes the command wrote in all.
    stdout_dropped_bytes, stderr_dropped_bytes: bytes left out by the cap.
    duration: seconds from start to the end of the main process.
    error: why the job failed or was stopped, in words.
    oom_killed: the kernel's OOM killer killed a process of the sandbox while the job ran
      (its memory limit was reached; the workspace and /tmp count toward it).
  """
  status: str
  exit_code: Optional[int] = None
  signal: Optional[int] = None
  stdout: bytes = b""
  stderr: bytes = b""
  stdout_total_bytes: int = 0
  stderr_total_bytes: int = 0
  stdout_dropped_bytes: int = 0
  stderr_dropped_bytes: int = 0
  duration: float = 0.0
  error: Optional[str] = None
  oom_killed: bool = False
  pid: Optional[int] = dataclasses.field(default=None, repr=False, compare=False)


class CappedBuffer:
  """Collects a byte stream keeping its first `limit // 2` and last `limit - limit // 2` bytes.

  Args:
    limit: bytes kept at most (not counting the omission marker); 0 keeps nothing.
  """

  def __init__(self, limit: int):
    if limit < 0:
      raise ValueError(f"limit must be >= 0 bytes; got {limit}")
    self.head_limit = limit // 2
    self.tail_limit = limit - self.head_limit
    self.head = bytearray()
    self.tail = bytearray()
    self.total = 0

  def write(self, data: bytes) -> None:
    self.total += len(data)
    room = self.head_limit - len(self.head)
    if room > 0:
      self.head += data[:room]
      data = data[room:]
    if data and self.tail_limit:
      self.tail += data
      if len(self.tail) > self.tail_limit:
        del self.tail[:len(self.tail) - self.tail_limit]

  @property
  def dropped(self) -> int:
    return self.total - len(self.head) - len(self.tail)

  def getvalue(self) -> bytes:
    if self.dropped == 0:
      return bytes(self.head + self.tail)
    return bytes(self.head) + _MARKER % self.dropped + bytes(self.tail)


class Process(Protocol):
  """A started command as the job runner sees it (backends adapt their process to this)."""
  pid: Optional[int]

  async def wait(self) -> tuple:
    """Waits for the main process; returns (exit_code or None, signal or None, error or None)."""

  async def kill_tree(self) -> None:
    """SIGKILLs the main process and all its descendants (waiting for it to have started)."""


class _PipeReader:
  """Reads a non-blocking pipe on the event loop into a CappedBuffer."""

  def __init__(self, loop, fd, buffer):
    self.loop, self.fd, self.buffer = loop, fd, buffer
    self.eof = asyncio.Event()
    os.set_blocking(fd, False)
    loop.add_reader(fd, self._on_readable)

  def _on_readable(self):
    try:
      while True:
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
          self._finish(close=True)
          return
        self.buffer.write(chunk)
    except BlockingIOError:
      return
    except OSError:
      self._finish(close=True)

  def _finish(self, close):
    if not self.eof.is_set():
      self.loop.remove_reader(self.fd)
      self.eof.set()
      if close:
        os.close(self.fd)

  def detach(self):
    """The main process is gone: take what is buffered, then discard what background
    processes still write (they keep the pipe; closing it would kill them with SIGPIPE)."""
    if self.eof.is_set():
      return
    self._on_readable()
    if self.eof.is_set():
      return
    self.loop.remove_reader(self.fd)
    self.eof.set()
    _Discard(self.loop, self.fd)


class _Discard:
  """Drains a pipe that outlived its job until its last writer closes it."""
  open_count = 0
  limit = 4096

  def __init__(self, loop, fd):
    if _Discard.open_count >= _Discard.limit:
      os.close(fd)
      return
    _Discard.open_count += 1
    self.loop, self.fd = loop, fd
    loop.add_reader(fd, self._on_readable)

  def _on_readable(self):
    try:
      while os.read(self.fd, 1 << 16):
        pass
    except BlockingIOError:
      return
    except OSError:
      pass
    self.loop.remove_reader(self.fd)
    os.close(self.fd)
    _Discard.open_count -= 1


async def collect(process: Process, stdout_fd: int, stderr_fd: Optional[int], spec: JobSpec,
                  *, cancel_event: Optional[asyncio.Event] = None,
                  started: Optional[float] = None) -> JobResult:
  """Runs a started process to its end under the spec's timeout and returns its JobResult.

  Args:
    process: the started command.
    stdout_fd, stderr_fd: read ends of its output pipes (stderr_fd None when merged); they are
      owned by this function from now on.
    spec: the job's spec (timeout, output cap).
    cancel_event: set it to stop the job (status "cancelled").
    started: time.monotonic() at spawn, for the duration.
  """
  loop = asyncio.get_running_loop()
  started = time.monotonic() if started is None else started
  out, err = CappedBuffer(spec.max_output_bytes), CappedBuffer(spec.max_output_bytes)
  readers = [_PipeReader(loop, stdout_fd, out)]
  if stderr_fd is not None:
    readers.append(_PipeReader(loop, stderr_fd, err))
  waiter = asyncio.ensure_future(process.wait())
  stoppers = []
  if cancel_event is not None:
    stoppers.append(asyncio.ensure_future(cancel_event.wait()))
  status = FINISHED
  try:
    done, _ = await asyncio.wait([waiter, *stoppers], timeout=spec.timeout,
                                 return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
      status = CANCELLED if done else TIMED_OUT
      for _ in range(20):   # kill again until the main process is reported gone
        await process.kill_tree()
        try:
          await asyncio.wait_for(asyncio.shield(waiter), 0.5)
          break
        except asyncio.TimeoutError:
          pass
  finally:
    for s in stoppers:
      s.cancel()
  if waiter.done():
    exit_code, sig, error = waiter.result()
  else:
    waiter.cancel()
    exit_code, sig = None, None
    error = f"the command's process (pid {process.pid}) could not be killed"
  duration = time.monotonic() - started
  for reader in readers:
    reader.detach()
  if error is not None:
    status = FAILED
  elif status == TIMED_OUT:
    error = f"command timed out after {spec.timeout:g} s; its process tree was killed"
    exit_code = None
  elif status == CANCELLED:
    error = "command cancelled; its process tree was killed"
    exit_code = None
  return JobResult(status=status, exit_code=exit_code, signal=sig, stdout=out.getvalue(),
                   stderr=err.getvalue(), stdout_total_bytes=out.total,
                   stderr_total_bytes=err.total, stdout_dropped_bytes=out.dropped,
                   stderr_dropped_bytes=err.dropped, duration=duration, error=error)


def _proc_stat(pid):
  """(ppid, pgrp, session) of a pid, or None if it is gone or a zombie."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      data = f.read()
  except OSError:
    return None
  fields = data[data.rindex(b")") + 2:].split()
  if fields[0] in (b"Z", b"X"):
    return None
  return int(fields[1]), int(fields[2]), int(fields[3])


def process_tree(root: int, candidates=None) -> list:
  """Pids of `root`, its descendants, and members of the session it leads.

  Args:
    root: a pid (as this process sees pids).
    candidates: pids to consider (e.g. a cgroup's members); None scans all of /proc.
  """
  if candidates is None:
    candidates = [int(p) for p in os.listdir("/proc") if p.isdigit()]
  info = {}
  for pid in candidates:
    st = _proc_stat(pid)
    if st is not None:
      info[pid] = st
  tree = {root}
  changed = True
  while changed:
    changed = False
    for pid, (ppid, _, session) in info.items():
      if pid not in tree and (ppid in tree or session == root):
        tree.add(pid)
        changed = True
  return sorted(tree)


def kill_process_tree(root: int, candidates_fn=None, timeout: float = 5.0,
                      belongs=None) -> None:
  """SIGKILLs `root`'s process tree (see process_tree), again and again until no member is
  left alive (a fork bomb keeps forking while it is being killed) or `timeout` seconds pass.

  Args:
    candidates_fn: returns the pids to consider (e.g. the sandbox's cgroup members).
    belongs: pid -> bool, checked on a pidfd held for the kill, so a pid that is not (or no
      longer) a process of the sandbox is never signalled, reused or not.
  """
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    pids = process_tree(root, candidates_fn() if candidates_fn else None)
    alive = [p for p in pids if _proc_stat(p) is not None]
    if not alive:
      return
    for pid in alive:
      _kill_verified(pid, belongs)
    time.sleep(0.002)


def _kill_verified(pid: int, belongs) -> None:
  try:
    fd = os.pidfd_open(pid)
  except OSError:   # gone already
    return
  try:
    if belongs is not None and not belongs(pid):
      return
    signal.pidfd_send_signal(fd, signal.SIGKILL)
  except OSError:
    pass
  finally:
    os.close(fd)


def oom_reason(result: JobResult, memory: Optional[int]) -> None:
  """Marks `result` as an OOM kill and says so in its error (the job's own process was
  killed, or a process it ran was)."""
  result.oom_killed = True
  limit = f" of {memory} bytes" if memory else ""
  what = ("the command was killed" if result.signal == signal.SIGKILL
          else "a process of the sandbox was killed")
  note = (f"{what} by the kernel's OOM killer: the sandbox reached its memory limit{limit} "
          f"(files in the workspace and /tmp count toward it)")
  result.error = note if not result.error else f"{result.error}; {note}"
