"""The Orchard Env client a run's episodes act through, from a config's `env` block."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence


@contextlib.contextmanager
def sandbox_client(env, *, shared_paths: Sequence[str] = ()) -> Iterator:
  """An Orchard Env SandboxClient: to `env.url` (with `env.api_key`) if set, else to an
  in-process service with the local bubblewrap backend, stopped on leaving.

  Args:
    env: the config's env block (url, api_key).
    shared_paths: host folders the local backend shows read-only at the same path in every
      sandbox (e.g. an external harness's install folder); ignored for a remote service.
  """
  from orchard_jax.env.client import SandboxClient
  if env.url:
    with SandboxClient(env.url, env.api_key or None) as client:
      yield client
    return
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.orchestrator import Orchestrator
  with Orchestrator(LocalBackend(shared_paths=list(shared_paths))) as service, \
      SandboxClient(service.url, service.api_key) as client:
    yield client
