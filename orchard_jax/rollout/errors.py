"""The rollout room's exceptions: one base class, `RolloutError`, and a subclass per kind of fault."""


class RolloutError(Exception):
  """Base class of every error raised by orchard_jax.rollout."""


def validation_message(errors, prefix: str = "") -> str:
  """pydantic / FastAPI validation errors (`ValidationError.errors()`) as one line for a 400:
  `where: what` per error, joined by "; ". A FastAPI "body" location part is dropped; `prefix`
  names the object validated when the location does not (e.g. "sampling_params.")."""
  parts = []
  for err in errors:
    where = (prefix + ".".join(str(x) for x in err.get("loc", ()) if x != "body")).rstrip(".")
    parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
  return "; ".join(parts) or "invalid request"


class RequestError(RolloutError):
  """A generation, scoring or chat request is malformed or asks for something unsupported.

  Servers answer it with HTTP 400 and the message; nothing is generated.
  """


class EngineError(RolloutError):
  """The inference engine could not serve a request (stopped, out of cache room, model fault)."""


class WeightUpdateError(EngineError):
  """New weights could not be loaded: missing folder, or a tree that does not fit the model."""


class UpstreamError(RolloutError):
  """An inference server (SGLang, the embedded engine, an OpenAI-compatible API) failed.

  Attributes:
    url: the server's URL.
    status_code: the HTTP status, or None when no response came (connection refused, timeout).
  """

  def __init__(self, message: str, *, url: str = "", status_code: int | None = None):
    super().__init__(message)
    self.url = url
    self.status_code = status_code


class SessionError(RolloutError):
  """A recording-proxy session cannot take the request (e.g. a call arrived while one is open)."""
