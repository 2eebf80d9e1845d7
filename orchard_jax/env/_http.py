"""The SDK's HTTP plumbing: retry policy (backoff with jitter) and error mapping.

Only failures that cannot have done anything are retried: connection errors (the request never
reached the service) and 503 answers (the service refused it). Requests marked idempotent
(reads, waits, deletes) are also retried after read errors. A command whose HTTP request timed
out is never sent again: the SDK polls the job it created instead.
"""
import dataclasses
import http.cookiejar
import json
import math
import os
import random
from typing import Optional

import httpx

from orchard_jax.env.errors import EnvError, ServiceUnavailable, error_from_body

API_KEY_ENV = "ORCHARD_ENV_API_KEY"
CLIENT_LABEL = "sdk-client"   # label naming the SDK client that created a sandbox
URL_ENV = "ORCHARD_ENV_URL"


def json_body(value) -> dict:
  """httpx keyword arguments sending `value` as a JSON body the service reads field by field:
  lone surrogates and non-finite numbers go as JSON escapes and tokens, so the service's 422
  names the field (httpx's own encoder raised UnicodeEncodeError or ValueError naming none)."""
  text = json.dumps(value, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
  return {"content": text.encode("ascii"), "headers": {"Content-Type": "application/json"}}


def as_bytes(data, what: str) -> bytes:
  """The bytes the SDK sends for a file's content or a command's stdin: bytes-like data as is,
  text as UTF-8.

  Raises:
    TypeError: data is neither (None used to upload an empty file; an int n, n NUL bytes).
    ValueError: text holding a lone surrogate, which no UTF-8 text can hold.
  """
  if isinstance(data, (bytes, bytearray, memoryview)):
    return bytes(data)
  if isinstance(data, str):
    try:
      return data.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ValueError(f"{what} holds a lone surrogate {data[e.start]!r} at character "
                       f"{e.start}, which no UTF-8 text can hold; pass bytes") from None
  raise TypeError(f"{what} must be bytes or str; got {type(data).__name__}")


def check_wait_timeout(timeout) -> None:
  """Raises ValueError unless `timeout` is None or a finite number of seconds >= 0."""
  if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout)
                                  and timeout >= 0):
    raise ValueError(f"timeout must be None (no limit) or seconds >= 0; got {timeout!r}")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  """Exponential backoff with jitter.

  Attributes:
    attempts: total tries (1 = no retry).
    backoff: seconds before the first retry; doubles each time.
    max_backoff: ceiling of one wait, seconds.
    jitter: each wait is scaled by a uniform factor in [1 - jitter, 1 + jitter].
  """
  attempts: int = 6
  backoff: float = 0.1
  max_backoff: float = 5.0
  jitter: float = 0.5

  def delay(self, attempt: int) -> float:
    """Seconds to wait after failed try number `attempt` (0-based)."""
    base = min(self.max_backoff, self.backoff * (2 ** attempt))
    return base * random.uniform(1 - self.jitter, 1 + self.jitter)


class CookieJar(http.cookiejar.CookieJar):
  """The SDK clients' cookie jar: the standard library's, which skips a response that sets no
  cookie without first copying all its headers into an email.message.Message (as
  CookieJar.extract_cookies does for every response httpx hands it: about a sixth of the
  SDK's CPU per exec). Responses that set cookies are handled by the standard library."""

  def extract_cookies(self, response, request):
    # httpx passes its urllib-compatible wrapper, whose `response` is the httpx.Response;
    # anything else (another httpx version) takes the standard library's whole path.
    headers = getattr(getattr(response, "response", None), "headers", None)
    if (isinstance(headers, httpx.Headers) and "set-cookie" not in headers
        and "set-cookie2" not in headers):
      return
    super().extract_cookies(response, request)


class RequestURLs:
  """Absolute request URLs of service paths, as `client` (an httpx client with a base URL)
  merges them, kept for reuse: httpx parses a relative URL, and the merged one again, on every
  request (about a fifth of the SDK's CPU per exec). At most `size` are kept (then they are
  all dropped and built again as used)."""

  def __init__(self, client, size: int = 256):
    self._client, self.size = client, size
    self._urls = {}

  def __call__(self, path: str) -> httpx.URL:
    url = self._urls.get(path)
    if url is None:
      if len(self._urls) >= self.size:
        self._urls.clear()
      url = self._urls[path] = self._client.build_request("GET", path).url
    return url


_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)
_READ_ERRORS = (httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.WriteError)


def should_retry(exc: Optional[BaseException], response: Optional[httpx.Response],
                 idempotent: bool) -> bool:
  if response is not None:
    return response.status_code == 503
  if isinstance(exc, _CONNECT_ERRORS):
    return True
  return idempotent and isinstance(exc, _READ_ERRORS)


def raise_for(response: httpx.Response) -> None:
  """Raises the EnvError the service described, if the answer is an error."""
  if response.status_code < 400:
    return
  try:
    body = response.json()
  except ValueError:
    body = response.text
  raise error_from_body(response.status_code, body)


def unreachable(url: str, exc: BaseException, attempts: int) -> EnvError:
  return ServiceUnavailable(f"Orchard Env at {url} did not answer after {attempts} tries: "
                            f"{type(exc).__name__}: {exc}")


def resolve(url: Optional[str], api_key: Optional[str]) -> tuple:
  url = url or os.environ.get(URL_ENV)
  if not url:
    raise ValueError(f"give the service URL (or set {URL_ENV})")
  key = api_key or os.environ.get(API_KEY_ENV)
  if not key:
    raise ValueError(f"give an API key (or set {API_KEY_ENV})")
  return url.rstrip("/"), key


def create_body(image, cpu, memory, disk, pids, timeout, heartbeat_timeout, network, env,
                labels, workdir, egress=()) -> dict:
  body = {"image": image, "network": network, "env": dict(env or {}),
          "labels": dict(labels or {})}
  if egress:
    body["egress"] = list(egress)
  for key, value in (("cpu", cpu), ("memory", memory), ("disk", disk), ("pids", pids),
                     ("timeout", timeout), ("heartbeat_timeout", heartbeat_timeout),
                     ("workdir", workdir)):
    if value is not None:
      body[key] = value
  return body


def exec_body(command, cwd, env, timeout, merge_stderr, max_output_bytes, stdin, shell,
              wait) -> dict:
  import base64
  body = {"command": command, "env": dict(env or {}), "merge_stderr": merge_stderr,
          "wait": wait}
  for key, value in (("cwd", cwd), ("timeout", timeout), ("max_output_bytes", max_output_bytes),
                     ("shell", shell)):
    if value is not None:
      body[key] = value
  if stdin is not None:
    body["stdin_b64"] = base64.b64encode(as_bytes(stdin, "stdin")).decode()
  return body


def patch_body(patch, cwd) -> dict:
  import base64
  body = {}
  if isinstance(patch, str):
    body["patch"] = patch
  else:
    body["patch_b64"] = base64.b64encode(bytes(patch)).decode()
  if cwd is not None:
    body["cwd"] = cwd
  return body
