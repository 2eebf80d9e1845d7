"""The in-sandbox `Browser` on this machine's Chromium (no sandbox: the driver's own rules).

Screenshots go through the page's DevTools session (Chromium's fast encoder settings), and
must show the same pixels as Playwright's own screenshot at every device scale and never
disturb the page's emulated device scale. DevTools and input calls into a page whose script
hangs have no time limit of their own: the driver's watchdog ends the page and the call fails
as an abort naming the limit, instead of blocking the driver."""
import base64
import io
import os

import numpy as np
import pytest
from PIL import Image

from orchard_jax.tasks.gui.driver.browser import Abort, Browser
from orchard_jax.tasks.gui.sandbox import CHROMIUM_CANDIDATES

PAGE = ("data:text/html,<p style='font:14px serif'>Hello, the quick brown fox</p>"
        "<button onclick='document.title=\"clicked\"'>OK</button><input value=abc>")


def _pixels(data: bytes) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture
def fresh():
  executable = next(p for p in CHROMIUM_CANDIDATES if os.path.isfile(p))
  browser = Browser(executable, action_timeout_s=2.0, screenshot_timeout_s=2.0)
  yield browser
  browser.close()


def test_screenshots_match_playwrights_and_keep_the_device_scale(fresh):
  for scale, device_scale in [("css", 1.0), ("css", 2.0), ("device", 2.0), ("css", 1.5)]:
    obs = fresh.open({"url": PAGE, "viewport": {"width": 320, "height": 200},
                      "device_scale": device_scale,
                      "screenshot": {"format": "png", "scale": scale}})
    ours = base64.b64decode(obs["screenshot"])
    theirs = fresh.page.screenshot(type="png", scale=scale, animations="allow",
                                   caret="initial")
    factor = device_scale if scale == "device" else 1.0
    assert (obs["width"], obs["height"]) == (round(320 * factor), round(200 * factor))
    assert np.array_equal(_pixels(ours), _pixels(theirs)), (scale, device_scale)
    assert fresh.evaluate("devicePixelRatio") == device_scale
    fresh.act({"name": "click", "x": 20, "y": 45})          # the button
    assert fresh.observe()["title"] == "clicked"


def _hang(browser):
  browser.open({"url": PAGE, "viewport": {"width": 320, "height": 200},
                "screenshot": {"format": "jpeg", "quality": 50}})
  browser.evaluate("setTimeout(() => { for (;;) {} }, 50)")
  browser.page.wait_for_timeout(300)


def test_a_hung_page_fails_the_action_with_the_reason(fresh):
  _hang(fresh)
  with pytest.raises(Abort, match="stopped responding during hover: no answer within 2 s"):
    fresh.act({"name": "hover", "x": 10, "y": 10})
  with pytest.raises(Abort):          # the page is gone: the rollout ends (and its sandbox)
    fresh.observe()


def test_a_hung_page_fails_the_observation_and_the_screenshot_with_the_reason(fresh):
  _hang(fresh)
  with pytest.raises(Abort, match="stopped responding during settling"):
    fresh.observe()
  # A page that hangs after it answered the settle: the screenshot's own watchdog.
  with pytest.raises(Abort, match="no screenshot within 2 s"):
    fresh._screenshot(fresh.page, "png", {"format": "png"})
