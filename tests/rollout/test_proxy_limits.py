"""The recording proxy bounds what a caller can make it hold, and answers a caller that asks for
a route it does not serve with a JSON error naming the routes it does.

The proxy lives in the trainer's process and is reached by harnesses running model-written code
inside sandboxes, so an unbounded body (a 300 MB one grew the proxy by ~10 GB while it was
parsed and tokenised) must be refused before it is parsed: 413 in the wire's own error shape,
whether the body announced its length or arrived chunked, and the next call on the same proxy
is served as usual.
"""
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax.rollout import InferenceServer, RecordingProxy, SGLangUpstream

LIMIT = 4096
_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
_PATHS = ["chat/completions", "responses", "messages", "messages/count_tokens"]


@pytest.fixture(scope="module")
def proxy(engine, tokenizer):
  with InferenceServer(engine) as server, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=tokenizer, max_request_bytes=LIMIT,
                      sampling_overrides={"max_new_tokens": 2}) as proxy:
    yield proxy


def _error_message(path: str, body: dict) -> str:
  """The message of an error body in the wire's shape (chat: OpenAI's legacy `object: error`;
  Responses: `error.message`; Messages: `type: error`)."""
  if path.startswith("messages"):
    assert body["type"] == "error", body
    return body["error"]["message"]
  if path == "responses":
    return body["error"]["message"]
  assert body["object"] == "error", body
  return body["message"]


def _chunks(data: bytes, size: int):
  for start in range(0, len(data), size):
    yield data[start:start + size]


@_SETTINGS
@given(path=st.sampled_from(_PATHS), size=st.integers(1, 3 * LIMIT), chunked=st.booleans(),
       chunk=st.integers(1, 2 * LIMIT))
def test_a_body_over_the_limit_is_a_413_in_the_wire_shape(proxy, path, size, chunked, chunk):
  data = b"x" * size          # never valid JSON: at or under the limit it is a 400
  content = _chunks(data, chunk) if chunked else data
  with httpx.Client(timeout=60) as http:
    response = http.post(f"{proxy.session_url('limits')}/{path}", content=content,
                         headers={"content-type": "application/json"})
  message = _error_message(path, response.json())
  if size > LIMIT:
    assert response.status_code == 413, (size, response.text)
    assert f"limit of {LIMIT} bytes" in message and "max_request_bytes" in message
    if path.startswith("messages"):
      assert response.json()["error"]["type"] == "request_too_large"
  else:
    assert response.status_code == 400, (size, response.text)


def test_after_a_refused_body_the_same_connection_serves_the_next_call(proxy):
  call = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
  with httpx.Client(timeout=120) as http:
    url = f"{proxy.session_url('limits-then-ok')}/chat/completions"
    refused = http.post(url, content=b" " * (LIMIT + 1),
                        headers={"content-type": "application/json"})
    assert refused.status_code == 413
    served = http.post(url, json=call)
  assert served.status_code == 200, served.text
  assert served.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("method,path", [
    ("POST", "/sessions/s/v1/v1/messages"),          # an Anthropic base URL given with /v1
    ("POST", "/v1/chat/completions"),                # the proxy's root given as the base URL
    ("POST", "/sessions/a%2Fb/v1/chat/completions"),  # a session id holding '/'
    ("GET", "/nothing")])
def test_an_unknown_route_is_a_json_404_naming_the_model_routes(proxy, method, path):
  with httpx.Client(timeout=30) as http:
    response = http.request(method, proxy.url + path, json={})
  assert response.status_code == 404
  message = response.json()["message"]
  assert path.split("?")[0] in message or "a%2Fb" in path
  assert "/sessions/{id}/v1/chat/completions" in message


def test_a_wrong_method_on_a_model_route_is_a_json_405(proxy):
  with httpx.Client(timeout=30) as http:
    response = http.get(f"{proxy.session_url('m')}/chat/completions")
  assert response.status_code == 405
  assert "GET" in response.json()["message"] and "POST" in response.json()["message"]
