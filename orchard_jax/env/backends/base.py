"""The interface every sandbox backend implements (local bubblewrap, Kubernetes).

The orchestrator owns records (in its store) and policy (TTL, reaping, auth); a backend only
turns a sandbox id and a spec into running isolation and back. Everything a backend needs to
find a sandbox again is in the `ref` dict it returns from `create`, which the orchestrator stores
with the sandbox record, so any orchestrator replica can serve any sandbox where the backend
allows it (Kubernetes). Jobs follow the same rule: `start_job` returns a JSON-able `job_ref`.
"""
import abc
import dataclasses
from typing import Optional

from orchard_jax.env.jobs import JobResult, JobSpec


@dataclasses.dataclass
class SandboxSpec:
  """What a sandbox should be (already validated and converted to units).

  Attributes:
    image: the image string (see orchard_jax.env.images).
    cpu: cores, or None for no limit.
    memory: bytes, or None.
    disk: bytes of writable space (workspace and /tmp each), or None for the backend default.
    pids: most processes and threads, or None.
    network: True gives the sandbox outbound network access (never the host's loopback
      services); False (default) gives it none.
    egress: endpoints ("http://host:port", see orchard_jax.env.egress) the sandbox may reach
      whatever `network` says: the allow-list.
    env: environment added to every command.
    labels: free-form string labels (listing filters, Kubernetes labels).
    workdir: workspace path overriding the image's, or None.
    tenant: the tenant that owns the sandbox (a Kubernetes label), or None.
  """
  image: str = "host"
  cpu: Optional[float] = None
  memory: Optional[int] = None
  disk: Optional[int] = None
  pids: Optional[int] = None
  network: bool = False
  egress: list = dataclasses.field(default_factory=list)
  env: dict = dataclasses.field(default_factory=dict)
  labels: dict = dataclasses.field(default_factory=dict)
  workdir: Optional[str] = None
  tenant: Optional[str] = None


class PtySession(abc.ABC):
  """An interactive shell on a pseudo-terminal inside a sandbox."""

  @abc.abstractmethod
  async def read(self) -> bytes:
    """The next chunk of terminal output; b"" once the shell has exited."""

  @abc.abstractmethod
  async def write(self, data: bytes) -> None:
    """Sends keystrokes."""

  @abc.abstractmethod
  async def resize(self, rows: int, cols: int) -> None:
    """Changes the terminal size."""

  @abc.abstractmethod
  async def close(self) -> None:
    """Kills the shell and frees the terminal."""

  async def failure(self) -> Optional[str]:
    """Once `read` has returned b"": why the shell could not be started (the spawner's one
    line, naming the shell: "cannot start '/bin/zsh': No such file or directory"), or None when
    it started and then exited, or when the backend cannot tell."""
    return None


class Backend(abc.ABC):
  """A place where sandboxes run. All methods are called on the orchestrator's event loop."""

  name = "base"

  async def start(self) -> None:
    """Prepares the backend when the service starts (raise BackendUnavailable if it cannot run)."""

  async def stop(self) -> None:
    """Releases what `start` acquired; sandboxes are deleted by the orchestrator before."""

  @abc.abstractmethod
  def describe(self) -> dict:
    """{"backend": name, "limits": {"cpu": bool, "memory": bool, "pids": bool, "disk": bool},
    ...}: what this backend enforces here (shown by the health endpoint)."""

  @abc.abstractmethod
  def validate(self, spec: SandboxSpec) -> dict:
    """Checks a spec before anything is created; returns {"workdir": ..., "env": {...},
    "egress": [{"endpoint", "url"}, ...]}: the image's workspace and environment, and the
    address inside the sandbox of each egress endpoint. Raises an EnvError (ImageError,
    LimitNotEnforceable, InvalidRequest...) naming the problem."""

  @abc.abstractmethod
  async def create(self, sandbox_id: str, spec: SandboxSpec) -> dict:
    """Creates the sandbox and returns once it is ready; returns its JSON-able `ref`."""

  @abc.abstractmethod
  async def delete(self, sandbox_id: str, ref: Optional[dict]) -> None:
    """Removes the sandbox and everything of it (idempotent; ref None for orphans)."""

  @abc.abstractmethod
  async def list_sandboxes(self) -> set:
    """Ids of every sandbox this backend holds (raise to make the reconcile skip)."""

  @abc.abstractmethod
  async def is_alive(self, sandbox_id: str, ref: dict) -> bool:
    """False once the sandbox has died on its own."""

  @abc.abstractmethod
  async def start_job(self, sandbox_id: str, ref: dict, job_id: str, spec: JobSpec) -> dict:
    """Starts a command; returns a JSON-able job_ref. Raises SandboxFailed if it cannot start."""

  @abc.abstractmethod
  async def wait_job(self, sandbox_id: str, ref: dict, job_id: str, job_ref: dict,
                     timeout: Optional[float]) -> Optional[JobResult]:
    """The job's result, waiting up to `timeout` seconds; None if still running then."""

  @abc.abstractmethod
  async def cancel_job(self, sandbox_id: str, ref: dict, job_id: str, job_ref: dict) -> None:
    """Kills the job's process tree (its result becomes "cancelled")."""

  @abc.abstractmethod
  async def read_file(self, sandbox_id: str, ref: dict, path: str) -> bytes:
    """The bytes of a file inside the sandbox (SandboxFileNotFound, FileOperationError)."""

  @abc.abstractmethod
  async def write_file(self, sandbox_id: str, ref: dict, path: str, data: bytes,
                       mode: int) -> None:
    """Writes a file inside the sandbox atomically, creating parent folders."""

  @abc.abstractmethod
  async def list_files(self, sandbox_id: str, ref: dict, path: str) -> list:
    """Entries of a folder (or the one entry of a file): dicts with name, path, type, size,
    mode, mtime (and target for symlinks)."""

  async def stats(self, sandbox_id: str, ref: dict) -> dict:
    """Current resource usage (memory_bytes, pids, cpu_seconds where measurable)."""
    return {}

  async def open_pty(self, sandbox_id: str, ref: dict, spec: JobSpec) -> PtySession:
    raise NotImplementedError(f"the {self.name} backend has no interactive terminals")

  async def open_port(self, sandbox_id: str, ref: dict, port: int):
    """An (asyncio.StreamReader, asyncio.StreamWriter) connected to `port` inside the sandbox."""
    raise NotImplementedError(f"the {self.name} backend cannot expose ports")
