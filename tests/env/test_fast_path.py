"""The exec fast path (orchard_jax.env.fast_path) answers exactly as the FastAPI route does.

One live service (local backend, two tenants). Each request is sent, in process, to two ASGI
apps over the same SandboxManager: the service's app (fast path on) and one built with
fast_exec=False, where every exec goes through its FastAPI route. Over keys (valid, another
tenant's, wrong, missing), sandbox ids, content types and bodies (valid commands, invalid
fields, any JSON, bytes that are not JSON) the two give the same status and the same body, but
for what differs between any two runs (job id, times); and only well-formed, authorised
requests take the fast path.
"""
import json
import secrets

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchard_jax.env import LocalBackend, Orchestrator, SandboxClient
from orchard_jax.env import app as _app
from orchard_jax.env import fast_path as _fast_path
from tests.env.conftest import make_config

_VOLATILE = ("id", "started_at", "finished_at", "duration")


@pytest.fixture(scope="module")
def service(tmp_path_factory, image_root):
  keys = {"alice": secrets.token_urlsafe(18), "bob": secrets.token_urlsafe(18)}
  backend = LocalBackend(state_dir=str(tmp_path_factory.mktemp("state")),
                         image_roots=[image_root])
  with Orchestrator(backend, config=make_config(), api_keys=keys) as svc, \
       SandboxClient(svc.url, keys["alice"]) as alice, \
       SandboxClient(svc.url, keys["bob"]) as bob:
    svc.keys = keys
    svc.boxes = {"alice": alice.create_sandbox(pids=64).id, "bob": bob.create_sandbox(pids=64).id}
    svc.apps = {"fast": _app.build_app(svc.manager, svc.tenants),
                "route": _app.build_app(svc.manager, svc.tenants, fast_exec=False)}
    yield svc


def _fast_path_of(app) -> _fast_path.ExecFastPath:
  layer = app.middleware_stack
  while not isinstance(layer, _fast_path.ExecFastPath):
    layer = layer.app
  return layer


def _send(service, which, path, headers, body):
  async def go():
    transport = httpx.ASGITransport(app=service.apps[which])
    async with httpx.AsyncClient(transport=transport, base_url="http://env") as http:
      return await http.post(path, headers=headers, content=body, timeout=60)
  answer = service.call(go(), timeout=120)
  try:
    payload = answer.json()
  except ValueError:
    return answer.status_code, answer.text
  if isinstance(payload, dict):
    for key in _VOLATILE:
      payload.pop(key, None)
  return answer.status_code, payload


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_COMMANDS = st.one_of(st.sampled_from(["echo hi", "exit 3", "printf '%s' \"$X\"", "", "   ",
                                       "pwd; echo err >&2"]),
                      st.lists(st.sampled_from(["printf", "%s\\n", "a", "b\x00c", ""]),
                               max_size=3),
                      _TEXT, st.integers(), st.none())
_FIELDS = st.fixed_dictionaries({"command": _COMMANDS}, optional={
    "env": st.one_of(st.dictionaries(st.sampled_from(["X", "A=B", "", "Y"]), _TEXT, max_size=2),
                     st.lists(_TEXT, max_size=1)),
    "cwd": st.sampled_from(["/tmp", "sub", "/no/such/folder", "a\x00b", ""]),
    "timeout": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([30])),
    "merge_stderr": st.one_of(st.booleans(), st.sampled_from(["yes", 1])),
    "max_output_bytes": st.integers(min_value=-2, max_value=1 << 41),
    "stdin": _TEXT, "stdin_b64": st.sampled_from(["aGk=", "not base64!", ""]),
    "shell": st.sampled_from(["/bin/sh", "/bin/bash", "sh", "/no/shell"]),
    "wait": st.just(True), "unknown_field": st.integers()})
_VALID = st.fixed_dictionaries({"command": st.sampled_from(
    ["echo hi", "exit 3", "printf '%s' \"$X\"", "pwd; echo err >&2", ["printf", "%s|", "a", "b"]])},
    optional={"env": st.dictionaries(st.sampled_from(["X", "Y"]), _TEXT, max_size=2),
              "cwd": st.sampled_from(["/tmp", "."]), "timeout": st.sampled_from([30, 0.5e2]),
              "merge_stderr": st.booleans(), "max_output_bytes": st.integers(0, 1 << 20),
              "stdin": _TEXT, "shell": st.sampled_from(["/bin/sh", "/bin/bash"])})
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6)
_BODIES = st.one_of(_VALID.map(lambda d: json.dumps(d).encode()),
                    _VALID.map(lambda d: json.dumps(d).encode()), _FIELDS.map(lambda d: json.dumps(d).encode()),
                    _JSON.map(lambda v: json.dumps(v).encode()),
                    st.sampled_from([b"", b"{", b"NaN", b'{"command": "echo hi"}garbage',
                                     b'{"command": "echo \xff"}', b"[" * 5000]))


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(["alice", "alice", "alice", "bob", "wrong", None]),
       owner=st.sampled_from(["alice", "alice", "alice", "bob", "nobody"]),
       content_type=st.sampled_from(["application/json", "application/json",
                                     "application/json; charset=utf-8", "Application/JSON",
                                     None, "text/plain", "application/merge-patch+json"]),
       body=_BODIES)
def test_fast_path_answers_as_the_route_does(service, key, owner, content_type, body):
  headers = {}
  if key is not None:
    headers["X-API-Key"] = service.keys.get(key, "not-a-key")
  if content_type is not None:
    headers["Content-Type"] = content_type
  sandbox_id = service.boxes.get(owner, "sbx-000000000000")
  path = f"/v1/sandboxes/{sandbox_id}/exec"
  fast = _send(service, "fast", path, headers, body)
  assert fast == _send(service, "route", path, headers, body)
  event(f"status {fast[0]}")


def test_only_well_formed_authorised_execs_take_the_fast_path(service):
  alice = {"X-API-Key": service.keys["alice"], "Content-Type": "application/json"}
  path = f"/v1/sandboxes/{service.boxes['alice']}/exec"
  ok = json.dumps({"command": "echo hi"}).encode()
  _send(service, "fast", path, alice, ok)   # builds the middleware stack
  fast = _fast_path_of(service.apps["fast"])
  before = fast.served
  assert _send(service, "fast", path, alice, ok)[1]["stdout"] == "hi\n"
  assert fast.served == before + 1
  for headers, body, sent_to in (
      ({"Content-Type": "application/json"}, ok, path),                         # no key: 401
      (dict(alice, **{"X-API-Key": "wrong"}), ok, path),                        # bad key: 403
      (alice, b'{"command": ""}', path),                                        # 422
      ({"X-API-Key": service.keys["alice"], "Content-Type": "text/plain"}, ok, path),
      (alice, ok, path + "/"),                                                  # not the route
  ):
    _send(service, "fast", sent_to, headers, body)
  assert fast.served == before + 1
  # Another tenant's sandbox is well-formed and authorised: the fast path answers 404 itself.
  bob = dict(alice, **{"X-API-Key": service.keys["bob"]})
  status, payload = _send(service, "fast", path, bob, ok)
  assert status == 404 and fast.served == before + 2
