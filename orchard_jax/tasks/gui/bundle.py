"""The in-sandbox driver as one zip application, the single file copied into each browser sandbox.

`python driver.pyz start` runs `driver/__main__.py` from the zip (package `gui_driver`). The
archive holds only orchard_jax/tasks/gui/driver (standard library plus Playwright, which the
sandbox's Python must have); its bytes are identical for identical sources (fixed timestamps),
so a copy can be checked by hash.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import zipfile

PACKAGE = "gui_driver"
SANDBOX_PATH = "/tmp/orchard-gui/driver.pyz"
_SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver")
_ENTRY = f"import sys\nfrom {PACKAGE}.__main__ import main\nmain(sys.argv)\n"


@functools.lru_cache(maxsize=1)
def driver_zipapp() -> bytes:
  """The zip application's bytes (built on first use, then cached)."""
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
    def add(name: str, data: bytes) -> None:
      info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      info.external_attr = 0o644 << 16
      archive.writestr(info, data)
    add("__main__.py", _ENTRY.encode())
    for name in sorted(os.listdir(_SOURCE_DIR)):
      if name.endswith(".py"):
        with open(os.path.join(_SOURCE_DIR, name), "rb") as f:
          add(f"{PACKAGE}/{name}", f.read())
  return buffer.getvalue()


def bundle_digest() -> str:
  """sha256 of the zip application (its version, for logs)."""
  return hashlib.sha256(driver_zipapp()).hexdigest()
