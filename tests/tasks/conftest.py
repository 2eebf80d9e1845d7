"""Shared fixtures: a real Orchard Env service (local bubblewrap backend) and a small real task
set built from the `parse` package (cached in the user's cache folder after the first run)."""
import pytest


@pytest.fixture(scope="session")
def env_client():
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.client import SandboxClient
  from orchard_jax.env.orchestrator import Orchestrator
  with Orchestrator(LocalBackend()) as service, SandboxClient(service.url, service.api_key) as c:
    yield c


@pytest.fixture(scope="session")
def parse_tasks():
  from tests.parse_tasks import parse_task_set
  return parse_task_set()
