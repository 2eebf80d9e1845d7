"""The service's memory stays bounded whatever a sandbox or a client does: endless files, a
FIFO, uploads far over the limit and large downloads go through it a chunk at a time. The
service runs in a child process (ServiceProcess, local backend) so its resident set can be
read from /proc; the bound asserted is its start-up RSS + 64 MiB.
"""
import json
import time

import httpx
import pytest

from orchard_jax import env as orchard_env

LIMIT = 64 << 20            # max_file_bytes of this service
BOUND = 64 << 20            # growth of the service's RSS allowed


def _rss(pid):
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  config = {"max_file_bytes": LIMIT}
  with orchard_env.ServiceProcess(["--state-dir", str(tmp_path_factory.mktemp("state")),
                                   "--config-json", json.dumps(config),
                                   "--log-level", "warning"]) as service:
    with orchard_env.SandboxClient(service.url, service.api_key) as client:
      yield service, client


def test_rss_stays_bounded_while_a_sandbox_serves_endless_files(served):
  service, client = served
  pid = service.process.pid
  with client.create_sandbox(disk="96Mi") as box:
    box.exec("ln -s /dev/zero zero; ln -s /dev/urandom random; mkfifo fifo")
    box.exec("head -c 60000000 /dev/urandom > big.bin")   # under the limit: downloaded whole
    before = _rss(pid)
    peak = before
    for _ in range(3):
      for name in ("zero", "random", "fifo"):
        started = time.monotonic()
        with pytest.raises(orchard_env.FileOperationError, match="regular file"):
          box.download(name)
        assert time.monotonic() - started < 10
        peak = max(peak, _rss(pid))
      with httpx.stream("GET", f"{service.url}/v1/sandboxes/{box.id}/files",
                        params={"path": "big.bin"}, headers={"X-API-Key": service.api_key},
                        timeout=120) as response:
        got = 0
        for chunk in response.iter_raw(1 << 16):
          got += len(chunk)
          time.sleep(0.0005)             # a slow reader: the service must not buffer ahead
          peak = max(peak, _rss(pid)) if got % (8 << 20) < (1 << 16) else peak
      assert got == 60_000_000
    assert peak - before < BOUND, (before, peak)


def test_an_upload_far_over_the_limit_is_refused_as_it_flows(served):
  service, client = served
  pid = service.process.pid
  with client.create_sandbox(disk="96Mi") as box:
    before = _rss(pid)

    def endless():   # no Content-Length: the limit is enforced on the bytes themselves
      for _ in range(300):
        yield b"\0" * (1 << 20)
    answer = httpx.put(f"{service.url}/v1/sandboxes/{box.id}/files", params={"path": "up.bin"},
                       headers={"X-API-Key": service.api_key}, content=endless(), timeout=120)
    assert answer.status_code == 413 and "max_file_bytes" in answer.text
    assert _rss(pid) - before < BOUND
    assert box.exec("ls").stdout.split() == []    # nothing half-written is left
    # A declared length over the limit is refused before any byte of the body is sent.
    import socket
    host, port = service.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
      raw.sendall(f"PUT /v1/sandboxes/{box.id}/files?path=x HTTP/1.1\r\nHost: x\r\n"
                  f"X-API-Key: {service.api_key}\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
                  .encode())
      assert raw.recv(4096).startswith(b"HTTP/1.1 413 ")
    huge_json = httpx.post(f"{service.url}/v1/sandboxes/{box.id}/exec",
                           headers={"X-API-Key": service.api_key},
                           content=(b'{"command": "' + b"x" * (100 << 20) + b'"}'), timeout=120)
    assert huge_json.status_code == 413
    assert _rss(pid) - before < 2 * BOUND
    assert box.exec("echo fine").stdout == "fine\n"
