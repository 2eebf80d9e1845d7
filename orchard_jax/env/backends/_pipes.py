"""Pipes on the event loop, read and written with flow control, for the local backend's file
transfers: the service holds at most one chunk of a file at a time, whatever its size, and
stops reading the moment a limit is reached.
"""
import asyncio
import contextlib
import os
from typing import AsyncIterator, Optional

CHUNK = 1 << 16


class PipeReader:
  """Reads a pipe on the event loop: `readline` for a header, `read` for the data after it.

  Args:
    fd: the read end (owned from now on; closed by `close`).
  """

  def __init__(self, fd: int):
    self.fd = fd
    self._buffer = b""
    self._eof = False
    os.set_blocking(fd, False)

  async def _fill(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      try:
        chunk = os.read(self.fd, CHUNK)
      except BlockingIOError:
        ready = loop.create_future()
        loop.add_reader(self.fd, lambda: ready.done() or ready.set_result(None))
        try:
          await ready
        finally:
          loop.remove_reader(self.fd)
        continue
      except OSError:
        chunk = b""
      if not chunk:
        self._eof = True
      self._buffer += chunk
      return

  async def readline(self, limit: int = 1 << 20) -> bytes:
    """The next line (with its newline), or what is left at EOF; at most `limit` bytes."""
    while b"\n" not in self._buffer and not self._eof and len(self._buffer) < limit:
      await self._fill()
    line, sep, rest = self._buffer.partition(b"\n")
    self._buffer = rest
    return line + sep

  async def read(self, n: int = CHUNK) -> bytes:
    """Up to `n` bytes; b"" at EOF."""
    if not self._buffer and not self._eof:
      await self._fill()
    data, self._buffer = self._buffer[:n], self._buffer[n:]
    return data

  async def chunks(self, size: int) -> AsyncIterator[bytes]:
    """Exactly the next `size` bytes in chunks (fewer if the writer stops early), then closes
    the pipe: a writer still writing gets EPIPE."""
    try:
      left = size
      while left > 0:
        data = await self.read(min(CHUNK, left))
        if not data:
          return
        left -= len(data)
        yield data
    finally:
      self.close()

  def close(self) -> None:
    if self.fd is not None:
      with contextlib.suppress(OSError):
        os.close(self.fd)
      self.fd = None


async def write_all(fd: int, chunks, *, limit: Optional[int] = None) -> int:
  """Writes an async iterable of byte chunks into a pipe with flow control (awaiting the
  reader), and returns how many bytes went in. Stops early, without error, when the reader
  has gone (EPIPE). Does not close `fd`.

  Raises:
    whatever iterating `chunks` raises (e.g. a limit reached upstream).
  """
  loop = asyncio.get_running_loop()
  os.set_blocking(fd, False)
  total = 0
  async for chunk in chunks:
    view = memoryview(chunk)
    while view:
      try:
        n = os.write(fd, view)
      except BlockingIOError:
        ready = loop.create_future()
        loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
        try:
          await ready
        finally:
          loop.remove_writer(fd)
        continue
      except (BrokenPipeError, OSError):
        return total
      view = view[n:]
      total += n
  return total
