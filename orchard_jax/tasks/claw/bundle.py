"""The services package as one zip application, the single file copied into each sandbox.

`python3 -S services.pyz start` runs `services/__main__.py` from the zip. The archive holds
only the standard-library package `orchard_jax/tasks/claw/services` (as `claw_services/`), so
any image with a Python 3.9+ interpreter runs it. Beside each source file it carries the
bytecode compiled by this interpreter (zipimport cannot cache bytecode, and compiling the
sources took a third of a service's start-up); an interpreter of another version ignores it
and compiles the sources. The bytes are built once per process and are identical for identical
sources and interpreter (fixed timestamps, unchecked-hash pycs), so a copy can be checked by
hash.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import marshal
import os
import zipfile

PACKAGE = "claw_services"
SANDBOX_PATH = "/tmp/claw/services.pyz"
_SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "services")
_ENTRY = (f"import sys\nfrom {PACKAGE}.__main__ import main\nmain(sys.argv)\n")


@functools.lru_cache(maxsize=1)
def services_zipapp() -> bytes:
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
          source = f.read()
        add(f"{PACKAGE}/{name}", source)
        add(f"{PACKAGE}/{name}c", _bytecode(source, f"{PACKAGE}/{name}"))
  return buffer.getvalue()


def _bytecode(source: bytes, filename: str) -> bytes:
  """A .pyc of `source` for this interpreter: magic, flags 0b11 (hash-based, unchecked),
  the source hash, then the marshalled code (PEP 552)."""
  code = compile(source, filename, "exec", dont_inherit=True)
  return (importlib.util.MAGIC_NUMBER + (3).to_bytes(4, "little")
          + importlib.util.source_hash(source) + marshal.dumps(code))


def bundle_digest() -> str:
  """sha256 of the zip application (its version, for logs and caches)."""
  return hashlib.sha256(services_zipapp()).hexdigest()
