"""What a careless or hostile caller sees: every answer is the service's JSON error shape naming
what was expected and what was seen, never a 500, and an exposed port relays whatever header
bytes the sandbox's server answers with (local backend; the answers come from the service).
"""
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax import env as orchard_env
from tests.env.conftest import make_config

_SETTINGS = settings(max_examples=30, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])

# Answers each request with the header bytes its X-Echo request header gives in hex (repeated
# as two X-Reply headers) and a Set-Cookie given twice.
_ECHO_SERVER = r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000)); s.listen(16)
while True:
  c, _ = s.accept()
  head = b""
  while b"\r\n\r\n" not in head:
    chunk = c.recv(65536)
    if not chunk:
      break
    head += chunk
  echo = b""
  for line in head.split(b"\r\n"):
    if line.lower().startswith(b"x-echo:"):
      echo = bytes.fromhex(line.split(b":", 1)[1].strip().decode())
  c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Reply: " + echo + b"\r\nX-Reply: " + echo
            + b"\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nConnection: close\r\n\r\nok")
  c.close()
"""


@pytest.fixture(scope="module")
def local_service(tmp_path_factory):
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path_factory.mktemp("state")))
  with orchard_env.Orchestrator(backend, config=make_config()) as service:
    yield service


@pytest.fixture(scope="module")
def exposed(local_service):
  """The URL of port 8000 of a sandbox running _ECHO_SERVER."""
  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box = client.create_sandbox()
    box.upload("echo.py", _ECHO_SERVER)
    box.start("exec python3 echo.py")
    probe = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000))\""
    for _ in range(200):
      if box.exec(probe).exit_code == 0:
        break
    yield box.expose_port(8000)["url"]


# A header value as HTTP allows it: visible ASCII and obs-text (0x80-0xff), spaces and tabs
# inside, never at either end (a parser trims them).
_VALUE_BYTES = st.lists(st.integers(0x21, 0x7e) | st.integers(0x80, 0xff) | st.just(0x20)
                        | st.just(0x09), min_size=1, max_size=40).map(bytes).map(
                            lambda b: b.strip(b" \t") or b"x")


@_SETTINGS
@given(value=_VALUE_BYTES)
def test_an_exposed_port_relays_any_header_bytes_exactly(exposed, value):
  response = httpx.get(exposed, headers={"X-Echo": value.hex()}, timeout=30)
  assert response.status_code == 200, response.text
  assert response.content == b"ok"
  raw = [(k.lower(), v) for k, v in response.headers.raw]
  assert [v for k, v in raw if k == b"x-reply"] == [value, value]
  assert [v for k, v in raw if k == b"set-cookie"] == [b"a=1", b"b=2"]


def _raw(service, method, path, **kwargs):
  headers = {"X-API-Key": service.api_key, **kwargs.pop("headers", {})}
  return httpx.request(method, service.url + path, timeout=60, headers=headers, **kwargs)


def _error(response) -> dict:
  assert 400 <= response.status_code < 500, (response.status_code, response.text)
  error = response.json()["error"]
  assert error["code"] and error["message"], error
  return error


def test_a_query_parameter_named_path_is_named_when_missing(local_service):
  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box = client.create_sandbox()
    for route in (f"/v1/sandboxes/{box.id}/files",):
      error = _error(_raw(local_service, "GET", route))
      assert error["details"]["fields"] == ["path"] and "path: Field required" in error["message"]


@pytest.mark.parametrize("body,where", [(b"{bad json", "character 1"), (b'{"image": }', "character 10"),
                                        (b"", None)])
def test_a_body_that_is_not_json_is_named_as_such(local_service, body, where):
  error = _error(_raw(local_service, "POST", "/v1/sandboxes", content=body,
                      headers={"content-type": "application/json"}))
  assert error["details"]["fields"] == ["body"], error
  if where:
    assert "not valid JSON" in error["message"] and where in error["message"], error


def test_a_json_body_sent_as_a_form_names_the_content_type(local_service):
  # curl -d '{...}' without -H 'Content-Type: application/json' sends a form.
  error = _error(_raw(local_service, "POST", "/v1/sandboxes", content=b"{}",
                      headers={"content-type": "application/x-www-form-urlencoded"}))
  assert "Content-Type: application/json" in error["message"], error
  assert "application/x-www-form-urlencoded" in error["message"], error


@pytest.mark.parametrize("method,path,status,code", [
    ("GET", "/v2/sandboxes", 404, "not_found"), ("GET", "/", 404, "not_found"),
    ("POST", "/v1/sandboxes/x/nothing", 404, "not_found"),
    ("PATCH", "/v1/sandboxes", 405, "method_not_allowed")])
def test_an_unknown_route_or_method_has_the_service_error_shape(local_service, method, path,
                                                                 status, code):
  response = _raw(local_service, method, path)
  assert response.status_code == status
  error = _error(response)
  assert error["code"] == code and path in error["message"], error


@_SETTINGS
@given(body=st.binary(max_size=64), content_type=st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
       route=st.sampled_from(["/v1/sandboxes", "/v1/sandboxes/{id}/exec",
                              "/v1/sandboxes/{id}/patch", "/v1/sandboxes/{id}/ports"]))
def test_arbitrary_bytes_are_a_4xx_in_the_service_shape(local_service, exposed, body,
                                                        content_type, route):
  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box_id = client.list_sandboxes()[0]["id"]
  headers = {"content-type": content_type} if content_type else {}
  response = _raw(local_service, "POST", route.format(id=box_id), content=body, headers=headers)
  if response.status_code in (200, 201):   # a body that happened to be valid
    if route == "/v1/sandboxes":
      _raw(local_service, "DELETE", f"/v1/sandboxes/{response.json()['id']}")
    return
  error = _error(response)
  # Fields are names a caller can act on, never a character offset or a location.
  assert all(not f.isdigit() and f not in ("query", "header") for f in error["details"].get(
      "fields", [])), error


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_wait_timeout_is_named_as_such(local_service, value):
  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box = client.create_sandbox()
    job = box.start("true")
    for route in (f"/v1/sandboxes/{box.id}/wait", f"/v1/sandboxes/{box.id}/jobs/{job.id}/wait"):
      error = _error(_raw(local_service, "POST", route, params={"timeout": value}))
      assert error["details"]["fields"] == ["timeout"] and "finite" in error["message"], error


@pytest.mark.parametrize("query,expected", [("rows=abc", "rows and cols must be integers"),
                                            ("cols=0", "rows and cols must be 1-1000"),
                                            ("shell=%00", "shell")])
def test_a_bad_terminal_parameter_closes_the_pty_with_4422_naming_it(local_service, query,
                                                                     expected):
  import asyncio

  import websockets

  async def close_of(url):
    async with websockets.connect(url, additional_headers={"X-API-Key": local_service.api_key},
                                  open_timeout=30) as ws:
      with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 30)
      return ws.close_code, ws.close_reason

  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box = client.create_sandbox()
    url = local_service.url.replace("http", "ws", 1) + f"/v1/sandboxes/{box.id}/pty?{query}"
    code, reason = asyncio.run(close_of(url))
  assert code == 4422 and expected in reason, (code, reason)


@pytest.mark.parametrize("shell,expected", [
    ("/bin/no-such-shell", "cannot start '/bin/no-such-shell'"),
    ("no-such-shell", "cannot start 'no-such-shell'"),
    ("/etc", "cannot start '/etc'"),                  # a folder, not a program
    ("/" + "\u00e9" * 200, "cannot start '/\u00e9")])  # a reason cut to 123 bytes of UTF-8
def test_a_shell_that_cannot_start_closes_the_pty_with_4422_naming_it(local_service, shell,
                                                                       expected):
  """The spawner's failure reaches the client as the close code and reason, not as a normal
  closure (1000) that reads as a shell which ran and exited; the sandbox stays usable."""
  import asyncio
  import urllib.parse

  import websockets

  async def close_of(url):
    async with websockets.connect(url, additional_headers={"X-API-Key": local_service.api_key},
                                  open_timeout=30) as ws:
      with pytest.raises(websockets.ConnectionClosed):
        while True:   # a shell that never started writes nothing
          await asyncio.wait_for(ws.recv(), 30)
      return ws.close_code, ws.close_reason

  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box = client.create_sandbox()
    url = (local_service.url.replace("http", "ws", 1) + f"/v1/sandboxes/{box.id}/pty?"
           + urllib.parse.urlencode({"shell": shell}))
    code, reason = asyncio.run(close_of(url))
    assert box.exec("echo still here").stdout == "still here\n"
  assert code == 4422 and reason.startswith(expected), (code, reason)
  assert len(reason.encode()) <= 123


def test_a_shell_that_exits_closes_the_pty_normally(local_service):
  import asyncio

  import websockets

  async def close_of(url):
    async with websockets.connect(url, additional_headers={"X-API-Key": local_service.api_key},
                                  open_timeout=30) as ws:
      await ws.send(b"exit 3\n")
      with pytest.raises(websockets.ConnectionClosed):
        while True:
          await asyncio.wait_for(ws.recv(), 30)
      return ws.close_code

  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    box = client.create_sandbox()
    url = local_service.url.replace("http", "ws", 1) + f"/v1/sandboxes/{box.id}/pty"
    assert asyncio.run(close_of(url)) == 1000
