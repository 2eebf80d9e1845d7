"""Property-based: any request body or query the exec, files and patch routes can be sent, on a
live service of each backend (Kubernetes: the fake API server and kubelet of
tests/env/fake_kube.py), is answered without a 5xx, and never harms another sandbox.

Hypothesis writes the requests: text with NUL bytes, lone surrogates and control characters,
argv lists, environment names with '=' or empty, paths with '..', '/./' and '//', base64 that
is not base64, numbers that are negative, huge, infinite or NaN (sent as JSON's Infinity and
NaN), fields of the wrong type and fields that do not exist.
"""
import base64
import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchard_jax import env as orchard_env

pytestmark = pytest.mark.slow   # about 30 s per test and backend on 2 cores

# Every code point, lone surrogates (category Cs) included.
_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()),
                max_size=40)
_NAME = st.one_of(_TEXT, st.sampled_from(["", "A=B", "PATH", "X\x00Y", "=", "ok_name"]))
_NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(min_value=-2**70, max_value=2**70),
                    st.sampled_from([0, 0.001, 0.5, 2, 1e308]), _TEXT, st.none(),
                    st.booleans())
_PATH = st.one_of(_TEXT, st.sampled_from(["", ".", "..", "a/./b", "a//b", "../../etc/passwd",
                                          "/", "/tmp/x/", "/proc/self/fd/1", "x" * 5000,
                                          "/dev/zero", "dir/", "a\x00b"]))
_SOME = st.one_of(_TEXT, _NUMBER, st.lists(_TEXT, max_size=3),
                  st.dictionaries(_NAME, _TEXT, max_size=3))
_B64 = st.one_of(_TEXT, st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()),
                 st.sampled_from(["====", "YWJj", "YWJj\n", "not base64!"]))


def _maybe(key, strategy):
  return st.one_of(st.just({}), strategy.map(lambda v: {key: v}))


@st.composite
def exec_bodies(draw):
  body = {}
  body.update(draw(_maybe("command", st.one_of(_TEXT, st.lists(_TEXT, max_size=4), _SOME,
                                               st.sampled_from(["echo hi", "exit 3", "true",
                                                                ["printf", "%s", "x"]])))))
  for key, strategy in (("shell", st.one_of(_TEXT, st.sampled_from(["/bin/sh", "/nope"]))),
                        ("cwd", _PATH), ("env", st.one_of(st.dictionaries(_NAME, _TEXT,
                                                                          max_size=3), _SOME)),
                        ("timeout", _NUMBER), ("merge_stderr", _SOME),
                        ("max_output_bytes", _NUMBER), ("stdin", _SOME), ("stdin_b64", _B64),
                        ("wait_timeout", _NUMBER), ("unknown_field", _SOME)):
    body.update(draw(_maybe(key, strategy)))
  # Whatever runs, runs briefly: the answer comes within a few seconds.
  body["wait_timeout"] = body.get("wait_timeout") if draw(st.booleans()) else 3
  return body


@st.composite
def patch_bodies(draw):
  diff = st.one_of(_TEXT, st.sampled_from([
      "", "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n", "diff --git a/f b/f\nnew file mode 100644\n",
      "Only garbage\n", "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -0,0 +1 @@\n+x\n"]))
  body = {}
  for key, strategy in (("patch", diff), ("patch_b64", _B64), ("cwd", _PATH),
                        ("timeout", _NUMBER), ("extra", _SOME)):
    body.update(draw(_maybe(key, strategy)))
  return body


@pytest.fixture(scope="module")
def boxes(service):
  """The sandbox the requests go to, and a bystander that must not notice."""
  with orchard_env.SandboxClient(service.url, service.api_key) as client:
    target = client.create_sandbox(timeout=3600)
    bystander = client.create_sandbox(timeout=3600)
    target.upload("f", b"a\n")
    yield target, bystander


def _query(params):
  """The query string of `params` for any text: each name and value as its UTF-8 bytes,
  percent-encoded, a lone surrogate as the three bytes of its 'surrogatepass' encoding (what a
  hostile client can put in a URL; httpx's params= cannot encode one and raised in the test,
  before any request went out, on a random run's mode='\\ud800')."""
  return "&".join(f"{quote(k, safe='')}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}"
                  for k, v in params.items())


def _send(service, method, path, headers=None, **kwargs):
  if "params" in kwargs:
    path += "?" + _query(kwargs.pop("params"))
  response = httpx.request(method, service.url + path, timeout=120,
                           headers={"X-API-Key": service.api_key, **(headers or {})}, **kwargs)
  assert response.status_code < 500, (method, path, kwargs, response.status_code, response.text)
  if response.headers.get("content-type", "").startswith("application/json"):
    json.loads(response.content)   # a JSON answer is valid JSON
  return response


def _still_fine(service, boxes):
  target, bystander = boxes
  assert bystander.exec("echo alive", timeout=30).stdout == "alive\n"
  assert target.refresh()["state"] == "ready"
  assert httpx.get(service.url + "/health", timeout=120).json()["status"] == "ok"


_SETTINGS = settings(max_examples=50, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow, HealthCheck.data_too_large])


@_SETTINGS
@given(body=exec_bodies())
def test_exec_requests_never_fail_the_service(service, boxes, body):
  _send(service, "POST", f"/v1/sandboxes/{boxes[0].id}/exec", content=json.dumps(body),
        headers={"Content-Type": "application/json"})
  _still_fine(service, boxes)


@_SETTINGS
@given(path=_PATH, mode=st.one_of(_TEXT, st.sampled_from(["644", "7777", "99999", "-1", ""])),
       data=st.binary(max_size=256), read_back=st.booleans())
@example(path="a\ud800b", mode="\ud800", data=b"x", read_back=True)    # undecodable query bytes
def test_file_requests_never_fail_the_service(service, boxes, path, mode, data, read_back):
  target = boxes[0]
  _send(service, "PUT", f"/v1/sandboxes/{target.id}/files", params={"path": path, "mode": mode},
        content=data)
  _send(service, "GET", f"/v1/sandboxes/{target.id}/files", params={"path": path})
  _send(service, "GET", f"/v1/sandboxes/{target.id}/files/list", params={"path": path})
  _still_fine(service, boxes)


@_SETTINGS
@given(body=patch_bodies())
def test_patch_requests_never_fail_the_service(service, boxes, body):
  answer = _send(service, "POST", f"/v1/sandboxes/{boxes[0].id}/patch",
                 content=json.dumps(body), headers={"Content-Type": "application/json"})
  if answer.status_code == 200:   # "applied" only ever means a file changed
    assert answer.json()["applied"] is False or body.get("patch") or body.get("patch_b64")
  _still_fine(service, boxes)
