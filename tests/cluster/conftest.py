"""Fixtures of the cluster tests: the fake Kubernetes API server (tests/cluster/fake_kube.py).

The helper module is loaded from its file: the test tree is not an importable package (an
unrelated `tests` package in site-packages would shadow it).
"""
import importlib.util
import os

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))


def load_helper(name: str):
  """Imports tests/cluster/<name>.py as a module."""
  path = os.path.join(_HERE, f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"_cluster_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def fake_kube():
  """A running fake Kubernetes API server (no real one can run on this machine)."""
  with load_helper("fake_kube").FakeKubeAPI() as api:
    yield api


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
  """A real redis-server on a free local port, for one test module."""
  with load_helper("redis_server").RedisServer(tmp_path_factory.mktemp("redis")) as server:
    yield server
