"""The local backend's network: every sandbox has its own network namespace.

- `network=False`: the namespace has only its loopback device: nothing outside is reachable.
- `network=True`: slirp4netns (a user-mode TCP/IP stack, the one rootless Podman uses) gives
  the namespace a tap device with outbound access through the host's network stack, started
  with `--disable-host-loopback`, so the sandbox's 10.0.2.2 does not lead to the host's
  127.0.0.1 and the sandbox's own 127.0.0.1 is its own: no loopback service of the host (the
  Orchard Env service itself, a database, the recording proxy) is reachable. Names resolve
  through slirp4netns's DNS forwarder (10.0.2.3), written to the sandbox's /etc/resolv.conf.
- `egress=[...]` (either way): for each allowed endpoint the service holds a listening socket
  created *inside* the sandbox's namespace (by the spawner, which enters it) and relays every
  connection it accepts to the endpoint, dialled from the host (see orchard_jax.env.egress for
  the addresses used inside). Nothing else of the host is reachable through it.

What is not filtered with network=True: addresses outside the host (the internet, the LAN,
and the host's own non-loopback addresses, as for any other machine on the network).
"""
import asyncio
import contextlib
import logging
import os
import shutil
from typing import Optional

_log = logging.getLogger("orchard_jax.env.local")
SLIRP_ADDRESS = "10.0.2.100"
SLIRP_DNS = "10.0.2.3"
MAX_RELAYED_CONNECTIONS = 256   # per sandbox; more are refused (closed at once)
_RELAY_CHUNK = 1 << 16


def slirp4netns() -> str:
  """Path of slirp4netns, or "" when it is not installed."""
  return shutil.which("slirp4netns") or ""


def slirp_argv(path: str, init_pid: int, *, userns: bool, sandboxed: bool, ready_fd: int = 3,
               exit_fd: Optional[int] = 4) -> list:
  """slirp4netns's command line for the namespace of `init_pid`.

  Args:
    userns: the sandbox has a user namespace (slirp4netns must join it to configure the tap).
    sandboxed: also confine slirp4netns itself (its own mount namespace and seccomp filter).
    ready_fd: slirp4netns writes "1" there once the namespace's network is configured.
    exit_fd: slirp4netns exits when this descriptor's other end closes (None: no such fd).
  """
  argv = [path, "--configure", "--mtu=65520", "--disable-host-loopback",
          f"--ready-fd={ready_fd}"]
  if exit_fd is not None:
    argv.append(f"--exit-fd={exit_fd}")
  if userns:
    argv.append(f"--userns-path=/proc/{init_pid}/ns/user")
  if sandboxed:
    argv += ["--enable-sandbox", "--enable-seccomp"]
  return argv + [str(init_pid), "tap0"]


def hosts_file(sandbox_id: str, names: dict) -> bytes:
  """/etc/hosts of a sandbox: localhost, its own host name, and {name: address} of egress."""
  lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
           f"127.0.1.1\t{sandbox_id[:63]}"]
  lines += [f"{address}\t{name}" for name, address in sorted(names.items())]
  return ("\n".join(lines) + "\n").encode()


def resolv_conf() -> bytes:
  return f"nameserver {SLIRP_DNS}\noptions edns0\n".encode()


class EgressRelay:
  """Relays connections accepted on listening sockets inside one sandbox to their endpoints.

  Args:
    sandbox_id: for log lines.
  """

  def __init__(self, sandbox_id: str):
    self.sandbox_id = sandbox_id
    self._servers = []
    self._connections = set()
    self._slots = asyncio.Semaphore(MAX_RELAYED_CONNECTIONS)

  async def add(self, sock, target: tuple) -> None:
    """Starts serving a listening socket (already bound inside the sandbox) for `target`
    ((host, port) dialled from the host)."""
    sock.setblocking(False)
    server = await asyncio.start_server(
        lambda r, w: self._relay(r, w, target), sock=sock, limit=_RELAY_CHUNK)
    self._servers.append(server)

  async def _relay(self, reader, writer, target):
    if self._slots.locked():
      writer.close()
      return
    async with self._slots:
      task = asyncio.current_task()
      self._connections.add(task)
      try:
        try:
          up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*target), 10)
        except (OSError, asyncio.TimeoutError) as e:
          _log.info("egress of %s to %s:%s failed: %s", self.sandbox_id, *target, e)
          return
        try:
          await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
          up_writer.close()
      finally:
        writer.close()
        self._connections.discard(task)

  async def close(self) -> None:
    """Stops listening and cuts every relayed connection."""
    for server in self._servers:
      server.close()
    for task in list(self._connections):
      task.cancel()
    for server in self._servers:
      with contextlib.suppress(Exception):
        await asyncio.wait_for(server.wait_closed(), 1)
    self._servers = []


async def _pipe(reader, writer):
  """Copies one direction until EOF, with flow control (at most one chunk in flight)."""
  try:
    while True:
      data = await reader.read(_RELAY_CHUNK)
      if not data:
        break
      writer.write(data)
      await writer.drain()
    if writer.can_write_eof():
      writer.write_eof()
  except (OSError, asyncio.IncompleteReadError):
    pass


def close_quietly(*fds):
  for fd in fds:
    if fd is not None:
      with contextlib.suppress(OSError):
        os.close(fd)
