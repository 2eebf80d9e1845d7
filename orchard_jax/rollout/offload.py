"""A request's CPU-heavy work (chat-template rendering, tokenisation, parsing a large body) run
off the HTTP services' event loop when the request is large.

The inference server and the recording proxy each serve every client from one asyncio event
loop. Work done on it holds up every other request: rendering and tokenising a 5 MB prompt on
the loop took 12 s, during which no other client of the proxy got an answer. Such work runs in
a worker thread instead (`asyncio.to_thread`), where it shares the interpreter with the loop:
pure-Python work (Jinja rendering) yields the GIL every switch interval (5 ms), and
`data.Tokenizer.encode` releases it for long texts, so the loop keeps serving meanwhile.

A small request's work (well under a millisecond) stays on the loop: handing it to a thread
costs more than it does (~50-100 us, against the proxy's ~0.2 ms of CPU per call).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# A request of this many bytes (its body, or a prompt's characters) or more has its CPU-heavy
# work done in a worker thread.
OFF_LOOP_BYTES = 64 << 10


async def off_loop(size: int, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
  """`fn(*args, **kwargs)`: in a worker thread when `size` (the request's bytes) is at least
  `OFF_LOOP_BYTES`, else right here on the event loop. Exceptions propagate as raised.

  `fn` must not touch the event loop's objects (asyncio primitives) when it runs in a thread;
  state it reads must not change while it runs (the caller holds the session's lock).
  """
  if size < OFF_LOOP_BYTES:
    return fn(*args, **kwargs)
  return await asyncio.to_thread(fn, *args, **kwargs)
