"""SGLangClient: its requests against SGLang's documented schema, routing, retries, parsing.

The servers here are real HTTP servers (FastAPI in a thread) that record what they receive and
answer in SGLang's documented response shape; they stand in for SGLang, which cannot run on
this CPU-only machine.
"""
import asyncio
import threading

import fastapi
import pytest

from orchard_jax.rollout import (
  AsyncSGLangClient, BackgroundServer, RequestError, SGLangClient, UpstreamError)

# SGLang's documented /generate fields and their types (docs.sglang.io "Sampling Parameters",
# table "/generate Endpoint", and GenerateReqInput), written out independently of the client.
_INT_LIST = lambda v: isinstance(v, list) and all(type(t) is int for t in v)  # noqa: E731
_DOC_GENERATE = {
  "text": lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(t, str) for t in v)),
  "input_ids": lambda v: _INT_LIST(v) or (isinstance(v, list) and all(_INT_LIST(r) for r in v)),
  "sampling_params": lambda v: isinstance(v, dict) or (isinstance(v, list) and all(isinstance(d, dict) for d in v)),
  "rid": lambda v: isinstance(v, (str, list)),
  "session_id": lambda v: isinstance(v, str),
  "return_logprob": lambda v: isinstance(v, (bool, list)),
  "logprob_start_len": lambda v: isinstance(v, (int, list)),
  "top_logprobs_num": lambda v: isinstance(v, (int, list)),
  "return_text_in_logprobs": lambda v: isinstance(v, bool),
  "stream": lambda v: isinstance(v, bool),
}
# docs.sglang.io "Sampling parameters": core parameters, penalizers, other options.
_DOC_SAMPLING = {
  "max_new_tokens": int, "stop": (str, list), "stop_token_ids": list, "temperature": (int, float),
  "top_p": (int, float), "top_k": int, "min_p": (int, float), "frequency_penalty": (int, float),
  "presence_penalty": (int, float), "min_new_tokens": int, "n": int, "ignore_eos": bool,
  "skip_special_tokens": bool, "spaces_between_special_tokens": bool, "no_stop_trim": bool,
  "json_schema": str, "regex": str, "ebnf": str, "sampling_seed": int,
}


def _check_documented(body: dict) -> None:
  assert set(body) <= set(_DOC_GENERATE), set(body) - set(_DOC_GENERATE)
  for key, ok in _DOC_GENERATE.items():
    if key in body:
      assert ok(body[key]), (key, body[key])
  assert ("text" in body) != ("input_ids" in body)
  params = body.get("sampling_params", {})
  for p in params if isinstance(params, list) else [params]:
    for key, value in p.items():
      assert key in _DOC_SAMPLING, key
      assert isinstance(value, _DOC_SAMPLING[key]), (key, value)


def _sglang_result(body: dict, index: int, server: str) -> dict:
  ids = body["input_ids"][index] if body.get("input_ids") and isinstance(body["input_ids"][0], list) \
      else body.get("input_ids", [1, 2, 3])
  params = body.get("sampling_params") or {}
  params = params[index] if isinstance(params, list) else params
  n_new = params.get("max_new_tokens", 3)
  out = [7] * n_new
  meta = {"id": f"r{index}", "finish_reason": {"type": "length", "length": n_new},
          "prompt_tokens": len(ids), "completion_tokens": n_new, "cached_tokens": 0,
          "weight_version": "default", "server": server}
  if body.get("return_logprob"):
    start = body.get("logprob_start_len", -1)
    meta["output_token_logprobs"] = [[-0.5, t, None] for t in out]
    if start is not None and start >= 0:
      meta["input_token_logprobs"] = [[None if start + i == 0 else -1.0 - i, t, None]
                                      for i, t in enumerate(ids[start:])]
  return {"text": "x" * n_new, "output_ids": out, "meta_info": meta}


def _recording_app(name: str, failures: list[int] | None = None, delay_s: float = 0.0):
  app = fastapi.FastAPI()
  app.state.bodies = []
  app.state.weight_requests = []
  failures = list(failures or [])

  @app.post("/generate")
  async def generate(request: fastapi.Request):
    body = await request.json()
    app.state.bodies.append(body)
    if failures:
      return fastapi.responses.JSONResponse({"error": "busy"}, status_code=failures.pop(0))
    if delay_s:
      await asyncio.sleep(delay_s)
    if isinstance(body.get("input_ids", [None])[0], list) or isinstance(body.get("text"), list):
      n = len(body.get("input_ids") or body.get("text"))
      return [_sglang_result(body, i, name) for i in range(n)]
    return _sglang_result(body, 0, name)

  @app.get("/health")
  async def health():
    return fastapi.Response(status_code=200)

  @app.get("/get_model_info")
  async def model_info():
    return {"model_path": f"/models/{name}", "tokenizer_path": None, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False}

  @app.post("/update_weights_from_disk")
  async def update(request: fastapi.Request):
    body = await request.json()
    app.state.weight_requests.append(body)
    return {"success": True, "message": "Succeeded to update model weights.",
            "num_paused_requests": 0}

  return app


@pytest.fixture(scope="module")
def two_servers():
  apps = [_recording_app("a", delay_s=0.1), _recording_app("b", delay_s=0.1)]
  with BackgroundServer(apps[0]) as a, BackgroundServer(apps[1]) as b:
    yield apps, [a.url, b.url]


def test_generate_request_matches_sglang_documented_schema(two_servers):
  apps, urls = two_servers
  with SGLangClient(urls[0]) as client:
    out = client.generate(input_ids=[5, 6, 7], return_logprob=True, session_id="s1",
                          sampling_params={"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9,
                                           "top_k": 20, "stop": ["\n\n"], "stop_token_ids": [2],
                                           "sampling_seed": 3})
    client.generate(text="hello", sampling_params={"max_new_tokens": 2})
    client.generate_batch([[1, 2], [3, 4, 5]], sampling_params={"max_new_tokens": 1},
                          return_logprob=True)
  for body in apps[0].state.bodies[-3:]:
    _check_documented(body)
  first = apps[0].state.bodies[-3]
  assert first["input_ids"] == [5, 6, 7] and first["return_logprob"] is True
  assert first["sampling_params"]["max_new_tokens"] == 4
  assert out.output_ids == [7, 7, 7, 7]
  assert out.output_logprobs == [-0.5] * 4
  assert out.meta_info.finish_reason.type == "length"
  assert out.meta_info.model_extra["server"] == "a"  # unknown meta_info keys are kept


def test_unknown_sampling_field_is_refused_before_sending(two_servers):
  apps, urls = two_servers
  before = len(apps[0].state.bodies)
  with SGLangClient(urls[0]) as client:
    with pytest.raises(RequestError, match="max_new_tokens"):
      client.generate(input_ids=[1], sampling_params={"max_tokens": 5})
    with pytest.raises(RequestError, match="exactly one"):
      client.generate(input_ids=[1], text="a")
  assert len(apps[0].state.bodies) == before


def test_score_returns_prompt_logprobs_with_none_first(two_servers):
  apps, urls = two_servers
  with SGLangClient(urls[0]) as client:
    scores = client.score([4, 5, 6, 7])
    assert scores == [None, -2.0, -3.0, -4.0]
    assert client.score([4, 5, 6, 7], logprob_start_len=2) == [-1.0, -2.0]
    body = apps[0].state.bodies[-1]
    client.score([4, 5, 6, 7], temperature=0.7)   # the distribution a T = 0.7 request samples
    tempered = apps[0].state.bodies[-1]
  _check_documented(body)
  assert body["sampling_params"] == {"max_new_tokens": 0, "temperature": 1.0}
  assert body["logprob_start_len"] == 2
  assert tempered["sampling_params"] == {"max_new_tokens": 0, "temperature": 0.7}


def test_sticky_sessions_and_least_load(two_servers):
  apps, urls = two_servers
  with SGLangClient(urls) as client:
    servers = {client.generate(input_ids=[1], session_id="sess-A",
                               sampling_params={"max_new_tokens": 1}).meta_info.model_extra["server"]
               for _ in range(4)}
    assert len(servers) == 1  # one session, one server
    # Concurrent session-less requests spread evenly: each goes where the fewest are in flight.
    seen = []

    def call():
      seen.append(client.generate(input_ids=[1], sampling_params={"max_new_tokens": 1})
                  .meta_info.model_extra["server"])

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert sorted(seen) == ["a"] * 3 + ["b"] * 3
    assert all(v == 0 for v in client.in_flight().values())


def test_transient_failure_is_retried_on_another_server():
  flaky, good = _recording_app("flaky", failures=[503, 503, 503, 503]), _recording_app("good")
  with BackgroundServer(flaky) as f, BackgroundServer(good) as g:
    with SGLangClient([f.url, g.url], backoff_s=0.01) as client:
      out = client.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1})
      assert out.meta_info.model_extra["server"] == "good"
    # A refused connection is transient too; a 4xx is not retried.
    with SGLangClient(["http://127.0.0.1:9", g.url], backoff_s=0.01) as client:
      assert client.generate(input_ids=[1]).meta_info.model_extra["server"] == "good"
    bad = _recording_app("bad", failures=[400])
    with BackgroundServer(bad) as b, SGLangClient(b.url, backoff_s=0.01) as client:
      with pytest.raises(UpstreamError) as info:
        client.generate(input_ids=[1])
      assert info.value.status_code == 400 and len(bad.state.bodies) == 1


def test_update_weights_goes_to_every_server_and_model_info(two_servers):
  apps, urls = two_servers
  with SGLangClient(urls) as client:
    out = client.update_weights_from_disk("/ckpt/7", weight_version="7", load_format="auto")
    assert [r.success for r in out] == [True, True]
    assert client.model_info().model_path == "/models/a"
    assert all(client.health().values())
  for app in apps:
    assert app.state.weight_requests[-1] == {"model_path": "/ckpt/7", "load_format": "auto",
                                             "weight_version": "7"}


def test_async_client_same_behaviour(two_servers):
  apps, urls = two_servers

  async def main():
    async with AsyncSGLangClient(urls) as client:
      outs = await asyncio.gather(*[
        client.generate(input_ids=[1, 2], session_id="z", return_logprob=True,
                        sampling_params={"max_new_tokens": 2}) for _ in range(3)])
      scores = await client.score([1, 2, 3])
      batch = await client.generate_batch([[1], [2], [3]], sampling_params={"max_new_tokens": 1})
      return outs, scores, batch

  outs, scores, batch = asyncio.run(main())
  assert len({o.meta_info.model_extra["server"] for o in outs}) == 1
  assert scores == [None, -2.0, -3.0]
  assert len(batch) == 3
