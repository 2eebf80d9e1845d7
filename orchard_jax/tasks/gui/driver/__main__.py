"""Starts a browser sandbox's processes: `python driver.pyz start`, configuration on stdin.

Standard input carries one JSON object (never the command line, so the token is not in the
process list):
  {"token": "...", "control_port": 9300, "pages_port": 8300,
   "executable": ["/usr/lib/chromium/chromium-headless-shell", ...], "miniwob_dir": "/path/to/miniwob/html",
   "sites": {"shop": {...fixtures...}}, "log": "/tmp/gui/driver.log",
   "timeouts": {"action_s": 5, "navigation_s": 15, "screenshot_s": 10}}

The command binds both ports first (a port in use fails the start with one line naming it),
then forks a supervisor that leaves the command's session, and from it the page server
(pages.py: the task's pages on `pages_port`) and the driver (Playwright and Chromium, serving
control.py on `control_port`). The command returns once the browser has started, printing
{"ready": true, "pids": {...}, "browser": version, "startup": {...seconds}}, or
{"ready": false, "error": ...} with exit 2. Every process, Chromium's included, lives in the
sandbox's process namespace: deleting the sandbox ends them all.
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


def _listen(port, what: str, host: str = "127.0.0.1") -> socket.socket:
  if not isinstance(port, int) or not 0 < port < 65536:
    _fail(f"config.{what}: expected a port number, got {port!r}")
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
    sock.listen(64)
  except OSError as e:
    _fail(f"{what}: cannot listen on {host}:{port}: {e.strerror or e}")
  return sock


def _host_rules(pages_port: int) -> str:
  """Every *.test name resolves to the page server (the sites' own host names)."""
  return f"MAP *.test 127.0.0.1:{pages_port}"


def _miniwob_dir(given):
  """The MiniWoB++ html folder: as given when it exists here, else the miniwob package's of
  this sandbox's Python (a container image has its own), else None."""
  if given and os.path.isdir(given):
    return given
  try:
    import importlib.util
    spec = importlib.util.find_spec("miniwob")
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  folder = os.path.join(list(spec.submodule_search_locations)[0], "html")
  return folder if os.path.isdir(folder) else None


def _run_pages(sock, config) -> None:
  from .pages import PageServer
  server = PageServer(sock, token=config["token"],
                      miniwob_dir=_miniwob_dir(config.get("miniwob_dir")),
                      sites=config.get("sites") or {})
  server.serve_forever(poll_interval=3600)


def _run_driver(sock, config, report_fd: int, t_start: float) -> None:
  from .browser import Browser
  from .control import ControlServer
  t0 = time.perf_counter()
  timeouts = config.get("timeouts") or {}
  try:
    browser = Browser(config["executable"], host_rules=_host_rules(config["pages_port"]),
                      action_timeout_s=float(timeouts.get("action_s", 5)),
                      navigation_timeout_s=float(timeouts.get("navigation_s", 15)),
                      screenshot_timeout_s=float(timeouts.get("screenshot_s", 10)),
                      extra_args=list(config.get("chromium_args") or []))
  except Exception as e:  # noqa: BLE001 - reported to the start command, then exit
    os.write(report_fd, json.dumps({"error": f"Chromium did not start: {type(e).__name__}: "
                                    f"{str(e).strip()[:1500]}"}).encode())
    os._exit(3)
  report = {"driver": os.getpid(), "browser": browser.health()["version"],
            "startup": {"launch_s": round(time.perf_counter() - t0, 3),
                        "total_s": round(time.perf_counter() - t_start, 3)}}
  os.write(report_fd, json.dumps(report).encode())
  os.close(report_fd)
  server = ControlServer(sock, browser, token=config["token"], pages_port=config["pages_port"])
  try:
    server.serve_forever(poll_interval=3600)
  finally:
    browser.close()


def start(config: dict) -> None:
  t_start = time.perf_counter()
  token = config.get("token")
  if not isinstance(token, str) or len(token) < 16:
    _fail("config.token: expected a random string of at least 16 characters")
  candidates = config.get("executable")
  candidates = [candidates] if isinstance(candidates, str) else list(candidates or [])
  found = [c for c in candidates if isinstance(c, str) and os.path.isfile(c)]
  if not found:
    _fail(f"config.executable: no Chromium at any of {candidates} in this sandbox (install "
          "Debian's chromium-headless-shell or chromium)")
  config["executable"] = found[0]
  from .pages import SITES
  sites = config.get("sites") or {}
  unknown = sorted(set(sites) - set(SITES))
  if not isinstance(sites, dict) or unknown:
    _fail(f"config.sites: unknown site(s) {unknown}; known: {sorted(SITES)}")
  for name, fixtures in sites.items():     # refuse bad fixtures before anything starts
    try:
      SITES[name]().reset(fixtures or {})
    except (ValueError, KeyError, TypeError) as e:
      _fail(f"config.sites.{name}: bad fixtures: {type(e).__name__}: {e}")
  pages_sock = _listen(config.get("pages_port"), "pages_port")
  # The control port on every interface: Orchard Env reaches a Kubernetes pod's exposed port at
  # the pod's IP (a local sandbox's network namespace has only its loopback). The page server
  # stays on the loopback: only the sandbox's browser uses it.
  control_sock = _listen(config.get("control_port"), "control_port",
                         config.get("control_host") or "0.0.0.0")
  log_path = config.get("log") or "/tmp/orchard-gui-driver.log"
  read_end, write_end = os.pipe()
  if os.fork() > 0:                          # the command: wait for the driver's report
    os.close(write_end)
    pages_sock.close()
    control_sock.close()
    data = b""
    while True:
      chunk = os.read(read_end, 65536)
      if not chunk:
        break
      data += chunk
    try:
      report = json.loads(data)
    except ValueError:
      _fail(f"the driver ended before reporting (see {log_path})")
    if "error" in report:
      _fail(report["error"])
    sys.stdout.write(json.dumps({"ready": True, **report}) + "\n")
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
  children = {}
  pid = os.fork()
  if pid == 0:
    os.close(write_end)
    control_sock.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
      _run_pages(pages_sock, config)
    finally:
      os._exit(1)
  children[pid] = "pages"
  pid = os.fork()
  if pid == 0:
    pages_sock.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
      _run_driver(control_sock, config, write_end, t_start)
    finally:
      os._exit(1)
  children[pid] = "driver"
  os.close(write_end)
  pages_sock.close()
  control_sock.close()
  while children:
    try:
      pid, status = os.wait()
    except ChildProcessError:
      break
    name = children.pop(pid, None)
    if name:
      how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
             else f"exit {os.WEXITSTATUS(status)}")
      sys.stderr.write(f"{time.strftime('%H:%M:%S')} {name} (pid {pid}) ended: {how}\n")
      sys.stderr.flush()
  os._exit(0)


def main(argv) -> None:
  if len(argv) < 2 or argv[1] != "start":
    sys.stderr.write("usage: driver.pyz start   (configuration as JSON on standard input)\n")
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
