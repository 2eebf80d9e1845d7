"""A real redis-server for the tests (the system package; .ci/run installs it)."""
import os
import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class RedisServer:
  """redis-server on 127.0.0.1 in a temporary folder; a context manager.

  Attributes:
    url: redis://127.0.0.1:PORT/0
  """

  def __init__(self, folder, *, appendonly: bool = False):
    self.binary = shutil.which("redis-server")
    if self.binary is None:
      pytest.fail("redis-server is not installed; install the system package (apt-get install "
                  "redis-server), as README's install line and .ci/run do")
    self.folder = str(folder)
    self.port = free_port()
    self.url = f"redis://127.0.0.1:{self.port}/0"
    self.appendonly = appendonly
    self.process = None

  def start(self) -> "RedisServer":
    args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.folder,
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--maxmemory-policy", "noeviction", "--protected-mode", "yes"]
    self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
      if self.process.poll() is not None:
        raise RuntimeError(f"redis-server exited: {self.process.stderr.read().decode()[-2000:]}")
      try:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
          s.sendall(b"PING\r\n")
          if s.recv(16).startswith(b"+PONG"):
            return self
      except OSError:
        time.sleep(0.05)
    raise RuntimeError("redis-server did not answer PING within 20 s")

  def stop(self) -> None:
    if self.process is not None and self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    if self.process is not None and self.process.stderr:
      self.process.stderr.close()

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()


def environ_without_proxies() -> dict:
  env = dict(os.environ)
  for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy",
              "ALL_PROXY"):
    env.pop(key, None)
  return env
