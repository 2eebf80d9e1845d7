"""An engine scheduler stopped while its thread is inside a long JAX computation (a compile of a
new shape, a long prefill) waits for that step to end, so the process exits cleanly. A daemon
thread left inside XLA when the interpreter exits is cancelled there and glibc aborts the
process ("FATAL: exception not rethrown", exit 134): claw_eval with the Codex harness died that
way after printing its results. The scheduler runs in a child process (the fault is a process
exit) with no model: the long step is a control function, which the thread runs in its loop."""
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import threading, time, types
    import jax, jax.numpy as jnp
    from orchard_jax.rollout.scheduler import Scheduler

    @jax.jit
    def work(x):
      return jax.lax.fori_loop(0, 200, lambda i, y: jnp.tanh(y @ y), x)

    x = jnp.ones((256, 256)) / 256
    work(x).block_until_ready()                       # compiled before the thread runs it
    started = threading.Event()

    def long_step():                                  # ~2 s of XLA work, far past stop_warn_s
      started.set()
      end = time.monotonic() + 2.0
      steps = 0
      while time.monotonic() < end:
        work(x).block_until_ready()
        steps += 1
      return steps

    config = types.SimpleNamespace(max_batch_size=1, admission_wait_s=0.0)
    scheduler = Scheduler(None, None, config, recurrent=False, name="engine-test")
    scheduler.stop_warn_s = 0.2
    scheduler.start()
    thread = scheduler._thread
    future = scheduler.post_control(long_step)
    started.wait(30)
    scheduler.stop()
    assert not thread.is_alive(), "stop() returned while the scheduling thread still ran"
    assert future.done() and future.result() > 0
    print("stopped cleanly", flush=True)
""")


def test_stop_waits_for_a_step_that_outlasts_the_warning_interval():
  proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "stopped cleanly" in proc.stdout
  assert "exception not rethrown" not in proc.stderr
  assert "still in a step" in proc.stderr              # the wait is reported, not silent
