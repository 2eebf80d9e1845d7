"""Test-wide set-up: eight XLA host devices on CPU, so sharding tests can build real meshes.

This must run before jax is imported anywhere, which pytest guarantees for a root conftest.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# JAX's persistent compilation cache, as the launchers use it (launch/compile_cache.py): the
# suite builds many engines and trainers of the same tiny shapes, in this process and in the
# launcher processes it starts, and each would compile the same XLA programs again. Loading
# them from disk changes no result (the same executable) and no trace count (`compile_count`
# counts traces, which still happen). A test that needs its own cache sets the variable itself.
from launch import compile_cache  # noqa: E402

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", compile_cache.default_folder())
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                      str(compile_cache.MIN_COMPILE_TIME_S))

# mini-swe-agent (a test dependency) writes a config folder under $HOME when first imported, and
# litellm fetches a price table from the network on import. The first test to import them fixes
# these for the whole session, so set them here, before any test runs.
import tempfile  # noqa: E402

os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-config-"))
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Hypothesis for every property test: no per-example deadline, since a deadline times the
# machine, not the code (on a loaded 2-core CI runner a pure-Python example can pass 200 ms,
# and a jitted one always does on its first, compiling call), and failures print the
# @reproduce_failure blob, so an example drawn once in CI can be replayed exactly. A test's own
# @settings still override both.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("orchard", deadline=None, print_blob=True)
_hypothesis_settings.load_profile("orchard")
