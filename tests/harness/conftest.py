"""Shared fixtures: a real Orchard Env service (local bubblewrap backend) and its client."""
import pytest


@pytest.fixture(scope="session")
def env_client():
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.client import SandboxClient
  from orchard_jax.env.orchestrator import Orchestrator
  with Orchestrator(LocalBackend()) as service, SandboxClient(service.url, service.api_key) as c:
    yield c
