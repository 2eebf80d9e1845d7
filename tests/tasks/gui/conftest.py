"""Fixtures of the GUI tests: a real browser sandbox (headless Chromium from Debian's package,
launched by Playwright inside a real Orchard Env sandbox of the local bubblewrap backend),
shared by a module's tests (each episode starts on a fresh browser context and re-seeded
sites), and helpers to find a sandbox's processes from the host."""
import os
import shutil

import pytest

from orchard_jax.tasks.gui.sandbox import CHROMIUM_CANDIDATES, BrowserConfig, BrowserSandbox

SITES = ("shop", "mail", "booking")


@pytest.fixture(autouse=True, scope="session")
def _chromium_installed():
  if not any(os.path.isfile(path) for path in CHROMIUM_CANDIDATES):
    pytest.fail("the GUI tests need Chromium: sudo apt-get install -y chromium-headless-shell "
                "(launch/install.sh installs it)")
  if shutil.which("bwrap") is None:
    pytest.fail("the GUI tests need bubblewrap: sudo apt-get install -y bubblewrap")


@pytest.fixture(scope="module")
def browser(env_client):
  """One browser sandbox with every local site, at a small viewport (fast screenshots)."""
  with BrowserSandbox(env_client, BrowserConfig(viewport=(800, 600)), sites=SITES) as b:
    yield b


def pid_namespace(pid: int) -> str:
  return os.readlink(f"/proc/{pid}/ns/pid")


def processes_in_namespace(namespace: str) -> list:
  """Host pids whose pid namespace is `namespace` (a sandbox's)."""
  found = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
          found.append(int(pid))
      except OSError:
        pass
  return found


def chromium_pids() -> dict:
  """Host pid -> command line of every Chromium process on this machine."""
  found = {}
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      exe = os.readlink(f"/proc/{pid}/exe")
      if os.path.basename(exe).startswith("chromium"):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          found[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      pass
  return found


def browser_namespace(browser: BrowserSandbox) -> tuple:
  """(the sandbox's pid namespace as the kernel names it, host pids of the Chromium processes
  in it). A namespace's name (its nsfs inode) is the same seen from inside and outside."""
  inside = browser.exec("readlink /proc/self/ns/pid").stdout.strip()
  pids = sorted(pid for pid in chromium_pids() if _namespace_or_none(pid) == inside)
  assert pids, f"no Chromium process found in the sandbox's pid namespace {inside}"
  return inside, pids


def _namespace_or_none(pid: int):
  try:
    return pid_namespace(pid)
  except OSError:
    return None
