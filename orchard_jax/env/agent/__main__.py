"""`orchard-agent --host $(POD_IP) --port 7777`: serve the agent API inside a sandbox pod.

Also listens on a unix socket when $ORCHARD_AGENT_UNIX_SOCKET is set (used where the pod's
network is reached through a socket file, as the test cluster does).
"""
import argparse
import asyncio
import os
import socket

import uvicorn

from orchard_jax.env.agent.server import TOKEN_ENV, build_app


def _not_dumpable():
  """Makes the agent's /proc entries (descriptors, memory, the environment it started with,
  which held the token) inaccessible to the commands it runs, which share its user: the
  kernel gives a non-dumpable process's /proc files to root. Commands are dumpable again
  after their exec, as usual."""
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(4, 0, 0, 0, 0) != 0:   # PR_SET_DUMPABLE, 0
    raise SystemExit(f"orchard-agent: prctl(PR_SET_DUMPABLE, 0) failed: "
                     f"{os.strerror(ctypes.get_errno())}")


def main(argv=None):
  parser = argparse.ArgumentParser(prog="orchard-agent")
  parser.add_argument("--host", default="0.0.0.0")
  parser.add_argument("--port", type=int, default=7777)
  parser.add_argument("--workdir", default=os.environ.get("ORCHARD_WORKDIR", "/"))
  args = parser.parse_args(argv)
  token = os.environ.get(TOKEN_ENV)
  if not token:
    raise SystemExit(f"${TOKEN_ENV} is not set; the agent refuses to run without a token")
  os.environ.pop(TOKEN_ENV)
  _not_dumpable()
  sockets = []
  # IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets (else ~40 ms per response).
  tcp = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET,
                      socket.SOCK_STREAM, socket.IPPROTO_TCP)
  tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  tcp.bind((args.host, args.port))
  sockets.append(tcp)
  unix_path = os.environ.pop("ORCHARD_AGENT_UNIX_SOCKET", None)
  if unix_path:
    if os.path.exists(unix_path):
      os.unlink(unix_path)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o666)
    sockets.append(unix)
  config = uvicorn.Config(build_app(token, args.workdir), log_level="warning",
                          ws_ping_interval=None)
  server = uvicorn.Server(config)
  try:
    import uvloop
    uvloop.run(server.serve(sockets=sockets))
  except ImportError:
    asyncio.run(server.serve(sockets=sockets))


if __name__ == "__main__":
  main()
