"""Starts a rollout's services: `python3 services.pyz start` (or `python -m ...services start`);
`tools`, `call` and `mcp` are the in-sandbox tool command (`client`).

Standard input carries one JSON object (never the command line, so the control token is not
visible in the process list):
  {"services": {"mail": {"port": 8101, "reset": {...reset body...}}, ...},
   "control_token": "...", "host": "127.0.0.1", "log": "/tmp/claw-services.log"}

The command binds every port first (a port in use fails the whole start with exit 2 and one
line naming it), then forks a supervisor that leaves the command's session, and from it one
process per service, each seeded from its reset body and serving its already-listening socket.
Because the sockets listen before the command returns, a service is reachable the moment the
command exits 0; it prints {"ready": true, "pids": {name: pid}, "supervisor": pid}. The
supervisor writes a line to the log when a service process ends (it never restarts one: a dead
service is the episode's end, not something to hide).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time


def _fail(message: str, code: int = 2) -> None:
  sys.stdout.write(json.dumps({"ready": False, "error": message}) + "\n")
  sys.stdout.flush()
  os._exit(code)


def _serve(name: str, sock: socket.socket, token: str, reset: dict) -> None:
  from . import SERVICES, core, server as _server
  service = SERVICES[name]()
  try:
    service.reset(reset or {})
  except core.ServiceError as e:
    sys.stderr.write(f"{name}: reset failed: {e.message}\n")
    os._exit(3)
  server = _server.make_server(service, token, sock=sock)
  server.serve_forever(poll_interval=3600)


def start(config: dict) -> None:
  from . import SERVICES
  services = config.get("services")
  token = config.get("control_token")
  if not isinstance(services, dict) or not services:
    _fail("config.services: expected {name: {port, reset}} for at least one service")
  if not isinstance(token, str) or len(token) < 16:
    _fail("config.control_token: expected a random string of at least 16 characters")
  unknown = sorted(set(services) - set(SERVICES))
  if unknown:
    _fail(f"config.services: unknown service(s) {', '.join(unknown)}; known: "
          f"{', '.join(SERVICES)}")
  from . import core
  for name, spec in services.items():     # refuse bad fixtures before anything starts
    try:
      SERVICES[name]().reset((spec.get("reset") if isinstance(spec, dict) else None) or {})
    except core.ServiceError as e:
      _fail(f"{name}: {e.message}")
  host = config.get("host") or "127.0.0.1"
  sockets = {}
  for name, spec in services.items():
    port = spec.get("port") if isinstance(spec, dict) else None
    if not isinstance(port, int) or not 0 < port < 65536:
      _fail(f"config.services.{name}.port: expected a port number, got {port!r}")
    try:
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      sock.bind((host, port))
      sock.listen(64)
    except OSError as e:
      _fail(f"{name}: cannot listen on {host}:{port}: {e.strerror or e}")
    sockets[name] = sock
  log_path = config.get("log") or "/tmp/claw-services.log"
  read_end, write_end = os.pipe()
  if os.fork() > 0:                          # the command: wait for the pids, report, exit
    os.close(write_end)
    for sock in sockets.values():
      sock.close()
    data = b""
    while True:
      chunk = os.read(read_end, 65536)
      if not chunk:
        break
      data += chunk
    if not data:
      _fail("the supervisor ended before starting the services")
    sys.stdout.write(json.dumps({"ready": True, **json.loads(data)}) + "\n")
    sys.stdout.flush()
    os._exit(0)
  # The supervisor: its own session, its standard streams on the log.
  os.close(read_end)
  os.setsid()
  log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  os.dup2(log, 1)
  os.dup2(log, 2)
  pids = {}
  for name, sock in sockets.items():
    pid = os.fork()
    if pid == 0:
      os.close(write_end)
      for other, s in sockets.items():
        if other != name:
          s.close()
      signal.signal(signal.SIGTERM, signal.SIG_DFL)
      try:
        _serve(name, sock, token, services[name].get("reset") or {})
      finally:
        os._exit(1)
    pids[name] = pid
  for sock in sockets.values():
    sock.close()
  os.write(write_end, json.dumps({"pids": pids, "supervisor": os.getpid()}).encode())
  os.close(write_end)
  names = {pid: name for name, pid in pids.items()}
  while names:
    try:
      pid, status = os.wait()
    except ChildProcessError:
      break
    name = names.pop(pid, None)
    if name:
      how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
             else f"exit {os.WEXITSTATUS(status)}")
      sys.stderr.write(f"{time.strftime('%H:%M:%S')} service {name} (pid {pid}) ended: {how}\n")
      sys.stderr.flush()
  os._exit(0)


def main(argv) -> None:
  if len(argv) >= 2 and argv[1] in ("tools", "call", "mcp"):
    from . import client
    sys.exit(client.main(argv[1:]))
  if len(argv) < 2 or argv[1] != "start":
    sys.stderr.write("usage: services.pyz start  (configuration as JSON on standard input)\n"
                     "       services.pyz tools | call NAME [JSON] | mcp   (see client.py)\n")
    sys.exit(2)
  try:
    config = json.loads(sys.stdin.read())
  except ValueError as e:
    _fail(f"standard input is not a JSON configuration: {e}")
  if not isinstance(config, dict):
    _fail("standard input: expected a JSON object")
  start(config)


if __name__ == "__main__":
  main(sys.argv)
