"""launch/xla_env.py: the XLA:CPU scheduler a launched process compiles with."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from launch import xla_env  # noqa: E402


def test_the_memory_schedule_is_added_to_existing_flags():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert xla_env.configure(env) == "memory"
  assert env["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                              "--xla_cpu_enable_concurrency_optimized_scheduler=false")
  assert xla_env.configure(env) == "XLA_FLAGS"             # idempotent: added once
  assert env["XLA_FLAGS"].count("concurrency_optimized") == 1


def test_xla_default_on_request_and_a_users_own_flag_is_kept():
  env = {xla_env.ENV: "concurrency"}
  assert xla_env.configure(env) == "concurrency" and "XLA_FLAGS" not in env
  mine = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
  env = {"XLA_FLAGS": mine}
  assert xla_env.configure(env) == "XLA_FLAGS" and env["XLA_FLAGS"] == mine


def test_a_misspelt_choice_is_one_clear_error():
  with pytest.raises(ValueError, match="ORCHARD_JAX_CPU_SCHEDULER is 'memroy'"):
    xla_env.configure({xla_env.ENV: "memroy"})


def test_xla_accepts_the_flag_and_schedules_for_memory():
  # A fresh process with the flag set compiles and runs (XLA rejects unknown flags at backend
  # start), and the memory schedule does not hold a later stage's buffers early: two chained
  # loops whose second starts from a zero buffer of its own.
  code = (
      "import jax, jax.numpy as jnp\n"
      "def f(x):\n"
      "  ys = [jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) + x, jnp.zeros_like(x))"
      " for _ in range(6)]\n"
      "  return sum(ys)\n"
      "x = jnp.ones((256, 1024))\n"
      "c = jax.jit(f).lower(x).compile()\n"
      "print(c.memory_analysis().temp_size_in_bytes, float(c(x).sum()))\n")
  def temp(scheduler):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", **{xla_env.ENV: scheduler})
    xla_env.configure(env)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return [float(v) for v in out.stdout.split()]
  memory, concurrency = temp("memory"), temp("concurrency")
  assert memory[1] == concurrency[1]                        # same result
  assert memory[0] <= concurrency[0]
