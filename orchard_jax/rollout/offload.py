"""A request's CPU-heavy work (chat-template rendering, tokenisation, parsing a large body) run
off the HTTP services' event loop when the request is large.

The inference server and the recording proxy each serve every client from one asyncio event
loop. Work done on it holds up every other request: rendering and tokenising a 5 MB prompt on
the loop took 12 s, during which no other client of the proxy got an answer. Such work runs in
a worker thread instead, where it shares the interpreter with the loop:
pure-Python work (Jinja rendering) yields the GIL every switch interval (5 ms), and
`data.Tokenizer.encode` releases it for long texts, so the loop keeps serving meanwhile.

A small request's work (well under a millisecond) stays on the loop: handing it to a thread
costs more than it does (~50-100 us, against the proxy's ~0.2 ms of CPU per call).

The threads are a pool of their own, not the event loop's default executor: clients' large
requests (a 64 MiB prompt tokenises for over a minute) never queue the services' own work that
uses the default one (a weight update, a cache flush) behind them.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")

# A request of this many bytes (its body, or a prompt's characters) or more has its CPU-heavy
# work done in a worker thread.
OFF_LOOP_BYTES = 64 << 10
# Threads of the pool: the work is CPU-bound, so more than the cores gain nothing, but a few
# let one huge request share the CPU with other large ones instead of making them wait.
OFF_LOOP_THREADS = max(4, os.cpu_count() or 1)
_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
  global _pool
  with _pool_lock:
    if _pool is None:
      _pool = concurrent.futures.ThreadPoolExecutor(OFF_LOOP_THREADS,
                                                    thread_name_prefix="orchard-off-loop")
    return _pool


async def off_loop(size: int, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
  """`fn(*args, **kwargs)`: in a worker thread when `size` (the request's bytes) is at least
  `OFF_LOOP_BYTES`, else right here on the event loop. Exceptions propagate as raised.

  `fn` must not touch the event loop's objects (asyncio primitives) when it runs in a thread;
  state it reads must not change while it runs (the caller holds the session's lock).
  """
  if size < OFF_LOOP_BYTES:
    return fn(*args, **kwargs)
  return await asyncio.get_running_loop().run_in_executor(
    _executor(), functools.partial(fn, *args, **kwargs))
