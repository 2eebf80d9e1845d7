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

import os
import sys

from orchard_jax.tasks.sandbox_app.supervisor import (Part, fail as _fail, listen, read_config,
                                                     start as _start)


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
  parts = []
  for name, spec in services.items():
    port = spec.get("port") if isinstance(spec, dict) else None
    sock = listen(port, f"services.{name}.port", host)
    parts.append(Part(name, _service(name, sock, token, spec.get("reset") or {}), (sock,)))
  _start(parts, log_path=config.get("log") or "/tmp/claw-services.log")


def _service(name: str, sock, token: str, reset: dict):
  """The body of service `name`'s process: seeded from its reset body, serving `sock`."""
  def run(_report) -> None:
    from . import SERVICES, core, server as _server
    service = SERVICES[name]()
    try:
      service.reset(reset or {})
    except core.ServiceError as e:
      sys.stderr.write(f"{name}: reset failed: {e.message}\n")
      sys.stderr.flush()
      os._exit(3)
    server = _server.make_server(service, token, sock=sock)
    server.serve_forever(poll_interval=3600)
  return run


def main(argv) -> None:
  if len(argv) >= 2 and argv[1] in ("tools", "call", "mcp"):
    from . import client
    sys.exit(client.main(argv[1:]))
  if len(argv) < 2 or argv[1] != "start":
    sys.stderr.write("usage: services.pyz start  (configuration as JSON on standard input)\n"
                     "       services.pyz tools | call NAME [JSON] | mcp   (see client.py)\n")
    sys.exit(2)
  start(read_config())


if __name__ == "__main__":
  main(sys.argv)
