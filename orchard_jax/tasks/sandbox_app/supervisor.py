"""The start command of a zip application's processes, run inside the sandbox (standard library
only: this file is copied into the zip applications).

`start(parts, log_path=...)` is what `python3 app.pyz start` ends in. The caller has bound
every listening socket first (`listen`: a port in use fails the start with one line naming it)
and checked its configuration (`fail` prints the reason). `start` then forks a supervisor that
leaves the command's session, its standard streams on the log, and from it one process per
`Part`. The command waits until the supervisor has started every part and every part with
`reports=True` has called its `report` (e.g. a browser that has launched), then prints one line
{"ready": true, "pids": {part: pid}, "supervisor": pid, ...the parts' reports} and exits 0; or
{"ready": false, "error": ...} with exit 2 when a part reported an error or ended without
reporting (then every process of the start is killed). Because the sockets listen before the command returns, a part is reachable the moment
the command exits 0. The supervisor writes a line to the log when a part ends; it never restarts
one (a dead part is the episode's end, not something to hide).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence


def fail(message: str, code: int = 2) -> None:
  """Prints {"ready": false, "error": message} and ends the process with `code`."""
  sys.stdout.write(json.dumps({"ready": False, "error": message}) + "\n")
  sys.stdout.flush()
  os._exit(code)


def read_config() -> dict:
  """The start command's configuration: one JSON object on standard input (never the command
  line, so tokens stay out of the process list); anything else fails the start."""
  try:
    config = json.loads(sys.stdin.read())
  except ValueError as e:
    fail(f"standard input is not a JSON configuration: {e}")
  if not isinstance(config, dict):
    fail("standard input: expected a JSON object")
  return config


def listen(port: Any, what: str, host: str = "127.0.0.1") -> socket.socket:
  """A socket listening on host:port; a bad port or one in use fails the start naming `what`."""
  if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
    fail(f"config.{what}: expected a port number, got {port!r}")
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
    sock.listen(64)
  except OSError as e:
    fail(f"{what}: cannot listen on {host}:{port}: {e.strerror or e}")
  return sock


class Part(NamedTuple):
  """One process of the application.

  Attributes:
    name: its name in the answer's pids and in the log.
    run: `run(report)` serves until the process ends. `report(dict)` (parts with reports=True)
      sends what the start command prints beside "ready" (a dict with "error" fails the start
      with that message); for other parts it is None.
    sockets: the listening sockets this part serves (every other one is closed in its process).
    reports: the start command waits for this part's report.
  """
  name: str
  run: Callable[[Optional[Callable[[dict], None]]], None]
  sockets: Sequence[socket.socket] = ()
  reports: bool = False


def start(parts: Sequence[Part], *, log_path: str) -> None:
  """Starts `parts` under a supervisor and reports to the command's caller (module docstring).
  Never returns."""
  names = [p.name for p in parts]
  if len(set(names)) != len(names):
    fail(f"parts must have distinct names, got {names}")
  sockets = [s for p in parts for s in p.sockets]
  read_end, write_end = os.pipe()
  if os.fork() > 0:                          # the command: wait for the reports, print, exit
    os.close(write_end)
    for sock in sockets:
      sock.close()
    _answer(read_end, [p.name for p in parts if p.reports], log_path)
  # The supervisor: its own session, its standard streams on the log.
  os.close(read_end)
  os.setsid()
  log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  os.dup2(log, 1)
  os.dup2(log, 2)
  pids: Dict[str, int] = {}
  for part in parts:
    pid = os.fork()
    if pid == 0:
      _run_part(part, sockets, write_end)
    pids[part.name] = pid
  for sock in sockets:
    sock.close()
  _send(write_end, {"part": None, "report": {"pids": pids, "supervisor": os.getpid()}})
  os.close(write_end)
  by_pid = {pid: name for name, pid in pids.items()}
  while by_pid:
    try:
      pid, status = os.wait()
    except ChildProcessError:
      break
    name = by_pid.pop(pid, None)
    if name:
      how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
             else f"exit {os.WEXITSTATUS(status)}")
      sys.stderr.write(f"{time.strftime('%H:%M:%S')} {name} (pid {pid}) ended: {how}\n")
      sys.stderr.flush()
  os._exit(0)


def _run_part(part: Part, sockets: List[socket.socket], write_end: int) -> None:
  """The body of a part's process (never returns)."""
  own = {id(s) for s in part.sockets}
  for sock in sockets:
    if id(sock) not in own:
      sock.close()
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  report = None
  if part.reports:
    def report(data: dict) -> None:
      nonlocal write_end
      if write_end >= 0:
        _send(write_end, {"part": part.name, "report": data})
        os.close(write_end)
        write_end = -1
  else:
    os.close(write_end)
  try:
    part.run(report)
  finally:
    os._exit(1)


def _send(fd: int, message: dict) -> None:
  data = (json.dumps(message) + "\n").encode()
  while data:
    data = data[os.write(fd, data):]


def _answer(read_end: int, reporting: List[str], log_path: str) -> None:
  """The command's side: reads every message until all writers have closed, prints the answer."""
  data = b""
  while True:
    chunk = os.read(read_end, 65536)
    if not chunk:
      break
    data += chunk
  answer: Dict[str, Any] = {}
  reported, errors = set(), []
  for line in data.splitlines():
    try:
      message = json.loads(line)
    except ValueError:
      continue
    report = message.get("report") or {}
    if "error" in report:
      errors.append(str(report["error"]))
      continue
    reported.add(message.get("part"))
    answer.update(report)
  missing = [name for name in reporting if name not in reported]
  if None not in reported:
    errors.append(f"the supervisor ended before starting every process (see {log_path})")
  elif missing and not errors:
    errors.append(f"{', '.join(missing)} ended before reporting (see {log_path})")
  if errors:                   # a failed start leaves nothing running: end the whole session
    if answer.get("supervisor"):
      try:
        os.killpg(int(answer["supervisor"]), signal.SIGKILL)
      except OSError:
        pass
    fail(errors[0])
  sys.stdout.write(json.dumps({"ready": True, **answer}) + "\n")
  sys.stdout.flush()
  os._exit(0)
