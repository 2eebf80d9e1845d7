"""Fixtures of the distillation tests: a real Orchard Env service (local bubblewrap backend), a
real SWE instance, and the experiment config pointed at both."""
import pytest

from experiments import swe_distill as experiment

@pytest.fixture(scope="session")
def env_service():
  """(url, api_key) of an Orchard Env service for the whole session."""
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.orchestrator import Orchestrator
  with Orchestrator(LocalBackend()) as service:
    yield service.url, service.api_key


@pytest.fixture(scope="session")
def env_client(env_service):
  from orchard_jax.env.client import SandboxClient
  with SandboxClient(*env_service) as client:
    yield client


@pytest.fixture(scope="session")
def task_set():
  """A small real task set (parse bugs); instances[0] is the one the tests run."""
  from tests.parse_tasks import parse_task_set
  return parse_task_set()


@pytest.fixture(scope="session")
def tok():
  from orchard_jax.data import tiny_tokenizer
  return tiny_tokenizer()


@pytest.fixture(scope="session")
def distill_config(env_service, task_set):
  """make(workdir, **distill) -> experiments/swe_distill.py's config on the first task of
  `task_set`, sandboxes from `env_service`, one attempt at a time unless `parallel` is given."""
  def make(workdir, **distill):
    config = experiment.get_config()
    config.workdir = str(workdir)
    config.progress = False
    config.tasks.dataset, config.tasks.limit = task_set.path, 1
    config.env.url, config.env.api_key = env_service
    config.distill.update(dict(dict(parallel=1), **distill))
    return config
  return make
