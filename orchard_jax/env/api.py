"""The service's request bodies (pydantic) and unit parsing shared by the service and the SDK.

Responses are plain JSON objects documented on the routes in `orchard_jax.env.app`:
a sandbox (`id, state, image, cpu, memory, disk, pids, network, env, labels, workdir,
created_at, ready_at, expires_at, timeout, heartbeat_timeout, last_heartbeat, error, limits`),
and a job (`id, sandbox_id, command, status, exit_code, signal, stdout, stderr, stdout_b64,
stderr_b64, stdout_total_bytes, stdout_dropped_bytes, ..., duration, started_at, finished_at,
error`). `stdout`/`stderr` are text with undecodable bytes replaced (U+FFFD); when the bytes
are not valid UTF-8 the exact bytes are also sent base64-encoded in `stdout_b64`/`stderr_b64`.
Times are Unix seconds; durations are seconds; sizes are bytes.
"""
import re
from typing import Optional, Union

import pydantic

from orchard_jax.env import egress as _egress

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_bytes(value: Union[int, float, str, None], what: str = "size") -> Optional[int]:
  """Bytes from an int or a quantity string: 1048576, "512Mi", "2G", "1.5GiB" (Ki/Mi/Gi/Ti are
  powers of 1024, k/M/G/T of 1000, as in Kubernetes).

  Raises:
    ValueError: the value is not a non-negative size.
  """
  if value is None:
    return None
  if isinstance(value, bool):
    raise ValueError(f"{what} must be bytes or a quantity like '512Mi'; got {value!r}")
  if isinstance(value, (int, float)):
    if value < 0:
      raise ValueError(f"{what} must be >= 0 bytes; got {value!r}")
    return int(value)
  match = _QUANTITY.match(str(value))
  if not match:
    raise ValueError(f"{what} must be bytes or a quantity like '512Mi' or '2G'; got {value!r}")
  return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def parse_cpu(value: Union[int, float, str, None]) -> Optional[float]:
  """Cores from a number or a Kubernetes cpu quantity ("500m" = 0.5)."""
  if value is None:
    return None
  if isinstance(value, str):
    text = value.strip()
    try:
      cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
      raise ValueError(f"cpu must be cores (1.5) or millicores ('500m'); got {value!r}") from None
  else:
    cores = float(value)
  if cores <= 0:
    raise ValueError(f"cpu must be > 0 cores; got {value!r}")
  return cores


class _Model(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra="forbid")


class CreateSandbox(_Model):
  """POST /v1/sandboxes."""
  image: str = "host"
  cpu: Optional[Union[float, str]] = None
  memory: Optional[Union[int, str]] = None
  disk: Optional[Union[int, str]] = None
  pids: Optional[int] = pydantic.Field(None, ge=1)
  timeout: Optional[float] = pydantic.Field(None, gt=0, description="lifetime (TTL) in seconds")
  heartbeat_timeout: Optional[float] = pydantic.Field(
      None, gt=0, description="delete when no heartbeat or exec for this many seconds")
  network: bool = pydantic.Field(
      False, description="outbound network access (never the host's loopback services)")
  egress: list[str] = pydantic.Field(
      [], description="endpoints the sandbox may reach whatever `network` says, e.g. "
      "'http://127.0.0.1:8123' (see orchard_jax.env.egress)")
  env: dict[str, str] = {}
  labels: dict[str, str] = {}
  workdir: Optional[str] = None
  wait: bool = pydantic.Field(False, description="answer only once the sandbox is ready")
  wait_timeout: Optional[float] = pydantic.Field(
      None, gt=0, description="with wait: answer after this many seconds even if still pending")

  @pydantic.field_validator("cpu")
  @classmethod
  def _cpu(cls, v):
    return parse_cpu(v)

  @pydantic.field_validator("memory", "disk")
  @classmethod
  def _bytes(cls, v, info):
    return parse_bytes(v, info.field_name)

  @pydantic.field_validator("egress")
  @classmethod
  def _egress(cls, v):
    return [e.origin for e in _egress.parse_endpoints(v)]

  @pydantic.field_validator("workdir")
  @classmethod
  def _workdir(cls, v):
    if v is not None and (not v.startswith("/") or v.rstrip("/") == ""):
      raise ValueError(f"workdir must be an absolute path other than '/'; got {v!r}")
    return v


class Exec(_Model):
  """POST /v1/sandboxes/{id}/exec."""
  command: Union[str, list[str]]
  shell: Optional[str] = None
  cwd: Optional[str] = None
  env: dict[str, str] = {}
  timeout: Optional[float] = pydantic.Field(None, gt=0)
  wait: bool = True
  wait_timeout: Optional[float] = pydantic.Field(
      None, gt=0, description="with wait: answer after this many seconds even if still running")
  merge_stderr: bool = False
  max_output_bytes: Optional[int] = pydantic.Field(None, ge=0)
  stdin: Optional[str] = None
  stdin_b64: Optional[str] = None

  @pydantic.field_validator("command")
  @classmethod
  def _command(cls, v):
    if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
      raise ValueError("command must be a non-empty string or argv list")
    return v


class Patch(_Model):
  """POST /v1/sandboxes/{id}/patch: a unified diff applied in `cwd` (default: the workdir)."""
  patch: Optional[str] = None
  patch_b64: Optional[str] = None
  cwd: Optional[str] = None
  timeout: float = pydantic.Field(120, gt=0)


class Expose(_Model):
  """POST /v1/sandboxes/{id}/ports."""
  port: int = pydantic.Field(..., ge=1, le=65535)
  ttl: float = pydantic.Field(3600, gt=0, description="seconds until the URL stops working")
