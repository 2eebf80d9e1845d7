"""Starts a browser sandbox's processes: `python driver.pyz start`, configuration on stdin.

Standard input carries one JSON object (never the command line, so the token is not in the
process list):
  {"token": "...", "control_port": 9300, "pages_port": 8300,
   "executable": ["/usr/lib/chromium/chromium-headless-shell", ...], "miniwob_dir": "/path/to/miniwob/html",
   "sites": {"shop": {...fixtures...}}, "log": "/tmp/gui/driver.log",
   "timeouts": {"action_s": 5, "navigation_s": 15, "screenshot_s": 10},
   "sys_path": ["/folder/with/playwright", ...]}   (optional: for an interpreter run with -S)

The command binds both ports first (a port in use fails the start with one line naming it),
then forks a supervisor that leaves the command's session, and from it the page server
(pages.py: the task's pages on `pages_port`) and the driver (Playwright and Chromium, serving
control.py on `control_port`). The command returns once the browser has started, printing
{"ready": true, "pids": {...}, "browser": version, "startup": {...seconds}}, or
{"ready": false, "error": ...} with exit 2. Every process, Chromium's included, lives in the
sandbox's process namespace: deleting the sandbox ends them all.
"""
from __future__ import annotations

import os
import sys
import time

from orchard_jax.tasks.sandbox_app.supervisor import (Part, fail as _fail, listen, read_config,
                                                     start as _start)


def _host_rules(pages_port: int) -> str:
  """Every *.test name resolves to the page server (the sites' own host names)."""
  return f"MAP *.test 127.0.0.1:{pages_port}"


def _pages(sock, config):
  """The page server's process: the task's pages on `sock`."""
  def run(_report) -> None:
    from .pages import PageServer, miniwob_html_dir
    server = PageServer(sock, token=config["token"],
                        miniwob_dir=miniwob_html_dir(config.get("miniwob_dir")),
                        sites=config.get("sites") or {})
    server.serve_forever(poll_interval=3600)
  return run


def _driver(sock, config, t_start: float):
  """The driver's process: launches Chromium through Playwright, reports, then serves the
  control API on `sock`."""
  def run(report) -> None:
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
      report({"error": f"Chromium did not start: {type(e).__name__}: {str(e).strip()[:1500]}"})
      os._exit(3)
    report({"driver": os.getpid(), "browser": browser.health()["version"],
            "startup": {"launch_s": round(time.perf_counter() - t0, 3),
                        "total_s": round(time.perf_counter() - t_start, 3)}})
    server = ControlServer(sock, browser, token=config["token"], pages_port=config["pages_port"])
    try:
      server.serve_forever(poll_interval=3600)
    finally:
      browser.close()
  return run


def start(config: dict) -> None:
  t_start = time.perf_counter()
  extra = config.get("sys_path") or []
  if not isinstance(extra, list) or not all(isinstance(p, str) for p in extra):
    _fail(f"config.sys_path: expected a list of folders, got {extra!r}")
  sys.path.extend(p for p in extra if p not in sys.path)    # where Playwright is, under -S
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
  pages_sock = listen(config.get("pages_port"), "pages_port")
  # The control port on every interface: Orchard Env reaches a Kubernetes pod's exposed port at
  # the pod's IP (a local sandbox's network namespace has only its loopback). The page server
  # stays on the loopback: only the sandbox's browser uses it.
  control_sock = listen(config.get("control_port"), "control_port",
                        config.get("control_host") or "0.0.0.0")
  _start([Part("pages", _pages(pages_sock, config), (pages_sock,)),
          Part("driver", _driver(control_sock, config, t_start), (control_sock,), reports=True)],
         log_path=config.get("log") or "/tmp/orchard-gui-driver.log")


def main(argv) -> None:
  if len(argv) < 2 or argv[1] != "start":
    sys.stderr.write("usage: driver.pyz start   (configuration as JSON on standard input)\n")
    sys.exit(2)
  start(read_config())


if __name__ == "__main__":
  main(sys.argv)
