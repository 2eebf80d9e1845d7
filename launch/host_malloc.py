"""glibc malloc settings for launched processes: large buffers mmapped and returned on free.

XLA:CPU allocates each program's output buffers and scratch with the C library's malloc. glibc
serves a request above its mmap threshold with its own mmap and returns it to the system on
free; below, from an arena (the heap), whose freed space stays in the process. The threshold
starts at 128 KiB but is dynamic: whenever an mmapped chunk is freed, glibc raises it to that
chunk's size (up to 32 MiB on 64-bit), so after the first training step every buffer up to 32
MiB (a [4096, 512] float32 activation is 8 MiB, an expert weight's gradient 16 MiB at the
`small` preset) comes from the arenas instead, and the next steps' buffers do not always fit
where the last ones were freed: the process's resident size grows by up to one step's outputs
a step, by an amount that changes from run to run.

Measured on the `small` qwen3_moe forward + backward (launch/benchmarks/model.py's worker, 1 +
3 steps; XLA's memory analysis: temp 1.84 GB, arguments and outputs 0.43 GB each, 1.0 GB
resident after compilation, so 3.27 GB live at the step's peak), peak RSS over five runs with
glibc's defaults 3.83-4.69 GB (one run grew 0.43 GB every step: 3.41, 3.85, 4.28, 4.69), with
M_ARENA_MAX 2 4.08 GB (still growing), with the threshold fixed at 1 MiB 3.345 and 3.348 GB,
the same at every step. The price is page faults: each step maps its buffers afresh, 1.2 M
minor faults a step instead of 0.5-0.6 M, system time 4.3 instead of 1.6-2.1 s of 26-28 CPU
seconds (all threads; at load 6-9, nice 10): about 10% more CPU a step. Transparent huge pages
for them (glibc.malloc.hugetlb=1) cut the faults to 0.28 M but cost more system time (6.7-7.3
s, compaction). ORCHARD_JAX_MALLOC=default trades the steady peak back for that time.

`configure` fixes the threshold (which also turns off its dynamic adjustment; mallopt(3),
M_MMAP_THRESHOLD), so every buffer of MMAP_THRESHOLD bytes or more is mmapped and unmapped on
free, for this process (mallopt through ctypes) and for processes it starts (glibc's
MALLOC_MMAP_THRESHOLD_ environment variable, read at their start). Small allocations (Python
objects, XLA's bookkeeping) still come from the arenas.

Environment variable ORCHARD_JAX_MALLOC: unset or "mmap" to apply it, "default" to leave glibc
as it is. A MALLOC_MMAP_THRESHOLD_ (or GLIBC_TUNABLES naming glibc.malloc.mmap_threshold)
already in the environment is left as it is, as is a C library other than glibc.
"""
import ctypes
import ctypes.util
import os
from collections.abc import MutableMapping

ENV = "ORCHARD_JAX_MALLOC"
CHOICES = ("mmap", "default")
# Buffers from 1 MiB up are mmapped (16 MiB measured the same peak and fault count at small).
MMAP_THRESHOLD = 1 << 20
GLIBC_ENV = "MALLOC_MMAP_THRESHOLD_"
_M_MMAP_THRESHOLD = -3                      # mallopt(3) parameter number (glibc malloc.h)


def configure(environ: MutableMapping[str, str] = os.environ) -> str:
  """Applies ORCHARD_JAX_MALLOC's choice to this process and to `environ` (inherited by the
  processes this one starts).

  Call early in a process's life (before large buffers are allocated; launch/run.py and the
  benches do it first thing): chunks allocated before stay where they are.

  Args:
    environ: the environment to read and update (default: this process's). Only with
      os.environ is this process's own malloc changed; another mapping is the environment of a
      process about to be started.
  Returns:
    "mmap" (applied), "default", "environment" (the environment already sets the threshold),
    or "unavailable" (the C library is not glibc; nothing changed).
  Raises:
    ValueError: ORCHARD_JAX_MALLOC is not one of CHOICES.
  """
  choice = environ.get(ENV, "mmap").strip().lower() or "mmap"
  if choice not in CHOICES:
    raise ValueError(f"{ENV} is {environ[ENV]!r}; expected one of {list(CHOICES)}")
  if choice == "default":
    return "default"
  if GLIBC_ENV in environ or "glibc.malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", ""):
    return "environment"
  libc = _glibc()
  if libc is None:
    return "unavailable"
  environ[GLIBC_ENV] = str(MMAP_THRESHOLD)
  if environ is os.environ and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
    raise OSError(f"mallopt(M_MMAP_THRESHOLD, {MMAP_THRESHOLD}) failed")
  return "mmap"


def _glibc():
  """This process's C library through ctypes when it is glibc (it has gnu_get_libc_version),
  else None."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  except OSError:
    return None
  if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
    return None
  libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  libc.mallopt.restype = ctypes.c_int
  return libc
