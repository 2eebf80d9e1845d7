"""Interactive features on the local backend: a shell on a PTY over WebSocket, and a port of a
sandbox exposed at an authenticated, expiring URL."""
import time

import httpx
import pytest
from websockets.sync.client import connect

from orchard_jax import env as orchard_env
from tests.env.conftest import make_config


@pytest.fixture(scope="module")
def local_service(tmp_path_factory):
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path_factory.mktemp("state")))
  with orchard_env.Orchestrator(backend, config=make_config()) as service:
    yield service


@pytest.fixture
def client(local_service):
  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as c:
    yield c


def _read_until(ws, needle: bytes, timeout=20.0) -> bytes:
  seen = b""
  deadline = time.monotonic() + timeout
  while needle not in seen:
    message = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
    seen += message if isinstance(message, bytes) else message.encode()
  return seen


def test_pty_shell_over_websocket(client, local_service):
  with client.create_sandbox() as box:
    url = box.pty_url() + "?rows=30&cols=100"
    with connect(url, additional_headers={"X-API-Key": local_service.api_key}) as ws:
      ws.send(b"test -t 0 && echo on-a-terminal; stty size; echo $((6 * 7))-done\n")
      out = _read_until(ws, b"42-done\r\n")
      assert b"on-a-terminal\r\n30 100\r\n" in out   # a real terminal of the asked size
      ws.send('{"type": "resize", "rows": 50, "cols": 132}')
      ws.send(b"stty size\n")
      assert b"50 132" in _read_until(ws, b"50 132")
      ws.send(b"exit\n")
      with pytest.raises(Exception):
        _read_until(ws, b"never printed", timeout=10)
    with pytest.raises(Exception):
      with connect(url, additional_headers={"X-API-Key": "wrong"}) as ws:
        ws.recv(timeout=5)


def test_exposed_port_is_reachable_until_removed_or_expired(client):
  box = client.create_sandbox()
  box.upload("site/hello.txt", "served from the sandbox\n")
  box.start("cd site && exec python3 -m http.server 8000 --bind 127.0.0.1")
  deadline = time.monotonic() + 20
  while box.exec("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000))\"").exit_code:
    assert time.monotonic() < deadline
    time.sleep(0.1)
  exposure = box.expose_port(8000, ttl=600)
  url = exposure["url"]
  response = httpx.get(url + "hello.txt")   # no API key: the URL's token is the credential
  assert response.status_code == 200 and response.text == "served from the sandbox\n"
  assert httpx.get(url.replace(exposure["id"], "not-the-token") + "hello.txt").status_code == 404
  box.unexpose_port(exposure["id"])
  assert httpx.get(url + "hello.txt").status_code == 404
  short = box.expose_port(8000, ttl=0.5)
  assert httpx.get(short["url"] + "hello.txt").status_code == 200
  time.sleep(0.8)
  assert httpx.get(short["url"] + "hello.txt").status_code == 404
  last = box.expose_port(8000)
  assert httpx.get(last["url"] + "hello.txt").status_code == 200
  box.delete()
  assert httpx.get(last["url"] + "hello.txt").status_code == 404
