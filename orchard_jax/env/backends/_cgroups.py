"""Per-sandbox cgroups for the local backend: cpu, memory and process-count limits, and stats.

Works with cgroup v1 (one hierarchy per controller) and v2 (the unified hierarchy, where a
controller counts as available only if it is enabled for our part of the tree). Each sandbox
gets one cgroup per available controller at `<our cgroup>/<root name>/<sandbox id>`; every
process of the sandbox (bubblewrap and each command) joins them before it runs anything, so
limits hold from the first instruction and a sandbox's processes can be counted and killed
even when they escape their process group.

What is enforceable depends on the machine (root or a delegated cgroup is needed to write
here); `CgroupManager.available` says which controllers work, and the backend refuses limits
it cannot enforce unless told to ignore them.
"""
import logging
import os
import signal
import time
from typing import Optional

_log = logging.getLogger("orchard_jax.env.cgroups")
CONTROLLERS = ("cpu", "memory", "pids")
_CPU_PERIOD_US = 100_000


def _mounts() -> tuple[dict, Optional[str]]:
  """Returns ({controller: v1 mount point}, v2 mount point or None)."""
  v1, v2 = {}, None
  with open("/proc/self/mountinfo") as f:
    for line in f:
      left, _, right = line.partition(" - ")
      fields, rfields = left.split(), right.split()
      if not rfields:
        continue
      fstype, mount_point = rfields[0], fields[4]
      if fstype == "cgroup2" and v2 is None:
        v2 = mount_point
      elif fstype == "cgroup":
        for opt in rfields[2].split(","):
          if opt in CONTROLLERS and opt not in v1:
            v1[opt] = mount_point
  return v1, v2


def _own_paths() -> tuple[dict, Optional[str]]:
  """Returns ({v1 controller: our cgroup path}, our v2 cgroup path)."""
  v1, v2 = {}, None
  with open("/proc/self/cgroup") as f:
    for line in f:
      _, controllers, path = line.rstrip("\n").split(":", 2)
      if controllers == "":
        v2 = path
      for c in controllers.split(","):
        v1[c] = path
  return v1, v2


class CgroupManager:
  """Creates, limits, measures and removes the cgroups of sandboxes.

  Args:
    root_name: the folder created under our own cgroup in each hierarchy; one per orchestrator
      state directory, so several orchestrators on one machine never touch each other's groups.
  """

  def __init__(self, root_name: str):
    self.root_name = root_name
    self.roots = {}      # controller -> absolute folder of our root in that hierarchy
    self.version = {}    # controller -> 1 or 2
    self.problems = {}   # controller -> why it is unavailable
    v1_mounts, v2_mount = _mounts()
    v1_paths, v2_path = _own_paths()
    v2_controllers = set()
    if v2_mount is not None and v2_path is not None:
      try:
        with open(os.path.join(v2_mount, v2_path.lstrip("/"), "cgroup.subtree_control")) as f:
          v2_controllers = set(f.read().split())
      except OSError:
        pass
    for c in CONTROLLERS:
      if c in v1_mounts and c in v1_paths:
        base = os.path.join(v1_mounts[c], v1_paths[c].lstrip("/"))
        version = 1
      elif c in v2_controllers:
        base = os.path.join(v2_mount, v2_path.lstrip("/"))
        version = 2
      else:
        self.problems[c] = "no cgroup hierarchy with this controller is mounted or delegated here"
        continue
      root = os.path.join(base, root_name)
      try:
        os.makedirs(root, exist_ok=True)
        if version == 2:
          self._enable_v2(root)
      except OSError as e:
        self.problems[c] = f"cannot create {root}: {e.strerror} (needs root or a delegated cgroup)"
        continue
      self.roots[c] = root
      self.version[c] = version

  @staticmethod
  def _enable_v2(root):
    with open(os.path.join(root, "cgroup.controllers")) as f:
      have = f.read().split()
    wanted = " ".join(f"+{c}" for c in CONTROLLERS if c in have)
    if wanted:
      with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
        f.write(wanted)

  def home_procs(self) -> list:
    """cgroup.procs files of the cgroups this service itself is in (one per hierarchy used)."""
    return sorted({os.path.join(os.path.dirname(root), "cgroup.procs")
                   for root in self.roots.values()})

  @property
  def available(self) -> dict:
    """{controller: True/False} for cpu, memory and pids."""
    return {c: c in self.roots for c in CONTROLLERS}

  def _dirs(self, sandbox_id: str) -> dict:
    return {c: os.path.join(root, sandbox_id) for c, root in self.roots.items()}

  def create(self, sandbox_id: str, *, cpu: Optional[float], memory: Optional[int],
             pids: Optional[int]) -> list[str]:
    """Creates the sandbox's groups, writes the limits, returns the cgroup.procs paths to join.

    Args:
      cpu: cores (fractional allowed), or None for no cpu limit.
      memory: bytes (including tmpfs pages the sandbox writes), or None.
      pids: maximum number of processes and threads, or None.
    Raises:
      OSError: a write failed (the caller removes the half-made groups).
    """
    procs = []
    seen = set()
    for c, path in self._dirs(sandbox_id).items():
      if path in seen:   # v2: one folder serves every controller
        continue
      seen.add(path)
      os.makedirs(path, exist_ok=True)
      procs.append(os.path.join(path, "cgroup.procs"))
    dirs = self._dirs(sandbox_id)
    if cpu is not None and "cpu" in dirs:
      quota = max(1000, int(cpu * _CPU_PERIOD_US))
      if self.version["cpu"] == 1:
        _write(dirs["cpu"], "cpu.cfs_period_us", _CPU_PERIOD_US)
        _write(dirs["cpu"], "cpu.cfs_quota_us", quota)
      else:
        _write(dirs["cpu"], "cpu.max", f"{quota} {_CPU_PERIOD_US}")
    if memory is not None and "memory" in dirs:
      if self.version["memory"] == 1:
        _write(dirs["memory"], "memory.limit_in_bytes", memory)
        swap_file = os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes")
        if os.path.exists(swap_file):
          _write(dirs["memory"], "memory.memsw.limit_in_bytes", memory)
      else:
        _write(dirs["memory"], "memory.max", memory)
        if os.path.exists(os.path.join(dirs["memory"], "memory.swap.max")):
          _write(dirs["memory"], "memory.swap.max", 0)
    if pids is not None and "pids" in dirs:
      _write(dirs["pids"], "pids.max", pids)
    return procs

  def pids(self, sandbox_id: str) -> list[int]:
    """Host pids of every process in the sandbox's groups."""
    found = set()
    for path in set(self._dirs(sandbox_id).values()):
      try:
        with open(os.path.join(path, "cgroup.procs")) as f:
          found.update(int(x) for x in f.read().split())
      except OSError:
        pass
    return sorted(found)

  def stats(self, sandbox_id: str) -> dict:
    """Current usage: memory_bytes, pids, cpu_seconds (keys present where measurable)."""
    dirs = self._dirs(sandbox_id)
    out = {}
    if "memory" in dirs:
      name = "memory.usage_in_bytes" if self.version["memory"] == 1 else "memory.current"
      out["memory_bytes"] = _read_int(dirs["memory"], name)
    if "pids" in dirs:
      out["pids"] = _read_int(dirs["pids"], "pids.current")
    if "cpu" in dirs and self.version["cpu"] == 2:
      try:
        with open(os.path.join(dirs["cpu"], "cpu.stat")) as f:
          for line in f:
            if line.startswith("usage_usec"):
              out["cpu_seconds"] = int(line.split()[1]) / 1e6
      except OSError:
        pass
    return {k: v for k, v in out.items() if v is not None}

  def counters(self, sandbox_id: str) -> "EventCounters":
    """The sandbox's OOM-kill and pids-limit counters (see EventCounters)."""
    dirs = self._dirs(sandbox_id)
    files = {}
    if "memory" in dirs:
      name = "memory.oom_control" if self.version["memory"] == 1 else "memory.events"
      files["oom_kill"] = os.path.join(dirs["memory"], name)
    if "pids" in dirs:
      files["max"] = os.path.join(dirs["pids"], "pids.events")
    return EventCounters(files)

  def oom_kills(self, sandbox_id: str) -> Optional[int]:
    """How many processes of the sandbox the kernel's OOM killer has killed (its memory
    limit reached), or None where the memory controller is not in use."""
    counters = self.counters(sandbox_id)
    try:
      return counters.oom_kills()
    finally:
      counters.close()

  def pids_limit_hits(self, sandbox_id: str) -> Optional[int]:
    """How many times a fork in the sandbox failed at its pids limit, or None."""
    counters = self.counters(sandbox_id)
    try:
      return counters.pids_limit_hits()
    finally:
      counters.close()

  def close(self) -> None:
    """Removes this service's (empty) root folders."""
    for root in set(self.roots.values()):
      try:
        os.rmdir(root)
      except OSError:
        pass

  def kill_all(self, sandbox_id: str, *, timeout: float = 5.0) -> None:
    """SIGKILLs every process in the sandbox's groups until none is left (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
      pids = self.pids(sandbox_id)
      if not pids or time.monotonic() > deadline:
        return
      for pid in pids:
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      time.sleep(0.002)

  def remove(self, sandbox_id: str) -> None:
    """Kills what is left in the sandbox's groups and removes them."""
    self.kill_all(sandbox_id)
    for path in set(self._dirs(sandbox_id).values()):
      deadline = time.monotonic() + 5
      while True:
        try:
          os.rmdir(path)
          break
        except FileNotFoundError:
          break
        except OSError:   # EBUSY while the last processes exit
          if time.monotonic() > deadline:
            _log.warning("could not remove cgroup %s", path)
            break
          time.sleep(0.002)

  def list(self) -> set:
    """Sandbox ids that have a group in any hierarchy (including leftovers of a killed run)."""
    ids = set()
    for root in self.roots.values():
      try:
        ids.update(e.name for e in os.scandir(root) if e.is_dir())
      except OSError:
        pass
    return ids


def _write(folder, name, value):
  with open(os.path.join(folder, name), "w") as f:
    f.write(str(value))


class EventCounters:
  """A sandbox's event counters (OOM kills, forks refused at the pids limit), read before and
  after every command through descriptors held open from the first read until `close`.

  A cgroup file read again from offset 0 gives its current content, so each read is one
  pread(2) instead of a path lookup, an open and a close (about 45 us -> 7 us a file, four
  files a command). Reads after `close` (a command that ends after its sandbox was deleted)
  return None and reopen nothing.

  Args:
    files: {key: path of the flat keyed cgroup file whose line "<key> <count>" is wanted};
      "oom_kill" (memory.events or memory.oom_control) and "max" (pids.events).
  """

  def __init__(self, files: dict):
    self._files = dict(files)
    self._fds = {}
    self._closed = False

  def oom_kills(self) -> Optional[int]:
    """OOM kills in the sandbox so far; None without the memory controller."""
    return self._read("oom_kill")

  def pids_limit_hits(self) -> Optional[int]:
    """Forks refused at the sandbox's pids limit so far; None without the pids controller."""
    return self._read("max")

  def _read(self, key: str) -> Optional[int]:
    if self._closed or key not in self._files:
      return None
    fd = self._fds.get(key)
    try:
      if fd is None:
        fd = self._fds[key] = os.open(self._files[key], os.O_RDONLY | os.O_CLOEXEC)
      return _parse_key(os.pread(fd, 4096, 0), key)
    except (OSError, ValueError):
      return None

  def close(self) -> None:
    self._closed = True
    for fd in self._fds.values():
      os.close(fd)
    self._fds.clear()


def _parse_key(data: bytes, key: str) -> int:
  """The integer after `key` in a flat keyed cgroup file ("oom_kill 3"); 0 if absent."""
  wanted = key.encode()
  for line in data.split(b"\n"):
    parts = line.split()
    if len(parts) == 2 and parts[0] == wanted:
      return int(parts[1])
  return 0


def _read_int(folder, name):
  try:
    with open(os.path.join(folder, name)) as f:
      return int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None
