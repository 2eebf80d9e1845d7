"""Builds a zip application from modules of this repository, under their own import paths.

`build("orchard_jax.tasks.claw.services.__main__", ["orchard_jax.tasks.claw.services",
"orchard_jax.tasks.sandbox_app.supervisor"])` gives the bytes of a zip that `python3 -S app.pyz
ARGS` runs as `main(sys.argv)` of the first module. Each named package contributes the .py files
of its folder, each named module its one file; every package above them is an empty
`__init__.py` in the zip (the real ones import the rest of the library), so the code inside
must use only the standard library and what it names. Beside each source file the zip carries
the bytecode compiled by this interpreter (zipimport cannot cache bytecode, and compiling the
sources took a third of a Claw service's start-up); an interpreter of another version ignores
it and compiles the sources. The bytes are identical for identical sources and interpreter
(fixed timestamps, unchecked hash-based pycs, PEP 552), so a copy can be checked by hash.
"""
from __future__ import annotations

import importlib.util
import io
import marshal
import os
import zipfile
from typing import Sequence

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))          # the folder that holds orchard_jax/
_TIMESTAMP = (2026, 1, 1, 0, 0, 0)


def build(main: str, modules: Sequence[str]) -> bytes:
  """The zip application's bytes.

  Args:
    main: the dotted module whose `main(argv)` the zip runs (it must be among `modules` or in
      one of their packages).
    modules: dotted names of packages (every .py file of the folder, not its subfolders) and
      single modules, all under orchard_jax.
  Raises:
    ValueError: a name is neither a package folder nor a module file of this repository, or
      `main` is not included.
  """
  files: dict[str, bytes] = {}
  for name in modules:
    path = os.path.join(_ROOT, *name.split("."))
    if os.path.isfile(os.path.join(path, "__init__.py")):
      for entry in sorted(os.listdir(path)):
        if entry.endswith(".py"):
          files[f"{name.replace('.', '/')}/{entry}"] = _read(os.path.join(path, entry))
    elif os.path.isfile(path + ".py"):
      files[name.replace(".", "/") + ".py"] = _read(path + ".py")
    else:
      raise ValueError(f"zip application: {name!r} is neither a package nor a module under "
                       f"{_ROOT}")
  if main.replace(".", "/") + ".py" not in files:
    raise ValueError(f"zip application: the main module {main!r} is not among {list(modules)}")
  for arcname in list(files):             # empty parents, so every package imports
    parts = arcname.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
      files.setdefault("/".join(parts[:depth]) + "/__init__.py", b"")
  files["__main__.py"] = f"import sys\nfrom {main} import main\nmain(sys.argv)\n".encode()
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
    for arcname in sorted(files):
      _add(archive, arcname, files[arcname])
      if arcname != "__main__.py":          # a zip's __main__ is run from source
        _add(archive, arcname + "c", _bytecode(files[arcname], arcname))
  return buffer.getvalue()


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
  info = zipfile.ZipInfo(name, date_time=_TIMESTAMP)
  info.compress_type = zipfile.ZIP_DEFLATED
  info.external_attr = 0o644 << 16
  archive.writestr(info, data)


def _bytecode(source: bytes, filename: str) -> bytes:
  """A .pyc of `source` for this interpreter: magic, flags 0b11 (hash-based, unchecked), the
  source hash, then the marshalled code (PEP 552)."""
  code = compile(source, filename, "exec", dont_inherit=True)
  return (importlib.util.MAGIC_NUMBER + (3).to_bytes(4, "little")
          + importlib.util.source_hash(source) + marshal.dumps(code))
