"""Orchard-GUI benchmark: `python launch/bench.py --suite gui`.

Measured in one run (Orchard Env in its own process, local backend, full isolation), with
`uptime`'s load printed beside:
- browser sandbox ready: from the sandbox create request until Chromium answers inside it
  (`BrowserSandbox.__enter__`: create, copy the driver, start the page server, Playwright and
  Chromium, expose the control port), p50 and p99 over 10 sandboxes, against the issue's 3 s
  budget and beside Playwright launching the same Chromium on the host (no sandbox, no HTTP);
- one environment step (a click that toggles a MiniWoB++ checkbox, the settle, the PNG
  screenshot, back through Orchard Env's exposed port and the harness's tool backend), p50 and
  p99 over 100 steps at 1280 x 1000 (the published viewport) and at the tiny preset's
  192 x 224, against the issue's 200 ms budget and beside the same kind of click and screenshot
  by Playwright in-process on the host (the machine's floor for the work itself);
- a step that loads a page (clicking the shop's Cart and Home links in turn), p50.
"""
import os
import subprocess
import tempfile
import time

from launch.benchmarks import common

_SANDBOXES = 10
_STEPS = 100


def _uptime() -> str:
  return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _host_launch(executable: str, repeats: int) -> list:
  """Playwright starting and launching Chromium on the host, with the sandbox's flags."""
  from playwright.sync_api import sync_playwright
  from orchard_jax.tasks.gui.driver.browser import CHROMIUM_FLAGS
  out = []
  for _ in range(repeats):
    started = time.perf_counter()
    with sync_playwright() as p:
      browser = p.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
      browser.new_page().close()
      out.append(time.perf_counter() - started)
      browser.close()
  return out


def _host_steps(executable: str, url_html: str, viewport: tuple, repeats: int) -> list:
  """A click on a page's button and a PNG screenshot, Playwright in-process on the host."""
  from playwright.sync_api import sync_playwright
  from orchard_jax.tasks.gui.driver.browser import CHROMIUM_FLAGS
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    page.set_content(url_html)

    def step():
      page.mouse.click(viewport[0] // 2, viewport[1] // 4)
      page.screenshot(type="png")
    durations = common.time_calls(step, warmup=5, repeats=repeats)
    browser.close()
  return durations


_PAGE = ("<html><body style='margin:0;font:16px sans-serif'><button id=b style='width:100%;"
         "height:50%' onclick=\"this.textContent = 'clicked ' + (+this.dataset.n + 1); "
         "this.dataset.n = +this.dataset.n + 1\" data-n=0>click me</button><p>"
         + "Lorem ipsum dolor sit amet. " * 80 + "</p></body></html>")


def _centre(browser, css: str, text: str = "") -> str:
  """The tool arguments of a click at the centre of the first element matching css (and text)."""
  import json
  box = browser.evaluate(
      "(() => { const e = [...document.querySelectorAll(%s)].find(e => !%s || "
      "e.textContent.trim() === %s); const r = e.getBoundingClientRect(); return [r.x + "
      "r.width / 2, r.y + r.height / 2, innerWidth, innerHeight]; })()"
      % (json.dumps(css), json.dumps(text), json.dumps(text)))
  return json.dumps({"x": box[0] / box[2] * 1000, "y": box[1] / box[3] * 1000})


def run() -> list:
  import logging
  from orchard_jax.env import SandboxClient, ServiceProcess
  from orchard_jax.tasks.gui import BrowserConfig, BrowserSandbox, BrowserTools
  from orchard_jax.tasks.gui.sandbox import CHROMIUM_CANDIDATES
  logging.getLogger("httpx").setLevel(logging.WARNING)
  executable = next(p for p in CHROMIUM_CANDIDATES if os.path.isfile(p))
  print("load before:", _uptime(), flush=True)
  rows = []
  state = tempfile.mkdtemp(prefix="orchard-gui-bench-")
  with ServiceProcess(["--state-dir", state, "--log-level", "warning"],
                      env={"PYTHONWARNINGS": "ignore"}) as service, \
       SandboxClient(service.url, service.api_key) as client:
    ready = []
    for i in range(_SANDBOXES + 1):
      started = time.perf_counter()
      with BrowserSandbox(client, BrowserConfig(viewport=(1280, 1000)), sites=["shop"]) as b:
        elapsed = time.perf_counter() - started
        if i:                        # the first warms the page cache
          ready.append(elapsed)
        b.open("http://shop.test/")
    host = _host_launch(executable, 5)
    for q in (50, 99):
      rows.append(common.Row("browser sandbox ready (create .. Chromium answers)", f"p{q} s",
                             common.percentile(ready, q), 3.0, "budget",
                             higher_is_better=False, target=1.0))
    rows.append(common.Row("browser sandbox ready", "p50 s", common.percentile(ready, 50),
                           common.percentile(host, 50), "Playwright launching Chromium on the "
                           "host", higher_is_better=False))
    for viewport in ((1280, 1000), (192, 224)):
      with BrowserSandbox(client, BrowserConfig(viewport=viewport)) as browser:
        browser.open("http://miniwob.test/miniwob/click-checkboxes.html",
                     setup="(() => { Math.seedrandom('1'); core.startEpisodeReal(); })()")
        tools = BrowserTools(browser)
        target = _centre(browser, "#boxes label")     # found once: not part of the step
        steps = common.time_calls(lambda: tools.call("click", target), warmup=5,
                                  repeats=_STEPS)
      floor = _host_steps(executable, _PAGE, viewport, _STEPS)
      label = f"env step (click, settle, PNG screenshot) {viewport[0]}x{viewport[1]}"
      for q in (50, 99):
        rows.append(common.Row(label, f"p{q} ms", common.percentile(steps, q) * 1000, 200.0,
                               "budget", higher_is_better=False, target=1.0))
      rows.append(common.Row(label, "p50 ms", common.percentile(steps, 50) * 1000,
                             common.percentile(floor, 50) * 1000,
                             "same click + screenshot, Playwright on the host",
                             higher_is_better=False))
    with BrowserSandbox(client, BrowserConfig(viewport=(1280, 1000)), sites=["shop"]) as browser:
      browser.open("http://shop.test/")
      tools = BrowserTools(browser)
      links = [_centre(browser, "header nav a", text) for text in ("Cart", "Home")]
      turn = [0]

      def navigate():
        turn[0] += 1
        tools.call("click", links[turn[0] % 2])
      steps = common.time_calls(navigate, warmup=4, repeats=_STEPS // 2)
    rows.append(common.Row("env step with a page load (click a link) 1280x1000", "p50 ms",
                           common.percentile(steps, 50) * 1000, 200.0, "budget",
                           higher_is_better=False, target=1.0))
  print("load after:", _uptime(), f"({os.cpu_count()} cores)", flush=True)
  return rows
