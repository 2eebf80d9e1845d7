"""The in-sandbox driver as one zip application, the single file copied into each browser sandbox.

`python driver.pyz start` runs `orchard_jax/tasks/gui/driver/__main__.py` from the zip
(sandbox_app.zipapp: the driver package and the shared supervisor, standard library plus
Playwright, which the sandbox's Python must have). Its bytes are identical for identical sources
and interpreter, so a copy can be checked by hash.
"""
from __future__ import annotations

import functools
import hashlib

from orchard_jax.tasks.sandbox_app import zipapp

SANDBOX_PATH = "/tmp/orchard-gui/driver.pyz"
MODULES = ("orchard_jax.tasks.gui.driver", "orchard_jax.tasks.sandbox_app.supervisor")


@functools.lru_cache(maxsize=1)
def driver_zipapp() -> bytes:
  """The zip application's bytes (built on first use, then cached)."""
  return zipapp.build("orchard_jax.tasks.gui.driver.__main__", MODULES)


def bundle_digest() -> str:
  """sha256 of the zip application (its version, for logs)."""
  return hashlib.sha256(driver_zipapp()).hexdigest()
