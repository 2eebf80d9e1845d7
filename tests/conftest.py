"""Test-wide set-up: eight XLA host devices on CPU, so sharding tests can build real meshes.

This must run before jax is imported anywhere, which pytest guarantees for a root conftest.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# mini-swe-agent (a test dependency) writes a config folder under $HOME when first imported, and
# litellm fetches a price table from the network on import. The first test to import them fixes
# these for the whole session, so set them here, before any test runs.
import tempfile  # noqa: E402

os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-config-"))
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
