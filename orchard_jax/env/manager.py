"""The orchestrator's logic, independent of HTTP: sandbox lifecycle, jobs, reaping, reconcile.

State lives only in the store (records) and the backend (running isolation); this object keeps
nothing another replica would need: in-memory events only speed up waits that also work by
reading the store.
"""
import asyncio
import base64
import collections
import dataclasses
import logging
import secrets
import time
from typing import Optional

from orchard_jax.env import api as _api
from orchard_jax.env import jobs as _jobs
from orchard_jax.env import store as _store
from orchard_jax.env import tenants as _tenants
from orchard_jax.env.backends.base import Backend, SandboxSpec
from orchard_jax.env.errors import (CapacityError, EnvError, ExposureNotFound, InvalidRequest,
                                    JobNotFound, PayloadTooLarge, QuotaExceeded,
                                    SandboxFailed, SandboxNotFound,
                                    SandboxStateError)

_log = logging.getLogger("orchard_jax.env.manager")
PENDING, READY, FAILED, DELETING, DELETED = "pending", "ready", "failed", "deleting", "deleted"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclasses.dataclass
class ServiceConfig:
  """Policy knobs of the service (all times in seconds, sizes in bytes).

  Attributes:
    default_timeout: sandbox lifetime (TTL) when a create request gives none.
    max_timeout: the longest lifetime a request may ask for.
    pending_timeout: a sandbox not ready after this long is deleted.
    reap_interval: how often TTL, pending and heartbeat expiry are checked.
    default_exec_timeout: command timeout when a request gives none (None: no timeout).
    exec_wait_limit: longest one HTTP request waits for a job; clients then poll.
    default_max_output_bytes / max_output_bytes: per-stream output cap, default and ceiling.
    max_sandboxes: live sandboxes allowed at once (429 beyond).
    job_ttl: finished job records are kept this long.
    tombstone_ttl: deleted sandboxes are remembered this long, so errors can say why.
    default_cpu / default_memory / default_disk: limits when a request gives none.
    max_file_bytes: largest upload or download.
    tenant_max_sandboxes / tenant_max_cpu / tenant_max_memory: every tenant's quota of live
      sandboxes, their total cpu (cores) and memory (bytes); None: no quota. A tenant under a
      cpu or memory quota must give its sandboxes that limit.
    tenant_quotas: per-tenant overrides, {tenant: {"max_sandboxes": .., "max_cpu": ..,
      "max_memory": ..}} (a key left out keeps the default above).
  """
  default_timeout: float = 3600.0
  max_timeout: float = 7 * 24 * 3600.0
  pending_timeout: float = 300.0
  reap_interval: float = 5.0
  default_exec_timeout: Optional[float] = 600.0
  exec_wait_limit: float = 300.0
  default_max_output_bytes: int = _jobs.DEFAULT_MAX_OUTPUT_BYTES
  max_output_bytes: int = 64 << 20
  max_sandboxes: int = 5000
  job_ttl: float = 3600.0
  tombstone_ttl: float = 900.0
  default_cpu: Optional[float] = None
  default_memory: Optional[int] = None
  default_disk: Optional[int] = None
  max_file_bytes: int = 1 << 30
  tenant_max_sandboxes: Optional[int] = None
  tenant_max_cpu: Optional[float] = None
  tenant_max_memory: Optional[int] = None
  tenant_quotas: dict = dataclasses.field(default_factory=dict)

  def quota(self, tenant: Optional[str]) -> dict:
    """{"max_sandboxes", "max_cpu", "max_memory"} of `tenant` (values may be None)."""
    out = {"max_sandboxes": self.tenant_max_sandboxes, "max_cpu": self.tenant_max_cpu,
           "max_memory": self.tenant_max_memory}
    out.update((self.tenant_quotas or {}).get(tenant, {}))
    return {k: v for k, v in out.items() if v is not None}


def _now() -> float:
  return time.time()


def encode_output(data: bytes, prefix: str, out: dict) -> None:
  """Puts bytes into a JSON record as text (+ exact base64 when not valid UTF-8)."""
  try:
    out[prefix] = data.decode("utf-8")
    out[prefix + "_b64"] = None
  except UnicodeDecodeError:
    out[prefix] = data.decode("utf-8", errors="replace")
    out[prefix + "_b64"] = base64.b64encode(data).decode()


HEADROOM = 32 << 20   # memory a sandbox keeps for its processes beside a full disk


def _disk_for(disk: Optional[int], memory: Optional[int], default: Optional[int]) -> Optional[int]:
  """The writable space of a sandbox (its workspace, and /tmp, each a tmpfs of this size).

  Both tmpfs count toward the memory limit (as a memory-backed emptyDir does on Kubernetes):
  with a memory limit, 2 x disk + HEADROOM must fit in it, so filling both is "No space left
  on device", never a kill by the OOM killer. Without a given disk, the default shrinks to
  fit; a given disk that does not fit is refused (never replaced).

  Raises:
    InvalidRequest: a given disk that does not fit the given memory.
  """
  if memory is None:
    return disk if disk is not None else default
  room = (memory - HEADROOM) // 2
  if disk is None:
    return min(default, room) if default else room
  if disk > room:
    raise InvalidRequest(
        f"disk {disk} bytes does not fit memory {memory} bytes: the workspace and /tmp are "
        f"each a tmpfs of `disk` bytes whose pages count toward the memory limit, so filling "
        f"them would be a kill by the OOM killer instead of 'No space left on device'; give "
        f"memory >= 2 x disk + {HEADROOM >> 20}Mi ({2 * disk + HEADROOM} bytes) or disk <= "
        f"{room} bytes", details={"fields": ["disk", "memory"]})
  return disk


async def _limited(data, limit: int):
  """The chunks of `data` (bytes or an async iterable), raising PayloadTooLarge as soon as
  more than `limit` bytes have come."""
  if isinstance(data, (bytes, bytearray, memoryview)):
    if len(data) > limit:
      raise PayloadTooLarge(f"upload of {len(data)} bytes exceeds max_file_bytes {limit}")
    yield bytes(data)
    return
  total = 0
  async for chunk in data:
    total += len(chunk)
    if total > limit:
      raise PayloadTooLarge(f"upload exceeds max_file_bytes {limit} (more than {limit} "
                            f"bytes arrived)")
    if chunk:
      yield chunk


def public_sandbox(record: dict) -> dict:
  """The API view of a sandbox record (without the backend's internal ref)."""
  return {k: v for k, v in record.items() if k not in ("ref", "image_env")}


def public_job(record: dict) -> dict:
  return {k: v for k, v in record.items() if k not in ("job_ref",)}


class SandboxManager:
  """Sandbox lifecycle, jobs and reaping on top of a Backend and a Store.

  Args:
    backend: where sandboxes run.
    store: where records live (MemoryStore for one replica).
    config: policy (ServiceConfig).
  """

  def __init__(self, backend: Backend, store: _store.Store, config: ServiceConfig):
    self.backend, self.store, self.config = backend, store, config
    self._ready_events = {}     # sandbox id -> asyncio.Event (speeds up waits in this replica)
    self._tasks = set()
    self._reaper = None
    self.counters = {"created": 0, "deleted": 0, "reaped": 0, "jobs": 0}
    # (finished_at, job id) of the jobs this replica finished, oldest first: the reaper forgets
    # expired jobs from its front instead of scanning (and copying) every job record per pass.
    self._finished_jobs = collections.deque()
    self.on_job_done = None     # callback(job record) for metrics
    self.on_created = None

  # ------------------------------------------------------------------ service lifecycle
  async def start(self) -> None:
    await self.backend.start()
    await self.reconcile()
    self._reaper = asyncio.ensure_future(self._reap_forever())

  async def stop(self) -> None:
    if self._reaper is not None:
      self._reaper.cancel()
    # With a shared store the other replicas keep serving these sandboxes.
    records = [] if self.store.shared else await self.store.list(_store.SANDBOX)
    gate = asyncio.Semaphore(64)

    async def _delete(record):
      async with gate:
        try:
          await self.delete(record["id"], reason="service stopped")
        except EnvError as e:
          _log.warning("deleting %s at shutdown failed: %s", record["id"], e)
    await asyncio.gather(*[_delete(r) for r in records if r["state"] != DELETED])
    for task in list(self._tasks):
      task.cancel()
    await self.backend.stop()
    await self.store.close()

  def _spawn(self, coro):
    task = asyncio.ensure_future(coro)
    self._tasks.add(task)
    task.add_done_callback(self._tasks.discard)
    return task

  async def reconcile(self) -> dict:
    """Makes records and backend agree: deletes sandboxes without a record, drops records
    without a sandbox. If the backend cannot list, nothing is touched (a failed listing must
    not look like "no sandboxes")."""
    try:
      present = set(await self.backend.list_sandboxes())
    except Exception as e:  # noqa: BLE001 - any listing failure means: skip
      _log.warning("reconcile skipped: the %s backend could not list sandboxes: %s",
                   self.backend.name, e)
      return {"skipped": True, "error": str(e)}
    records = {r["id"]: r for r in await self.store.list(_store.SANDBOX)
               if r["state"] != DELETED}
    orphans = present - set(records)
    for sandbox_id in sorted(orphans):
      _log.info("reconcile: deleting %s, which has no record", sandbox_id)
      try:
        await self.backend.delete(sandbox_id, None)
      except Exception as e:  # noqa: BLE001
        _log.warning("reconcile: could not delete orphan %s: %s", sandbox_id, e)
    dropped = []
    now = _now()
    for sandbox_id, record in records.items():
      stale_pending = (record["state"] == PENDING and
                       now - record["created_at"] > self.config.pending_timeout)
      if sandbox_id not in present and (record["state"] in (READY, FAILED) or stale_pending):
        dropped.append(sandbox_id)
        await self._tombstone(record, "lost: the backend no longer has it (found at reconcile)")
    return {"skipped": False, "orphans_deleted": sorted(orphans), "records_dropped": dropped}

  # ------------------------------------------------------------------ sandboxes
  async def create(self, request: _api.CreateSandbox,
                   who: Optional[_tenants.Principal] = None) -> dict:
    """Creates a sandbox owned by `who`'s tenant (None: the service's own).

    Raises:
      InvalidRequest: limits that contradict each other or the service's ceilings.
      QuotaExceeded: the tenant would exceed its quota (429).
      CapacityError: the service is full (429).
    """
    cfg = self.config
    timeout = request.timeout if request.timeout is not None else cfg.default_timeout
    if timeout > cfg.max_timeout:
      raise InvalidRequest(f"timeout {timeout:g} s exceeds the service's max_timeout "
                           f"{cfg.max_timeout:g} s", details={"fields": ["timeout"]})
    memory = request.memory if request.memory is not None else cfg.default_memory
    disk = _disk_for(request.disk, memory, cfg.default_disk or
                     self.backend.describe().get("default_disk"))
    spec = SandboxSpec(image=request.image,
                       cpu=request.cpu if request.cpu is not None else cfg.default_cpu,
                       memory=memory, disk=disk,
                       pids=request.pids, network=request.network,
                       egress=list(request.egress), env=dict(request.env),
                       labels=dict(request.labels), workdir=request.workdir,
                       tenant=who.tenant if who is not None else None)
    image_info = self.backend.validate(spec)
    tenant = spec.tenant
    async with self.store.lock(f"tenant:{tenant}"):
      live = await self.store.count(_store.SANDBOX)
      if live >= cfg.max_sandboxes:
        raise CapacityError(f"the service holds {live} sandboxes, its max_sandboxes is "
                            f"{cfg.max_sandboxes}; delete some first")
      await self._check_quota(tenant, spec)
      record = self._new_record(request, spec, image_info, timeout)
      await self.store.put(_store.SANDBOX, record["id"], record)
    sandbox_id = record["id"]
    self._ready_events[sandbox_id] = asyncio.Event()
    self.counters["created"] += 1
    self._spawn(self._bring_up(sandbox_id, spec))
    if request.wait:
      return await self.wait_ready(sandbox_id, min(request.wait_timeout or cfg.pending_timeout,
                                                   cfg.pending_timeout))
    return public_sandbox(record)

  async def _check_quota(self, tenant: Optional[str], spec: SandboxSpec) -> None:
    """Raises QuotaExceeded if `spec` would take `tenant` over its quota (see ServiceConfig)."""
    quota = self.config.quota(tenant)
    if tenant is None or not quota:
      return
    for what in ("cpu", "memory"):
      if quota.get(f"max_{what}") is not None and getattr(spec, what) is None:
        raise InvalidRequest(f"tenant {tenant!r} has a {what} quota: give the sandbox a {what} "
                             f"limit", details={"fields": [what]})
    mine = [r for r in await self.store.list(_store.SANDBOX)
            if r.get("tenant") == tenant and r["state"] != DELETED]
    usage = {"sandboxes": len(mine), "cpu": sum(r.get("cpu") or 0 for r in mine),
             "memory": sum(r.get("memory") or 0 for r in mine)}
    asked = {"sandboxes": 1, "cpu": spec.cpu or 0, "memory": spec.memory or 0}
    for what in ("sandboxes", "cpu", "memory"):
      limit = quota.get(f"max_{what}")
      if limit is not None and usage[what] + asked[what] > limit:
        raise QuotaExceeded(
            f"tenant {tenant!r} would hold {usage[what] + asked[what]:g} {what} (alive now: "
            f"{usage[what]:g}, this sandbox: {asked[what]:g}); its quota is {limit:g}; delete "
            f"some sandboxes first", details={"quota": what, "limit": limit,
                                              "usage": usage[what], "requested": asked[what]})

  def _new_record(self, request, spec, image_info, timeout) -> dict:
    now = _now()
    sandbox_id = "sbx-" + secrets.token_hex(6)
    return {"id": sandbox_id, "tenant": spec.tenant, "state": PENDING, "image": spec.image,
              "cpu": spec.cpu,
              "memory": spec.memory, "disk": spec.disk, "pids": spec.pids,
              "network": spec.network, "egress": image_info.get("egress", []),
              "env": spec.env, "labels": spec.labels,
              "workdir": image_info["workdir"], "image_env": image_info.get("env", {}),
              "created_at": now, "ready_at": None, "expires_at": now + timeout,
              "timeout": timeout, "heartbeat_timeout": request.heartbeat_timeout,
              "last_heartbeat": now, "error": None, "backend": self.backend.name,
              "limits": self.backend.describe().get("limits", {}), "ref": None}

  async def _bring_up(self, sandbox_id: str, spec: SandboxSpec) -> None:
    started = time.monotonic()
    try:
      ref = await asyncio.wait_for(self.backend.create(sandbox_id, spec),
                                   self.config.pending_timeout)
      error = None
    except asyncio.TimeoutError:
      ref, error = None, f"not ready after pending_timeout {self.config.pending_timeout:g} s"
    except EnvError as e:
      ref, error = None, e.message
    except Exception as e:  # noqa: BLE001 - recorded on the sandbox, not lost
      _log.exception("creating %s failed", sandbox_id)
      ref, error = None, f"{type(e).__name__}: {e}"
    async with self.store.lock(sandbox_id):
      record = await self.store.get(_store.SANDBOX, sandbox_id)
      if record is None or record["state"] != PENDING:   # deleted while starting
        if ref is not None:
          await self.backend.delete(sandbox_id, ref)
      else:
        if ref is not None:
          record.update(state=READY, ready_at=_now(), last_heartbeat=_now(), ref=ref)
        else:
          record.update(state=FAILED, error=f"sandbox failed to start: {error}",
                        expires_at=min(record["expires_at"], _now() + self.config.tombstone_ttl))
          try:
            await self.backend.delete(sandbox_id, None)
          except Exception:  # noqa: BLE001
            pass
        await self.store.put(_store.SANDBOX, sandbox_id, record)
    if self.on_created is not None and ref is not None:
      self.on_created(time.monotonic() - started)
    event = self._ready_events.pop(sandbox_id, None)
    if event is not None:
      event.set()

  async def get(self, sandbox_id: str, who: Optional[_tenants.Principal] = None) -> dict:
    """The record of a sandbox `who` may see (any, when who is None: the service itself).
    Raises SandboxNotFound, alike for a sandbox of another tenant and one that never was."""
    record = await self.store.get(_store.SANDBOX, sandbox_id)
    if record is not None and who is not None and not who.may_see(record):
      record = None
    if record is None or record["state"] == DELETED:
      raise self._not_found(sandbox_id, record)
    return record

  def _not_found(self, sandbox_id, tombstone):
    if tombstone is None:
      return SandboxNotFound(f"sandbox {sandbox_id!r} not found")
    ago = _now() - tombstone["deleted_at"]
    return SandboxNotFound(f"sandbox {sandbox_id!r} not found; it was deleted {ago:.0f} s ago "
                           f"({tombstone['reason']})", details={"reason": tombstone["reason"]})

  async def wait_ready(self, sandbox_id: str, timeout: float, who: Optional[_tenants.Principal] = None) -> dict:
    """Waits until the sandbox is ready (returns it), failed (raises), or timeout (returns it
    still pending)."""
    deadline = time.monotonic() + timeout
    record = await self.get(sandbox_id, who)
    while True:
      if record["state"] == DELETED:
        raise SandboxFailed(f"sandbox {sandbox_id!r} was deleted before it was ready: "
                            f"{record['reason']}", details={"reason": record["reason"]})
      if record["state"] == READY:
        return public_sandbox(record)
      if record["state"] == FAILED:
        raise SandboxFailed(record["error"] or f"sandbox {sandbox_id!r} failed",
                            details={"sandbox": public_sandbox(record)})
      if record["state"] not in (PENDING, DELETING):
        raise SandboxStateError(f"sandbox {sandbox_id!r} is {record['state']}")
      left = deadline - time.monotonic()
      if left <= 0:
        return public_sandbox(record)
      event = self._ready_events.get(sandbox_id)
      try:
        if event is not None and record["state"] == PENDING:
          await asyncio.wait_for(event.wait(), left)
        else:   # being created by another replica: poll the store
          await asyncio.sleep(min(0.05, left))
      except asyncio.TimeoutError:
        pass
      record = await self.store.get(_store.SANDBOX, sandbox_id)
      if record is None:
        raise SandboxNotFound(f"sandbox {sandbox_id!r} not found")

  async def list(self, labels: Optional[dict] = None, include_deleted: bool = False,
                 who: Optional[_tenants.Principal] = None) -> list:
    out = []
    for record in await self.store.list(_store.SANDBOX):
      if who is not None and not who.may_see(record):
        continue
      if record["state"] == DELETED and not include_deleted:
        continue
      if labels and any(record.get("labels", {}).get(k) != v for k, v in labels.items()):
        continue
      out.append(public_sandbox(record))
    out.sort(key=lambda r: r.get("created_at") or 0)
    return out

  async def heartbeat(self, sandbox_id: str, who: Optional[_tenants.Principal] = None) -> dict:
    async with self.store.lock(sandbox_id):
      record = await self.get(sandbox_id, who)
      record["last_heartbeat"] = _now()
      await self.store.put(_store.SANDBOX, sandbox_id, record)
    return public_sandbox(record)

  async def delete(self, sandbox_id: str, reason: str = "deleted by a client",
                   who: Optional[_tenants.Principal] = None) -> dict:
    if who is not None:
      await self.get(sandbox_id, who)   # 404 for another tenant's sandbox
    async with self.store.lock(sandbox_id):
      record = await self.store.get(_store.SANDBOX, sandbox_id)
      if record is None:
        raise SandboxNotFound(f"sandbox {sandbox_id!r} not found")
      if record["state"] == DELETED:
        return public_sandbox(record)
      record["state"] = DELETING
      await self.store.put(_store.SANDBOX, sandbox_id, record)
      try:
        await self.backend.delete(sandbox_id, record.get("ref"))
      except Exception as e:  # noqa: BLE001 - the record stays "deleting"; the reaper retries
        _log.warning("backend delete of %s failed: %s", sandbox_id, e)
        raise SandboxStateError(f"deleting sandbox {sandbox_id!r} failed: {e}") from None
      for exposure in await self.store.list(_store.EXPOSURE, sandbox_id):
        await self.store.delete(_store.EXPOSURE, exposure["id"])
      tomb = await self._tombstone(record, reason)
    self.counters["deleted"] += 1
    event = self._ready_events.pop(sandbox_id, None)
    if event is not None:
      event.set()
    return public_sandbox(tomb)

  async def _tombstone(self, record, reason):
    tomb = {"id": record["id"], "state": DELETED, "reason": reason, "deleted_at": _now(),
            "created_at": record.get("created_at"), "image": record.get("image"),
            "labels": record.get("labels", {}), "tenant": record.get("tenant")}
    await self.store.put(_store.SANDBOX, record["id"], tomb)
    return tomb

  async def ready_record(self, sandbox_id: str, who: Optional[_tenants.Principal] = None) -> dict:
    record = await self.get(sandbox_id, who)
    if record["state"] != READY:
      if record["state"] == FAILED:
        raise SandboxFailed(record["error"] or f"sandbox {sandbox_id!r} failed")
      raise SandboxStateError(f"sandbox {sandbox_id!r} is {record['state']}, not ready; "
                              f"wait for it first (POST /v1/sandboxes/{sandbox_id}/wait)")
    hb = record.get("heartbeat_timeout")
    if hb and _now() - record["last_heartbeat"] > hb / 4:   # activity counts as a heartbeat
      record["last_heartbeat"] = _now()
      await self.store.put(_store.SANDBOX, sandbox_id, record)
    return record

  # ------------------------------------------------------------------ jobs
  def job_spec(self, record: dict, request: _api.Exec) -> _jobs.JobSpec:
    """The JobSpec of an exec request: environment = defaults < image < sandbox < request."""
    env = {"PATH": _DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "xterm"}
    env.update(record.get("image_env") or {})
    env.update(record.get("env") or {})
    env.update(request.env)
    cap = request.max_output_bytes
    if cap is None:
      cap = self.config.default_max_output_bytes
    if cap > self.config.max_output_bytes:
      raise InvalidRequest(f"max_output_bytes {cap} exceeds the service's ceiling "
                           f"{self.config.max_output_bytes}")
    stdin = request.stdin_bytes
    timeout = request.timeout if request.timeout is not None else self.config.default_exec_timeout
    cwd = self._path(record, request.cwd, "cwd") if request.cwd else record["workdir"]
    return _jobs.JobSpec(command=request.command, shell=request.shell,
                         cwd=cwd, env=env, timeout=timeout,
                         merge_stderr=request.merge_stderr, max_output_bytes=cap, stdin=stdin)

  async def exec(self, sandbox_id: str, request: _api.Exec, who: Optional[_tenants.Principal] = None) -> dict:
    record = await self.ready_record(sandbox_id, who)
    spec = self.job_spec(record, request)
    job_id = "job-" + secrets.token_hex(8)
    job_ref = await self.backend.start_job(sandbox_id, record["ref"], job_id, spec)
    job = {"id": job_id, "sandbox_id": sandbox_id, "command": request.command,
           "cwd": spec.cwd, "timeout": spec.timeout, "merge_stderr": spec.merge_stderr,
           "status": _jobs.RUNNING, "exit_code": None, "signal": None, "started_at": _now(),
           "finished_at": None, "duration": None, "error": None, "job_ref": job_ref}
    await self.store.put(_store.JOB, job_id, job)
    self.counters["jobs"] += 1
    finisher = self._spawn(self._finish_job(record, job))
    if not request.wait:
      return public_job(job)
    limit = self.config.exec_wait_limit
    if request.wait_timeout is not None:
      limit = min(limit, request.wait_timeout)
    try:
      return public_job(await asyncio.wait_for(asyncio.shield(finisher), limit))
    except asyncio.TimeoutError:
      return public_job(job)

  async def _finish_job(self, record, job) -> dict:
    result = await self.backend.wait_job(record["id"], record["ref"], job["id"],
                                         job["job_ref"], None)
    return await self._record_result(job, result)

  async def _record_result(self, job, result: _jobs.JobResult) -> dict:
    final = dict(job, status=result.status, exit_code=result.exit_code, signal=result.signal,
                 duration=result.duration, finished_at=_now(), error=result.error,
                 oom_killed=result.oom_killed,
                 stdout_total_bytes=result.stdout_total_bytes,
                 stderr_total_bytes=result.stderr_total_bytes,
                 stdout_dropped_bytes=result.stdout_dropped_bytes,
                 stderr_dropped_bytes=result.stderr_dropped_bytes)
    encode_output(result.stdout, "stdout", final)
    encode_output(result.stderr, "stderr", final)
    await self.store.put(_store.JOB, job["id"], final)
    self._finished_jobs.append((final["finished_at"], job["id"]))
    if self.on_job_done is not None:
      self.on_job_done(final)
    return final

  async def get_job(self, sandbox_id: str, job_id: str, who: Optional[_tenants.Principal] = None) -> dict:
    if who is not None:
      await self.get(sandbox_id, who)
    job = await self.store.get(_store.JOB, job_id)
    if job is None or job["sandbox_id"] != sandbox_id:
      raise JobNotFound(f"job {job_id!r} not found in sandbox {sandbox_id!r}")
    return job

  async def wait_job(self, sandbox_id: str, job_id: str, timeout: float,
                     who: Optional[_tenants.Principal] = None) -> dict:
    """The job once final, or as it is after `timeout` seconds (status "running")."""
    timeout = min(timeout, self.config.exec_wait_limit)
    job = await self.get_job(sandbox_id, job_id, who)
    if job["status"] in _jobs.FINAL_STATUSES:
      return public_job(job)
    record = await self.store.get(_store.SANDBOX, sandbox_id)
    if record is None or record["state"] != READY:
      deadline = time.monotonic() + timeout   # the sandbox is going: the finisher will write
      while time.monotonic() < deadline:
        job = await self.get_job(sandbox_id, job_id)
        if job["status"] in _jobs.FINAL_STATUSES:
          break
        await asyncio.sleep(0.05)
      return public_job(job)
    result = await self.backend.wait_job(sandbox_id, record["ref"], job_id, job["job_ref"],
                                         timeout)
    if result is None:
      return public_job(await self.get_job(sandbox_id, job_id))
    latest = await self.get_job(sandbox_id, job_id)
    if latest["status"] in _jobs.FINAL_STATUSES:
      return public_job(latest)
    return public_job(await self._record_result(latest, result))

  async def cancel_job(self, sandbox_id: str, job_id: str, who: Optional[_tenants.Principal] = None) -> dict:
    job = await self.get_job(sandbox_id, job_id, who)
    if job["status"] not in _jobs.FINAL_STATUSES:
      record = await self.ready_record(sandbox_id)
      await self.backend.cancel_job(sandbox_id, record["ref"], job_id, job["job_ref"])
    return await self.wait_job(sandbox_id, job_id, 10)

  async def list_jobs(self, sandbox_id: str, who: Optional[_tenants.Principal] = None) -> list:
    await self.get(sandbox_id, who)
    jobs = [public_job(j) for j in await self.store.list(_store.JOB, sandbox_id)]
    jobs.sort(key=lambda j: j["started_at"])
    return jobs

  async def run(self, sandbox_id: str, request: _api.Exec) -> _jobs.JobResult:
    """Runs a command to its end and returns the raw JobResult (for patches); no job record."""
    record = await self.ready_record(sandbox_id)
    spec = self.job_spec(record, request)
    job_id = "internal-" + secrets.token_hex(6)
    job_ref = await self.backend.start_job(sandbox_id, record["ref"], job_id, spec)
    return await self.backend.wait_job(sandbox_id, record["ref"], job_id, job_ref, None)

  # ------------------------------------------------------------------ files and patches
  def _path(self, record, path, what="path"):
    """The absolute, normalised path of `path` (relative paths are under the workdir)."""
    try:
      path = _api.sandbox_path(path or "", what)
    except ValueError as e:
      raise InvalidRequest(str(e), details={"field": what}) from None
    if not path.startswith("/"):
      path = _api.sandbox_path(record["workdir"].rstrip("/") + "/" + path)
    return path

  async def read_file(self, sandbox_id: str, path: str,
                      who: Optional[_tenants.Principal] = None) -> tuple:
    """(size in bytes, async iterator of the file's bytes), streamed from the sandbox.

    Raises:
      SandboxFileNotFound; FileOperationError (a directory, FIFO, device or socket, or a
      symlink to one); PayloadTooLarge (over max_file_bytes), all before any byte is sent.
    """
    record = await self.ready_record(sandbox_id, who)
    return await self.backend.read_file(sandbox_id, record["ref"], self._path(record, path),
                                        self.config.max_file_bytes)

  async def write_file(self, sandbox_id: str, path: str, data, mode: int = 0o644,
                       who: Optional[_tenants.Principal] = None) -> dict:
    """Writes bytes or an async iterable of byte chunks to `path`, counting them as they
    arrive: past max_file_bytes the upload stops with PayloadTooLarge and nothing is kept."""
    if not 0 <= mode <= 0o7777:
      raise InvalidRequest(f"mode must be 0 to 7777 (octal); got {mode:o}",
                           details={"fields": ["mode"]})
    record = await self.ready_record(sandbox_id, who)
    full = self._path(record, path)
    if full == "/" or path.endswith("/"):
      raise InvalidRequest(f"path {path!r} names a folder; give a file path",
                           details={"fields": ["path"]})
    size = await self.backend.write_file(sandbox_id, record["ref"], full,
                                         _limited(data, self.config.max_file_bytes), mode)
    return {"path": full, "size": size}

  async def list_files(self, sandbox_id: str, path: str, who: Optional[_tenants.Principal] = None) -> list:
    record = await self.ready_record(sandbox_id, who)
    return await self.backend.list_files(sandbox_id, record["ref"], self._path(record, path))

  async def apply_patch(self, sandbox_id: str, request: _api.Patch, who: Optional[_tenants.Principal] = None) -> dict:
    """Applies a unified diff: `git apply`, else GNU `patch --forward --fuzz=5` (checked with
    --dry-run first, so a failed attempt changes nothing). Returns {applied, method, output}."""
    data = request.data
    record = await self.ready_record(sandbox_id, who)
    cwd = self._path(record, request.cwd, "cwd") if request.cwd else record["workdir"]
    path = f"/tmp/.orchard-patch-{secrets.token_hex(6)}.diff"
    await self.backend.write_file(sandbox_id, record["ref"], path, data, 0o644)
    patch_cmd = ["patch", "--batch", "--forward", "--fuzz=5", "-p1", "-i", path]
    attempts = [("git apply", ["git", "apply", "--verbose", "--whitespace=nowarn", path]),
                ("patch", ["sh", "-c", '"$@" --dry-run >/dev/null && "$@"', "sh", *patch_cmd])]
    outputs = []
    applied, method = False, None
    for name, argv in attempts:
      result = await self.run(sandbox_id, _api.Exec(command=argv, cwd=cwd, timeout=request.timeout,
                                                    merge_stderr=True))
      text = result.stdout.decode(errors="replace")
      outputs.append(f"$ {' '.join(argv)}\n{text}{result.error or ''}")
      if result.status == _jobs.FINISHED and result.exit_code == 0:
        applied, method = True, name
        break
    await self.run(sandbox_id, _api.Exec(command=["rm", "-f", path], cwd="/", timeout=30))
    return {"applied": applied, "method": method, "output": "\n".join(outputs), "cwd": cwd}

  # ------------------------------------------------------------------ exposures
  async def expose(self, sandbox_id: str, request: _api.Expose, base_url: str,
                   who: Optional[_tenants.Principal] = None) -> dict:
    await self.ready_record(sandbox_id, who)
    token = secrets.token_urlsafe(24)
    exposure = {"id": token, "sandbox_id": sandbox_id, "port": request.port,
                "created_at": _now(), "expires_at": _now() + request.ttl,
                "url": f"{base_url.rstrip('/')}/exposed/{token}/"}
    await self.store.put(_store.EXPOSURE, token, exposure)
    return exposure

  async def list_exposures(self, sandbox_id: str, who: Optional[_tenants.Principal] = None) -> list:
    await self.get(sandbox_id, who)
    return await self.store.list(_store.EXPOSURE, sandbox_id)

  async def unexpose(self, sandbox_id: str, exposure_id: str, who: Optional[_tenants.Principal] = None) -> None:
    await self.get(sandbox_id, who)
    exposure = await self.store.get(_store.EXPOSURE, exposure_id)
    if exposure is None or exposure["sandbox_id"] != sandbox_id:
      raise ExposureNotFound(f"exposure {exposure_id[:6]}... not found on {sandbox_id!r}")
    await self.store.delete(_store.EXPOSURE, exposure_id)

  async def resolve_exposure(self, token: str) -> tuple:
    """(sandbox record, exposure) for a live exposure token; ExposureNotFound otherwise."""
    exposure = await self.store.get(_store.EXPOSURE, token)
    if exposure is None or exposure["expires_at"] < _now():
      raise ExposureNotFound("this exposed URL does not exist or has expired")
    record = await self.store.get(_store.SANDBOX, exposure["sandbox_id"])
    if record is None or record["state"] != READY:
      raise ExposureNotFound("the sandbox behind this exposed URL is gone")
    return record, exposure

  # ------------------------------------------------------------------ reaping
  async def _reap_forever(self):
    while True:
      await asyncio.sleep(self.config.reap_interval)
      try:
        await self.reap()
      except Exception:  # noqa: BLE001 - the reaper must keep running
        _log.exception("reap pass failed")

  async def _forget_old_jobs(self, now: float) -> None:
    """Deletes job records finished more than job_ttl ago. This replica's own come off the
    front of its finish-ordered queue (a pass costs what it deletes, not what is kept: a full
    scan copied every record, 3.5 s of the event loop per pass at 100k jobs); with a shared
    store the records of other or former replicas are also looked for in a full scan."""
    ttl = self.config.job_ttl
    while self._finished_jobs and now - self._finished_jobs[0][0] > ttl:
      _, job_id = self._finished_jobs.popleft()
      job = await self.store.get(_store.JOB, job_id)
      if job is not None and job.get("finished_at") and now - job["finished_at"] > ttl:
        await self.store.delete(_store.JOB, job_id)
    if self.store.shared:
      for job in await self.store.list(_store.JOB):
        if job.get("finished_at") and now - job["finished_at"] > ttl:
          await self.store.delete(_store.JOB, job["id"])

  async def reap(self) -> list:
    """One pass: deletes sandboxes past their TTL, stuck pending, silent past their heartbeat
    timeout or dead in the backend; forgets old tombstones, jobs and exposures; has the
    backend kill what finished commands left holding a sandbox's pids limit.
    Returns [(sandbox id, reason)] of what it deleted."""
    reclaim = getattr(self.backend, "reclaim", None)
    if reclaim is not None:
      await reclaim()
    now = _now()
    reaped = []
    for record in await self.store.list(_store.SANDBOX):
      sandbox_id, state = record["id"], record["state"]
      if state == DELETED:
        if now - record["deleted_at"] > self.config.tombstone_ttl:
          await self.store.delete(_store.SANDBOX, sandbox_id)
          for job in await self.store.list(_store.JOB, sandbox_id):
            await self.store.delete(_store.JOB, job["id"])
        continue
      reason = None
      if now > record["expires_at"]:
        reason = f"expired: its ttl of {record['timeout']:g} s ran out"
      elif state == PENDING and now - record["created_at"] > self.config.pending_timeout:
        reason = f"not ready within pending_timeout {self.config.pending_timeout:g} s"
      elif (state == READY and record.get("heartbeat_timeout")
            and now - record["last_heartbeat"] > record["heartbeat_timeout"]):
        reason = f"no heartbeat for {record['heartbeat_timeout']:g} s"
      elif state == DELETING:
        reason = "retrying an unfinished delete"
      elif state == READY and not await self.backend.is_alive(sandbox_id, record["ref"]):
        async with self.store.lock(sandbox_id):
          current = await self.store.get(_store.SANDBOX, sandbox_id)
          if current is not None and current["state"] == READY:
            current.update(state=FAILED, error="the sandbox died",
                           expires_at=min(current["expires_at"], now + self.config.tombstone_ttl))
            await self.store.put(_store.SANDBOX, sandbox_id, current)
        continue
      if reason is not None:
        try:
          await self.delete(sandbox_id, reason=reason)
          reaped.append((sandbox_id, reason))
          self.counters["reaped"] += 1
        except EnvError as e:
          _log.warning("reaping %s failed: %s", sandbox_id, e)
    await self._forget_old_jobs(now)
    for exposure in await self.store.list(_store.EXPOSURE):
      if exposure["expires_at"] < now:
        await self.store.delete(_store.EXPOSURE, exposure["id"])
    return reaped
