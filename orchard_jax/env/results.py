"""What the SDK returns: ExecResult (a finished command) and PatchResult."""
import base64
import dataclasses
from typing import Optional

from orchard_jax.env.errors import CommandFailed


def _bytes_of(job: dict, name: str) -> bytes:
  raw = job.get(name + "_b64")
  if raw:
    return base64.b64decode(raw)
  return (job.get(name) or "").encode("utf-8")


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """A command that has ended (never a running one).

  Attributes:
    job_id, sandbox_id: where it ran.
    status: "finished", "timed_out", "cancelled" or "failed" (could not start / sandbox died).
    exit_code: the exit status when the command ended by itself, else None.
    stdout_bytes, stderr_bytes: the exact output bytes (capped: head + marker + tail).
    duration: seconds the command ran.
    stdout_total_bytes, stderr_total_bytes: bytes written in all; *_dropped_bytes: cut by the cap.
    signal: the signal that ended it, if any.
    error: why it failed or was stopped, in words (an OOM kill and a reclaimed fork bomb
      are named here).
    oom_killed: the kernel's OOM killer struck in the sandbox while the command ran: its
      memory limit (which counts the workspace and /tmp) was reached.
  """
  job_id: str
  sandbox_id: str
  status: str
  exit_code: Optional[int]
  stdout_bytes: bytes
  stderr_bytes: bytes
  duration: float
  stdout_total_bytes: int = 0
  stderr_total_bytes: int = 0
  stdout_dropped_bytes: int = 0
  stderr_dropped_bytes: int = 0
  signal: Optional[int] = None
  error: Optional[str] = None
  command: object = None
  oom_killed: bool = False

  @classmethod
  def from_job(cls, job: dict) -> "ExecResult":
    return cls(job_id=job["id"], sandbox_id=job["sandbox_id"], status=job["status"],
               exit_code=job.get("exit_code"), stdout_bytes=_bytes_of(job, "stdout"),
               stderr_bytes=_bytes_of(job, "stderr"), duration=job.get("duration") or 0.0,
               stdout_total_bytes=job.get("stdout_total_bytes", 0),
               stderr_total_bytes=job.get("stderr_total_bytes", 0),
               stdout_dropped_bytes=job.get("stdout_dropped_bytes", 0),
               stderr_dropped_bytes=job.get("stderr_dropped_bytes", 0),
               signal=job.get("signal"), error=job.get("error"), command=job.get("command"),
               oom_killed=bool(job.get("oom_killed")))

  @property
  def stdout(self) -> str:
    """stdout as text; bytes that are not UTF-8 become U+FFFD."""
    return self.stdout_bytes.decode("utf-8", errors="replace")

  @property
  def stderr(self) -> str:
    return self.stderr_bytes.decode("utf-8", errors="replace")

  @property
  def output(self) -> str:
    """stdout then stderr (use merge_stderr=True for the true interleaving)."""
    return self.stdout + self.stderr

  @property
  def timed_out(self) -> bool:
    return self.status == "timed_out"

  @property
  def truncated(self) -> bool:
    return bool(self.stdout_dropped_bytes or self.stderr_dropped_bytes)

  @property
  def ok(self) -> bool:
    return self.status == "finished" and self.exit_code == 0

  def check(self) -> "ExecResult":
    """Returns self if the command exited 0; raises CommandFailed otherwise."""
    if not self.ok:
      what = (f"exited with {self.exit_code}" if self.status == "finished"
              else f"{self.status}: {self.error}")
      raise CommandFailed(f"command {self.command!r} in {self.sandbox_id} {what}; stderr tail: "
                          f"{self.stderr[-1000:]!r}", details={"job_id": self.job_id})
    return self


@dataclasses.dataclass(frozen=True)
class PatchResult:
  """Whether a patch applied, with which tool, and what the tools printed."""
  applied: bool
  method: Optional[str]
  output: str
  cwd: str
