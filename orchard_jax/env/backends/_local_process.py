"""The local backend's processes as the service sees them: the status pipe of a command the
spawner started (its pid, then how it ended), the command as jobs.collect drives it, a terminal
session, and the pipe and socket helpers the backend uses on its event loop.
"""
import asyncio
import json
import os
import socket
import struct

from orchard_jax.env import jobs as _jobs
from orchard_jax.env.backends.base import PtySession


class _StatusReader:
  """Reads the JSON lines a spawned process's status pipe carries: pid, then how it ended.

  Attributes:
    on_pid: None, or a function called with the pid when its line arrives.
  """

  def __init__(self, fd):
    self.fd = fd
    self.pid = None
    self.on_pid = None
    self.exit = None
    self.signal = None
    self.error = None
    self.ended = asyncio.Event()
    self.started = asyncio.Event()
    self._buf = b""
    self._loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    self._loop.add_reader(fd, self._on_readable)

  def _on_readable(self):
    try:
      while True:
        chunk = os.read(self.fd, 4096)
        if not chunk:
          self._end()
          return
        self._buf += chunk
        while b"\n" in self._buf:
          line, self._buf = self._buf.split(b"\n", 1)
          msg = json.loads(line)
          if "pid" in msg:
            self.pid = msg["pid"]
            self.started.set()
            if self.on_pid is not None:
              self.on_pid(self.pid)
          if "error" in msg:
            self.error = msg["error"]
          if "exit" in msg or "signal" in msg or "error" in msg:
            self.exit, self.signal = msg.get("exit"), msg.get("signal")
            self._end()
            return
    except BlockingIOError:
      return

  def _end(self):
    if not self.ended.is_set():
      self.started.set()
      self.ended.set()
      self.close()

  def close(self):
    if self.fd is not None:
      self._loop.remove_reader(self.fd)
      os.close(self.fd)
      self.fd = None

  def describe_end(self):
    if self.error:
      return self.error
    if self.signal:
      return f"killed by signal {self.signal}"
    if self.exit is not None:
      return f"exited with status {self.exit}"
    return "ended without a status"


class _SpawnedProcess:
  """A command started by the spawner, as jobs.collect wants it."""

  def __init__(self, status, backend, box):
    self.status, self.backend, self.box = status, backend, box

  @property
  def pid(self):
    return self.status.pid

  async def wait(self):
    await self.status.ended.wait()
    if self.status.error:
      return None, None, self.status.error
    if self.status.exit is None and self.status.signal is None:
      return None, None, f"sandbox {self.box.id!r} went away while the command ran"
    return self.status.exit, self.status.signal, None

  async def kill_tree(self):
    try:
      await asyncio.wait_for(self.status.started.wait(), 10)
    except asyncio.TimeoutError:
      return
    if self.status.pid is None:
      return
    cgroups = self.backend._cgroups
    candidates = (lambda: cgroups.pids(self.box.id)) if cgroups.available.get("pids") else None
    await asyncio.to_thread(_jobs.kill_process_tree, self.status.pid, candidates,
                            belongs=self.box.owns)


class _LocalPty(PtySession):

  def __init__(self, master, process):
    self.master, self.process = master, process
    os.set_blocking(master, False)
    self._loop = asyncio.get_running_loop()

  async def read(self) -> bytes:
    while True:
      try:
        return os.read(self.master, 65536)
      except BlockingIOError:
        ready = asyncio.Event()
        self._loop.add_reader(self.master, ready.set)
        try:
          await ready.wait()
        finally:
          self._loop.remove_reader(self.master)
      except OSError:   # EIO: the shell and everything on the terminal have exited
        return b""

  async def write(self, data: bytes) -> None:
    view = memoryview(data)
    while view:
      try:
        n = os.write(self.master, view)
        view = view[n:]
      except BlockingIOError:
        await asyncio.sleep(0.005)

  async def resize(self, rows: int, cols: int) -> None:
    import fcntl
    import termios
    fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

  async def failure(self):
    status = self.process.status
    try:   # the terminal closed: the status pipe's last line is at most moments behind
      await asyncio.wait_for(status.ended.wait(), 5)
    except asyncio.TimeoutError:
      return None
    return status.error

  async def close(self) -> None:
    await self.process.kill_tree()
    if self.master is not None:
      os.close(self.master)
      self.master = None


async def _as_async(chunks):
  if isinstance(chunks, (bytes, bytearray, memoryview)):
    yield bytes(chunks)
    return
  if hasattr(chunks, "__aiter__"):
    async for chunk in chunks:
      yield chunk
  else:
    for chunk in chunks:
      yield chunk


def _data_fd(data: bytes) -> int:
  """The read end of a pipe holding `data` (at most a pipe's buffer, 64 KiB), write end closed."""
  if len(data) > 65536:
    raise ValueError(f"{len(data)} bytes do not fit a pipe's buffer")
  r, w = os.pipe2(os.O_CLOEXEC)
  try:
    os.write(w, data)
  finally:
    os.close(w)
  return r


def _read_available(fd) -> bytes:
  os.set_blocking(fd, False)
  out = b""
  try:
    while True:
      chunk = os.read(fd, 65536)
      if not chunk:
        break
      out += chunk
  except BlockingIOError:
    pass
  return out


async def _read_all(fd) -> bytes:
  loop = asyncio.get_running_loop()
  os.set_blocking(fd, False)
  chunks = []
  done = loop.create_future()

  def _on_readable():
    try:
      while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
          loop.remove_reader(fd)
          if not done.done():
            done.set_result(None)
          return
        chunks.append(chunk)
    except BlockingIOError:
      pass
  loop.add_reader(fd, _on_readable)
  try:
    await done
  finally:
    loop.remove_reader(fd)
    os.close(fd)
  return b"".join(chunks)


async def _feed(fd, data: bytes) -> None:
  """Writes data into a pipe without blocking the loop, then closes it."""
  loop = asyncio.get_running_loop()
  os.set_blocking(fd, False)
  view = memoryview(data)
  try:
    while view:
      try:
        n = os.write(fd, view)
        view = view[n:]
      except BlockingIOError:
        ready = asyncio.Event()
        loop.add_writer(fd, ready.set)
        try:
          await ready.wait()
        finally:
          loop.remove_writer(fd)
  except (BrokenPipeError, OSError):
    pass
  finally:
    os.close(fd)


async def _recv_fds(loop, sock):
  while True:
    try:
      return socket.recv_fds(sock, 16, 1)
    except BlockingIOError:
      ready = asyncio.Event()
      loop.add_reader(sock.fileno(), ready.set)
      try:
        await ready.wait()
      finally:
        loop.remove_reader(sock.fileno())
