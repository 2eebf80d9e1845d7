"""The services package as one zip application, the single file copied into each sandbox.

`python3 -S services.pyz start` runs `orchard_jax/tasks/claw/services/__main__.py` from the zip
(sandbox_app.zipapp: the standard-library services package and the shared supervisor), so any
image with a Python 3.9+ interpreter runs it; the bytecode it carries spares the start-up the
compiling. Its bytes are identical for identical sources and interpreter, so a copy can be
checked by hash.
"""
from __future__ import annotations

import functools
import hashlib

from orchard_jax.tasks.sandbox_app import zipapp

SANDBOX_PATH = "/tmp/claw/services.pyz"
MODULES = ("orchard_jax.tasks.claw.services", "orchard_jax.tasks.sandbox_app.supervisor")


@functools.lru_cache(maxsize=1)
def services_zipapp() -> bytes:
  """The zip application's bytes (built on first use, then cached)."""
  return zipapp.build("orchard_jax.tasks.claw.services.__main__", MODULES)


def bundle_digest() -> str:
  """sha256 of the zip application (its version, for logs and caches)."""
  return hashlib.sha256(services_zipapp()).hexdigest()
