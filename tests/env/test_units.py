"""Pieces of Orchard Env checked on their own: output capping, units, images, SDK retries."""
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_jax import env as orchard_env
from orchard_jax.env import api, images, jobs


# ---------------------------------------------------------------------------- capping
@pytest.mark.parametrize("limit", [0, 1, 7, 64, 1000])
@pytest.mark.parametrize("chunks", [[b"abc"], [b"x" * 5000], [bytes([i % 251]) * 37 for i in range(300)]])
def test_capped_buffer_keeps_head_and_tail(limit, chunks):
  data = b"".join(chunks)
  buf = jobs.CappedBuffer(limit)
  for c in chunks:
    buf.write(c)
  head, tail = limit // 2, limit - limit // 2
  assert buf.total == len(data)
  if len(data) <= limit:
    assert buf.getvalue() == data and buf.dropped == 0
  else:
    dropped = len(data) - limit
    assert buf.dropped == dropped
    expected_tail = data[len(data) - tail:] if tail else b""
    assert buf.getvalue() == (data[:head] + b"\n[... orchard-env: %d bytes omitted ...]\n" % dropped
                              + expected_tail)


# ---------------------------------------------------------------------------- units
@pytest.mark.parametrize("text,expected", [
    (1024, 1024), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1.5Gi", 3 * 2**29),
    ("100k", 100_000), ("64Ki", 65536), ("7", 7), (4096.0, 4096), ("1Ei", 2**60),
    ("0.1Ki", 103)])   # fractions round up to whole bytes, as Kubernetes does
def test_parse_bytes(text, expected):
  assert api.parse_bytes(text) == expected


@pytest.mark.parametrize("bad,hint", [
    ("1Gb", "'Gi'"), ("1GB", "'Gi'"), ("1gb", "'Gi'"), ("64KiB", "'Ki'"), ("1K", "'k'"),
    ("512m", "milli"), ("lots", "quantity"), ("-1", "quantity"), ("1Xi", "suffix"),
    (True, "quantity"), (-5, "2\\^60"), (1.5, "whole"), (float("inf"), "whole"),
    ("2Ei", "at most")])
def test_parse_bytes_refuses_what_could_mean_two_things(bad, hint):
  with pytest.raises(ValueError, match=hint):
    api.parse_bytes(bad, "memory")


def test_parse_cpu():
  assert api.parse_cpu("500m") == 0.5 and api.parse_cpu(2) == 2.0 and api.parse_cpu("10m") == 0.01
  for bad in ("0", "5m", "500M", float("nan"), float("inf"), True, "1.5 cores"):
    with pytest.raises(ValueError, match="cpu"):
      api.parse_cpu(bad)


# ---------------------------------------------------------------------------- images
def test_image_directory_layer_over_host(tmp_path):
  root = tmp_path / "images"
  image = root / "pkg-env"
  (image / "venv" / "bin").mkdir(parents=True)
  (image / "repo").mkdir()
  images.write_image_manifest(str(image), binds={"venv": "/opt/venv"}, workdir="/testbed",
                              env={"PATH": "/opt/venv/bin:/usr/bin:/bin"}, workspace_seed="repo")
  with open(image / "image.json") as f:
    manifest = json.load(f)
  assert manifest == {"version": 1, "base": "host", "binds": {"venv": "/opt/venv"},
                      "workdir": "/testbed", "env": {"PATH": "/opt/venv/bin:/usr/bin:/bin"},
                      "workspace_seed": "repo"}
  spec = images.resolve_image(str(image), allowed_roots=[str(root)])
  assert spec.kind == "layer" and spec.workdir == "/testbed"
  assert spec.binds == ((str(image / "venv"), "/opt/venv"),)
  assert spec.workspace_seed == str(image / "repo")


def test_image_guards(tmp_path):
  root = tmp_path / "images"
  outside = tmp_path / "elsewhere"
  outside.mkdir()
  (root / "img").mkdir(parents=True)
  with pytest.raises(orchard_env.ImageNotAllowed, match="outside the allowed image roots"):
    images.resolve_image(str(outside), allowed_roots=[str(root)])
  os.symlink(str(outside), root / "img" / "escape")
  with pytest.raises(orchard_env.ImageError, match="leaves the image directory"):
    images.write_image_manifest(str(root / "img"), binds={"escape": "/opt/x"})
  with pytest.raises(orchard_env.ImageError, match="under"):
    images.write_image_manifest(str(root / "img"), binds={".": "/proc/x"})
  (root / "img" / "image.json").write_text('{"base": "host", "colour": "red"}')
  with pytest.raises(orchard_env.ImageError, match="unknown keys"):
    images.resolve_image(str(root / "img"), allowed_roots=[str(root)])
  (root / "img" / "image.json").unlink()
  with pytest.raises(orchard_env.ImageError, match="not a root filesystem"):
    images.resolve_image(str(root / "img"), allowed_roots=[str(root)])
  with pytest.raises(orchard_env.ImageError, match="container images need"):
    images.resolve_image("python:3.11-slim", allowed_roots=[str(root)])


def test_image_shared_rootfs_and_absolute_binds_stay_under_the_roots(tmp_path):
  # Task images share one Debian root filesystem and one interpreter: absolute paths, allowed
  # only under an image root, like the image directory itself.
  root = tmp_path / "images"
  (root / "rootfs" / "bin").mkdir(parents=True)
  (root / "rootfs" / "bin" / "sh").write_text("")
  (root / "python").mkdir()
  (root / "task" / "seed").mkdir(parents=True)
  images.write_image_manifest(str(root / "task"), base="rootfs", rootfs=str(root / "rootfs"),
                              binds={str(root / "python"): "/opt/python"}, workspace_seed="seed")
  spec = images.resolve_image(str(root / "task"), allowed_roots=[str(root)])
  assert spec.kind == "rootfs" and spec.root == str(root / "rootfs")
  assert spec.binds == ((str(root / "python"), "/opt/python"),)
  outside = tmp_path / "host-python"
  outside.mkdir()
  images.write_image_manifest(str(root / "task"), base="rootfs", rootfs=str(root / "rootfs"),
                              binds={str(outside): "/opt/python"})
  with pytest.raises(orchard_env.ImageNotAllowed, match="bind source .* outside the allowed"):
    images.resolve_image(str(root / "task"), allowed_roots=[str(root)])
  with pytest.raises(orchard_env.ImageError, match="rootfs must be an absolute path"):
    images.write_image_manifest(str(root / "task"), base="host", rootfs=str(root / "rootfs"))


def test_image_layer_runs_with_its_binds_env_and_seeded_workspace(tmp_path):
  root = tmp_path / "images"
  image = root / "tool"
  (image / "bin").mkdir(parents=True)
  (image / "bin" / "hello-tool").write_text("#!/bin/sh\necho tool says $GREETING\n")
  (image / "bin" / "hello-tool").chmod(0o755)
  (image / "seed").mkdir()
  (image / "seed" / "README").write_text("seeded\n")
  images.write_image_manifest(str(image), binds={"bin": "/opt/tool/bin"}, workdir="/testbed",
                              env={"GREETING": "hi", "PATH": "/opt/tool/bin:/usr/bin:/bin"},
                              workspace_seed="seed")
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path / "state"), image_roots=[str(root)])
  with orchard_env.Orchestrator(backend) as service, \
       orchard_env.SandboxClient(service.url, service.api_key) as client:
    with client.create_sandbox(image=str(image)) as box:
      assert box.workdir == "/testbed"
      assert box.exec("hello-tool").stdout == "tool says hi\n"
      assert box.exec("cat README && echo more >> README && cat README").stdout == "seeded\nseeded\nmore\n"
      assert box.exec("touch /opt/tool/bin/x").exit_code != 0
    assert (image / "seed" / "README").read_text() == "seeded\n"   # the seed is untouched


# ---------------------------------------------------------------------------- SDK retries
class _Flaky(BaseHTTPRequestHandler):
  """A stand-in service: answers 503 `fail` times, then 200; or sleeps (a slow command)."""
  script = {}

  def log_message(self, *args):
    pass

  def _answer(self):
    _Flaky.script["requests"].append((self.command, self.path))
    length = int(self.headers.get("content-length") or 0)
    self.rfile.read(length)
    if _Flaky.script.get("sleep"):
      time.sleep(_Flaky.script["sleep"])
    if _Flaky.script["fail"] > 0:
      _Flaky.script["fail"] -= 1
      self.send_response(503)
      body = b'{"error": {"code": "unavailable", "message": "busy"}}'
    else:
      self.send_response(200)
      body = json.dumps({"sandboxes": []}).encode()
    self.send_header("content-type", "application/json")
    self.send_header("content-length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  do_GET = do_POST = _answer


@pytest.fixture
def flaky():
  server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  _Flaky.script = {"fail": 0, "requests": [], "sleep": 0}
  yield f"http://127.0.0.1:{server.server_address[1]}", _Flaky.script
  server.shutdown()


def test_sdk_retries_503_with_backoff(flaky):
  url, script = flaky
  script["fail"] = 2
  policy = orchard_env.RetryPolicy(attempts=4, backoff=0.05, jitter=0.5)
  with orchard_env.SandboxClient(url, "k", retry=policy) as client:
    started = time.monotonic()
    assert client.list_sandboxes() == []
    assert len(script["requests"]) == 3
    assert time.monotonic() - started >= 0.05 * 0.5 + 0.1 * 0.5
  script.update(fail=10, requests=[])
  with orchard_env.SandboxClient(url, "k", retry=policy) as client:
    with pytest.raises(orchard_env.ServiceUnavailable):
      client.list_sandboxes()
    assert len(script["requests"]) == 4


def test_backoff_grows_and_jitters():
  policy = orchard_env.RetryPolicy(backoff=0.1, max_backoff=1.0, jitter=0.5)
  for attempt, base in [(0, 0.1), (1, 0.2), (2, 0.4), (5, 1.0)]:
    delays = [policy.delay(attempt) for _ in range(200)]
    assert all(base * 0.5 <= d <= base * 1.5 for d in delays)
    assert len(set(delays)) > 100


def test_sdk_retries_connection_refused_then_gives_up():
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  policy = orchard_env.RetryPolicy(attempts=3, backoff=0.01)
  with pytest.raises(orchard_env.ServiceUnavailable, match="3 tries"):
    orchard_env.SandboxClient(f"http://127.0.0.1:{port}", "k", retry=policy).list_sandboxes()


def test_sdk_never_resends_a_command_whose_request_timed_out(flaky):
  import httpx
  url, script = flaky
  script["sleep"] = 0.5
  client = orchard_env.SandboxClient(url, "k", retry=orchard_env.RetryPolicy(attempts=5, backoff=0.01))
  with pytest.raises(httpx.ReadTimeout):
    client.request("POST", "/v1/sandboxes/sbx-1/exec", json={"command": "rm -rf x"}, timeout=0.1)
  time.sleep(0.6)
  assert script["requests"] == [("POST", "/v1/sandboxes/sbx-1/exec")]


def test_a_dead_spawner_is_replaced_and_its_sandboxes_reported_dead(tmp_path):
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path / "state"))
  config = orchard_env.ServiceConfig(reap_interval=0.1)
  with orchard_env.Orchestrator(backend, config=config) as service, \
       orchard_env.SandboxClient(service.url, service.api_key) as client:
    box = client.create_sandbox()
    backend._spawner.kill()          # a crash of the helper takes its sandboxes with it
    backend._spawner.wait()
    deadline = time.monotonic() + 10
    while box.refresh()["state"] != "failed":
      assert time.monotonic() < deadline
      time.sleep(0.05)
    assert "died" in box.info["error"]
    with client.create_sandbox() as fresh:   # and the service keeps working
      assert fresh.exec("echo again").stdout == "again\n"
    assert client.health()["backend"]["spawner_alive"] is True


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_service_connections_send_without_waiting_for_acks(host, tmp_path):
  """Every connection the service accepts has TCP_NODELAY: a response is two writes (headers,
  body), and with Nagle's algorithm the second waits for the client's delayed ACK (~40 ms on
  Linux) on every request. asyncio sets it only on sockets created as IPPROTO_TCP."""
  import asyncio
  import socket

  if host == "::1" and not socket.has_ipv6:
    pytest.skip("no IPv6 on this machine")
  service = orchard_env.Orchestrator(orchard_env.LocalBackend(state_dir=str(tmp_path)), host=host)
  try:
    listening = service.bind()
  except OSError as e:
    pytest.skip(f"cannot bind {host}: {e}")

  async def accept_one():
    seen = asyncio.get_running_loop().create_future()

    def on_connect(reader, writer):
      sock = writer.get_extra_info("socket")
      seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
      writer.close()
    server = await asyncio.start_server(on_connect, sock=listening)
    async with server:
      _, writer = await asyncio.open_connection(host, service.port)
      nodelay = await asyncio.wait_for(seen, 10)
      writer.close()
    return nodelay
  assert asyncio.run(accept_one()) != 0


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
  except OSError:
    return False


def test_fork_server_is_outside_the_sandbox_and_ends_with_it(tmp_path):
  """Each local sandbox's fork server sits in its cgroups but outside its pid namespace (its
  commands' processes list does not show it), its commands are its children inside that
  namespace, a sandbox whose fork server died still runs commands (through the helper), and
  deleting a sandbox ends its fork server."""
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path / "state"))
  with orchard_env.Orchestrator(backend) as service, \
       orchard_env.SandboxClient(service.url, service.api_key) as client:
    box, spare = client.create_sandbox(), client.create_sandbox()
    handles = backend._boxes[box.id]
    server = handles.server_status.pid
    assert _alive(server)
    with open(f"/proc/{server}/cgroup") as f:
      assert box.id in f.read()   # charged to the sandbox: its limits hold for its commands
    assert os.readlink(f"/proc/{server}/ns/pid") == os.readlink("/proc/self/ns/pid")
    listed = box.exec("ps -e -o pid=,comm=").stdout.split("\n")
    assert not any("python" in line for line in listed), listed
    parent = box.exec("cat /proc/self/stat").stdout.rsplit(")", 1)[1].split()[1]
    assert parent == "0", parent   # forked from outside the sandbox's pid namespace
    os.kill(server, 9)
    deadline = time.monotonic() + 10
    while not handles.server_status.ended.is_set() and _alive(server):
      assert time.monotonic() < deadline
      time.sleep(0.05)
    assert box.exec("echo still").stdout == "still\n"   # the helper takes over
    spare_server = backend._boxes[spare.id].server_status.pid
    spare.delete()
    deadline = time.monotonic() + 10
    while _alive(spare_server):
      assert time.monotonic() < deadline, "the fork server outlived its sandbox"
      time.sleep(0.05)


# ---------------------------------------------------------------------------- job expiry
def test_the_reaper_forgets_expired_jobs_without_scanning_every_job(tmp_path, monkeypatch):
  import asyncio
  from orchard_jax.env import manager as manager_module
  from orchard_jax.env import store as store_module

  class CountingStore(store_module.MemoryStore):   # the real in-memory store, counting scans
    shared = False
    scans = 0

    async def list(self, kind, sandbox_id=None):
      if kind == store_module.JOB and sandbox_id is None:
        self.scans += 1
      return await super().list(kind, sandbox_id)

  async def scenario(shared):
    store = CountingStore()
    store.shared = shared
    manager = manager_module.SandboxManager(
        orchard_env.LocalBackend(state_dir=str(tmp_path / f"state-{shared}")), store,
        orchard_env.ServiceConfig(job_ttl=60))
    clock = [1000.0]
    monkeypatch.setattr(manager_module, "_now", lambda: clock[0])
    for name, at in (("job-early", 1000.0), ("job-late", 1050.0)):
      clock[0] = at
      await manager._record_result({"id": name, "sandbox_id": "sbx-1", "status": "running"},
                                   jobs.JobResult(status=jobs.FINISHED, exit_code=0))
    # A record this replica did not finish (another replica's, on a shared store).
    await store.put(store_module.JOB, "job-foreign", {"id": "job-foreign", "sandbox_id": "sbx-2",
                                                      "status": "finished", "finished_at": 900.0})
    clock[0] = 1070.0   # job-early is 70 s old (> job_ttl), job-late 20 s
    await manager.reap()
    left = {j["id"] for j in await store.list(store_module.JOB)}
    return left, store.scans - 1   # less the listing just above

  left, scans = asyncio.run(scenario(shared=False))
  assert left == {"job-late", "job-foreign"} and scans == 0
  left, scans = asyncio.run(scenario(shared=True))
  assert left == {"job-late"} and scans == 1


def test_status_reader_reports_the_pid_once_as_its_line_arrives():
  """The local backend counts a command as running from its pid line (on_pid), not from a
  task waiting on it; the lines are the fork server's (JSON, one a line, split anywhere)."""
  import asyncio
  from orchard_jax.env.backends._local_process import _StatusReader

  async def scenario():
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    reader = _StatusReader(read_end)
    seen = []
    reader.on_pid = lambda pid: seen.append((pid, reader.ended.is_set()))
    for piece in (b'{"pi', b'd": 4242}\n{"ex', b'it": 3}\n'):
      os.write(write_end, piece)
      await asyncio.sleep(0.01)
    os.close(write_end)
    await asyncio.wait_for(reader.ended.wait(), 5)
    return seen, reader.pid, reader.exit
  seen, pid, exit_code = asyncio.run(scenario())
  assert seen == [(4242, False)] and pid == 4242 and exit_code == 3


def _containers(value, out):
  if isinstance(value, (dict, list)):
    out.append(id(value))
    for item in (value.values() if isinstance(value, dict) else value):
      _containers(item, out)
  return out


_JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=30)


@given(record=_JSON_LIKE)
def test_store_copies_are_deep_copies(record):
  """MemoryStore hands out and keeps copies: equal to copy.deepcopy's, sharing no dict or list
  with the original (a caller mutating one never changes the other)."""
  import copy
  from orchard_jax.env import store
  copied = store._copy(record)
  assert copied == copy.deepcopy(record)
  assert not set(_containers(copied, [])) & set(_containers(record, []))
