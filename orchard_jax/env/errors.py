"""The env room's exceptions: one base class, `EnvError`, and one subclass per kind of failure.

Each class carries the HTTP status the service answers with and a stable `code` string that
travels in the JSON error body (`{"error": {"code": ..., "message": ...}}`), so the SDK raises
the same class on the client side that the service raised on the server side.
"""
from typing import Optional


# A WebSocket close frame's reason holds at most 123 bytes of UTF-8 (RFC 6455 5.5).
_CLOSE_REASON_BYTES = 123


def close_reason(text: str) -> str:
  """`text` cut to fit a WebSocket close frame's reason (123 bytes of UTF-8, RFC 6455 5.5), at
  a character boundary, ending in "..." when cut: the service's and the in-pod agent's
  terminal closes both use it."""
  data = text.encode()
  if len(data) <= _CLOSE_REASON_BYTES:
    return text
  return data[:_CLOSE_REASON_BYTES - 3].decode(errors="ignore") + "..."


class EnvError(Exception):
  """Base class of every error raised by Orchard Env (service, SDK and backends)."""
  status_code = 500
  code = "env_error"

  def __init__(self, message: str, *, details: Optional[dict] = None):
    super().__init__(message)
    self.message = message
    self.details = details or {}

  def to_json(self) -> dict:
    return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(EnvError):
  """A request field has a value the service cannot accept (says which and why)."""
  status_code = 422
  code = "invalid_request"


class AuthenticationError(EnvError):
  """The X-API-Key header is missing (401) or wrong (403)."""
  status_code = 401
  code = "unauthenticated"


class PermissionDenied(AuthenticationError):
  status_code = 403
  code = "forbidden"


class NotFound(EnvError):
  status_code = 404
  code = "not_found"


class SandboxNotFound(NotFound):
  """No sandbox with this id (never created, deleted, expired or reaped)."""
  code = "sandbox_not_found"


class JobNotFound(NotFound):
  code = "job_not_found"


class ExposureNotFound(NotFound):
  code = "exposure_not_found"


class SandboxFileNotFound(NotFound):
  """A path inside a sandbox does not exist (download, list)."""
  code = "file_not_found"


class SandboxStateError(EnvError):
  """The sandbox exists but is not in a state that allows the operation (e.g. still pending)."""
  status_code = 409
  code = "sandbox_state"


class SandboxFailed(SandboxStateError):
  """The sandbox failed to start or died; the message says why."""
  code = "sandbox_failed"


class FileOperationError(EnvError):
  """A file operation inside a sandbox failed (permission, not a directory, disk full...)."""
  status_code = 422
  code = "file_error"


class PatchError(EnvError):
  """A patch did not apply (raised by the SDK's apply_patch(check=True))."""
  status_code = 422
  code = "patch_failed"


class CommandFailed(EnvError):
  """A command exited non-zero or timed out and the caller asked for check=True."""
  status_code = 422
  code = "command_failed"


class ImageError(EnvError):
  """The image string does not name a usable image (missing, malformed image.json...)."""
  status_code = 422
  code = "image_error"


class ImageNotAllowed(ImageError):
  """The image directory is outside the configured image roots."""
  status_code = 403
  code = "image_not_allowed"


class LimitNotEnforceable(EnvError):
  """A requested resource limit cannot be enforced on this machine (missing cgroup controller)."""
  status_code = 422
  code = "limit_not_enforceable"


class CapacityError(EnvError):
  """The service is at its configured sandbox limit."""
  status_code = 429
  code = "capacity"


class QuotaExceeded(CapacityError):
  """The tenant would exceed its quota (sandboxes alive, total cpu or memory)."""
  code = "quota_exceeded"


class PayloadTooLarge(EnvError):
  """An upload, download or request body is over the service's limit."""
  status_code = 413
  code = "too_large"


class BackendUnavailable(EnvError):
  """The backend cannot work here (bubblewrap missing, Kubernetes API unreachable...)."""
  status_code = 503
  code = "backend_unavailable"


class ServiceUnavailable(EnvError):
  """The service answered 503 or could not be reached after all retries."""
  status_code = 503
  code = "unavailable"


_BY_CODE = {}


def _register(cls):
  _BY_CODE[cls.code] = cls
  for sub in cls.__subclasses__():
    _register(sub)


_register(EnvError)


def error_from_body(status_code: int, body) -> EnvError:
  """Rebuilds the service's exception from an HTTP error answer (used by the SDK)."""
  if isinstance(body, dict) and isinstance(body.get("error"), dict):
    err = body["error"]
    cls = _BY_CODE.get(err.get("code"), EnvError)
    exc = cls(str(err.get("message")), details=err.get("details") or {})
    exc.status_code = status_code
    return exc
  if isinstance(body, dict) and "detail" in body:   # FastAPI's own validation errors
    return InvalidRequest(f"HTTP {status_code}: {body['detail']}")
  cls = {401: AuthenticationError, 403: PermissionDenied, 404: NotFound, 422: InvalidRequest,
         503: ServiceUnavailable}.get(status_code, EnvError)
  exc = cls(f"HTTP {status_code}: {str(body)[:500]}")
  exc.status_code = status_code
  return exc
