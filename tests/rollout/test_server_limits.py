"""The inference server bounds the request bodies it reads, as the recording proxy does (one
implementation, `rollout.body_limit`): a body over `max_request_bytes` is a 413 with a one-line
JSON error naming the limit and the setting, whether its Content-Length announced it or it
arrived chunked; another client's request made meanwhile is served, and so is the next request
on the refused connection.
"""
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax.rollout import InferenceServer
from orchard_jax.rollout.body_limit import BodyTooLarge, check_limit

LIMIT = 4096
_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
_ROUTES = ["/generate", "/v1/chat/completions", "/v1/completions", "/update_weights_from_disk"]
_SMALL = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


@pytest.fixture(scope="module")
def server(engine):
  with InferenceServer(engine, max_request_bytes=LIMIT) as running:
    yield running


def _chunks(data: bytes, size: int):
  for start in range(0, len(data), size):
    yield data[start:start + size]


@_SETTINGS
@given(route=st.sampled_from(_ROUTES), size=st.integers(1, 3 * LIMIT), chunked=st.booleans(),
       chunk=st.integers(1, 2 * LIMIT))
def test_a_body_over_the_limit_is_a_413_naming_the_limit(server, route, size, chunked, chunk):
  data = b"x" * size          # never valid JSON: at or under the limit it is a 400 (or 422)
  content = _chunks(data, chunk) if chunked else data
  with httpx.Client(timeout=60) as http:
    response = http.post(server.url + route, content=content,
                         headers={"content-type": "application/json"})
  body = response.json()
  if size > LIMIT:
    assert response.status_code == 413, (size, response.text)
    assert body["object"] == "error" and body["type"] == "RequestTooLargeError"
    assert body["code"] == 413 and "\n" not in body["message"]
    assert f"limit of {LIMIT} bytes" in body["message"]
    assert "InferenceServer max_request_bytes" in body["message"]
    if not chunked:
      assert f"body of {size} bytes" in body["message"]   # refused by its Content-Length
  else:
    assert response.status_code in (400, 422), (size, response.text)


def test_a_request_during_a_refused_upload_is_served_and_the_connection_is_kept(server):
  """A slow chunked upload over the limit (another user) is refused while a normal request
  runs alongside; the refused client's next request on its connection is served."""
  started, answers = threading.Event(), {}

  def slow_body():
    for piece in _chunks(b"y" * (2 * LIMIT), 512):
      started.set()
      time.sleep(0.02)
      yield piece

  def upload():
    with httpx.Client(timeout=60) as http:
      answers["refused"] = http.post(server.url + "/generate", content=slow_body(),
                                     headers={"content-type": "application/json"})
      answers["after"] = http.post(server.url + "/generate", json=_SMALL)

  uploader = threading.Thread(target=upload)
  uploader.start()
  assert started.wait(30)
  with httpx.Client(timeout=120) as http:
    served = http.post(server.url + "/generate", json=_SMALL)
  uploader.join(60)
  assert served.status_code == 200 and len(served.json()["output_ids"]) == 2
  assert answers["refused"].status_code == 413
  assert "InferenceServer max_request_bytes" in answers["refused"].json()["message"]
  assert answers["after"].status_code == 200, answers["after"].text
  assert answers["after"].json()["output_ids"] == served.json()["output_ids"]  # greedy


def test_a_body_at_the_limit_is_read_whole(server):
  body = httpx.Request("POST", "/", json=_SMALL).content
  padded = body[:-1] + b" " * (LIMIT - len(body)) + body[-1:]    # JSON allows the spaces
  assert len(padded) == LIMIT
  with httpx.Client(timeout=120) as http:
    response = http.post(server.url + "/generate", content=_chunks(padded, 1000),
                         headers={"content-type": "application/json"})
  assert response.status_code == 200, response.text


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "64"])
def test_a_limit_that_is_not_a_positive_whole_number_is_refused(limit):
  with pytest.raises(ValueError, match="InferenceServer max_request_bytes"):
    check_limit(limit, "InferenceServer max_request_bytes")


def test_the_error_says_whether_more_bytes_were_coming():
  assert str(BodyTooLarge(5000, 4096, "S", partial=True)) == (
    "request body of 5000+ bytes exceeds the limit of 4096 bytes (S)")
  assert "of 5000 bytes" in str(BodyTooLarge(5000, 4096, "S", partial=False))


@pytest.mark.parametrize("content,expected", [
    (b"xx", "request body: Invalid JSON"), (b"[1, 2]", "request body: Input should be an object"),
    (b'{"input_ids": [1], "sampling_params": {"max_tokens": 3}}', "max_new_tokens")])
def test_a_generate_body_that_is_not_a_request_is_a_one_line_400(server, content, expected):
  response = httpx.post(server.url + "/generate", content=content, timeout=60)
  assert response.status_code == 400, response.text
  message = response.json()["message"]
  assert expected in message and "\n" not in message, message
