"""launch/host_malloc.py: glibc's mmap threshold fixed for launched processes."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from launch import host_malloc  # noqa: E402

glibc = pytest.mark.skipif(host_malloc._glibc() is None, reason="glibc's malloc only")


@glibc
def test_the_threshold_is_put_in_the_environment_of_started_processes():
  env = {}
  assert host_malloc.configure(env) == "mmap"
  assert env[host_malloc.GLIBC_ENV] == str(host_malloc.MMAP_THRESHOLD)
  assert host_malloc.configure(env) == "environment"          # idempotent, and a user's own
  env = {host_malloc.GLIBC_ENV: "65536"}                       # setting is kept
  assert host_malloc.configure(env) == "environment" and env[host_malloc.GLIBC_ENV] == "65536"
  env = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}
  assert host_malloc.configure(env) == "environment" and host_malloc.GLIBC_ENV not in env


def test_glibc_default_on_request_and_a_misspelt_choice_is_one_clear_error():
  env = {host_malloc.ENV: "default"}
  assert host_malloc.configure(env) == "default" and host_malloc.GLIBC_ENV not in env
  with pytest.raises(ValueError, match="ORCHARD_JAX_MALLOC is 'mmaps'"):
    host_malloc.configure({host_malloc.ENV: "mmaps"})


# A fresh process frees a 16 MiB buffer (glibc then raises its dynamic threshold to 16 MiB),
# allocates and touches 48 buffers of 4 MiB and one of 900 KiB after them (so the heap's top cannot
# be trimmed), frees the 48 and prints how much of their 192 MiB is still resident.
_PROBE = """
import ctypes, sys
sys.path.insert(0, {root!r})
from launch import host_malloc
if {choice!r}:
  assert host_malloc.configure() == {choice!r}
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def rss():
  return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
libc.free(libc.malloc(16 << 20))
before = rss()
chunks = [libc.malloc(4 << 20) for _ in range(48)]
for c in chunks:
  ctypes.memset(c, 1, 4 << 20)
sentinel = libc.malloc(900 << 10)
for c in chunks:
  libc.free(c)
print((rss() - before) / 1024)
"""


def _kept_mib(choice: str, parent_choice: str = "default") -> float:
  """MiB the probe keeps of its 192. It calls configure() itself when `choice` is set; its
  environment is the one a parent with ORCHARD_JAX_MALLOC=`parent_choice` gives it."""
  env = {k: v for k, v in os.environ.items()
         if k not in (host_malloc.ENV, host_malloc.GLIBC_ENV, "GLIBC_TUNABLES")}
  env[host_malloc.ENV] = parent_choice
  host_malloc.configure(env)
  if choice:
    env[host_malloc.ENV] = choice
  out = subprocess.run([sys.executable, "-c", _PROBE.format(root=ROOT, choice=choice)],
                       env=env, capture_output=True, text=True, timeout=60, check=True)
  return float(out.stdout)


@glibc
def test_freed_large_buffers_go_back_to_the_system_with_it_and_stay_without():
  assert _kept_mib("default") > 150    # glibc's dynamic threshold: the arena keeps them
  assert _kept_mib("mmap") < 16         # fixed threshold: each was mmapped and unmapped
  assert _kept_mib("", parent_choice="mmap") < 16   # a process its parent configured
