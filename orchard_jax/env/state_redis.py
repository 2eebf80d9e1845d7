"""The Redis store: sandbox, job and exposure records shared by several orchestrator replicas.

Implements `orchard_jax.env.store.Store` on one Redis server (redis-py's asyncio client), so
any replica behind the Kubernetes Service can serve any sandbox: a request that lands on
replica B finds the record replica A wrote, and per-sandbox locks serialise changes to one
sandbox across replicas. `MemoryStore` stays the single-replica default.

Layout (all keys under `prefix`, default "orchard-env"):
  {prefix}:{kind}                      hash: record id -> JSON record
  {prefix}:{kind}:by-sandbox:{sid}     set of job / exposure ids of sandbox `sid`
  {prefix}:lock:{key}                  lock token (redis-py Lock: SET NX PX + Lua release)

Durability: a `put` returns once Redis acknowledged it, so a record written before a replica
dies is there for the next replica; with the fleet's Redis (append-only file, fsync every
second, `noeviction`, launch/k8s/env_service.py) it also survives a Redis restart.

Locks expire after `lock_ttl` seconds unless renewed; the holder renews them every
`lock_ttl / 3` seconds, so a long operation keeps its lock while a replica that dies
releases its locks within `lock_ttl` seconds. A single Redis server (or a primary with
replicas) is supported; Redis Cluster is not (the delete script touches keys it derives).
"""
import asyncio
import contextlib
import json
from typing import AsyncIterator, Optional

from orchard_jax.env import errors
from orchard_jax.env.store import EXPOSURE, JOB, KINDS, SANDBOX, Store

_INDEXED = (JOB, EXPOSURE)

# Atomically removes a record and its by-sandbox index entry.
# KEYS[1] = records hash; ARGV[1] = id; ARGV[2] = index key prefix ("" when not indexed).
_DELETE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then
  local ok, record = pcall(cjson.decode, raw)
  if ok and type(record) == 'table' and type(record['sandbox_id']) == 'string' then
    redis.call('SREM', ARGV[2] .. record['sandbox_id'], ARGV[1])
  end
end
return 1
"""


class StoreUnavailable(errors.ServiceUnavailable):
  """The Redis server cannot be reached or refused a command (HTTP 503, so clients retry)."""


class RedisStore(Store):
  """Records in Redis; locks as Redis locks (see the module docstring).

  Args:
    url: a Redis URL, e.g. "redis://orchard-redis.orchard.svc.cluster.local:6379/0" or
      "unix:///run/redis.sock" (redis-py's URL syntax, credentials included).
    prefix: namespace of every key, so several services can share one Redis.
    lock_ttl: seconds a lock outlives a holder that stopped renewing it (a dead replica).
    lock_wait: seconds to wait for a lock before giving up with StoreUnavailable (None waits
      as long as it takes).
    client: an existing `redis.asyncio.Redis` (the store then does not close it).
  """

  shared = True       # a stopping replica leaves the sandboxes to the others

  def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "orchard-env",
               lock_ttl: float = 30.0, lock_wait: Optional[float] = 600.0, client=None):
    import redis.asyncio
    from redis.backoff import EqualJitterBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry
    if lock_ttl <= 0:
      raise ValueError(f"lock_ttl must be > 0 seconds; got {lock_ttl!r}")
    self.url = url
    self.prefix = prefix
    self.lock_ttl = float(lock_ttl)
    self.lock_wait = lock_wait
    self._own_client = client is None
    if client is None:
      # Transient connection failures are retried by redis-py itself (backoff with jitter).
      client = redis.asyncio.Redis.from_url(
          url, retry=Retry(EqualJitterBackoff(cap=1.0, base=0.05), 3),
          retry_on_error=[RedisConnectionError, RedisTimeoutError],
          socket_connect_timeout=5, health_check_interval=30)
    self._redis = client
    self._delete_script = client.register_script(_DELETE)

  def __repr__(self):
    return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

  # --- keys -------------------------------------------------------------------------------

  def _check(self, kind: str) -> None:
    if kind not in KINDS:
      raise ValueError(f"record kind must be one of {KINDS}; got {kind!r}")

  def _records(self, kind: str) -> str:
    return f"{self.prefix}:{kind}"

  def _index_prefix(self, kind: str) -> str:
    return f"{self.prefix}:{kind}:by-sandbox:"

  # --- records ----------------------------------------------------------------------------

  async def put(self, kind, record_id, record):
    self._check(kind)
    data = json.dumps(record, separators=(",", ":"))
    async with self._errors(f"writing {kind} {record_id!r}"):
      pipe = self._redis.pipeline(transaction=True)
      pipe.hset(self._records(kind), record_id, data)
      sandbox_id = record.get("sandbox_id")
      if kind in _INDEXED and sandbox_id:
        pipe.sadd(self._index_prefix(kind) + sandbox_id, record_id)
      await pipe.execute()

  async def get(self, kind, record_id):
    self._check(kind)
    async with self._errors(f"reading {kind} {record_id!r}"):
      raw = await self._redis.hget(self._records(kind), record_id)
    return None if raw is None else json.loads(raw)

  async def delete(self, kind, record_id):
    self._check(kind)
    index = self._index_prefix(kind) if kind in _INDEXED else ""
    async with self._errors(f"deleting {kind} {record_id!r}"):
      await self._delete_script(keys=[self._records(kind)], args=[record_id, index])

  async def list(self, kind, sandbox_id=None):
    self._check(kind)
    async with self._errors(f"listing {kind} records"):
      if sandbox_id is None:
        values = await self._redis.hvals(self._records(kind))
      else:
        if kind not in _INDEXED:
          raise ValueError(f"records of kind {kind!r} are not indexed by sandbox")
        ids = sorted(await self._redis.smembers(self._index_prefix(kind) + sandbox_id))
        values = await self._redis.hmget(self._records(kind), ids) if ids else []
    records = [json.loads(v) for v in values if v is not None]
    if sandbox_id is not None:      # an index entry may outlive a record moved elsewhere
      records = [r for r in records if r.get("sandbox_id") == sandbox_id]
    return records

  # --- locks ------------------------------------------------------------------------------

  @contextlib.asynccontextmanager
  async def lock(self, key) -> AsyncIterator[None]:
    """Holds the Redis lock on `key` (a sandbox id) across every replica sharing the store.

    Raises:
      StoreUnavailable: Redis is unreachable, or the lock was not free within `lock_wait`.
    """
    from redis.asyncio.lock import Lock
    from redis.exceptions import LockError
    lock = Lock(self._redis, f"{self.prefix}:lock:{key}", timeout=self.lock_ttl, sleep=0.02,
                blocking_timeout=self.lock_wait, thread_local=False,
                raise_on_release_error=False)
    async with self._errors(f"locking {key!r}"):
      acquired = await lock.acquire()
    if not acquired:
      raise StoreUnavailable(f"the lock on {key!r} was not free within {self.lock_wait:g} s "
                             "(another replica holds it)")
    renewer = asyncio.ensure_future(self._renew(lock))
    try:
      yield
    finally:
      renewer.cancel()
      with contextlib.suppress(asyncio.CancelledError):
        await renewer
      try:
        await lock.release()
      except (LockError, *self._redis_errors()):
        pass                # expired (we were too slow) or Redis is gone: it frees itself

  async def _renew(self, lock) -> None:
    from redis.exceptions import LockError
    while True:
      await asyncio.sleep(self.lock_ttl / 3)
      try:
        await lock.reacquire()
      except (LockError, *self._redis_errors()):
        return

  # --- plumbing ---------------------------------------------------------------------------

  async def ping(self) -> None:
    """Checks that Redis answers (the service's start-up and health checks).

    Raises:
      StoreUnavailable: it does not.
    """
    async with self._errors("ping"):
      await self._redis.ping()

  async def clear(self) -> None:
    """Deletes every key under this store's prefix (tests and `reset` tools only)."""
    async with self._errors("clearing"):
      keys = [k async for k in self._redis.scan_iter(match=f"{self.prefix}:*", count=1000)]
      if keys:
        await self._redis.delete(*keys)

  async def close(self):
    if self._own_client:
      await self._redis.aclose()

  @staticmethod
  def _redis_errors() -> tuple:
    from redis.exceptions import RedisError
    return (RedisError, OSError)

  @contextlib.asynccontextmanager
  async def _errors(self, what: str) -> AsyncIterator[None]:
    from redis.exceptions import RedisError
    try:
      yield
    except (RedisError, OSError) as e:
      raise StoreUnavailable(f"Redis store at {self.url} failed while {what}: "
                             f"{type(e).__name__}: {e}") from None


__all__ = ["RedisStore", "StoreUnavailable", "SANDBOX", "JOB", "EXPOSURE"]
