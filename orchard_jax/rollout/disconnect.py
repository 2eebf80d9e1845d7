"""Watching an HTTP client for going away, so that work for it stops and a record says so.

An ASGI server tells the app that the client disconnected by answering `receive()` with
{"type": "http.disconnect"}; it does not cancel the app's work. `DisconnectWatch` reads
`receive()` in a task once the request body has been read, and

- `run(awaitable)` awaits the work unless the client goes away first, in which case it cancels
  the work (an engine request in flight is aborted: its future is cancelled, or the upstream
  HTTP request is closed) and raises `ClientDisconnected`;
- `deliver(response, ...)` sends a finished response and reports whether the client was still
  there: False when it left before or while the response was written. No server can know
  whether the client read bytes written just before it closed; "delivered" means written in
  full to an open connection.

SGLang aborts a request whose client disconnects the same way (vLLM's `with_cancellation`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, TypeVar

_log = logging.getLogger(__name__)
T = TypeVar("T")


class ClientDisconnected(Exception):
  """The HTTP client went away before its answer was sent; the work for it was cancelled."""


class DisconnectWatch:
  """Reads an ASGI connection's `receive()` until {"type": "http.disconnect"}.

  Create it after the request body has been read (the watch consumes what `receive()` gives).
  Use it as an async context manager, or call `close()`.

  Args:
    receive: the ASGI receive callable of the request.
  """

  def __init__(self, receive: Callable[[], Awaitable[dict]]):
    self.gone = asyncio.Event()
    self._task = asyncio.ensure_future(self._watch(receive))

  async def _watch(self, receive: Callable[[], Awaitable[dict]]) -> None:
    try:
      while (await receive()).get("type") != "http.disconnect":
        pass
    except Exception:  # noqa: BLE001 - a server that cannot tell counts the client as gone
      _log.debug("receive() failed while watching for a disconnect", exc_info=True)
    self.gone.set()

  async def run(self, awaitable: Awaitable[T]) -> T:
    """The awaitable's result, unless the client disconnects first.

    Raises:
      ClientDisconnected: the client went away; the work was cancelled and awaited (so its
        own cancellation handling, such as marking a record undelivered, has run).
    """
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(self.gone.wait())
    try:
      await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
      work.cancel()
      raise
    finally:
      gone.cancel()
    if work.done():
      return work.result()
    work.cancel()
    try:
      await work
    except asyncio.CancelledError:
      pass
    except Exception:  # noqa: BLE001 - the client is gone; nobody to answer
      _log.debug("work for a disconnected client failed while cancelled", exc_info=True)
    raise ClientDisconnected("the client disconnected before its answer was ready")

  async def deliver(self, response: Any, scope: dict, receive: Callable, send: Callable) -> bool:
    """Send `response` (a Starlette Response without a background task) unless the client
    has gone; True when it was written in full while the client was connected."""
    await asyncio.sleep(0)          # let a disconnect already reported be seen first
    if self.gone.is_set():
      return False
    await response(scope, receive, send)
    # Checked before yielding: once the response is complete, the server answers receive()
    # with http.disconnect too, which the watch must not be read as the client leaving.
    return not self.gone.is_set()

  def close(self) -> None:
    self._task.cancel()

  async def __aenter__(self) -> "DisconnectWatch":
    return self

  async def __aexit__(self, *exc: Any) -> None:
    self.close()
