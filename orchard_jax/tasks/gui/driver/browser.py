"""The browser of one rollout: headless Chromium driven by Playwright, inside the sandbox.

`Browser` launches Chromium (Debian's `chromium-headless-shell` or `chromium`, through
Playwright's `executable_path`; Playwright never downloads a browser) with the flags a browser
needs inside Orchard Env's sandbox and on a closed network, and performs already-validated
actions in CSS pixels (the host converts the agent's 0-1000 coordinates and checks every
argument, orchard_jax.tasks.gui.actions). After each action the page settles (a navigation it
started is waited for, then the next animation frame) and the observation is taken: a screenshot,
the URL, title and tabs, the task's probe (a JavaScript expression the task reads its reward
from, e.g. MiniWoB's WOB_RAW_REWARD_GLOBAL) and, when asked, the accessibility tree as text.

Failures are sorted into two kinds, because they end an episode differently:
  action errors  the action could not be done (no such tab, an element refused the input):
                 the agent is told, the episode goes on.
  aborts         the browser is gone (crashed, closed) or the page stopped responding
                 (a screenshot or a navigation past its time limit): the episode ends as
                 aborted with the reason.

Standard library and Playwright only: this file runs inside the sandbox.
"""
from __future__ import annotations

import base64
import os
import signal
import threading
import time
from typing import Any, Dict, List, Optional

# Flags for Chromium in Orchard Env's sandbox: it has no user namespaces for Chromium's own
# sandbox (seccomp forbids them), a small /dev/shm, no GPU, and no network but the task's
# pages; background services would only fail on a closed network, slowly and often.
# Not --single-process: it started a sandbox 0.4 s sooner at load 12, but its one in-process
# renderer cannot serve a second browser context, and the browser dies with the first
# context's last page (a fresh context per task is the rule here).
CHROMIUM_FLAGS = (
    "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic", "--disable-breakpad",
    "--disable-domain-reliability", "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only", "--mute-audio", "--hide-scrollbars", "--font-render-hinting=none",
)
# Resolves on the page's next animation frame (the action's effect, and whatever it scheduled
# for that frame, is in the DOM and laid out) with what an observation reads from the page, in
# one round trip: the title and the task's probe. The screenshot that follows captures a new
# frame. A probe the page's Content-Security-Policy keeps from `eval` is read separately.
INFO_SCRIPT = """async (probe) => {
  await new Promise(resolve => requestAnimationFrame(() => resolve()));
  let value = null, error = null;
  if (probe) {
    try {
      value = (0, eval)(probe);
      if (typeof value === "function") value = value();
      value = await value;
    } catch (e) { error = String(e); }
  }
  return {title: document.title, probe: value, probe_error: error};
}"""


def _cdp_send_takes_a_timeout() -> bool:
  """Whether this Playwright's CDPSession.send takes `timeout` (milliseconds)."""
  import inspect
  try:
    from playwright.sync_api import CDPSession
    return "timeout" in inspect.signature(CDPSession.send).parameters
  except (ImportError, TypeError, ValueError):
    return False


_CDP_TIMEOUT = _cdp_send_takes_a_timeout()

# Actions that are only input events (no navigation, no wait): the action time limit holds.
_INPUT_ACTIONS = ("click", "hover", "drag", "scroll", "press_keys")


class Abort(Exception):
  """The browser or page can no longer be used; the episode ends with this reason."""


class ActionError(Exception):
  """The action could not be done; the agent is told and the episode goes on."""


class Browser:
  """One Chromium and its current browser context (a fresh one per task).

  Args:
    executable: Chromium's executable.
    host_rules: Chromium --host-resolver-rules (maps the sites' *.test names to the page
      server inside the sandbox).
    extra_args: more Chromium flags.
    action_timeout_s, navigation_timeout_s, screenshot_timeout_s: Playwright time limits.
  """

  def __init__(self, executable: str, *, host_rules: str = "",
               action_timeout_s: float = 5.0, navigation_timeout_s: float = 15.0,
               screenshot_timeout_s: float = 10.0, extra_args: List[str] = ()):
    from playwright.sync_api import sync_playwright
    self.action_timeout_ms = action_timeout_s * 1000
    self.navigation_timeout_ms = navigation_timeout_s * 1000
    self.screenshot_timeout_ms = screenshot_timeout_s * 1000
    args = list(CHROMIUM_FLAGS) + list(extra_args)
    if host_rules:
      args.append(f"--host-resolver-rules={host_rules}")
    self._playwright = sync_playwright().start()
    launch = dict(executable_path=executable, headless=True, args=args, handle_sigint=False,
                  handle_sigterm=False, handle_sighup=False, timeout=60_000)
    self._browser = self._playwright.chromium.launch(**launch)
    self._browser.on("disconnected", lambda *_: self._set_dead("the browser process ended"))
    self.dead: Optional[str] = None
    self.context = None
    self.pages: List[Any] = []
    self.active = 0
    self.options: Dict[str, Any] = {}
    self._cdp: Dict[Any, Any] = {}      # page -> its DevTools session (screenshots)

  def _set_dead(self, reason: str) -> None:
    self.dead = self.dead or reason

  # ------------------------------------------------------------------ tasks
  def open(self, options: Dict[str, Any]) -> Dict[str, Any]:
    """Starts a task: a fresh browser context (no cookies, storage or tabs of an earlier task),
    one tab at `options["url"]`, then `options["setup"]` (JavaScript run on the page, e.g.
    MiniWoB's seeded episode start). Returns the first observation.

    options: url, viewport {width, height}, device_scale, screenshot {format, quality, scale},
      probe (JavaScript expression or ""), setup (JavaScript or ""), a11y (bool),
      settle_ms (extra wait after each action), locale, timezone.
    """
    self._check_alive()
    if self.context is not None:
      try:
        self.context.close()
      except Exception:  # noqa: BLE001 - a broken context is replaced anyway
        pass
    self.options = dict(options)
    self._cdp = {}
    viewport = options.get("viewport") or {"width": 1280, "height": 1000}
    self.context = self._browser.new_context(
        viewport={"width": int(viewport["width"]), "height": int(viewport["height"])},
        device_scale_factor=float(options.get("device_scale") or 1.0),
        locale=options.get("locale") or "en-US", timezone_id=options.get("timezone") or "UTC",
        service_workers="block", accept_downloads=False)
    self.context.set_default_timeout(self.action_timeout_ms)
    self.context.set_default_navigation_timeout(self.navigation_timeout_ms)
    self.context.on("page", self._on_page)
    self.pages, self.active = [], 0
    page = self.context.new_page()
    self._goto(page, options["url"])
    if options.get("setup"):
      self._evaluate(page, options["setup"])
    return self.observe()

  def _on_page(self, page) -> None:
    """A tab the page opened (target=_blank, window.open) or new_tab: it becomes the active tab,
    as in a desktop browser."""
    page.on("crash", lambda *_: self._set_dead(f"the page {page.url} crashed"))
    if page not in self.pages:
      self.pages.append(page)
    self.active = self.pages.index(page)

  # ------------------------------------------------------------------ actions
  def act(self, action: Dict[str, Any]) -> str:
    """Performs one action (pixel coordinates); returns a short description of what was done.

    Raises:
      ActionError: the action could not be done (the agent is told).
      Abort: the browser or page is gone or stopped responding.
    """
    self._check_alive()
    name = action.get("name")
    page = self.page
    mouse, keyboard = page.mouse, page.keyboard
    url_before = page.url
    # Input events into a page whose script hangs never return: past the action time limit a
    # watchdog ends the page's renderer and the episode is aborted as hung.
    guard = _Watchdog(self.action_timeout_ms / 1000 if name in _INPUT_ACTIONS else None)
    try:
      with guard:
        if name == "click":
          mouse.click(action["x"], action["y"], button=action.get("button", "left"),
                      click_count=int(action.get("clicks", 1)))
          done = f"clicked at ({action['x']:.0f}, {action['y']:.0f}) px"
        elif name == "hover":
          mouse.move(action["x"], action["y"])
          done = f"moved the mouse to ({action['x']:.0f}, {action['y']:.0f}) px"
        elif name == "drag":
          mouse.move(action["x"], action["y"])
          mouse.down()
          mouse.move(action["to_x"], action["to_y"], steps=8)
          mouse.up()
          done = (f"dragged from ({action['x']:.0f}, {action['y']:.0f}) to "
                  f"({action['to_x']:.0f}, {action['to_y']:.0f}) px")
        elif name == "write":
          if action.get("clear"):
            keyboard.press("ControlOrMeta+A")
            keyboard.press("Delete")
          keyboard.type(action["text"])
          if action.get("enter"):
            keyboard.press("Enter")
          done = f"typed {len(action['text'])} characters"
        elif name == "press_keys":
          keyboard.press("+".join(action["keys"]))
          done = f"pressed {'+'.join(action['keys'])}"
        elif name == "scroll":
          mouse.move(action["x"], action["y"])
          mouse.wheel(action.get("dx", 0), action.get("dy", 0))
          done = f"scrolled by ({action.get('dx', 0):.0f}, {action.get('dy', 0):.0f}) px"
        elif name == "wait":
          page.wait_for_timeout(float(action["seconds"]) * 1000)
          done = f"waited {float(action['seconds']):g} s"
        elif name == "goto_url":
          self._goto(page, action["url"])
          done = f"opened {action['url']}"
        elif name == "go_back":
          if page.go_back(wait_until="load") is None:
            raise ActionError("there is no earlier page in this tab's history")
          done = "went back"
        elif name == "new_tab":
          new = self.context.new_page()   # _on_page makes it the active tab
          if action.get("url"):
            self._goto(new, action["url"])
          done = f"opened tab {self.pages.index(new)}"
        elif name == "switch_tab":
          index = int(action["index"])
          if not 0 <= index < len(self.pages):
            raise ActionError(f"there is no tab {index}; the tabs are 0-{len(self.pages) - 1}")
          self.active = index
          self.pages[index].bring_to_front()
          done = f"switched to tab {index}"
        elif name == "close_tab":
          index = int(action.get("index", self.active))
          if not 0 <= index < len(self.pages):
            raise ActionError(f"there is no tab {index}; the tabs are 0-{len(self.pages) - 1}")
          if len(self.pages) == 1:
            raise ActionError("the last tab cannot be closed")
          closing = self.pages.pop(index)
          self._cdp.pop(closing, None)
          closing.close()
          self.active = min(self.active if self.active < index else max(self.active - 1, 0),
                            len(self.pages) - 1)
          self.pages[self.active].bring_to_front()
          done = f"closed tab {index}"
        else:
          raise ActionError(f"unknown action {name!r}")
    except (ActionError, Abort):
      raise
    except Exception as e:  # noqa: BLE001 - Playwright's errors, sorted below
      if guard.fired:
        raise Abort(f"the page stopped responding during {name}: no answer within "
                    f"{self.action_timeout_ms / 1000:g} s") from None
      self._raise_sorted(e, name)
    if guard.fired:             # it returned, but only once the watchdog had ended the page
      raise Abort(f"the page stopped responding during {name}: no answer within "
                  f"{self.action_timeout_ms / 1000:g} s")
    self._settle(url_before)
    return done

  def _goto(self, page, url: str) -> None:
    try:
      page.goto(url, wait_until="load")
    except Exception as e:  # noqa: BLE001
      text = str(e).splitlines()[0]
      if "Timeout" in type(e).__name__ or "Timeout" in text:
        raise Abort(f"the page {url} did not finish loading within "
                    f"{self.navigation_timeout_ms / 1000:g} s") from None
      self._check_alive()
      raise ActionError(f"could not open {url}: {text}") from None

  def _raise_sorted(self, error: Exception, name: Optional[str]) -> None:
    self._check_alive()
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "Timeout" in type(error).__name__ or "Timeout" in text:
      raise Abort(f"the page stopped responding during {name} ({text})")
    if "closed" in text.lower() or "crash" in text.lower():
      raise Abort(f"the browser failed during {name}: {text}")
    raise ActionError(f"{name} failed: {text}")

  def _settle(self, url_before: str) -> None:
    """Waits for what the action set off: a navigation to finish loading, then the task's extra
    settle time. (The observation that follows waits for the next animation frame.)"""
    page = self.page
    if page.url != url_before:
      try:
        page.wait_for_load_state("load", timeout=self.navigation_timeout_ms)
      except Exception as e:  # noqa: BLE001
        self._raise_sorted(e, "settling")
    extra = float(self.options.get("settle_ms") or 0)
    if extra > 0:
      page.wait_for_timeout(extra)

  # ------------------------------------------------------------------ observation
  @property
  def page(self):
    if not self.pages:
      raise Abort("no tab is open (the task was never opened)")
    self.active = min(self.active, len(self.pages) - 1)
    return self.pages[self.active]

  def observe(self, *, screenshot: bool = True) -> Dict[str, Any]:
    """The observation: {screenshot (base64), format, width, height (image pixels), url,
    title, tabs [{index, url, title, active}], probe, a11y (when asked), seconds}.

    Raises:
      Abort: the page did not reach its next animation frame within the action time limit
        (its script hangs), or the browser is gone.
    """
    self._check_alive()
    t0 = time.perf_counter()
    page = self.page
    probe = self.options.get("probe") or ""
    info = self._page_info(page, probe if self.active == 0 else "")
    out: Dict[str, Any] = {"url": page.url}
    if screenshot:
      shot = self.options.get("screenshot") or {}
      fmt = shot.get("format", "png")
      data = self._screenshot(page, fmt, shot)
      out.update(screenshot=base64.b64encode(data).decode("ascii"), format=fmt,
                 **_image_size(data, fmt))
    tabs = []
    for i, tab in enumerate(self.pages):
      if i == self.active:
        title = info.get("title") or ""
      else:
        try:
          title = tab.title()
        except Exception:  # noqa: BLE001 - a tab mid-navigation has no title yet
          title = ""
      tabs.append({"index": i, "url": tab.url, "title": title, "active": i == self.active})
    out["tabs"] = tabs
    out["title"] = tabs[self.active]["title"]
    if not probe:
      out["probe"] = None
    elif self.active == 0 and info.get("probe_error") is None:
      out["probe"] = info.get("probe")
    else:       # another tab is active, or the page's policy forbids eval
      out["probe"] = self._probe(probe)
    if self.options.get("a11y"):
      try:
        out["a11y"] = page.locator("body").aria_snapshot(timeout=self.action_timeout_ms)
      except Exception as e:  # noqa: BLE001
        out["a11y"] = f"(no accessibility tree: {str(e).splitlines()[0]})"
    out["seconds"] = round(time.perf_counter() - t0, 4)
    return out

  def _page_info(self, page, probe: str) -> Dict[str, Any]:
    """INFO_SCRIPT on `page`, within the action time limit (past it the page is hung)."""
    try:
      handle = page.wait_for_function(INFO_SCRIPT, arg=probe, timeout=self.action_timeout_ms)
      return handle.json_value() or {}
    except Exception as e:  # noqa: BLE001
      self._raise_sorted(e, "settling")
    return {}

  def _screenshot(self, page, fmt: str, shot: Dict[str, Any]) -> bytes:
    """A screenshot of the viewport. At CSS scale (one image pixel per CSS pixel, the default)
    through the page's own DevTools session: Chromium's `Page.captureScreenshot` with
    `optimizeForSpeed` (its fast encoder settings: a 1280x1000 PNG in well under half the time
    Playwright's screenshot takes, about 1.5x the bytes; the pixels are the same). A clip would
    reset the page's emulated device scale from this second session, so device-pixel
    screenshots of a scaled page go through Playwright's screenshot, as does a capture that
    did not answer within screenshot_timeout_s (then Playwright's own limit decides whether
    the page is hung). Where Playwright's DevTools calls take no time limit (older releases),
    a watchdog ends the page's renderer past it instead and the episode is aborted as hung.
    Chromium's transient "Unable to capture screenshot" (no compositor frame yet, e.g. right
    after a new browser context or a navigation) is retried a few times."""
    scale = shot.get("scale", "css")
    playwright = scale == "device" and float(self.options.get("device_scale") or 1.0) != 1.0
    params: Dict[str, Any] = {"format": fmt, "optimizeForSpeed": True}
    if fmt in ("jpeg", "webp") and shot.get("quality") is not None:
      params["quality"] = int(shot["quality"])
    limit_s = self.screenshot_timeout_ms / 1000
    for attempt in range(4):
      watchdog = _Watchdog(None if playwright or _CDP_TIMEOUT else limit_s)
      try:
        if playwright:
          kwargs = dict(type=fmt, scale=scale, timeout=self.screenshot_timeout_ms,
                        animations="allow", caret="initial")
          if "quality" in params:
            kwargs["quality"] = params["quality"]
          return page.screenshot(**kwargs)
        limit = {"timeout": self.screenshot_timeout_ms} if _CDP_TIMEOUT else {}
        with watchdog:
          data = self._session(page).send("Page.captureScreenshot", params, **limit)["data"]
        if not watchdog.fired:
          return base64.b64decode(data)
        raise Abort(f"the page stopped responding: no screenshot within {limit_s:g} s")
      except Abort:
        raise
      except Exception as e:  # noqa: BLE001
        if watchdog.fired:
          raise Abort(f"the page stopped responding: no screenshot within {limit_s:g} s") \
              from None
        self._check_alive()
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "Timeout" in type(e).__name__ or "Timeout" in text:
          if not playwright:         # the DevTools capture hung: Playwright's decides
            playwright = True
            continue
          raise Abort(f"the page stopped responding: no screenshot within {limit_s:g} s "
                      f"({text})") from None
        if "crash" in text.lower() or "closed" in text.lower() or attempt == 3:
          raise Abort(f"the page stopped responding: no screenshot ({text})") from None
        page.wait_for_timeout(100 * (attempt + 1))
    raise Abort("the page stopped responding: no screenshot")

  def _session(self, page):
    """The page's DevTools session (one per tab, opened on first use)."""
    session = self._cdp.get(page)
    if session is None:
      session = self._cdp[page] = self.context.new_cdp_session(page)
    return session

  def _probe(self, expression: str) -> Any:
    """The probe on the task's first tab (where the task's page lives), or None."""
    try:
      return self._evaluate(self.pages[0], expression)
    except ActionError:
      return None

  def evaluate(self, expression: str, *, tab: Optional[int] = None) -> Any:
    """A JavaScript expression's JSON value on a tab (the active one by default): the
    checker's and the scripted expert's privileged view of the page, never the agent's."""
    self._check_alive()
    page = self.page if tab is None else self.pages[int(tab)]
    return self._evaluate(page, expression)

  def _evaluate(self, page, expression: str) -> Any:
    try:
      return page.evaluate(expression)
    except Exception as e:  # noqa: BLE001
      self._check_alive()
      raise ActionError(f"script failed: {str(e).splitlines()[0]}") from None

  # ------------------------------------------------------------------ life
  def _check_alive(self) -> None:
    if self.dead:
      raise Abort(self.dead)
    if not self._browser.is_connected():
      self._set_dead("the browser process ended")
      raise Abort(self.dead)

  def health(self) -> Dict[str, Any]:
    return {"alive": self.dead is None and self._browser.is_connected(), "dead": self.dead,
            "version": self._browser.version, "tabs": len(self.pages)}

  def close(self) -> None:
    try:
      self._browser.close()
    except Exception:  # noqa: BLE001
      pass
    try:
      self._playwright.stop()
    except Exception:  # noqa: BLE001
      pass


class _Watchdog:
  """Kills this process's Chromium renderers (or its Chromium, when the renderer runs inside it)
  when its block outlasts `seconds` (a call into a hung page that has no time limit of its own
  then fails instead of blocking for ever);
  `fired` says whether it did. None: no limit."""

  def __init__(self, seconds: Optional[float]):
    self.fired = False
    self._timer = None
    if seconds is not None:
      self._timer = threading.Timer(seconds, self._fire)
      self._timer.daemon = True

  def __enter__(self) -> "_Watchdog":
    if self._timer is not None:
      self._timer.start()
    return self

  def __exit__(self, *exc) -> None:
    if self._timer is not None:
      self._timer.cancel()

  def _fire(self) -> None:
    self.fired = True
    chromium, renderers = [], []
    for pid in _descendants(os.getpid()):
      try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          argv = f.read().split(b"\0")
      except OSError:
        continue
      if any(b"--type=renderer" == a or a.startswith(b"--type=renderer") for a in argv):
        renderers.append(pid)
      elif argv and b"chrom" in os.path.basename(argv[0]):
        chromium.append(pid)
    # The renderer processes; with a --single-process browser (chromium_args) the renderer is
    # a thread of the browser, which then goes (the rollout is aborted either way).
    for pid in renderers or chromium:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        continue


def _descendants(root: int) -> List[int]:
  """Every process below `root`, from /proc."""
  children: Dict[int, List[int]] = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    children.setdefault(parent, []).append(int(entry))
  out, stack = [], [root]
  while stack:
    for child in children.get(stack.pop(), ()):
      out.append(child)
      stack.append(child)
  return out


def _image_size(data: bytes, fmt: str) -> Dict[str, int]:
  """Width and height read from a PNG's IHDR or a JPEG's SOF marker (no imaging library here)."""
  if fmt == "png" and data[:8] == b"\x89PNG\r\n\x1a\n":
    return {"width": int.from_bytes(data[16:20], "big"), "height": int.from_bytes(data[20:24], "big")}
  if fmt == "jpeg":
    i = 2
    while i + 9 < len(data):
      if data[i] != 0xFF:
        i += 1
        continue
      marker = data[i + 1]
      if marker in (0xC0, 0xC1, 0xC2):
        return {"height": int.from_bytes(data[i + 5:i + 7], "big"),
                "width": int.from_bytes(data[i + 7:i + 9], "big")}
      i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
  return {"width": 0, "height": 0}
