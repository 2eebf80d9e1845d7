"""`offload.off_loop`: small work runs on the event loop, large work in the offload pool, which
a flood of large requests fills without holding up the event loop's default executor (the
services' own work: weight updates, cache flushes)."""
import asyncio
import threading

import pytest

from orchard_jax.rollout.offload import OFF_LOOP_BYTES, OFF_LOOP_THREADS, off_loop


def test_small_work_stays_on_the_loop_and_large_work_leaves_it():
  async def main():
    here = threading.get_ident()
    small = await off_loop(OFF_LOOP_BYTES - 1, threading.get_ident)
    large = await off_loop(OFF_LOOP_BYTES, threading.get_ident)
    return here, small, large
  here, small, large = asyncio.run(main())
  assert small == here and large != here


def test_errors_of_large_work_reach_the_caller():
  def fail(x, *, y):
    raise ValueError(f"bad {x} {y}")

  with pytest.raises(ValueError, match="bad 1 2"):
    asyncio.run(off_loop(OFF_LOOP_BYTES, fail, 1, y=2))


def test_a_full_offload_pool_does_not_hold_up_the_default_executor():
  release = threading.Event()

  async def main():
    busy = [asyncio.ensure_future(off_loop(OFF_LOOP_BYTES, release.wait, 60))
            for _ in range(OFF_LOOP_THREADS + 2)]        # more than the pool holds
    try:
      # The service's own threaded work still runs at once, and so does the event loop.
      return await asyncio.wait_for(asyncio.to_thread(lambda: "served"), 10)
    finally:
      release.set()
      assert all(await asyncio.gather(*busy))
  assert asyncio.run(main()) == "served"
