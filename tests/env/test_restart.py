"""After the service is killed with SIGKILL while sandboxes run, nothing of them survives, and
a restart with the same state directory removes every leftover (records, cgroups, files)."""
import glob
import os
import time

from orchard_jax.env import SandboxClient, ServiceProcess
from tests.env.conftest import host_pids_with

MARKER = "577215"


def _wait_until(predicate, timeout):
  deadline = time.monotonic() + timeout
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.05)
  return predicate()


def _cgroup_dirs(sandbox_id):
  return glob.glob(f"/sys/fs/cgroup/*/**/orchard-env-*/{sandbox_id}", recursive=True)


def test_sigkill_then_restart_leaves_no_process_mount_or_folder(tmp_path):
  state = tmp_path / "state"
  args = ["--state-dir", str(state), "--log-level", "warning"]
  with ServiceProcess(args) as service:
    client = SandboxClient(service.url, service.api_key)
    ids = []
    for _ in range(3):
      box = client.create_sandbox(pids=128)
      box.exec(f"sleep {MARKER} &")
      ids.append(box.id)
    assert len(host_pids_with(f"sleep {MARKER}")) == 3
    assert all(_cgroup_dirs(i) for i in ids) or not os.path.exists("/sys/fs/cgroup/pids")
    client._owned.clear()   # a crash: nobody deletes anything
    service.kill()
  assert _wait_until(lambda: host_pids_with(f"sleep {MARKER}") == [], 15), \
      "sandbox processes outlived the killed service"
  leftovers = sorted(os.listdir(state / "sandboxes"))
  assert leftovers == sorted(f"{i}.json" for i in ids)   # what a restart has to clean

  with ServiceProcess(args) as service:
    with SandboxClient(service.url, service.api_key) as client:
      assert client.list_sandboxes() == []
      assert os.listdir(state / "sandboxes") == []
      for sandbox_id in ids:
        assert _cgroup_dirs(sandbox_id) == []
      with open("/proc/self/mountinfo") as f:
        mounts = f.read()
      assert str(state) not in mounts and not any(i in mounts for i in ids)
      box = client.create_sandbox()   # and the restarted service works
      assert box.exec("echo ok").stdout == "ok\n"


def test_services_sharing_a_state_dir_never_reap_each_others_sandboxes(tmp_path):
  state = tmp_path / "state"
  args = ["--state-dir", str(state), "--log-level", "warning"]
  with ServiceProcess(args) as first, SandboxClient(first.url, first.api_key) as client:
    box = client.create_sandbox()
    with ServiceProcess(args) as second:   # reconciles at start: box is not its orphan
      with SandboxClient(second.url, second.api_key) as other:
        assert other.list_sandboxes() == []
    assert box.exec("echo still here").stdout == "still here\n"
