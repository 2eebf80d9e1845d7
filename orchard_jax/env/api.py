"""The service's request bodies (pydantic): every field that reaches a process, a path, a
decoder or a JSON encoder is checked here, so a bad value is a 422 naming the field and never
reaches the backend (NUL bytes, lone surrogates, environment names, base64, finite numbers,
ranges, strict size units; see orchard_jax.env.units).

Responses are plain JSON objects documented on the routes in `orchard_jax.env.app`:
a sandbox (`id, tenant, state, image, cpu, memory, disk, pids, network, egress, env, labels,
workdir, created_at, ready_at, expires_at, timeout, heartbeat_timeout, last_heartbeat, error,
limits`), and a job (`id, sandbox_id, command, status, exit_code, signal, oom_killed, stdout,
stderr, stdout_b64, stderr_b64, stdout_total_bytes, stdout_dropped_bytes, ..., duration,
started_at, finished_at, error`). `stdout`/`stderr` are text with undecodable bytes replaced
(U+FFFD); when the bytes are not valid UTF-8 the exact bytes are also sent base64-encoded in
`stdout_b64`/`stderr_b64`. Times are Unix seconds; durations are seconds; sizes are bytes.
"""
import base64
import binascii
import posixpath
import re
from typing import Annotated, Optional, Union

import pydantic

from orchard_jax.env import egress as _egress
from orchard_jax.env import units as _units
from orchard_jax.env.units import check_path, check_text, parse_bytes, parse_cpu  # noqa: F401

MIN_MEMORY = 32 << 20      # bubblewrap, a shell and a small command fit; less fails to start
MIN_DISK = 1 << 20         # a tmpfs of size 0 would be unlimited: never allowed
MIN_PIDS = 16              # bubblewrap's two processes, the placeholder, a shell and a command
MAX_PIDS = 1 << 22
MAX_SECONDS = 10 * 365 * 86400.0
MAX_STDIN_BYTES = 64 << 20
MAX_PATCH_BYTES = 64 << 20
MAX_COMMAND_BYTES = 1 << 20
MAX_ARGS = 1 << 16
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?\Z")
_RESERVED_DIRS = ("/proc", "/dev", "/sys", "/.orchard")

Seconds = Annotated[float, pydantic.Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


def _b64(value: str, what: str, limit: int) -> bytes:
  if len(value) > (limit * 4) // 3 + 8:
    raise ValueError(f"{what} decodes to more than {limit} bytes")
  try:
    return base64.b64decode(value, validate=True)
  except (binascii.Error, ValueError):
    raise ValueError(f"{what} is not valid base64 (standard alphabet, padded)") from None


def sandbox_path(path: str, what: str = "path") -> str:
  """An absolute, normalised path (no '.', '..' or '//' parts left), or a relative one
  normalised the same way; raises ValueError for NUL, bad Unicode or an over-long path."""
  check_path(path, what)
  normal = posixpath.normpath(path)
  if normal.startswith("//"):
    normal = "/" + normal.lstrip("/")
  return normal


def _labels(labels: dict) -> dict:
  if len(labels) > 64:
    raise ValueError(f"at most 64 labels; got {len(labels)}")
  for key, value in labels.items():
    if not _LABEL_KEY.match(key):
      raise ValueError(f"label key {key!r} must be 1-128 characters of letters, digits and "
                       f"'._/-', starting and ending with a letter or digit")
    check_text(value, f"label {key!r}", max_len=1024)
    if any(ord(c) < 32 for c in value):
      raise ValueError(f"label {key!r} has a control character")
  return labels


class _Model(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra="forbid")


class CreateSandbox(_Model):
  """POST /v1/sandboxes."""
  image: str = "host"
  cpu: Optional[Union[float, str]] = None
  memory: Optional[Union[int, float, str]] = None
  disk: Optional[Union[int, float, str]] = None
  pids: Optional[int] = pydantic.Field(None, ge=MIN_PIDS, le=MAX_PIDS)
  timeout: Optional[Seconds] = pydantic.Field(None, description="lifetime (TTL) in seconds")
  heartbeat_timeout: Optional[Seconds] = pydantic.Field(
      None, description="delete when no heartbeat or exec for this many seconds")
  network: bool = pydantic.Field(
      False, description="outbound network access (never the host's loopback services)")
  egress: list[str] = pydantic.Field(
      [], description="endpoints the sandbox may reach whatever `network` says, e.g. "
      "'http://127.0.0.1:8123' (see orchard_jax.env.egress)")
  env: dict[str, str] = {}
  labels: dict[str, str] = {}
  workdir: Optional[str] = None
  wait: bool = pydantic.Field(False, description="answer only once the sandbox is ready")
  wait_timeout: Optional[Seconds] = pydantic.Field(
      None, description="with wait: answer after this many seconds even if still pending")

  @pydantic.field_validator("image")
  @classmethod
  def _image(cls, v):
    check_text(v, "image", max_len=4096)
    if not v.strip() or any(ord(c) < 32 for c in v):
      raise ValueError(f"image must be 'host', an image directory or a container image; "
                       f"got {v!r}")
    return v

  @pydantic.field_validator("cpu")
  @classmethod
  def _cpu(cls, v):
    return parse_cpu(v)

  @pydantic.field_validator("memory", "disk")
  @classmethod
  def _bytes(cls, v, info):
    value = parse_bytes(v, info.field_name)
    least = MIN_MEMORY if info.field_name == "memory" else MIN_DISK
    if value is not None and value < least:
      raise ValueError(f"{info.field_name} must be at least {least >> 20} Mi ({least} bytes); "
                       f"got {v!r}")
    return value

  @pydantic.field_validator("egress")
  @classmethod
  def _egress(cls, v):
    return [e.origin for e in _egress.parse_endpoints(v)]

  @pydantic.field_validator("env")
  @classmethod
  def _env(cls, v):
    return _units.check_env(v)

  @pydantic.field_validator("labels")
  @classmethod
  def _labels(cls, v):
    return _labels(v)

  @pydantic.field_validator("workdir")
  @classmethod
  def _workdir(cls, v):
    if v is None:
      return v
    path = sandbox_path(v, "workdir")
    if not path.startswith("/") or path == "/":
      raise ValueError(f"workdir must be an absolute path other than '/'; got {v!r}")
    if any(path == d or path.startswith(d + "/") for d in _RESERVED_DIRS):
      raise ValueError(f"workdir may not be under {', '.join(_RESERVED_DIRS)}; got {v!r}")
    return path


class Exec(_Model):
  """POST /v1/sandboxes/{id}/exec."""
  command: Union[str, list[str]]
  shell: Optional[str] = None
  cwd: Optional[str] = None
  env: dict[str, str] = {}
  timeout: Optional[Seconds] = None
  wait: bool = True
  wait_timeout: Optional[Seconds] = pydantic.Field(
      None, description="with wait: answer after this many seconds even if still running")
  merge_stderr: bool = False
  max_output_bytes: Optional[int] = pydantic.Field(None, ge=0, le=1 << 40)
  stdin: Optional[str] = None
  stdin_b64: Optional[str] = None

  @pydantic.field_validator("command")
  @classmethod
  def _command(cls, v):
    if isinstance(v, str):
      if not v.strip():
        raise ValueError("command must be a non-empty string or argv list")
      return check_text(v, "command", max_len=MAX_COMMAND_BYTES)
    if not v or not v[0]:
      raise ValueError("command must be a non-empty argv list whose first item names a "
                       "program")
    if len(v) > MAX_ARGS:
      raise ValueError(f"command has {len(v)} arguments; at most {MAX_ARGS} are allowed")
    total = 0
    for i, arg in enumerate(v):
      check_text(arg, f"command[{i}]", max_len=MAX_COMMAND_BYTES)
      total += len(arg) + 1
    if total > MAX_COMMAND_BYTES:
      raise ValueError(f"command's arguments hold {total} bytes; at most {MAX_COMMAND_BYTES}")
    return v

  @pydantic.field_validator("shell")
  @classmethod
  def _shell(cls, v):
    if v is not None:
      check_path(v, "shell")
    return v

  @pydantic.field_validator("cwd")
  @classmethod
  def _cwd(cls, v):
    return None if v is None else sandbox_path(v, "cwd")

  @pydantic.field_validator("env")
  @classmethod
  def _env(cls, v):
    return _units.check_env(v)

  @pydantic.field_validator("stdin")
  @classmethod
  def _stdin(cls, v):
    return None if v is None else check_text(v, "stdin", nul=True, max_len=MAX_STDIN_BYTES)

  @pydantic.field_validator("stdin_b64")
  @classmethod
  def _stdin_b64(cls, v):
    if v is not None:
      _b64(v, "stdin_b64", MAX_STDIN_BYTES)
    return v

  @pydantic.model_validator(mode="after")
  def _one_stdin(self):
    if self.stdin is not None and self.stdin_b64 is not None:
      raise ValueError("give at most one of stdin (text) and stdin_b64 (bytes)")
    return self

  @property
  def stdin_bytes(self) -> Optional[bytes]:
    """The standard input as bytes (None: /dev/null)."""
    if self.stdin_b64 is not None:
      return base64.b64decode(self.stdin_b64)
    return None if self.stdin is None else self.stdin.encode("utf-8")


_DIFF_HEADER = re.compile(rb"^(diff --git |--- |\+\+\+ |@@ |GIT binary patch|rename from |"
                          rb"new file mode |deleted file mode |old mode |Binary files )", re.M)


def diff_changes(data: bytes) -> bool:
  """True if `data` holds at least one file change of a unified or git diff: a "---"/"+++"
  pair with a hunk, or a git header that changes a file by itself (new, deleted, renamed,
  mode, binary)."""
  if re.search(rb"^--- .*\n\+\+\+ .*\n@@ ", data, re.M):
    return True
  return bool(re.search(rb"^diff --git .*\n(?:.*\n)*?(new file mode|deleted file mode|"
                        rb"rename from|old mode|GIT binary patch|Binary files)", data, re.M))


class Patch(_Model):
  """POST /v1/sandboxes/{id}/patch: a unified diff applied in `cwd` (default: the workdir)."""
  patch: Optional[str] = None
  patch_b64: Optional[str] = None
  cwd: Optional[str] = None
  timeout: Seconds = 120

  @pydantic.field_validator("patch")
  @classmethod
  def _patch(cls, v):
    return None if v is None else check_text(v, "patch", nul=True, max_len=MAX_PATCH_BYTES)

  @pydantic.field_validator("patch_b64")
  @classmethod
  def _patch_b64(cls, v):
    if v is not None:
      _b64(v, "patch_b64", MAX_PATCH_BYTES)
    return v

  @pydantic.field_validator("cwd")
  @classmethod
  def _cwd(cls, v):
    return None if v is None else sandbox_path(v, "cwd")

  @pydantic.model_validator(mode="after")
  def _one_patch(self):
    if (self.patch is None) == (self.patch_b64 is None):
      raise ValueError("give exactly one of patch (text) and patch_b64 (bytes)")
    if not diff_changes(self.data):
      field = "patch" if self.patch is not None else "patch_b64"
      raise ValueError(f"{field} holds no file change: expected a unified diff ('--- a/f', "
                       f"'+++ b/f', '@@ ... @@' hunks) or a git diff; got "
                       f"{self.data[:80]!r}{'...' if len(self.data) > 80 else ''}")
    return self

  @property
  def data(self) -> bytes:
    """The diff's bytes."""
    if self.patch_b64 is not None:
      return base64.b64decode(self.patch_b64)
    return self.patch.encode("utf-8")


class Expose(_Model):
  """POST /v1/sandboxes/{id}/ports."""
  port: int = pydantic.Field(..., ge=1, le=65535)
  ttl: Seconds = pydantic.Field(3600, description="seconds until the URL stops working")
