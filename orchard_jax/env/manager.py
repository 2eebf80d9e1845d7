"""The orchestrator's logic, independent of HTTP: sandbox lifecycle, jobs, reaping, reconcile.

State lives only in the store (records) and the backend (running isolation); this object keeps
nothing another replica would need: in-memory events only speed up waits that also work by
reading the store.
"""
import asyncio
import base64
import dataclasses
import logging
import secrets
import time
from typing import Optional

from orchard_jax.env import api as _api
from orchard_jax.env import jobs as _jobs
from orchard_jax.env import store as _store
from orchard_jax.env.backends.base import Backend, SandboxSpec
from orchard_jax.env.errors import (CapacityError, EnvError, ExposureNotFound, InvalidRequest,
                                    JobNotFound, SandboxFailed, SandboxNotFound,
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
  async def create(self, request: _api.CreateSandbox) -> dict:
    cfg = self.config
    timeout = request.timeout if request.timeout is not None else cfg.default_timeout
    if timeout > cfg.max_timeout:
      raise InvalidRequest(f"timeout {timeout:g} s exceeds the service's max_timeout "
                           f"{cfg.max_timeout:g} s")
    spec = SandboxSpec(image=request.image,
                       cpu=request.cpu if request.cpu is not None else cfg.default_cpu,
                       memory=request.memory if request.memory is not None else cfg.default_memory,
                       disk=request.disk if request.disk is not None else cfg.default_disk,
                       pids=request.pids, network=request.network,
                       egress=list(request.egress), env=dict(request.env),
                       labels=dict(request.labels), workdir=request.workdir)
    image_info = self.backend.validate(spec)
    live = await self.store.count(_store.SANDBOX)
    if live >= cfg.max_sandboxes:
      raise CapacityError(f"the service holds {live} sandboxes, its max_sandboxes is "
                          f"{cfg.max_sandboxes}; delete some first")
    now = _now()
    sandbox_id = "sbx-" + secrets.token_hex(6)
    record = {"id": sandbox_id, "state": PENDING, "image": spec.image, "cpu": spec.cpu,
              "memory": spec.memory, "disk": spec.disk, "pids": spec.pids,
              "network": spec.network, "egress": image_info.get("egress", []),
              "env": spec.env, "labels": spec.labels,
              "workdir": image_info["workdir"], "image_env": image_info.get("env", {}),
              "created_at": now, "ready_at": None, "expires_at": now + timeout,
              "timeout": timeout, "heartbeat_timeout": request.heartbeat_timeout,
              "last_heartbeat": now, "error": None, "backend": self.backend.name,
              "limits": self.backend.describe().get("limits", {}), "ref": None}
    await self.store.put(_store.SANDBOX, sandbox_id, record)
    self._ready_events[sandbox_id] = asyncio.Event()
    self.counters["created"] += 1
    self._spawn(self._bring_up(sandbox_id, spec))
    if request.wait:
      return await self.wait_ready(sandbox_id, min(request.wait_timeout or self.config.pending_timeout,
                                                   self.config.pending_timeout))
    return public_sandbox(record)

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

  async def get(self, sandbox_id: str) -> dict:
    record = await self.store.get(_store.SANDBOX, sandbox_id)
    if record is None or record["state"] == DELETED:
      raise self._not_found(sandbox_id, record)
    return record

  def _not_found(self, sandbox_id, tombstone):
    if tombstone is None:
      return SandboxNotFound(f"sandbox {sandbox_id!r} not found")
    ago = _now() - tombstone["deleted_at"]
    return SandboxNotFound(f"sandbox {sandbox_id!r} not found; it was deleted {ago:.0f} s ago "
                           f"({tombstone['reason']})", details={"reason": tombstone["reason"]})

  async def wait_ready(self, sandbox_id: str, timeout: float) -> dict:
    """Waits until the sandbox is ready (returns it), failed (raises), or timeout (returns it
    still pending)."""
    deadline = time.monotonic() + timeout
    record = await self.get(sandbox_id)
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

  async def list(self, labels: Optional[dict] = None, include_deleted: bool = False) -> list:
    out = []
    for record in await self.store.list(_store.SANDBOX):
      if record["state"] == DELETED and not include_deleted:
        continue
      if labels and any(record.get("labels", {}).get(k) != v for k, v in labels.items()):
        continue
      out.append(public_sandbox(record))
    out.sort(key=lambda r: r.get("created_at") or 0)
    return out

  async def heartbeat(self, sandbox_id: str) -> dict:
    async with self.store.lock(sandbox_id):
      record = await self.get(sandbox_id)
      record["last_heartbeat"] = _now()
      await self.store.put(_store.SANDBOX, sandbox_id, record)
    return public_sandbox(record)

  async def delete(self, sandbox_id: str, reason: str = "deleted by a client") -> dict:
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
            "labels": record.get("labels", {})}
    await self.store.put(_store.SANDBOX, record["id"], tomb)
    return tomb

  async def ready_record(self, sandbox_id: str) -> dict:
    record = await self.get(sandbox_id)
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

  async def exec(self, sandbox_id: str, request: _api.Exec) -> dict:
    record = await self.ready_record(sandbox_id)
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
                 stdout_total_bytes=result.stdout_total_bytes,
                 stderr_total_bytes=result.stderr_total_bytes,
                 stdout_dropped_bytes=result.stdout_dropped_bytes,
                 stderr_dropped_bytes=result.stderr_dropped_bytes)
    encode_output(result.stdout, "stdout", final)
    encode_output(result.stderr, "stderr", final)
    await self.store.put(_store.JOB, job["id"], final)
    if self.on_job_done is not None:
      self.on_job_done(final)
    return final

  async def get_job(self, sandbox_id: str, job_id: str) -> dict:
    job = await self.store.get(_store.JOB, job_id)
    if job is None or job["sandbox_id"] != sandbox_id:
      raise JobNotFound(f"job {job_id!r} not found in sandbox {sandbox_id!r}")
    return job

  async def wait_job(self, sandbox_id: str, job_id: str, timeout: float) -> dict:
    """The job once final, or as it is after `timeout` seconds (status "running")."""
    timeout = min(timeout, self.config.exec_wait_limit)
    job = await self.get_job(sandbox_id, job_id)
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

  async def cancel_job(self, sandbox_id: str, job_id: str) -> dict:
    job = await self.get_job(sandbox_id, job_id)
    if job["status"] not in _jobs.FINAL_STATUSES:
      record = await self.ready_record(sandbox_id)
      await self.backend.cancel_job(sandbox_id, record["ref"], job_id, job["job_ref"])
    return await self.wait_job(sandbox_id, job_id, 10)

  async def list_jobs(self, sandbox_id: str) -> list:
    await self.get(sandbox_id)
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

  async def read_file(self, sandbox_id: str, path: str) -> bytes:
    record = await self.ready_record(sandbox_id)
    return await self.backend.read_file(sandbox_id, record["ref"], self._path(record, path))

  async def write_file(self, sandbox_id: str, path: str, data: bytes, mode: int = 0o644) -> dict:
    if len(data) > self.config.max_file_bytes:
      raise InvalidRequest(f"file of {len(data)} bytes exceeds max_file_bytes "
                           f"{self.config.max_file_bytes}")
    record = await self.ready_record(sandbox_id)
    full = self._path(record, path)
    await self.backend.write_file(sandbox_id, record["ref"], full, data, mode)
    return {"path": full, "size": len(data)}

  async def list_files(self, sandbox_id: str, path: str) -> list:
    record = await self.ready_record(sandbox_id)
    return await self.backend.list_files(sandbox_id, record["ref"], self._path(record, path))

  async def apply_patch(self, sandbox_id: str, request: _api.Patch) -> dict:
    """Applies a unified diff: `git apply`, else GNU `patch --forward --fuzz=5` (checked with
    --dry-run first, so a failed attempt changes nothing). Returns {applied, method, output}."""
    data = request.data
    record = await self.ready_record(sandbox_id)
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
  async def expose(self, sandbox_id: str, request: _api.Expose, base_url: str) -> dict:
    await self.ready_record(sandbox_id)
    token = secrets.token_urlsafe(24)
    exposure = {"id": token, "sandbox_id": sandbox_id, "port": request.port,
                "created_at": _now(), "expires_at": _now() + request.ttl,
                "url": f"{base_url.rstrip('/')}/exposed/{token}/"}
    await self.store.put(_store.EXPOSURE, token, exposure)
    return exposure

  async def list_exposures(self, sandbox_id: str) -> list:
    await self.get(sandbox_id)
    return await self.store.list(_store.EXPOSURE, sandbox_id)

  async def unexpose(self, sandbox_id: str, exposure_id: str) -> None:
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

  async def reap(self) -> list:
    """One pass: deletes sandboxes past their TTL, stuck pending, silent past their heartbeat
    timeout or dead in the backend; forgets old tombstones, jobs and exposures.
    Returns [(sandbox id, reason)] of what it deleted."""
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
    for job in await self.store.list(_store.JOB):
      if job.get("finished_at") and now - job["finished_at"] > self.config.job_ttl:
        await self.store.delete(_store.JOB, job["id"])
    for exposure in await self.store.list(_store.EXPOSURE):
      if exposure["expires_at"] < now:
        await self.store.delete(_store.EXPOSURE, exposure["id"])
    return reaped
