"""Hostile code and hostile requests, on both backends (the Kubernetes one against the fake API
server and kubelet of tests/env/fake_kube.py, since no cluster runs here): nothing the service
or the spawner holds leaks into a command, one sandbox cannot forge another's results, the
syscall filter holds, and a bad request fails alone with a 422 naming its field.
"""

import httpx
import pytest

from orchard_jax import env as orchard_env

# Lists the descriptors open in this process, without the listing's own (closed by then).
_LIST = ("import os; print(sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) "
         "if os.path.exists(f'/proc/self/fd/{fd}')))")
_SCAN_FDS = f"""
import subprocess, sys
{_LIST}
print(subprocess.run([sys.executable, "-c", {_LIST!r}], capture_output=True, text=True,
                     close_fds=False).stdout.strip())
"""


def test_a_command_starts_with_only_its_standard_streams(box):
  # The command and a child it starts with close_fds=False hold 0, 1, 2 and nothing else.
  result = box.exec(["python3", "-c", _SCAN_FDS], stdin=b"input")
  assert result.stdout == "[0, 1, 2]\n[0, 1, 2]\n", result
  shell = box.exec("ls /proc/$$/fd; true")   # the shell itself, not ls
  assert shell.stdout.split() == ["0", "1", "2"], shell


_FORGER = r"""
import glob, json, os, time
forged = json.dumps({"exit": 0, "pid": 1}).encode() + b"\n"
deadline = time.time() + 6
while time.time() < deadline:
  for path in glob.glob("/proc/*/fd/*"):
    try:
      fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
      os.write(fd, forged)
      os.close(fd)
    except OSError:
      pass
  time.sleep(0.01)
"""


def test_a_hostile_background_process_cannot_change_other_results(client):
  with client.create_sandbox() as hostile, client.create_sandbox() as victim:
    hostile.upload("forge.py", _FORGER)
    hostile.exec("python3 forge.py >/dev/null 2>&1 &")
    for i in range(8):
      result = victim.exec(f"echo victim-{i}; exit 3")
      assert (result.status, result.exit_code, result.stdout) == ("finished", 3, f"victim-{i}\n")
      # Its own commands' exit statuses stay true too (their output is the sandbox's own to
      # scribble on: every command of one sandbox shares its user).
      own = hostile.exec(f"echo own-{i}; exit 5")
      assert (own.status, own.exit_code) == ("finished", 5) and f"own-{i}\n" in own.stdout
    assert client.health()["status"] == "ok"


@pytest.mark.parametrize("command", [
    "unshare -Ur true",                       # a user namespace: uid 0 inside it
    "unshare -n true",                        # any other namespace
    "unshare -m true",
])
def test_the_syscall_filter_refuses_namespaces(box, command):
  result = box.exec(command)
  assert result.exit_code not in (0, None) and "Operation not permitted" in result.stderr, result
  assert box.exec("echo still-fine").stdout == "still-fine\n"


@pytest.mark.parametrize("call", ["mount(b'none', b'/tmp', b'tmpfs', 0, None)",
                                  "syscall(321, 0, 0, 0)",      # bpf(2) on x86_64
                                  "syscall(250, 0, 0, 0)"])     # keyctl(2)
def test_the_syscall_filter_refuses_mount_bpf_and_keyctl(box, call):
  script = (f"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            f"print(libc.{call}, os.strerror(ctypes.get_errno()))")
  assert box.exec(["python3", "-c", script]).stdout == "-1 Operation not permitted\n"


def test_ptrace_of_a_process_it_did_not_start_is_refused(box):
  script = ("import ctypes, os, subprocess; libc = ctypes.CDLL(None, use_errno=True); "
            "p = subprocess.Popen(['sleep', '30'], start_new_session=True); "
            "print(libc.ptrace(16, p.pid, 0, 0), os.strerror(ctypes.get_errno())); p.kill()")
  assert box.exec(["python3", "-c", script]).stdout == "-1 Operation not permitted\n"


@pytest.fixture(scope="module")
def pair(service):
  """Two sandboxes shared by the bad-request cases: the one that gets the request, and one
  that must not notice."""
  with orchard_env.SandboxClient(service.url, service.api_key) as client:
    yield client.create_sandbox(), client.create_sandbox()


def _raw(service, method, path, headers=None, **kwargs):
  return httpx.request(method, service.url + path, timeout=60,
                       headers={"X-API-Key": service.api_key, **(headers or {})}, **kwargs)


@pytest.mark.parametrize("body,field", [
    ({"command": ["echo", "a\x00b"]}, "command"),
    ({"command": "echo \x00"}, "command"),
    ({"command": "true", "env": {"A=B": "1"}}, "env"),
    ({"command": "true", "env": {"": "1"}}, "env"),
    ({"command": "true", "env": {"A": "x\x00y"}}, "env"),
    ({"command": "true", "cwd": "/tmp\x00x"}, "cwd"),
    ({"command": "true", "shell": "/bin/sh\x00"}, "shell"),
    ({"command": "true", "stdin_b64": "not base64!"}, "stdin_b64"),
    ({"command": "true", "timeout": -1}, "timeout"),
])
def test_a_bad_exec_field_is_a_422_naming_it_and_harms_no_one(service, pair, body, field):
  box, other = pair
  answer = _raw(service, "POST", f"/v1/sandboxes/{box.id}/exec", json=body)
  assert answer.status_code == 422, answer.text
  assert field in answer.json()["error"]["details"]["fields"], answer.text
  for b in (box, other):
    assert b.exec("echo alive").stdout == "alive\n"
  assert _raw(service, "GET", f"/v1/sandboxes/{box.id}/jobs").status_code == 200


@pytest.mark.parametrize("raw,field", [
    ('{"command": "true", "timeout": Infinity}', "timeout"),
    ('{"command": "true", "timeout": NaN}', "timeout"),
    ('{"command": "true", "env": {"A": "\\ud800"}}', "env"),
    ('{"command": ["\\udc80"]}', "command"),
])
def test_non_finite_numbers_and_lone_surrogates_are_refused(service, pair, raw, field):
  box, _ = pair
  before = _raw(service, "GET", f"/v1/sandboxes/{box.id}/jobs").json()["jobs"]
  answer = _raw(service, "POST", f"/v1/sandboxes/{box.id}/exec", content=raw,
                headers={"Content-Type": "application/json"})
  assert answer.status_code == 422 and field in answer.json()["error"]["details"]["fields"]
  jobs = _raw(service, "GET", f"/v1/sandboxes/{box.id}/jobs")
  assert jobs.status_code == 200 and jobs.json()["jobs"] == before


@pytest.mark.parametrize("path", ["/etc/passwd", "/workspace", "/proc/self/status"])
def test_an_upload_the_sandbox_refuses_is_a_4xx_whatever_its_size(service, pair, path):
  """A read-only file, a folder, a /proc file: the sandbox refuses the write, and with a body
  larger than a pipe's buffer it does so before every byte is sent. The answer is that refusal
  (a 4xx naming the path), never a 500, the keep-alive connection stays usable, and both
  sandboxes go on working (a 1 MiB body used to end in a BrokenPipeError and a 500)."""
  box, other = pair
  with httpx.Client(base_url=service.url, headers={"X-API-Key": service.api_key},
                    timeout=60) as http:
    for size in (10, 1 << 20):
      answer = http.put(f"/v1/sandboxes/{box.id}/files", params={"path": path},
                        content=b"x" * size)
      assert 400 <= answer.status_code < 500, (size, answer.status_code, answer.text)
      assert path in answer.json()["error"]["message"]
      assert http.get(f"/v1/sandboxes/{box.id}").status_code == 200     # same connection
  for b in (box, other):
    assert b.exec("echo alive").stdout == "alive\n"


def test_sdk_misuse_is_a_clear_error_and_sends_nothing_harmful(service, pair):
  """Values the SDK's own encoders choked on (a lone surrogate, NaN) reach the service as JSON
  escapes and come back as its 422 naming the field; data that is not bytes or text is a
  TypeError before any request (upload(path, None) wrote an empty file; stdin=5 sent 5 NUL
  bytes); a negative or NaN wait is a ValueError (it was a TimeoutError)."""
  import asyncio
  box, _ = pair
  for call, field in [(lambda: box.exec("echo \ud800"), "command"),
                      (lambda: box.exec("true", env={"A": "\udc80"}), "env"),
                      (lambda: box.exec("true", timeout=float("nan")), "timeout")]:
    with pytest.raises(orchard_env.InvalidRequest) as error:
      call()
    assert field in error.value.details["fields"]
  with pytest.raises(TypeError, match="upload data must be bytes or str; got NoneType"):
    box.upload("none.txt", None)
  with pytest.raises(TypeError, match="stdin must be bytes or str; got int"):
    box.exec("cat", stdin=5)
  with pytest.raises(ValueError, match="stdin holds a lone surrogate"):
    box.exec("cat", stdin="\ud800")
  with pytest.raises(ValueError, match="seconds >= 0; got -1"):
    box.start("true").wait(timeout=-1)
  assert "none.txt" not in [entry["name"] for entry in box.list_files(".")]

  async def same_through_the_async_client():
    async with orchard_env.AsyncSandboxClient(service.url, service.api_key) as client:
      async with await client.create_sandbox() as other:
        with pytest.raises(orchard_env.InvalidRequest) as error:
          await other.exec("true", env={"A": "\udc80"})
        assert "env" in error.value.details["fields"]
        with pytest.raises(TypeError, match="upload data must be bytes or str"):
          await other.upload("none.txt", None)
        job = await other.start("true")
        with pytest.raises(ValueError, match="got nan"):
          await job.wait(timeout=float("nan"))
  asyncio.run(same_through_the_async_client())
