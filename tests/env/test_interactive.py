"""A port of a sandbox exposed at an authenticated, expiring URL (local backend: the fake
Kubernetes cluster has no pod network to reach arbitrary pod ports)."""
import time

import httpx
import pytest

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
