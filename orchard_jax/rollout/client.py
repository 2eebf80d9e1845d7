"""The SGLang client: generation, scoring and weight updates against one or more servers.

One client class serves every recipe, unchanged against real SGLang servers and the embedded
engine's server, since both speak SGLang's native API (`protocol.py`). With several server
URLs, requests of one session stick to one server (its prefix cache stays warm), and other
requests go to the server with the fewest requests in flight. Transient failures (connection
refused or reset, HTTP 429/502/503/504) are retried with exponential backoff (tenacity) on
another server when one is available; a server that failed is avoided for `cooldown_s`.

`SGLangClient` is synchronous (recipes, scripts; httpx); `AsyncSGLangClient` has the same
methods as coroutines (the recording proxy, asyncio harness drivers) on `http1.HTTP1Client`,
whose request costs about a third of aiohttp's CPU (what the proxy adds to every call).

Example:
  with SGLangClient(["http://gpu-0:30000", "http://gpu-1:30000"]) as client:
    out = client.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 32},
                          return_logprob=True, session_id="sess-7")
    out.output_ids, out.output_logprobs
    client.update_weights_from_disk("/ckpt/step_100", weight_version="100")
"""
from __future__ import annotations

import asyncio
import json as jsonlib
import threading
import time
import uuid
import weakref
from typing import Any, AsyncIterator, Iterable, Optional, Sequence, Union

import httpx
import orjson
import tenacity

from orchard_jax.rollout.errors import RequestError, UpstreamError
from orchard_jax.rollout.http1 import HTTP1Client, HTTPTransportError
from orchard_jax.rollout.protocol import (
  SGLANG_GENERATE_FIELDS, SGLANG_SAMPLING_FIELDS, GenerateResponse, ModelInfo, SamplingParams,
  UpdateWeightsFromDiskResponse)

_TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
Prompt = Union[str, Sequence[int]]


class _Router:
  """Picks a server URL: sticky per session, otherwise least requests in flight.

  Thread-safe. A URL that failed is skipped for `cooldown_s` unless every URL is cooling down.
  """

  def __init__(self, urls: Sequence[str], cooldown_s: float):
    if not urls:
      raise RequestError("no server URL given; expected one or more http(s) URLs")
    self.urls = [u.rstrip("/") for u in urls]
    for url in self.urls:
      if not url.startswith(("http://", "https://")):
        raise RequestError(f"server URL {url!r} must start with http:// or https://")
    self.cooldown_s = cooldown_s
    self._in_flight = {u: 0 for u in self.urls}
    self._down_until = {u: 0.0 for u in self.urls}
    self._sticky: dict[str, str] = {}
    self._lock = threading.Lock()

  def acquire(self, session_id: Optional[str], exclude: Iterable[str] = ()) -> str:
    """Pick a URL and count one more request in flight on it (pair with `release`)."""
    return self._pick(session_id, exclude)

  def _pick(self, session_id: Optional[str], exclude: Iterable[str]) -> str:
    exclude = set(exclude)
    with self._lock:
      now = time.monotonic()
      healthy = [u for u in self.urls if self._down_until[u] <= now and u not in exclude]
      candidates = healthy or [u for u in self.urls if u not in exclude] or self.urls
      url = self._sticky.get(session_id) if session_id is not None else None
      if url not in candidates:
        url = min(candidates, key=lambda u: (self._in_flight[u], self.urls.index(u)))
        if session_id is not None:
          self._sticky[session_id] = url
      self._in_flight[url] += 1
      return url

  def acquire_url(self, url: str) -> str:
    """Count one more request in flight on a given URL (pair with `release`)."""
    with self._lock:
      self._in_flight[url] += 1
    return url

  def release(self, url: str, ok: bool) -> None:
    with self._lock:
      self._in_flight[url] -= 1
      if not ok:
        self._down_until[url] = time.monotonic() + self.cooldown_s

  def release_session(self, session_id: str) -> None:
    with self._lock:
      self._sticky.pop(session_id, None)

  def in_flight(self) -> dict[str, int]:
    with self._lock:
      return dict(self._in_flight)


def _is_transient(error: BaseException) -> bool:
  return isinstance(error, UpstreamError) and (
    error.status_code is None or error.status_code in _TRANSIENT_STATUS)


def _sampling_dict(sampling_params: Union[None, dict, SamplingParams]) -> dict[str, Any]:
  if sampling_params is None:
    return {}
  if isinstance(sampling_params, SamplingParams):
    return sampling_params.model_dump(exclude_defaults=True)
  unknown = sorted(set(sampling_params) - SGLANG_SAMPLING_FIELDS)
  if unknown:
    raise RequestError(
      f"sampling_params has fields {unknown} that SGLang does not define; expected some of "
      f"{sorted(SGLANG_SAMPLING_FIELDS)} (note: the length limit is 'max_new_tokens')")
  return dict(sampling_params)


def build_generate_payload(
    *, input_ids: Optional[Union[Sequence[int], Sequence[Sequence[int]]]] = None,
    text: Optional[Union[str, Sequence[str]]] = None,
    sampling_params: Union[None, dict, SamplingParams, Sequence[dict]] = None,
    return_logprob: bool = False, logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None, return_text_in_logprobs: bool = False,
    rid: Optional[str] = None, session_id: Optional[str] = None,
    stream: bool = False, image_data: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """The JSON body of a `/generate` request, in SGLang's field names (see protocol.py);
  image_data: the images of one prompt (data URLs, paths or base64) for a vision-language
  model.

  Raises:
    RequestError: both or neither of input_ids and text, or unknown sampling fields.
  """
  if (input_ids is None) == (text is None):
    raise RequestError("give exactly one of input_ids and text")
  payload: dict[str, Any] = {}
  if input_ids is not None:
    ids = list(input_ids)
    nested = bool(ids) and hasattr(ids[0], "__len__")
    payload["input_ids"] = ([list(map(int, row)) for row in ids] if nested
                            else list(map(int, ids)))
  else:
    payload["text"] = text if isinstance(text, str) else list(text)
  if isinstance(sampling_params, (list, tuple)):
    payload["sampling_params"] = [_sampling_dict(s) for s in sampling_params]
  else:
    payload["sampling_params"] = _sampling_dict(sampling_params)
  if return_logprob:
    payload["return_logprob"] = True
    if logprob_start_len is not None:
      payload["logprob_start_len"] = int(logprob_start_len)
    if top_logprobs_num:
      payload["top_logprobs_num"] = int(top_logprobs_num)
    if return_text_in_logprobs:
      payload["return_text_in_logprobs"] = True
  if rid is not None:
    payload["rid"] = rid
  if session_id is not None:
    payload["session_id"] = session_id
  if stream:
    payload["stream"] = True
  if image_data:
    payload["image_data"] = list(image_data)
  assert set(payload) <= SGLANG_GENERATE_FIELDS, set(payload) - SGLANG_GENERATE_FIELDS
  return payload


def _parse_generate(body: Any, batched: bool, url: str) -> Union[GenerateResponse,
                                                               list[GenerateResponse]]:
  try:
    if batched:
      if not isinstance(body, list):
        raise ValueError(f"expected a list of results for a batched request, got {type(body)}")
      return [GenerateResponse.model_validate(item) for item in body]
    if isinstance(body, list):  # a server may wrap a single result
      body = body[0]
    return GenerateResponse.model_validate(body)
  except Exception as e:
    raise UpstreamError(f"{url}/generate answered with an unexpected body: {e}", url=url,
                        status_code=200) from e


def _scores(response: GenerateResponse, n_ids: int, start: int) -> list[Optional[float]]:
  entries = response.meta_info.input_token_logprobs
  if entries is None:
    raise UpstreamError("server returned no input_token_logprobs for a scoring request")
  values = [None if e[0] is None else float(e[0]) for e in entries]
  expected = n_ids - start
  if len(values) != expected:
    raise UpstreamError(
      f"server returned {len(values)} input log-probs for ids[{start}:] of {n_ids} ids; "
      f"expected {expected}")
  return values


class _ClientBase:
  def __init__(self, urls: Union[str, Sequence[str]], *, timeout_s: float = 600.0,
               max_retries: int = 3, backoff_s: float = 0.5, cooldown_s: float = 5.0,
               api_key: Optional[str] = None):
    self._router = _Router([urls] if isinstance(urls, str) else list(urls), cooldown_s)
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

  @property
  def urls(self) -> list[str]:
    return list(self._router.urls)

  def in_flight(self) -> dict[str, int]:
    """Requests in flight per server URL."""
    return self._router.in_flight()

  def release_session(self, session_id: str) -> None:
    """Forget a session's sticky server (call when the session ends)."""
    self._router.release_session(session_id)

  def _retry_kwargs(self, attempts: Optional[int] = None, second: bool = False
                    ) -> dict[str, Any]:
    """tenacity settings for `attempts` attempts (default max_retries + 1); `second`: the
    first of them is already the second try, so backoff continues from the second wait."""
    return dict(
      stop=tenacity.stop_after_attempt(self.max_retries + 1 if attempts is None else attempts),
      wait=tenacity.wait_exponential(multiplier=self.backoff_s * (2 if second else 1), max=30.0),
      retry=tenacity.retry_if_exception(_is_transient), reraise=True)

  @staticmethod
  def _check(response: httpx.Response, url: str, path: str) -> Any:
    return _ClientBase._check_body(response.status_code, response.content, url, path)

  @staticmethod
  def _check_body(status: int, content: bytes, url: str, path: str) -> Any:
    """The JSON body of a response, or UpstreamError for an HTTP error or a non-JSON body."""
    if status >= 400:
      text = content.decode("utf-8", "replace")
      raise UpstreamError(f"{url}{path} answered HTTP {status}: {text[:2000]}", url=url,
                          status_code=status)
    try:
      return orjson.loads(content)
    except ValueError:
      pass
    try:  # NaN / Infinity tokens, which orjson rejects and Python's json accepts
      return jsonlib.loads(content)
    except ValueError as e:
      text = content.decode("utf-8", "replace")
      raise UpstreamError(f"{url}{path} answered non-JSON: {text[:500]!r}", url=url,
                          status_code=status) from e



def _weights_body(model_path: str, load_format: Optional[str], weight_version: Optional[str],
                  fields: dict) -> dict:
  """The /update_weights_from_disk request body (unset optional fields left out)."""
  body = {"model_path": model_path, **fields}
  if load_format is not None:
    body["load_format"] = load_format
  if weight_version is not None:
    body["weight_version"] = weight_version
  return body

class SGLangClient(_ClientBase):
  """Synchronous client for SGLang's native API over one or more servers.

  Args:
    urls: one server URL or several ("http://host:port", no trailing path).
    timeout_s: per-request timeout in seconds (generation can be long).
    max_retries: retries of a transient failure, each on the least-loaded other server.
    backoff_s: base of the exponential backoff between retries, seconds.
    cooldown_s: how long a failed server is avoided, seconds.
    api_key: sent as a bearer token when given (SGLang's --api-key).
  """

  def __init__(self, urls: Union[str, Sequence[str]], **kwargs: Any):
    super().__init__(urls, **kwargs)
    self._http = httpx.Client(timeout=self.timeout_s, headers=self._headers)

  def close(self) -> None:
    self._http.close()

  def __enter__(self) -> "SGLangClient":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def _request(self, method: str, path: str, *, json: Any = None,
               session_id: Optional[str] = None, url: Optional[str] = None) -> Any:
    tried: list[str] = []

    def attempt() -> Any:
      target = (self._router.acquire_url(url) if url
                else self._router.acquire(session_id, exclude=tried))
      tried.append(target)
      ok = False
      try:
        response = self._http.request(method, target + path, json=json)
        body = self._check(response, target, path)
        ok = True
        return body
      except httpx.TransportError as e:
        raise UpstreamError(f"{target}{path} failed: {type(e).__name__}: {e}",
                            url=target) from e
      except UpstreamError as e:
        ok = e.status_code is not None and e.status_code not in _TRANSIENT_STATUS
        raise
      finally:
        self._router.release(target, ok)

    return tenacity.Retrying(**self._retry_kwargs())(attempt)

  def generate(self, *, input_ids: Optional[Sequence[int]] = None, text: Optional[str] = None,
               sampling_params: Union[None, dict, SamplingParams] = None,
               return_logprob: bool = False, logprob_start_len: Optional[int] = None,
               top_logprobs_num: Optional[int] = None, rid: Optional[str] = None,
               session_id: Optional[str] = None,
               image_data: Optional[Sequence[str]] = None) -> GenerateResponse:
    """Generate from one prompt (ids or text). See `build_generate_payload` for the fields.

    Returns:
      The `GenerateResponse` (text, output_ids, meta_info with log-probs when asked).
    Raises:
      RequestError: malformed arguments. UpstreamError: the server failed after retries.
    """
    payload = build_generate_payload(
      input_ids=input_ids, text=text, sampling_params=sampling_params,
      return_logprob=return_logprob, logprob_start_len=logprob_start_len,
      top_logprobs_num=top_logprobs_num, rid=rid, session_id=session_id,
      image_data=image_data)
    body = self._request("POST", "/generate", json=payload, session_id=session_id)
    return _parse_generate(body, False, "")

  def generate_batch(self, prompts: Sequence[Prompt], *,
                     sampling_params: Union[None, dict, SamplingParams] = None,
                     return_logprob: bool = False,
                     top_logprobs_num: Optional[int] = None) -> list[GenerateResponse]:
    """Generate from many prompts; they are split evenly over the servers, one batched
    request per server, sent concurrently. Results come back in prompt order."""
    chunks = _split(list(prompts), len(self._router.urls))
    results: list[Optional[list[GenerateResponse]]] = [None] * len(chunks)
    errors: list[BaseException] = []

    def run(i: int, chunk: list[Prompt]) -> None:
      try:
        payload = _batch_payload(chunk, sampling_params, return_logprob, top_logprobs_num)
        results[i] = _parse_generate(self._request("POST", "/generate", json=payload), True, "")
      except BaseException as e:  # noqa: BLE001 - re-raised below in the caller's thread
        errors.append(e)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(chunks)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    if errors:
      raise errors[0]
    return [r for chunk in results for r in chunk]

  def score(self, input_ids: Sequence[int], *, logprob_start_len: int = 0,
            session_id: Optional[str] = None, temperature: float = 1.0
            ) -> list[Optional[float]]:
    """Log-probs of given ids without sampling (on-policy distillation's teacher).

    Sends max_new_tokens=0 with return_logprob and `temperature`. Entry i is log p(ids[start +
    i] | ids[:start + i]); the entry of ids[0] is None (no context), as SGLang reports it.
    The embedded engine's prompt log-probs are of logits / temperature (the distribution a
    request at that temperature samples from; rollout/sampling.py). A stock SGLang server
    reports prompt log-probs of the raw logits whatever the temperature unless it was started
    with temperature-scaled log-probs; score at temperature 1 there, or enable that.

    Returns:
      A list of len(input_ids) - logprob_start_len floats (None for position 0).
    """
    response = self.generate(input_ids=input_ids,
                             sampling_params={"max_new_tokens": 0, "temperature": temperature},
                             return_logprob=True, logprob_start_len=logprob_start_len,
                             session_id=session_id)
    return _scores(response, len(input_ids), logprob_start_len)

  def health(self) -> dict[str, bool]:
    """GET /health on every server: URL -> healthy."""
    out = {}
    for url in self._router.urls:
      try:
        out[url] = self._http.get(url + "/health", timeout=10.0).status_code == 200
      except httpx.HTTPError:
        out[url] = False
    return out

  def wait_until_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> None:
    """Block until every server answers /health, or raise UpstreamError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
      status = self.health()
      if all(status.values()):
        return
      if time.monotonic() > deadline:
        down = [u for u, ok in status.items() if not ok]
        raise UpstreamError(f"servers {down} not healthy after {timeout_s:.0f} s", url=down[0])
      time.sleep(poll_s)

  def model_info(self, url: Optional[str] = None) -> ModelInfo:
    """GET /get_model_info of one server (the first by default)."""
    url = url or self._router.urls[0]
    return ModelInfo.model_validate(self._request("GET", "/get_model_info", url=url))

  def update_weights_from_disk(self, model_path: str, *, load_format: Optional[str] = None,
                               weight_version: Optional[str] = None,
                               **fields: Any) -> list[UpdateWeightsFromDiskResponse]:
    """POST /update_weights_from_disk to every server; raises if any server refuses.

    Args:
      model_path: folder the servers can read (shared storage on a cluster).
      load_format: see `UpdateWeightsFromDiskRequest`.
      weight_version: label the servers report in meta_info.weight_version afterwards.
      **fields: other `UpdateWeightFromDiskReqInput` fields (e.g. abort_all_requests=True).
    Raises:
      UpstreamError: a server answered success=false or failed.
    """
    body = _weights_body(model_path, load_format, weight_version, fields)
    out = []
    for url in self._router.urls:
      response = UpdateWeightsFromDiskResponse.model_validate(
        self._request("POST", "/update_weights_from_disk", json=body, url=url))
      if not response.success:
        raise UpstreamError(f"{url} refused the weight update: {response.message}", url=url)
      out.append(response)
    return out


class AsyncSGLangClient(_ClientBase):
  """`SGLangClient` for asyncio: the same routing and retries, methods are coroutines."""

  def __init__(self, urls: Union[str, Sequence[str]], **kwargs: Any):
    super().__init__(urls, **kwargs)
    # One connection pool per event loop, made on first use inside it.
    self._sessions: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HTTP1Client]"
    self._sessions = weakref.WeakKeyDictionary()

  def _session(self) -> HTTP1Client:
    loop = asyncio.get_running_loop()
    session = self._sessions.get(loop)
    if session is None:
      session = HTTP1Client(self._headers)
      self._sessions[loop] = session
    return session

  async def aclose(self) -> None:
    """Close the connection pool of the running event loop (call from the loop that used
    the client)."""
    session = self._sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
      await session.aclose()

  async def __aenter__(self) -> "AsyncSGLangClient":
    return self

  async def __aexit__(self, *exc: Any) -> None:
    await self.aclose()

  async def _request(self, method: str, path: str, *, json: Any = None,
                     session_id: Optional[str] = None, url: Optional[str] = None) -> Any:
    tried: list[str] = []
    # orjson: a long prompt's input_ids serialise about 10x faster than with json.dumps.
    data = None if json is None else orjson.dumps(json)

    async def attempt() -> Any:
      target = (self._router.acquire_url(url) if url
                else self._router.acquire(session_id, exclude=tried))
      tried.append(target)
      ok = False
      try:
        status, content = await self._session().request(method, target, path, data,
                                                        timeout_s=self.timeout_s)
        body = self._check_body(status, content, target, path)
        ok = True
        return body
      except (HTTPTransportError, TimeoutError) as e:
        raise UpstreamError(f"{target}{path} failed: {type(e).__name__}: {e}",
                            url=target) from e
      except asyncio.CancelledError:
        # The caller gave up (its own client disconnected): closing the request aborts it on
        # the server, which is not at fault.
        ok = True
        raise
      except UpstreamError as e:
        ok = e.status_code is not None and e.status_code not in _TRANSIENT_STATUS
        raise
      finally:
        self._router.release(target, ok)

    # The first attempt runs outside tenacity (its machinery costs ~30 us per request);
    # a transient failure hands the remaining attempts to it, after the first backoff.
    try:
      return await attempt()
    except UpstreamError as e:
      if not _is_transient(e) or self.max_retries < 1:
        raise
    await asyncio.sleep(min(self.backoff_s, 30.0))
    return await tenacity.AsyncRetrying(**self._retry_kwargs(self.max_retries, second=True))(
      attempt)

  async def generate(self, *, input_ids: Optional[Sequence[int]] = None,
                     text: Optional[str] = None,
                     sampling_params: Union[None, dict, SamplingParams] = None,
                     return_logprob: bool = False, logprob_start_len: Optional[int] = None,
                     top_logprobs_num: Optional[int] = None, rid: Optional[str] = None,
                     session_id: Optional[str] = None,
                     image_data: Optional[Sequence[str]] = None) -> GenerateResponse:
    """See `SGLangClient.generate`."""
    payload = build_generate_payload(
      input_ids=input_ids, text=text, sampling_params=sampling_params,
      return_logprob=return_logprob, logprob_start_len=logprob_start_len,
      top_logprobs_num=top_logprobs_num, rid=rid, session_id=session_id,
      image_data=image_data)
    body = await self._request("POST", "/generate", json=payload, session_id=session_id)
    return _parse_generate(body, False, "")

  async def generate_stream(self, *, input_ids: Sequence[int],
                            sampling_params: Union[None, dict, SamplingParams] = None,
                            return_logprob: bool = False,
                            top_logprobs_num: Optional[int] = None,
                            session_id: Optional[str] = None,
                            image_data: Optional[Sequence[str]] = None
                            ) -> AsyncIterator[GenerateResponse]:
    """`/generate` with "stream": true: yields the result so far after each engine step, the
    last one finished (meta_info.finish_reason set).

    Each yielded response is cumulative (all text, ids and log-probs since the start), also
    against a server that streams increments (SGLang's incremental streaming output): a chunk
    whose ids do not extend the ids so far is appended to them. Not retried once the server
    has answered (the tokens already streamed cannot be taken back); a connection refused
    before that is.

    Raises:
      UpstreamError: HTTP error, a stream that reports an error or ends unfinished.
    """
    payload = build_generate_payload(
      input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob,
      top_logprobs_num=top_logprobs_num, session_id=session_id, stream=True,
      image_data=image_data)
    data = orjson.dumps(payload)
    target = self._router.acquire(session_id)
    ok = False
    try:
      try:
        response = await self._session().open("POST", target, "/generate", data,
                                              timeout_s=self.timeout_s)
      except (HTTPTransportError, TimeoutError) as e:
        raise UpstreamError(f"{target}/generate failed: {type(e).__name__}: {e}",
                            url=target) from e
      async with response:
        if response.status >= 400:
          try:
            content = await response.read()
          except (HTTPTransportError, TimeoutError) as e:
            raise UpstreamError(f"{target}/generate answered HTTP {response.status}, then "
                                f"failed: {type(e).__name__}: {e}", url=target) from e
          self._check_body(response.status, content, target, "/generate")
        merged = _StreamMerger(target)
        try:
          buffer = b""
          async for data in response.chunks():
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
              body = event.strip()
              if not body.startswith(b"data:"):
                continue
              body = body[5:].strip()
              if body == b"[DONE]":
                break
              partial = merged.add(orjson.loads(body))
              yield partial
              if partial.meta_info.finish_reason is not None:
                ok = True
                return
        except (HTTPTransportError, TimeoutError, orjson.JSONDecodeError) as e:
          raise UpstreamError(f"{target}/generate stream broke: {type(e).__name__}: {e}",
                              url=target) from e
        raise UpstreamError(f"{target}/generate stream ended before the request finished",
                            url=target, status_code=200)
    finally:
      self._router.release(target, ok)

  async def generate_batch(self, prompts: Sequence[Prompt], *,
                           sampling_params: Union[None, dict, SamplingParams] = None,
                           return_logprob: bool = False,
                           top_logprobs_num: Optional[int] = None) -> list[GenerateResponse]:
    """See `SGLangClient.generate_batch`."""
    chunks = _split(list(prompts), len(self._router.urls))
    parts = await asyncio.gather(*[
      self._request("POST", "/generate",
                    json=_batch_payload(c, sampling_params, return_logprob, top_logprobs_num))
      for c in chunks])
    return [r for body in parts for r in _parse_generate(body, True, "")]

  async def score(self, input_ids: Sequence[int], *, logprob_start_len: int = 0,
                  session_id: Optional[str] = None, temperature: float = 1.0
                  ) -> list[Optional[float]]:
    """See `SGLangClient.score`."""
    response = await self.generate(
      input_ids=input_ids, sampling_params={"max_new_tokens": 0, "temperature": temperature},
      return_logprob=True, logprob_start_len=logprob_start_len, session_id=session_id)
    return _scores(response, len(input_ids), logprob_start_len)

  async def model_info(self, url: Optional[str] = None) -> ModelInfo:
    """See `SGLangClient.model_info`."""
    url = url or self._router.urls[0]
    return ModelInfo.model_validate(await self._request("GET", "/get_model_info", url=url))

  async def update_weights_from_disk(self, model_path: str, *, load_format: Optional[str] = None,
                                     weight_version: Optional[str] = None,
                                     **fields: Any) -> list[UpdateWeightsFromDiskResponse]:
    """See `SGLangClient.update_weights_from_disk`."""
    body = _weights_body(model_path, load_format, weight_version, fields)
    out = []
    for url in self._router.urls:
      response = UpdateWeightsFromDiskResponse.model_validate(
        await self._request("POST", "/update_weights_from_disk", json=body, url=url))
      if not response.success:
        raise UpstreamError(f"{url} refused the weight update: {response.message}", url=url)
      out.append(response)
    return out


class _StreamMerger:
  """Folds `/generate` stream chunks into cumulative `GenerateResponse`s (see
  `AsyncSGLangClient.generate_stream`)."""

  def __init__(self, url: str):
    self.url = url
    self.text, self.ids, self.logprobs, self.tops = "", [], [], []

  def add(self, chunk: Any) -> GenerateResponse:
    if isinstance(chunk, dict) and "error" in chunk:
      error = chunk["error"]
      message = error.get("message") if isinstance(error, dict) else error
      raise UpstreamError(f"{self.url}/generate stream failed: {message}", url=self.url,
                          status_code=200)
    part = _parse_generate(chunk, False, self.url)
    meta = part.meta_info
    ids = part.output_ids
    cumulative = len(ids) >= len(self.ids) and ids[:len(self.ids)] == self.ids
    self.ids = list(ids) if cumulative else self.ids + list(ids)
    self.text = part.text if part.text.startswith(self.text) else self.text + part.text
    if meta.output_token_logprobs is not None:
      entries = list(meta.output_token_logprobs)
      self.logprobs = entries if cumulative else self.logprobs + entries
    if meta.output_top_logprobs is not None:
      tops = list(meta.output_top_logprobs)
      self.tops = tops if cumulative else self.tops + tops
    update = {"output_token_logprobs": self.logprobs or meta.output_token_logprobs,
              "completion_tokens": len(self.ids)}
    if self.tops:
      update["output_top_logprobs"] = self.tops
    return part.model_copy(update={"text": self.text, "output_ids": self.ids,
                                   "meta_info": meta.model_copy(update=update)})


def _split(items: list, n: int) -> list[list]:
  n = max(1, min(n, len(items)))
  size, extra = divmod(len(items), n)
  out, start = [], 0
  for i in range(n):
    end = start + size + (1 if i < extra else 0)
    out.append(items[start:end])
    start = end
  return [c for c in out if c]


def _batch_payload(chunk: list[Prompt], sampling_params: Any, return_logprob: bool,
                   top_logprobs_num: Optional[int]) -> dict[str, Any]:
  if all(isinstance(p, str) for p in chunk):
    return build_generate_payload(text=list(chunk), sampling_params=sampling_params,
                                  return_logprob=return_logprob,
                                  top_logprobs_num=top_logprobs_num, rid=uuid.uuid4().hex)
  if any(isinstance(p, str) for p in chunk):
    raise RequestError("a batch mixes text and id prompts; give all as text or all as ids")
  return build_generate_payload(input_ids=[list(p) for p in chunk],
                                sampling_params=sampling_params, return_logprob=return_logprob,
                                top_logprobs_num=top_logprobs_num, rid=uuid.uuid4().hex)
