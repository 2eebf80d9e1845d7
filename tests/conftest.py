"""Test-wide set-up: eight XLA host devices on CPU, so sharding tests can build real meshes.

This must run before jax is imported anywhere, which pytest guarantees for a root conftest.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
