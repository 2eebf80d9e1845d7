"""The Orchard Env contract: the HTTP service driven through the SDK, once per backend.

Every expectation here is what a user of a sandbox service relies on: lifecycle,
exec semantics, files, patches, auth, isolation, limits and reaping. Expected values are
written out in the tests (or computed with plain Python from the same inputs), never with
the code under test.
"""
import contextlib
import http.server
import socket
import threading
import time

import httpx
import pytest
from websockets.sync.client import connect

from orchard_jax import env as orchard_env
from tests.env.conftest import host_pids_with


# ---------------------------------------------------------------------------- lifecycle
def test_lifecycle_create_get_list_heartbeat_delete(client):
  box = client.create_sandbox(labels={"suite": "contract", "case": "lifecycle"}, timeout=600)
  assert box.state == "ready"
  info = client.sandbox(box.id).info
  assert info["id"] == box.id and info["state"] == "ready" and info["labels"]["case"] == "lifecycle"
  assert info["expires_at"] - info["created_at"] == pytest.approx(600, abs=1)
  listed = client.list_sandboxes(labels={"case": "lifecycle"})
  assert [s["id"] for s in listed] == [box.id]
  assert client.list_sandboxes(labels={"case": "no-such-label"}) == []
  before = box.info["last_heartbeat"]
  time.sleep(0.01)
  assert box.heartbeat()["last_heartbeat"] > before
  box.delete()
  with pytest.raises(orchard_env.SandboxNotFound, match="deleted by a client"):
    client.sandbox(box.id)
  with pytest.raises(orchard_env.SandboxNotFound):
    client.delete_sandbox("sbx-000000000000")


def test_client_close_deletes_what_it_created(service):
  with orchard_env.SandboxClient(service.url, service.api_key) as c:
    ids = [c.create_sandbox().id for _ in range(2)]
  with orchard_env.SandboxClient(service.url, service.api_key) as c:
    for sandbox_id in ids:
      with pytest.raises(orchard_env.SandboxNotFound):
        c.sandbox(sandbox_id)


def test_bad_requests_say_what_was_expected(client):
  with pytest.raises(orchard_env.InvalidRequest, match="memory"):
    client.create_sandbox(memory="lots")
  with pytest.raises(orchard_env.ImageError):
    client.create_sandbox(image="/definitely/not/an/allowed/image")


# ---------------------------------------------------------------------------- exec semantics
def test_exec_separates_streams_and_reports_exit_code(box):
  result = box.exec("echo out; echo err >&2; exit 3")
  assert (result.status, result.exit_code) == ("finished", 3)
  assert (result.stdout, result.stderr) == ("out\n", "err\n")
  assert not result.ok and result.duration > 0
  with pytest.raises(orchard_env.CommandFailed, match="exited with 3"):
    box.exec("exit 3", check=True)


def test_exec_merges_streams_in_order(box):
  result = box.exec("echo a; sleep 0.05; echo b >&2; sleep 0.05; echo c", merge_stderr=True)
  assert result.stdout == "a\nb\nc\n" and result.stderr == ""


def test_exec_argv_env_cwd_stdin(box):
  assert box.exec(["printf", "%s|", "a b", "c"]).stdout == "a b|c|"
  assert box.exec("echo $GREETING", env={"GREETING": "hello there"}).stdout == "hello there\n"
  assert box.exec("pwd").stdout.strip() == box.workdir
  assert box.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
  assert box.exec("wc -c", stdin=b"\x00" * 70000).stdout.strip() == "70000"
  failed = box.exec("true", cwd="/no/such/folder")
  assert failed.status == "failed" and "/no/such/folder" in failed.error


def test_exec_output_that_is_not_utf8(box):
  raw = bytes([0xFF, 0xFE, 0x00, 0x80]) + "é".encode("latin-1") + b"ok"
  result = box.exec("printf '\\377\\376\\000\\200\\351ok'")
  assert result.stdout_bytes == raw
  assert result.stdout == raw.decode("utf-8", errors="replace")


def test_exec_caps_huge_output_keeping_head_and_tail(box):
  result = box.exec("seq 1 200000", max_output_bytes=2000)
  full = "".join(f"{i}\n" for i in range(1, 200001)).encode()
  assert result.stdout_total_bytes == len(full)
  assert result.stdout_dropped_bytes == len(full) - 2000
  assert result.truncated
  assert result.stdout_bytes.startswith(full[:1000])
  assert result.stdout_bytes.endswith(full[-1000:])
  assert b"bytes omitted" in result.stdout_bytes[1000:-1000]
  big = box.exec("head -c 30000000 /dev/zero", max_output_bytes=1 << 20)
  assert big.stdout_total_bytes == 30_000_000 and len(big.stdout_bytes) < (1 << 20) + 100


def test_timeout_kills_the_whole_process_tree(box):
  marker = "271828"
  started = time.monotonic()
  result = box.exec(f"sleep {marker}1 & (sleep {marker}2 & sleep {marker}3) & sleep {marker}4",
                    timeout=1.5)
  assert result.status == "timed_out" and result.exit_code is None
  assert result.timed_out and time.monotonic() - started < 30
  left = box.exec("ps -eo args | grep -c '[s]leep 271828' || true").stdout.strip()
  assert left == "0"
  assert host_pids_with(f"sleep {marker}") == []


def test_background_processes_outlive_the_command_but_not_the_sandbox(client):
  box = client.create_sandbox()
  marker = "314159"
  started = time.monotonic()
  result = box.exec(f"sleep {marker} & echo started")   # the sleeper keeps stdout open
  assert result.stdout == "started\n" and time.monotonic() - started < 10
  assert box.exec(f"ps -eo args | grep -c '[s]leep {marker}'").stdout.strip() == "1"
  assert len(host_pids_with(f"sleep {marker}")) == 1
  box.delete()
  deadline = time.monotonic() + 10
  while host_pids_with(f"sleep {marker}") and time.monotonic() < deadline:
    time.sleep(0.05)
  assert host_pids_with(f"sleep {marker}") == []


def test_running_job_is_never_reported_finished(box):
  job = box.start("sleep 1.5; echo done")
  assert job.status == "running"
  info = job.refresh()
  assert info["status"] == "running" and info["exit_code"] is None
  with pytest.raises(TimeoutError):
    job.wait(timeout=0.2)
  result = job.wait()
  assert (result.status, result.exit_code, result.stdout) == ("finished", 0, "done\n")


def test_cancel_kills_a_running_job(box):
  job = box.start("sleep 600")
  result = job.cancel()
  assert result.status == "cancelled" and result.exit_code is None


# ---------------------------------------------------------------------------- files
def test_files_round_trip_binary_and_list(box):
  payload = bytes(range(256)) * 4096 + b"\r\n\x00end"
  box.upload("data/blob.bin", payload, mode=0o600)
  assert box.download("data/blob.bin") == payload
  assert box.download(f"{box.workdir}/data/blob.bin") == payload
  entries = box.list_files("data")
  assert [(e["name"], e["type"], e["size"], e["mode"]) for e in entries] == [
      ("blob.bin", "file", len(payload), 0o600)]
  assert box.exec("sha256sum data/blob.bin").stdout.split()[0] == __import__(
      "hashlib").sha256(payload).hexdigest()
  with pytest.raises(orchard_env.SandboxFileNotFound):
    box.download("data/missing.bin")
  with pytest.raises(orchard_env.FileOperationError):
    box.upload("/usr/evil.txt", b"x")


# ---------------------------------------------------------------------------- patches
_PATCH = """\
diff --git a/hello.py b/hello.py
--- a/hello.py
+++ b/hello.py
@@ -1,2 +1,2 @@
 def greet():
-  return "hello"
+  return "hello, world"
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+brand new
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-obsolete
"""


def test_apply_patch_modifies_creates_and_deletes(box):
  box.upload("hello.py", 'def greet():\n  return "hello"\n')
  box.upload("old.txt", "obsolete\n")
  result = box.apply_patch(_PATCH)
  assert result.applied and result.method == "git apply"
  assert box.download("hello.py") == b'def greet():\n  return "hello, world"\n'
  assert box.download("new.txt") == b"brand new\n"
  assert box.exec("test -e old.txt").exit_code == 1
  with pytest.raises(orchard_env.PatchError):
    box.apply_patch(_PATCH)   # already applied: the context no longer matches
  assert not box.apply_patch(_PATCH, check=False).applied


# ---------------------------------------------------------------------------- auth
def test_auth_missing_and_wrong_key(service):
  assert httpx.get(service.url + "/health").status_code == 200
  assert httpx.get(service.url + "/v1/sandboxes").status_code == 401
  assert httpx.get(service.url + "/v1/sandboxes",
                   headers={"X-API-Key": "wrong"}).status_code == 403
  with orchard_env.SandboxClient(service.url, "wrong") as bad:
    with pytest.raises(orchard_env.PermissionDenied):
      bad.list_sandboxes()
  assert httpx.get(service.url + "/metrics").status_code == 401


# ---------------------------------------------------------------------------- isolation
def test_sandboxes_cannot_see_each_others_files_or_processes(client):
  a, b = client.create_sandbox(), client.create_sandbox()
  a.exec("echo secret > secret.txt; echo secret > /tmp/secret.txt; sleep 161803 &")
  assert b.exec("cat secret.txt").exit_code != 0
  assert b.exec("cat /tmp/secret.txt").exit_code != 0
  assert b.exec("ps -eo args | grep -c '[s]leep 161803' || true").stdout.strip() == "0"
  assert a.exec("ps -eo args | grep -c '[s]leep 161803'").stdout.strip() == "1"
  assert b.exec("touch /usr/bin/evil").exit_code != 0   # the image is read-only
  assert b.exec("test -e /root/.bash_history -o -e /root/.cache").exit_code != 0
  a.delete()
  b.delete()


def _outbound_address():
  """This machine's address on its default route (what another machine would connect to),
  or None when it has no route out."""
  probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
  try:
    probe.connect(("198.51.100.1", 9))   # a documentation address: nothing is sent
    return probe.getsockname()[0]
  except OSError:
    return None
  finally:
    probe.close()


@contextlib.contextmanager
def _http_server(host, body):
  """A plain HTTP server on this machine answering every GET with `body`."""
  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
      self.send_response(200)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):
      pass
  server = http.server.ThreadingHTTPServer((host, 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f"http://{host}:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()


_FETCH = ("python3 -c \"import sys, urllib.request; "
          "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\" ")


def test_network_and_egress_allow_list(client, service):
  """network=False reaches nothing; network=True reaches the network but none of the host's
  loopback services (the service itself, another server on 127.0.0.1); an allow-listed
  endpoint on the host's loopback is reachable either way, at the URL the SDK gives."""
  with _http_server("127.0.0.1", b"proxy") as proxy, \
       _http_server("127.0.0.1", b"private") as private:
    outside = _outbound_address()
    with contextlib.ExitStack() as stack:
      public = stack.enter_context(_http_server(outside, b"public")) if outside else None
      boxes = {network: stack.enter_context(client.create_sandbox(network=network,
                                                                  egress=[proxy]))
               for network in (False, True)}
      for network, box in boxes.items():
        assert [e["endpoint"] for e in box.egress] == [proxy]
        inside = box.egress_url(proxy + "/s/session-1/v1")
        assert inside == proxy + "/s/session-1/v1"   # a loopback endpoint keeps its URL
        assert box.exec(_FETCH + inside).stdout == "proxy\n", (network, box.egress)
        for blocked in (private, service.url + "/health"):
          result = box.exec(_FETCH + blocked)
          assert result.exit_code != 0 and result.stdout == "", (network, blocked)
        if public is not None:
          reached = box.exec(_FETCH + public)
          assert (reached.stdout == "public\n") == network, (network, reached.stderr[-300:])
      with pytest.raises(ValueError, match="allow-list"):
        boxes[True].egress_url(private)
  with pytest.raises(orchard_env.InvalidRequest, match="egress"):
    client.create_sandbox(egress=["ftp://127.0.0.1:21"])
  with pytest.raises(orchard_env.InvalidRequest, match="egress"):
    client.create_sandbox(egress=["http://127.0.0.1:0"])


# ---------------------------------------------------------------------------- limits
def test_fork_bomb_is_contained(client, service):
  pids = 64 if service.backend_kind == "local" else 256   # kubernetes: the node's pod limit
  with client.create_sandbox(pids=pids) as box:
    # The command outlives its timeout, so the service kills the job's session: every bomb
    # process, those reparented after their parent died included. (A bomb whose shell exits
    # first is left running, as every background process of a finished command is kept for
    # later commands; under load it can then hold the pids limit for good, which made the
    # old form of this test, without the sleep, fail about one run in four.)
    result = box.exec("bomb() { bomb | bomb & }; bomb; sleep 60", timeout=3)
    assert result.status == "timed_out", result
    assert client.health()["status"] == "ok"
    deadline = time.monotonic() + 15   # killed processes free their slots once reaped
    while True:
      alive = box.exec("echo alive", timeout=30)
      if alive.ok or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    assert alive.stdout == "alive\n", alive
  with client.create_sandbox() as other:
    assert other.exec("echo fine").stdout == "fine\n"


def test_memory_hog_is_contained(client):
  with client.create_sandbox(memory="128Mi") as box:
    result = box.exec("python3 -c \"x = bytearray(1 << 30); print('survived')\"", timeout=60)
    assert "survived" not in result.stdout and not result.ok
    assert box.exec("echo alive").stdout == "alive\n"
  assert client.health()["status"] == "ok"


def test_disk_limit(client):
  with client.create_sandbox(disk="8Mi") as box:
    result = box.exec("head -c 20000000 /dev/zero > big.bin", timeout=60)
    assert result.exit_code != 0 and "No space left" in result.stderr


# ---------------------------------------------------------------------------- reaping
def test_ttl_and_heartbeat_expiry_reap(client):
  ttl = client.create_sandbox(timeout=0.5, wait=False)   # the TTL counts from creation
  quiet = client.create_sandbox(heartbeat_timeout=0.8)   # silence counts from readiness
  kept = client.create_sandbox(heartbeat_timeout=0.8)
  deadline = time.monotonic() + 3
  while time.monotonic() < deadline:
    kept.heartbeat()
    time.sleep(0.2)
  with pytest.raises(orchard_env.SandboxNotFound, match="ttl"):
    ttl.refresh()
  with pytest.raises(orchard_env.SandboxNotFound, match="heartbeat"):
    quiet.refresh()
  assert kept.refresh()["state"] == "ready"
  kept.delete()


def test_metrics_count_sandboxes_and_jobs(client, box):
  box.exec("true")
  text = client.metrics()
  assert 'orchard_env_sandboxes{state="ready"}' in text
  assert "orchard_env_job_duration_seconds_count" in text


def test_workspace_belongs_to_the_sandbox_user(box):
  # git refuses repositories owned by another user ("dubious ownership").
  result = box.exec("git init -q . && git -c user.email=a@b -c user.name=a commit -q "
                    "--allow-empty -m init && git status --short && git log --format=%s")
  assert (result.exit_code, result.stdout) == (0, "init\n"), result.stderr


# ---------------------------------------------------------------------------- terminal
def _read_until(ws, needle: bytes, timeout=20.0) -> bytes:
  seen = b""
  deadline = time.monotonic() + timeout
  while needle not in seen:
    message = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
    seen += message if isinstance(message, bytes) else message.encode()
  return seen


def test_pty_shell_over_websocket(client, service):
  with client.create_sandbox() as box:
    url = box.pty_url() + "?rows=30&cols=100"
    with connect(url, additional_headers={"X-API-Key": service.api_key}) as ws:
      ws.send(b"test -t 0 && echo on-a-terminal; stty size; echo $((6 * 7))-done\n")
      out = _read_until(ws, b"42-done\r\n")
      assert b"on-a-terminal\r\n30 100\r\n" in out   # a real terminal of the asked size
      ws.send('{"type": "resize", "rows": 50, "cols": 132}')
      ws.send(b"stty size\n")
      assert b"50 132" in _read_until(ws, b"50 132")
      ws.send(b"exit\n")
      with pytest.raises(Exception):
        _read_until(ws, b"never printed", timeout=10)
    with pytest.raises(Exception):
      with connect(url, additional_headers={"X-API-Key": "wrong"}) as ws:
        ws.recv(timeout=5)


@pytest.mark.parametrize("shell", ["/bin/no-such-shell", "no-such-shell"])
def test_pty_with_a_shell_that_cannot_start_closes_with_4422_naming_it(client, service, shell):
  """Either backend runs the shell asked for, and one that cannot start is the close code and
  reason, not a normal closure (the Kubernetes agent ran its own shell whatever was asked)."""
  import urllib.parse

  from websockets.exceptions import ConnectionClosed
  with client.create_sandbox() as box:
    url = box.pty_url() + "?" + urllib.parse.urlencode({"shell": shell})
    with connect(url, additional_headers={"X-API-Key": service.api_key}) as ws:
      with pytest.raises(ConnectionClosed):
        while True:
          ws.recv(timeout=30)
    assert ws.close_code == 4422 and f"cannot start {shell!r}" in ws.close_reason, (
      ws.close_code, ws.close_reason)
    assert box.exec("echo still here").stdout == "still here\n"




# ---------------------------------------------------------------------------- reasons
def test_an_oom_kill_says_so(client):
  with client.create_sandbox(memory="128Mi") as box:
    result = box.exec("python3 -c \"x = bytearray(1 << 30)\"", timeout=60)
    assert result.oom_killed and result.signal == 9, result
    assert "OOM killer" in result.error and str(128 << 20) in result.error, result.error
    ok = box.exec("echo fine")
    assert ok.ok and not ok.oom_killed


def test_a_full_disk_is_enospc_not_a_kill(client):
  # disk 32Mi fits memory 128Mi (2 x 32Mi + 32Mi): writing more than the disk is ENOSPC.
  with client.create_sandbox(memory="128Mi", disk="32Mi") as box:
    for folder in (".", "/tmp"):
      result = box.exec(f"head -c 100000000 /dev/zero > {folder}/big.bin", timeout=60)
      assert result.status == "finished" and result.signal is None, result
      assert result.exit_code != 0 and "No space left on device" in result.stderr, result
      assert not result.oom_killed
      box.exec(f"rm -f {folder}/big.bin")
  with pytest.raises(orchard_env.InvalidRequest, match="OOM killer") as refused:
    client.create_sandbox(memory="128Mi", disk="64Mi")   # 2 x 64Mi > 128Mi - 32Mi
  assert set(refused.value.details["fields"]) == {"disk", "memory"}
  with client.create_sandbox(memory="256Mi") as fitted:   # an unspecified disk shrinks to fit
    assert fitted.info["disk"] == (256 - 32) // 2 << 20


def test_a_fork_bomb_left_by_a_finished_command_is_stopped(client, service):
  pids = 64 if service.backend_kind == "local" else 256
  with client.create_sandbox(pids=pids) as box:
    result = box.exec("bomb() { bomb | bomb & }; bomb; echo started")   # returns at once
    assert result.stdout == "started\n"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      alive = box.exec("echo alive", timeout=30)
      if alive.ok and box.exec("ps -e --no-headers | wc -l").stdout.strip() in [
          str(n) for n in range(1, 8)]:
        break
      time.sleep(0.5)
    assert alive.stdout == "alive\n", alive
    count = box.exec("ps -e --no-headers | wc -l").stdout.strip()
    assert int(count) < 8, count   # the placeholder, ps, wc and a shell: the bomb is gone


# ---------------------------------------------------------------------------- special files
@pytest.mark.parametrize("make", ["mkfifo pipe", "ln -s /dev/zero pipe", "ln -s /dev/null pipe",
                                  "python3 -c \"import socket; socket.socket(socket.AF_UNIX)"
                                  ".bind('pipe')\""])
def test_special_files_are_refused_at_once(box, make):
  assert box.exec(f"rm -f pipe; {make}").exit_code == 0
  started = time.monotonic()
  with pytest.raises(orchard_env.FileOperationError, match="regular file"):
    box.download("pipe")
  assert time.monotonic() - started < 10
  assert box.exec("echo fine").stdout == "fine\n"


def test_a_growing_file_downloads_as_it_was_when_opened(box):
  box.exec("(while true; do echo line; done) > grow.txt &")
  time.sleep(0.3)
  data = box.download("grow.txt")
  assert data and set(data.split(b"\n")) <= {b"line", b""}
  box.exec("pkill -f 'while true' || true; kill %1 2>/dev/null; true")


# ---------------------------------------------------------------------------- paths and patches
def test_paths_are_normalised(box):
  info = box.upload("deep/./dir//file.txt", b"x")
  assert info["path"] == f"{box.workdir}/deep/dir/file.txt"
  assert box.download("deep/dir/../dir/./file.txt") == b"x"
  assert box.download(f"{box.workdir}//deep/./dir/file.txt") == b"x"
  assert [e["name"] for e in box.list_files("./deep/.")] == ["dir"]
  assert box.exec("pwd", cwd="deep/./dir/").stdout == f"{box.workdir}/deep/dir\n"
  with pytest.raises(orchard_env.InvalidRequest, match="folder"):
    box.upload("deep/", b"x")


@pytest.mark.parametrize("patch", ["", "\n", "Only garbage was found here\n",
                                   "--- a/f\n+++ b/f\n"])   # headers without a hunk
def test_a_patch_that_changes_nothing_is_refused_not_applied(box, patch):
  with pytest.raises(orchard_env.InvalidRequest, match="no file change"):
    box.apply_patch(patch, check=False)


def test_health_lists_the_syscall_filter(client, service):
  health = client.health()["backend"]
  profile = health["seccomp"] if service.backend_kind == "local" else health["seccomp"]["profile"]
  assert {"setns", "mount", "bpf", "keyctl"} <= set(profile["denied"])
  assert "unshare" in profile["denied_when"] and profile["other_architectures"] == "killed"
