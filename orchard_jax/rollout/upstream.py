"""Where the recording proxy sends model calls.

- `SGLangUpstream`: SGLang servers or the embedded engine, through SGLang's native
  `/generate` with token ids (token in, token out): the proxy renders the chat template itself
  and records the ids and log-probs exactly as sampled.
- `OpenAIUpstream`: any OpenAI-compatible chat endpoint (a hosted API, vLLM, SGLang's
  /v1): the proxy forwards the chat request and records the messages only, marked text-only
  (SFT can re-tokenise them with the student's template; RL refuses them).
"""
from __future__ import annotations

import os
from typing import Any, AsyncIterator, Optional, Sequence, Union

import httpx
import tenacity

from orchard_jax.rollout.client import AsyncSGLangClient
from orchard_jax.rollout.errors import RequestError, UpstreamError
from orchard_jax.rollout.protocol import GenerateResponse, SamplingParams

_TRANSIENT = frozenset({429, 500, 502, 503, 504})


class SGLangUpstream:
  """Token-level upstream: SGLang servers or the embedded engine's server.

  Args:
    urls: one or more native API base URLs ("http://host:port").
    **client_kwargs: passed to `AsyncSGLangClient` (timeout_s, max_retries, api_key, ...).
  """
  text_only = False

  def __init__(self, urls: Union[str, Sequence[str]], **client_kwargs: Any):
    self.client = AsyncSGLangClient(urls, **client_kwargs)

  @property
  def description(self) -> str:
    return ",".join(self.client.urls)

  async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *,
                     session_id: str, top_logprobs_num: int = 0,
                     images: Optional[Sequence[str]] = None) -> GenerateResponse:
    """Sample a continuation of prompt_ids, with the log-prob of every sampled token;
    images: the prompt's images in placeholder order (SGLang's image_data)."""
    return await self.client.generate(
      input_ids=prompt_ids, sampling_params=params, return_logprob=True,
      top_logprobs_num=top_logprobs_num or None, session_id=session_id,
      image_data=images or None)

  def generate_stream(self, prompt_ids: Sequence[int], params: SamplingParams, *,
                      session_id: str, top_logprobs_num: int = 0,
                      images: Optional[Sequence[str]] = None
                      ) -> AsyncIterator[GenerateResponse]:
    """`generate` streamed: the cumulative result after each engine step, the last one
    finished (`AsyncSGLangClient.generate_stream`)."""
    return self.client.generate_stream(
      input_ids=prompt_ids, sampling_params=params, return_logprob=True,
      top_logprobs_num=top_logprobs_num or None, session_id=session_id,
      image_data=images or None)

  def release_session(self, session_id: str) -> None:
    self.client.release_session(session_id)

  async def aclose(self) -> None:
    await self.client.aclose()


class OpenAIUpstream:
  """Text-level upstream: an OpenAI-compatible `/chat/completions` endpoint.

  Args:
    base_url: the API base, e.g. "https://api.example.com/v1" or "http://host:30000/v1".
    model: model name sent upstream (replaces the harness's).
    api_key: the key, or None to read `api_key_env` from the environment (None if unset).
    api_key_env: environment variable holding the key.
    timeout_s, max_retries: per-call timeout; retries of 429/5xx and connection failures.
  """
  text_only = True

  def __init__(self, base_url: str, model: str, *, api_key: Optional[str] = None,
               api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 600.0,
               max_retries: int = 3):
    if not base_url.startswith(("http://", "https://")):
      raise RequestError(f"upstream base_url {base_url!r} must start with http:// or https://")
    self.base_url = base_url.rstrip("/")
    self.model = model
    key = api_key if api_key is not None else os.environ.get(api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers)
    self.max_retries = max_retries

  @property
  def description(self) -> str:
    return self.base_url

  async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
    """POST {base_url}/chat/completions with `body` (model replaced); the response JSON.

    Raises:
      UpstreamError: HTTP error after retries, or a body without choices[0].message.
    """
    body = {**body, "model": self.model, "stream": False}
    url = f"{self.base_url}/chat/completions"

    async def attempt() -> dict[str, Any]:
      try:
        response = await self._http.post(url, json=body)
      except httpx.TransportError as e:
        raise UpstreamError(f"{url} failed: {type(e).__name__}: {e}", url=url) from e
      if response.status_code >= 400:
        raise UpstreamError(f"{url} answered HTTP {response.status_code}: {response.text[:2000]}",
                            url=url, status_code=response.status_code)
      data = response.json()
      if not data.get("choices") or "message" not in data["choices"][0]:
        raise UpstreamError(f"{url} answered without choices[0].message: {str(data)[:500]}",
                            url=url, status_code=response.status_code)
      return data

    retrying = tenacity.AsyncRetrying(
      stop=tenacity.stop_after_attempt(self.max_retries + 1),
      wait=tenacity.wait_exponential(multiplier=0.5, max=30.0),
      retry=tenacity.retry_if_exception(
        lambda e: isinstance(e, UpstreamError) and (e.status_code is None
                                                    or e.status_code in _TRANSIENT)),
      reraise=True)
    return await retrying(attempt)

  def release_session(self, session_id: str) -> None:
    del session_id

  async def aclose(self) -> None:
    await self._http.aclose()
