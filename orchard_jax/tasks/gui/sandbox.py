"""A rollout's browser: headless Chromium inside its own Orchard Env sandbox.

`BrowserSandbox` creates one sandbox (local bubblewrap or a Kubernetes pod: whatever backend
the env client talks to), copies the driver's zip application into it, starts the page server
and the driver (Playwright and Chromium) with one exec, and publishes the driver's control port
through Orchard Env's exposed URLs. The harness drives the browser over that URL; the browser
itself reaches nothing but the sandbox's page server (the task's pages: MiniWoB++ and the local
sites under *.test) and the sandbox's egress allow-list (none by default). Every process,
Chromium's included, lives in the sandbox: leaving the `with` block deletes it, and a crashed
trainer or a killed env service takes the sandbox, and the browser, with it.

```python
with BrowserSandbox(env_client, BrowserConfig(viewport=(1280, 1000)), sites=["shop"]) as browser:
  obs = browser.open("http://shop.test/")          # Observation: screenshot, url, tabs, ...
  step = browser.act({"name": "click", "x": 640, "y": 120})   # pixels (see actions.py)
  state = browser.site_state("shop")               # the site's state, for the checker
```

A browser that crashed or a page that stopped responding raises `BrowserAborted` (the episode
ends as aborted with the reason); an action that failed comes back in `Step.error` (the agent is
told and goes on).
"""
from __future__ import annotations

import base64
import dataclasses
import os
import secrets
import sys
import time
from typing import Any, Mapping, Optional, Sequence

import httpx

from orchard_jax.tasks.gui import bundle
from orchard_jax.tasks.gui.driver.pages import miniwob_html_dir
from orchard_jax.tasks.gui.errors import BrowserAborted, BrowserSandboxError
from orchard_jax.tasks.sandbox_app.host import SandboxApp

TOKEN_HEADER = "X-Orchard-Token"
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium",
                       "/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
CONTROL_PORT, PAGES_PORT = 9300, 8300


@dataclasses.dataclass(frozen=True)
class BrowserConfig:
  """How a browser sandbox is built and how it observes (all configuration, no code paths).

  Attributes:
    viewport: (width, height) in CSS pixels (Orchard-GUI: 1280 x 1000).
    device_scale: device pixels per CSS pixel (screenshots are taken at CSS scale unless
      screenshot_scale is "device").
    screenshot_format: "png", "jpeg" or "webp"; screenshot_quality: 0-100 for jpeg/webp.
    screenshot_scale: "css" (one image pixel per CSS pixel) or "device".
    a11y: also return the page's accessibility tree as text (for text-only policies).
    settle_ms: extra wait after each action, beyond the load and two animation frames.
    action_timeout_s, navigation_timeout_s, screenshot_timeout_s: in-browser time limits;
      past them the page is deemed hung and the episode aborted.
    step_timeout_s: how long the harness waits for one control call before aborting.
    start_timeout_s: how long the start command may take (sandbox, driver, Chromium).
    executable: Chromium executables to try inside the sandbox, in order.
    python: the sandbox's interpreter with Playwright (None: this interpreter for the host
      image, "python3" for a container image).
    image, cpu, memory, disk, pids, ttl_s: the sandbox (Chromium needs ~300 MiB and many
      threads: keep pids high; None leaves pids to the backend, e.g. a Kubernetes node's
      podPidsLimit).
    miniwob_dir: the MiniWoB++ html folder as seen inside the sandbox (None: this machine's
      `miniwob` package for the host image, else the sandbox Python's own).
    chromium_args: extra Chromium flags.
  """
  viewport: tuple = (1280, 1000)
  device_scale: float = 1.0
  screenshot_format: str = "png"
  screenshot_quality: Optional[int] = None
  screenshot_scale: str = "css"
  a11y: bool = False
  settle_ms: float = 0.0
  action_timeout_s: float = 5.0
  navigation_timeout_s: float = 15.0
  screenshot_timeout_s: float = 10.0
  step_timeout_s: float = 60.0
  start_timeout_s: float = 120.0
  executable: tuple = CHROMIUM_CANDIDATES
  python: Optional[str] = None
  image: str = "host"
  cpu: float = 1.0
  memory: str = "1536Mi"
  disk: str = "256Mi"
  pids: Optional[int] = 1024
  ttl_s: float = 3600.0
  miniwob_dir: Optional[str] = None
  chromium_args: tuple = ()

  def __post_init__(self):
    width, height = self.viewport
    if not (isinstance(width, int) and isinstance(height, int) and 64 <= width <= 8192
            and 64 <= height <= 8192):
      raise ValueError(f"viewport: expected (width, height) integers in 64-8192, got "
                       f"{self.viewport!r}")
    if self.screenshot_format not in ("png", "jpeg", "webp"):
      raise ValueError(f"screenshot_format: expected png, jpeg or webp, got "
                       f"{self.screenshot_format!r}")
    if self.screenshot_scale not in ("css", "device"):
      raise ValueError(f"screenshot_scale: expected css or device, got {self.screenshot_scale!r}")
    if not 0.25 <= float(self.device_scale) <= 4:
      raise ValueError(f"device_scale: expected 0.25-4, got {self.device_scale!r}")
    if self.screenshot_quality is not None and not 0 <= int(self.screenshot_quality) <= 100:
      raise ValueError(f"screenshot_quality: expected 0-100, got {self.screenshot_quality!r}")

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "BrowserConfig":
    """From a config block (a ConfigDict or dict); unknown keys are refused by name."""
    values = dict(values)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"browser config: unknown key(s) {unknown}; known: {sorted(fields)}")
    for key in ("viewport", "executable", "chromium_args"):
      if key in values and values[key] is not None:
        values[key] = tuple(values[key])
    return cls(**values)

  @property
  def image_size(self) -> tuple:
    """(width, height) of a screenshot in pixels."""
    scale = self.device_scale if self.screenshot_scale == "device" else 1.0
    return (round(self.viewport[0] * scale), round(self.viewport[1] * scale))


@dataclasses.dataclass
class Observation:
  """What the browser shows after a step.

  Attributes:
    screenshot: the image bytes (None when not taken); format: "png", "jpeg" or "webp".
    width, height: the image's size in pixels.
    url, title: the active tab's.
    tabs: [{index, url, title, active}].
    probe: the task's probe value (e.g. MiniWoB's {done, reward, reason}), or None.
    a11y: the accessibility tree as text, when configured.
    seconds: time the driver spent observing.
  """
  screenshot: Optional[bytes]
  format: str
  width: int
  height: int
  url: str
  title: str
  tabs: list
  probe: Any = None
  a11y: Optional[str] = None
  seconds: float = 0.0

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> "Observation":
    shot = data.get("screenshot")
    return cls(base64.b64decode(shot) if shot else None, data.get("format", "png"),
               int(data.get("width") or 0), int(data.get("height") or 0), data.get("url", ""),
               data.get("title", ""), list(data.get("tabs") or []), data.get("probe"),
               data.get("a11y"), float(data.get("seconds") or 0.0))

  @property
  def data_url(self) -> str:
    """The screenshot as a data URL (an OpenAI image_url)."""
    if self.screenshot is None:
      raise ValueError("this observation has no screenshot")
    return f"data:image/{self.format};base64,{base64.b64encode(self.screenshot).decode()}"


@dataclasses.dataclass
class Step:
  """The result of one action: what was done or why not, and the observation after it.

  Attributes:
    done: a short description of what the browser did ("" when it failed).
    error: why the action could not be done (the agent is told), or None.
    observation: the page after the action (the last one when the action failed).
    seconds: wall time of the whole control call.
  """
  done: str
  error: Optional[str]
  observation: Observation
  seconds: float


def default_python(image: str) -> str:
  """The interpreter that runs the driver: this one for images that show the host's Python
  (its prefix is visible in "host" sandboxes), "python3" from the image's PATH otherwise."""
  if image == "host" or image.startswith("/"):
    return sys.executable
  return "python3"


def playwright_paths() -> list:
  """The folders this interpreter imports Playwright and its dependencies from. The driver
  runs this interpreter with -S (no site: its .pth files cost a tenth of a second or more at
  start-up under load) and these folders on its path."""
  import importlib.util
  import sysconfig
  paths = []
  for name in ("playwright", "greenlet", "pyee"):
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin:
      paths.append(os.path.dirname(os.path.dirname(spec.origin)))
  paths += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
  return list(dict.fromkeys(os.path.realpath(p) for p in paths))


def default_miniwob_dir() -> Optional[str]:
  """The `miniwob` package's html folder on this machine, or None when not installed."""
  return miniwob_html_dir()


def host_paths_for_sandbox() -> list:
  """Host folders a local-backend sandbox must be shown for the driver to import Playwright:
  the running virtual environment when there is one (the base interpreter's prefix is shown
  to "host" sandboxes already). Pass them as LocalBackend(shared_paths=...)."""
  if sys.prefix != sys.base_prefix:
    return [os.path.realpath(sys.prefix)]
  return []


class BrowserSandbox(SandboxApp):
  """One rollout's browser in one sandbox (module docstring).

  Args:
    env_client: an Orchard Env `SandboxClient`.
    config: BrowserConfig.
    sites: the local sites to serve ({name: fixtures} or names with default fixtures).
    egress: endpoints the sandbox may reach (Orchard Env's allow-list); none by default.
  Raises (on entering):
    BrowserSandboxError: the sandbox, the driver or Chromium did not start (with the reason).
  """

  error = BrowserSandboxError
  noun = "the browser"

  def __init__(self, env_client, config: BrowserConfig = BrowserConfig(), *,
               sites: Any = (), egress: Sequence[str] = ()):
    c = config
    sandbox_kwargs = dict(image=c.image, cpu=c.cpu, memory=c.memory, disk=c.disk, pids=c.pids,
                          timeout=c.ttl_s, labels={"orchard.gui": "browser"})
    if egress:
      sandbox_kwargs["egress"] = list(egress)
    super().__init__(env_client, sandbox_kwargs)
    self.config = config
    self.sites = dict(sites) if isinstance(sites, Mapping) else {name: {} for name in sites}
    self.egress = list(egress)
    self.token = secrets.token_hex(16)
    self.url: Optional[str] = None
    self.startup: dict = {}
    self.last: Optional[Observation] = None
    self.aborted: Optional[str] = None

  def _start(self) -> None:
    c = self.config
    config = {"token": self.token, "control_port": CONTROL_PORT, "pages_port": PAGES_PORT,
              "executable": list(c.executable), "sites": self.sites,
              "miniwob_dir": c.miniwob_dir or (default_miniwob_dir() if c.image == "host"
                                               else None),
              "log": "/tmp/orchard-gui/driver.log", "chromium_args": list(c.chromium_args),
              "timeouts": {"action_s": c.action_timeout_s, "navigation_s": c.navigation_timeout_s,
                           "screenshot_s": c.screenshot_timeout_s}}
    command = [c.python or default_python(c.image), bundle.SANDBOX_PATH, "start"]
    if c.python is None and command[0] == sys.executable:     # this interpreter: no site
      command.insert(1, "-S")
      config["sys_path"] = playwright_paths()
    self.startup = self.start_app(bundle.SANDBOX_PATH, bundle.driver_zipapp(), command, config,
                                  timeout_s=c.start_timeout_s)
    self.url = self.box.expose_port(CONTROL_PORT, ttl=c.ttl_s)["url"].rstrip("/")
    self._http = httpx.Client(timeout=c.step_timeout_s, headers={TOKEN_HEADER: self.token})

  # ------------------------------------------------------------------ control calls
  def _call(self, route: str, body: Optional[dict] = None, *, what: str) -> dict:
    """One control call; raises BrowserAborted for a dead browser, a hung page or a driver that
    no longer answers."""
    if self.aborted:
      raise BrowserAborted(self.aborted)
    if self._http is None:
      raise BrowserSandboxError("the browser sandbox is not running (use it inside its `with` "
                                "block)")
    try:
      if body is None:
        response = self._http.get(self.url + route)
      else:
        response = self._http.post(self.url + route, json=body)
    except httpx.TimeoutException:
      return self._abort(f"the browser did not answer {what} within "
                         f"{self.config.step_timeout_s:g} s (a hung page or browser)")
    except httpx.TransportError as e:
      return self._abort(f"cannot reach the browser sandbox for {what}: {type(e).__name__}: {e}")
    try:
      answer = response.json()
    except ValueError:
      answer = {"error": response.text[:500]}
    if response.status_code in (404, 410, 502) and isinstance(answer.get("error"), dict):
      message = answer["error"].get("message", "")   # Orchard Env's answer: the port is gone
      return self._abort(f"the browser's driver stopped answering during {what} ({message})")
    if response.status_code != 200:
      raise BrowserSandboxError(f"{what}: the driver answered {response.status_code}: "
                                f"{answer.get('error')}")
    if answer.get("abort"):
      return self._abort(answer["abort"])
    return answer

  def _abort(self, reason: str):
    self.aborted = self.aborted or reason
    raise BrowserAborted(self.aborted)

  def open(self, url: str, *, probe: str = "", setup: str = "",
           viewport: Optional[tuple] = None) -> Observation:
    """Starts a task on a fresh browser context at `url` (runs `setup` JavaScript on the page
    first, e.g. MiniWoB's seeded start); returns the first observation.

    Raises:
      BrowserAborted: the browser died or the page did not load in time.
      BrowserSandboxError: the page could not be opened (the message says why).
    """
    c = self.config
    width, height = viewport or c.viewport
    body = {"url": url, "viewport": {"width": width, "height": height},
            "device_scale": c.device_scale, "probe": probe, "setup": setup, "a11y": c.a11y,
            "settle_ms": c.settle_ms,
            "screenshot": {"format": c.screenshot_format, "quality": c.screenshot_quality,
                           "scale": c.screenshot_scale}}
    answer = self._call("/open", body, what=f"opening {url}")
    if not answer.get("ok"):
      raise BrowserSandboxError(f"could not open {url}: {answer.get('error')}")
    self.last = Observation.from_json(answer["observation"])
    return self.last

  def act(self, action: Mapping[str, Any]) -> Step:
    """Performs one action given in pixels (see actions.to_pixels); returns the Step.

    Raises:
      BrowserAborted: the browser died or the page stopped responding.
    """
    t0 = time.perf_counter()
    answer = self._call("/act", {"action": dict(action)}, what=f"the {action.get('name')} action")
    if answer.get("ok"):
      self.last = Observation.from_json(answer["observation"])
      return Step(answer.get("done", ""), None, self.last, time.perf_counter() - t0)
    observation = self.last
    try:   # the page after a failed action (a failed click may still have changed it)
      observation = self.observe()
    except BrowserAborted:
      raise
    return Step("", str(answer.get("error") or "the action failed"), observation,
                time.perf_counter() - t0)

  def observe(self, *, screenshot: bool = True) -> Observation:
    """The current observation (raises BrowserAborted like `act`)."""
    answer = self._call("/observe", {"screenshot": screenshot}, what="an observation")
    if not answer.get("ok"):
      raise BrowserSandboxError(f"observation failed: {answer.get('error')}")
    self.last = Observation.from_json(answer["observation"])
    return self.last

  def evaluate(self, expression: str, *, tab: Optional[int] = None) -> Any:
    """A JavaScript expression's value on a tab (the active one by default): the checker's
    and the scripted expert's privileged view; never offered to the agent.

    Raises:
      BrowserSandboxError: the script failed (the message has the page's error).
    """
    answer = self._call("/evaluate", {"expression": expression, "tab": tab},
                        what="a page script")
    if not answer.get("ok"):
      raise BrowserSandboxError(f"page script failed: {answer.get('error')}")
    return answer.get("value")

  def site_state(self, site: str) -> dict:
    """A local site's state (what its checker reads)."""
    answer = self._call("/site", {"site": site, "op": "state"}, what=f"the {site} state")
    if not answer.get("ok"):
      raise BrowserSandboxError(f"state of site {site!r}: {answer.get('error')}")
    return answer["state"]

  def site_reset(self, site: str, fixtures: Optional[dict] = None) -> None:
    """Re-seeds a local site (a task's initial state)."""
    answer = self._call("/site", {"site": site, "op": "reset", "fixtures": fixtures or {}},
                        what=f"resetting {site}")
    if not answer.get("ok"):
      raise BrowserSandboxError(f"reset of site {site!r}: {answer.get('error')}")

  def health(self) -> dict:
    """The driver's view of the browser: {alive, dead, version, tabs}."""
    return self._call("/health", None, what="a health check")["browser"]

  def exec(self, command, **kwargs):
    """Runs a command in the browser's sandbox (tests: crash the browser, list processes)."""
    if self.box is None:
      raise BrowserSandboxError("the browser sandbox is not running")
    return self.box.exec(command, **kwargs)
