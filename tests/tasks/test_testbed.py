"""The sandbox seam: command results from a real Orchard Env sandbox, including one that is
deleted while its command runs (a sandbox failure, never a timeout)."""
import threading
import time

from orchard_jax.tasks.swe.testbed import open_sandbox


def test_exit_codes_timeouts_and_files(env_client):
  with open_sandbox(env_client, "host") as sandbox:
    ok = sandbox.run("echo out; echo err >&2; exit 3", timeout_s=30)
    assert ok.exit_code == 3 and "out" in ok.output and "err" in ok.output
    assert not ok.timed_out and not ok.failed
    slow = sandbox.run("sleep 20", timeout_s=1)
    assert slow.timed_out and slow.exit_code == 124 and not slow.failed
    sandbox.write_file("/tmp/x/data.bin", b"\x00\x01hello")
    assert sandbox.run("od -c /tmp/x/data.bin | head -1", timeout_s=30).output.split()[1:4] == [
        "\\0", "001", "h"]


def test_a_sandbox_that_dies_mid_command_is_a_failure_not_a_timeout(env_client):
  with open_sandbox(env_client, "host") as sandbox:
    killer = threading.Timer(1.0, lambda: env_client.delete_sandbox(sandbox.box.id))
    killer.start()
    start = time.monotonic()
    result = sandbox.run("sleep 30", timeout_s=60)
    killer.join()
  assert time.monotonic() - start < 30
  assert result.failed and not result.timed_out and result.exit_code == -1
