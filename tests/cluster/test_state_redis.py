"""The Redis store against a real redis-server: the same record contract as the in-process
MemoryStore, per-sandbox locks that hold across processes (orchestrator replicas), locks that
a killed holder gives up, and records that outlive the process that wrote them."""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from orchard_jax.env import errors
from orchard_jax.env.state_redis import RedisStore, StoreUnavailable
from orchard_jax.env.store import EXPOSURE, JOB, SANDBOX, MemoryStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(coro):
  return asyncio.run(coro)


@pytest.fixture(params=["memory", "redis"])
def make_store(request, redis_server):
  """Builds a store of each kind; Redis stores get a fresh key prefix per test."""
  prefix = f"t-{uuid.uuid4().hex[:8]}"

  def make(**kwargs):
    if request.param == "memory":
      return MemoryStore()
    return RedisStore(redis_server.url, prefix=prefix, **kwargs)
  make.kind = request.param
  return make


def test_records_round_trip_as_copies(make_store):
  async def body():
    store = make_store()
    record = {"id": "sbx-1", "state": "ready", "env": {"A": "1"}, "ports": [1, 2]}
    await store.put(SANDBOX, "sbx-1", record)
    got = await store.get(SANDBOX, "sbx-1")
    assert got == record
    got["state"] = "changed"                      # the store keeps its own copy
    assert (await store.get(SANDBOX, "sbx-1"))["state"] == "ready"
    await store.put(SANDBOX, "sbx-1", dict(record, state="deleting"))
    assert (await store.get(SANDBOX, "sbx-1"))["state"] == "deleting"
    assert await store.get(SANDBOX, "nope") is None
    assert await store.get(JOB, "sbx-1") is None  # kinds are separate
    await store.close()
  _run(body())


def test_jobs_and_exposures_are_listed_per_sandbox(make_store):
  async def body():
    store = make_store()
    for sid in ("a", "b"):
      await store.put(SANDBOX, sid, {"id": sid})
    for i, sid in enumerate(["a", "a", "b"]):
      await store.put(JOB, f"job-{i}", {"id": f"job-{i}", "sandbox_id": sid, "status": "running"})
    await store.put(EXPOSURE, "exp-0", {"id": "exp-0", "sandbox_id": "b", "port": 8000})
    assert sorted(r["id"] for r in await store.list(SANDBOX)) == ["a", "b"]
    assert sorted(r["id"] for r in await store.list(JOB)) == ["job-0", "job-1", "job-2"]
    assert sorted(r["id"] for r in await store.list(JOB, sandbox_id="a")) == ["job-0", "job-1"]
    assert [r["id"] for r in await store.list(EXPOSURE, sandbox_id="b")] == ["exp-0"]
    assert await store.list(EXPOSURE, sandbox_id="a") == []
    await store.delete(JOB, "job-0")
    await store.delete(JOB, "job-0")               # absent: no error
    assert [r["id"] for r in await store.list(JOB, sandbox_id="a")] == ["job-1"]
    with pytest.raises(ValueError, match="not indexed by sandbox"):
      await store.list(SANDBOX, sandbox_id="a")
    with pytest.raises(ValueError, match="record kind must be one of"):
      await store.put("pod", "x", {})
    await store.close()
  _run(body())


def test_binary_unsafe_text_and_unicode_survive(make_store):
  async def body():
    store = make_store()
    record = {"id": "j", "sandbox_id": "s", "stdout": "caf\u00e9 \ufffd \u2603",
              "stdout_b64": "/w=="}
    await store.put(JOB, "j", record)
    assert await store.get(JOB, "j") == record
    await store.close()
  _run(body())


def test_the_lock_serialises_read_modify_write(make_store):
  """Many tasks increment one counter under the sandbox's lock: no update is lost."""
  async def body():
    stores = [make_store() for _ in range(2)]    # two "replicas" (same process here)
    if make_store.kind == "memory":
      stores = [stores[0], stores[0]]             # a memory store is per replica
    await stores[0].put(SANDBOX, "s", {"id": "s", "count": 0})

    async def bump(store):
      async with store.lock("s"):
        record = await store.get(SANDBOX, "s")
        await asyncio.sleep(0.001)                # invite interleaving
        record["count"] += 1
        await store.put(SANDBOX, "s", record)
    await asyncio.gather(*(bump(stores[i % 2]) for i in range(40)))
    assert (await stores[0].get(SANDBOX, "s"))["count"] == 40
    for store in set(stores):
      await store.close()
  _run(body())


_WORKER = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from orchard_jax.env.state_redis import RedisStore
    from orchard_jax.env.store import SANDBOX

    async def main(url, prefix, rounds, mode):
      store = RedisStore(url, prefix=prefix, lock_ttl=float(sys.argv[5]))
      if mode == "bump":
        for _ in range(int(rounds)):
          async with store.lock("s"):
            record = await store.get(SANDBOX, "s")
            await asyncio.sleep(0.002)
            record["count"] += 1
            await store.put(SANDBOX, "s", record)
      elif mode == "hold":            # take the lock, say so, and never let go
        async with store.lock("s"):
          await store.put(SANDBOX, "held", {{"id": "held"}})
          print("holding", flush=True)
          await asyncio.sleep(3600)
      await store.close()

    asyncio.run(main(*sys.argv[1:5]))
    """)


def _worker(redis_url, prefix, rounds, mode, lock_ttl=30.0):
  code = _WORKER.format(root=ROOT)
  return subprocess.Popen([sys.executable, "-c", code, redis_url, prefix, str(rounds), mode,
                           str(lock_ttl)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def test_locks_hold_across_processes(redis_server):
  prefix = f"t-{uuid.uuid4().hex[:8]}"
  _run(RedisStore(redis_server.url, prefix=prefix).put(SANDBOX, "s", {"id": "s", "count": 0}))
  workers = [_worker(redis_server.url, prefix, 25, "bump") for _ in range(3)]
  for w in workers:
    _, err = w.communicate(timeout=120)
    assert w.returncode == 0, err
  record = _run(RedisStore(redis_server.url, prefix=prefix).get(SANDBOX, "s"))
  assert record["count"] == 75


def test_a_killed_holder_gives_up_its_lock_after_the_ttl_and_not_before(redis_server):
  prefix = f"t-{uuid.uuid4().hex[:8]}"
  holder = _worker(redis_server.url, prefix, 0, "hold", lock_ttl=1.5)
  assert holder.stdout.readline().strip() == "holding"

  async def contend():
    store = RedisStore(redis_server.url, prefix=prefix, lock_ttl=1.5, lock_wait=2.0)
    # While the holder lives it renews the lock: waiting 2 s (> ttl) is not enough.
    with pytest.raises(StoreUnavailable, match="not free within 2 s"):
      async with store.lock("s"):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed = time.monotonic()
    async with store.lock("s"):
      waited = time.monotonic() - killed
    # The record the holder wrote before it died is still there.
    assert await store.get(SANDBOX, "held") == {"id": "held"}
    await store.close()
    return waited
  waited = _run(contend())
  assert waited <= 1.5 + 0.5
  holder.stdout.close()
  holder.stderr.close()


def test_an_unreachable_redis_is_a_503_naming_the_url():
  from orchard_jax.env.state_redis import RedisStore as Store
  url = "redis://127.0.0.1:1/0"                   # nothing listens on port 1

  async def body():
    store = Store(url)
    with pytest.raises(StoreUnavailable) as error:
      await store.get(SANDBOX, "x")
    await store.close()
    return error.value
  error = _run(body())
  assert isinstance(error, errors.EnvError) and error.status_code == 503
  assert url in str(error)
