"""The shared start-up of a task world's processes (tasks/sandbox_app), which Claw's services and
GUI's browser driver both use: the zip application holds its modules under their own import
paths and runs under `python -S` with nothing of the library but what it names; the start
command answers ready only once every reporting part has reported, and otherwise one line with
the reason (a part's error, a part that died before reporting, a port in use)."""
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from orchard_jax.tasks.sandbox_app import zipapp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_zip_holds_named_modules_under_their_paths_and_is_reproducible(tmp_path):
  modules = ["orchard_jax.tasks.claw.services", "orchard_jax.tasks.sandbox_app.supervisor"]
  app = zipapp.build("orchard_jax.tasks.claw.services.__main__", modules)
  assert hashlib.sha256(app).digest() == hashlib.sha256(
      zipapp.build("orchard_jax.tasks.claw.services.__main__", modules)).digest()
  names = zipfile.ZipFile(io.BytesIO(app)).namelist()
  assert "orchard_jax/tasks/claw/services/core.py" in names
  assert "orchard_jax/tasks/claw/services/core.pyc" in names
  assert "orchard_jax/tasks/sandbox_app/supervisor.py" in names
  assert not any(n.startswith("orchard_jax/tasks/claw/") and n.count("/") == 3 and
                 not n.endswith("__init__.py") and not n.endswith("__init__.pyc") for n in names)
  archive = zipfile.ZipFile(io.BytesIO(app))
  assert archive.read("orchard_jax/tasks/__init__.py") == b""      # a stub, not the library's
  path = tmp_path / "app.pyz"
  path.write_bytes(app)
  usage = subprocess.run([sys.executable, "-S", str(path)], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
  assert usage.returncode == 2 and "usage: services.pyz start" in usage.stderr
  with pytest.raises(ValueError, match="neither a package nor a module"):
    zipapp.build("orchard_jax.nothing.__main__", ["orchard_jax.nothing"])
  with pytest.raises(ValueError, match="main module"):
    zipapp.build("orchard_jax.tasks.gui.driver.__main__", modules)


_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {root!r})
    from orchard_jax.tasks.sandbox_app.supervisor import Part, listen, start
    mode = sys.argv[1]
    port = int(sys.argv[2])

    def serve(report):
      time.sleep(600)

    def launched(report):
      if mode == "error":
        report({{"error": "Chromium did not start: no display"}})
        os._exit(3)
      if mode == "dies":
        os._exit(1)
      report({{"browser": "1.0", "worker": os.getpid()}})
      time.sleep(600)

    sock = listen(port, "control_port")
    start([Part("pages", serve), Part("driver", launched, (sock,), reports=True)],
          log_path=sys.argv[3])
    """)


def _run(tmp_path, mode, port):
  script = tmp_path / "start.py"
  script.write_text(_SCRIPT.format(root=ROOT))
  done = subprocess.run([sys.executable, "-S", str(script), mode, str(port),
                         str(tmp_path / "log")], capture_output=True, text=True, timeout=60)
  return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _kill(answer):
  for pid in [answer.get("supervisor"), *(answer.get("pids") or {}).values()]:
    if pid:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def test_ready_only_after_the_reporting_part_reported(tmp_path):
  port = _free_port()
  code, answer = _run(tmp_path, "ok", port)
  try:
    assert code == 0 and answer["ready"] is True and answer["browser"] == "1.0"
    assert set(answer["pids"]) == {"pages", "driver"}
    assert answer["worker"] == answer["pids"]["driver"]
    with socket.create_connection(("127.0.0.1", port), timeout=5):
      pass                                         # the driver's socket listens already
    taken_code, taken = _run(tmp_path, "ok", port)
    assert taken_code == 2 and taken == {
        "ready": False, "error": f"control_port: cannot listen on 127.0.0.1:{port}: "
                                 "Address already in use"}
  finally:
    _kill(answer)


@pytest.mark.parametrize("mode, reason", [("error", "Chromium did not start: no display"),
                                          ("dies", "driver ended before reporting")])
def test_a_part_that_fails_or_dies_before_reporting_fails_the_start(tmp_path, mode, reason):
  code, answer = _run(tmp_path, mode, _free_port())
  assert code == 2 and answer["ready"] is False and reason in answer["error"]
  assert "pids" not in answer
  # Nothing of the failed start goes on running (the page server's part would sleep 600 s).
  for _ in range(100):
    if not _processes_running(str(tmp_path / "start.py")):
      break
    time.sleep(0.05)
  assert not _processes_running(str(tmp_path / "start.py"))


def _processes_running(script: str) -> list:
  found = []
  for pid in os.listdir("/proc"):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if script.encode() in f.read():
          with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "Z":
              found.append(int(pid))
    except (OSError, ValueError, IndexError):
      continue
  return found
