"""Fixtures of the env tests: a running Orchard Env service per backend, and SDK clients.

The contract suite runs once per backend: "local" (real bubblewrap sandboxes on this machine)
and "kubernetes" (the real KubernetesBackend against the fake Kubernetes API server in
tests/env/fake_kube.py: no Kubernetes cluster can run here, so the API server and kubelet are
stand-ins written for these tests; every pod still runs the real in-sandbox agent inside a
bubblewrap sandbox).
"""
import os
import shutil

import pytest

from orchard_jax.env import LocalBackend, Orchestrator, SandboxClient, ServiceConfig

BACKENDS = ["local", "kubernetes"]


@pytest.fixture(autouse=True, scope="session")
def _bubblewrap_installed():
  if shutil.which("bwrap") is None:
    pytest.fail("the env tests need bubblewrap: sudo apt-get install -y bubblewrap")


def make_config(**overrides) -> ServiceConfig:
  values = dict(reap_interval=0.2, default_exec_timeout=120.0, pending_timeout=30.0,
                tombstone_ttl=60.0)
  values.update(overrides)
  return ServiceConfig(**values)


@pytest.fixture(scope="session")
def image_root(tmp_path_factory):
  """A folder allowed as an image root for the tests."""
  return str(tmp_path_factory.mktemp("images"))


def _make_backend(kind, tmp_path_factory, image_root, stack):
  if kind == "local":
    return LocalBackend(state_dir=str(tmp_path_factory.mktemp("state")), image_roots=[image_root])
  from tests.env import fake_kube
  from orchard_jax.env.backends.kubernetes import KubernetesBackend, KubernetesConfig
  cluster = stack.enter_context(fake_kube.FakeCluster(str(tmp_path_factory.mktemp("cluster"))))
  backend = KubernetesBackend(
      KubernetesConfig(namespace="orchard-test", agent_image="orchard-agent:test",
                       creation_qps=50.0, node_pids_limit=fake_kube.NODE_PIDS_LIMIT),
      api_client=cluster.api_client())
  backend.cluster = cluster
  return backend


@pytest.fixture(scope="module", params=BACKENDS)
def service(request, tmp_path_factory, image_root):
  """The service on one backend, with two tenants and an admin: `api_key` is alice's,
  `keys` = {"alice": .., "bob": .., "admin": ..}."""
  import contextlib
  import secrets
  keys = {name: secrets.token_urlsafe(18) for name in ("alice", "bob", "admin")}
  with contextlib.ExitStack() as stack:
    backend = _make_backend(request.param, tmp_path_factory, image_root, stack)
    svc = stack.enter_context(Orchestrator(
        backend, config=make_config(), api_keys={"alice": keys["alice"], "bob": keys["bob"]},
        admin_keys={"ops": keys["admin"]}))
    svc.backend_kind = request.param
    svc.keys = keys
    yield svc


@pytest.fixture
def client(service):
  with SandboxClient(service.url, service.api_key) as c:
    yield c


@pytest.fixture
def box(client):
  with client.create_sandbox(memory="1Gi", pids=256) as b:
    yield b


def host_pids_with(marker: str) -> list:
  """Host pids whose command line contains `marker`."""
  found = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if marker.encode() in f.read().replace(b"\0", b" "):
          found.append(int(pid))
    except OSError:
      pass
  return found
