"""What must never go wrong with a browser sandbox, on real Chromium in real sandboxes:

- a malformed action (coordinates outside 0-1000, an unknown key, a missing field, broken JSON)
  is a format error the agent sees, never a crash; three in a row score -1;
- a page that hangs, or a browser that crashes, ends the episode as aborted with the reason;
- no Chromium process outlives its sandbox: after a rollout, after a crash, and after the env
  service is killed with SIGKILL (processes found from the host by the sandbox's pid namespace);
- viewport, device scale, screenshot format and the accessibility tree are configuration;
- the same browser sandbox runs on the Kubernetes backend (against tests/env/fake_kube.py: no
  cluster can run here; each pod still runs the real agent and Chromium in bubblewrap).
"""
import dataclasses
import json
import sys
import time
import uuid

import pytest

from orchard_jax.env import SandboxClient, ServiceProcess
from orchard_jax.harness.browser_agent import BrowserAgent, BrowserAgentConfig
from orchard_jax.harness.model_client import ChatResponse
from orchard_jax.tasks.gui import episode, miniwob, solutions
from orchard_jax.tasks.gui.sandbox import CONTROL_PORT, BrowserConfig, BrowserSandbox
from orchard_jax.tasks.gui.task import miniwob_tasks, site_tasks
from orchard_jax.tasks.gui.tools import BrowserTools
from tests.tasks.gui.conftest import browser_namespace, chromium_pids, processes_in_namespace

pytestmark = pytest.mark.slow


class ListModel:
  """Replies with the given tool calls in order (raw argument text), then done."""

  def __init__(self, calls):
    self.calls = list(calls)

  def complete(self, messages, *, tools=None):
    name, arguments = self.calls.pop(0) if self.calls else ("done", "{}")
    call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}
    return ChatResponse("", "tool_calls", {}, {}, [call], {"role": "assistant", "content": None,
                                                           "tool_calls": [call]})


def list_agent(calls, **config):
  def agent(tools, instruction):
    return BrowserAgent(ListModel(calls), tools, BrowserAgentConfig(**config)).run(instruction)
  return agent


def _wait_until(predicate, timeout):
  deadline = time.monotonic() + timeout
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.1)
  return predicate()


CLICK_TEST = miniwob_tasks(["click-test"], split="eval")[0]
BAD_CALLS = [("click", '{"x": 1200, "y": 10}'), ("press_keys", '{"keys": ["Hyperspace"]}'),
             ("goto_url", "{}"), ("click", '{"x": 5, "y": ')]


def test_bad_arguments_are_format_errors_the_agent_sees_and_three_in_a_row_score_minus_one(
    browser):
  result = episode.run_episode(CLICK_TEST, browser, list_agent(BAD_CALLS[:3]))
  assert result.exit_status == "RepeatedFormatError"
  assert result.outcome.status == "format_failure" and result.outcome.reward == -1.0
  errors = [m["content"] for m in result.run.messages if m["role"] == "tool"]
  assert errors == ["Error: click: 'x' must be from 0 to 1000, got 1200",
                    "Error: press_keys: unknown key 'Hyperspace'; use a modifier (Control, "
                    "Shift, Alt, Meta), one of Enter, Tab, Escape, Backspace, Delete, Insert, "
                    "Home, End, PageUp, PageDown, ArrowUp, ArrowDown, ArrowLeft, ArrowRight, "
                    "F1-F12, or a single character",
                    "Error: goto_url: missing required argument(s) 'url'"]
  assert result.run.format_errors == 3 and browser.health()["alive"]
  # a good call between bad ones resets the count; the episode goes on to the page's reward
  box = browser.evaluate("(() => { const r = document.getElementById('subbtn')"
                         ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2,"
                         " innerWidth, innerHeight]; })()", tab=0)
  calls = [BAD_CALLS[3], BAD_CALLS[0], ("hover", '{"x": 1, "y": 1}'), BAD_CALLS[1], BAD_CALLS[2],
           ("click", json.dumps({"x": box[0] / box[2] * 1000, "y": box[1] / box[3] * 1000}))]
  result = episode.run_episode(CLICK_TEST, browser, list_agent(calls))
  assert result.exit_status == "Submitted" and result.run.format_errors == 4
  assert result.outcome.status == "success", result.outcome


def test_a_reply_without_a_tool_call_is_a_format_error(browser):
  class Chatty:
    def complete(self, messages, *, tools=None):
      return ChatResponse.of_text("I think I am done.")
  result = episode.run_episode(CLICK_TEST, browser, lambda tools, instruction: BrowserAgent(
      Chatty(), tools, BrowserAgentConfig()).run(instruction))
  assert result.outcome.status == "format_failure" and result.outcome.reward == -1.0


@pytest.fixture(scope="module")
def fragile(env_client):
  """A browser with short in-page time limits, device scale 2 and JPEG screenshots."""
  config = BrowserConfig(viewport=(400, 300), device_scale=2.0, screenshot_scale="device",
                         screenshot_format="jpeg", screenshot_quality=60, action_timeout_s=2.0,
                         screenshot_timeout_s=3.0, step_timeout_s=30.0)
  return config


def test_viewport_scale_format_and_a11y_are_configuration(env_client, fragile):
  with BrowserSandbox(env_client, fragile, sites=["shop"]) as browser:
    obs = browser.open("http://shop.test/")
    assert obs.screenshot[:3] == b"\xff\xd8\xff" and obs.format == "jpeg"
    assert (obs.width, obs.height) == (800, 600) == fragile.image_size
    assert browser.evaluate("[innerWidth, innerHeight, devicePixelRatio]") == [400, 300, 2]
  with BrowserSandbox(env_client, BrowserConfig(viewport=(320, 240), a11y=True)) as browser:
    obs = browser.open(miniwob.url("click-test"))
    assert obs.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and (obs.width, obs.height) == (320, 240)
    # a text-only policy's observation: the accessibility tree names the page's button
    assert "button" in obs.a11y.lower() and "Click Me!" in obs.a11y, obs.a11y
    text_only = BrowserTools(browser, observation="a11y").observe()["content"]
    assert [p["type"] for p in text_only] == ["text", "text"]
    assert text_only[1]["text"].startswith("Accessibility tree:\n") and "Click Me!" in \
        text_only[1]["text"]


def test_a_hung_page_aborts_the_episode_with_the_reason_and_leaves_nothing(env_client, fragile):
  task = site_tasks(["shop/cheapest"])[0]
  # the harness gives up on a control call after 10 s (the driver's own 2-3 s limits come first
  # when it can still answer)
  hung = dataclasses.replace(fragile, step_timeout_s=10.0)
  with BrowserSandbox(env_client, hung, sites=["shop"]) as browser:
    namespace, pids = browser_namespace(browser)

    def agent(tools, instruction):
      browser.evaluate("setTimeout(() => { for (;;) {} }, 50)")   # the page's script hangs
      time.sleep(0.2)
      return BrowserAgent(ListModel([("hover", '{"x": 500, "y": 500}')]), tools,
                          BrowserAgentConfig()).run(instruction)
    result = episode.run_episode(task, browser, agent)
    assert result.exit_status == "aborted" and result.outcome.status == "aborted"
    assert result.outcome.reward is None
    assert "stopped responding" in result.outcome.reason or "did not answer" in \
        result.outcome.reason, result.outcome.reason
  assert _wait_until(lambda: not processes_in_namespace(namespace), 15)
  assert not set(pids) & set(chromium_pids())


def test_a_crashed_browser_aborts_the_episode_and_no_chromium_outlives_the_rollout(env_client):
  task = site_tasks(["mail/star"])[0]
  with BrowserSandbox(env_client, BrowserConfig(viewport=(640, 480)), sites=["mail"]) as browser:
    namespace, pids = browser_namespace(browser)
    inside = browser.exec("for d in /proc/[0-9]*; do case \"$(readlink $d/exe)\" in "
                          "*chromium*) echo ${d#/proc/};; esac; done | sort -n | head -1")
    browser_pid = int(inside.stdout.strip())

    def agent(tools, instruction):
      browser.exec(f"kill -9 {browser_pid}")   # the browser process itself, by its pid
      return BrowserAgent(ListModel([("click", '{"x": 500, "y": 500}')]), tools,
                          BrowserAgentConfig()).run(instruction)
    result = episode.run_episode(task, browser, agent)
    assert result.outcome.status == "aborted", result.outcome
    assert "browser" in result.outcome.reason, result.outcome.reason
  assert _wait_until(lambda: not processes_in_namespace(namespace), 15), \
      "processes of the browser's sandbox outlived the rollout"
  assert not set(pids) & set(chromium_pids())


def test_no_chromium_outlives_a_sigkill_of_the_env_service(tmp_path):
  with ServiceProcess(["--state-dir", str(tmp_path / "state"), "--log-level", "warning"]) as svc:
    client = SandboxClient(svc.url, svc.api_key)
    browser = BrowserSandbox(client, BrowserConfig(viewport=(320, 240))).__enter__()
    browser.open(miniwob.url("click-test"))
    namespace, pids = browser_namespace(browser)
    assert len(pids) >= 2   # the browser and at least a renderer or zygote
    svc.kill()              # a crash: nobody deletes anything
    assert _wait_until(lambda: not processes_in_namespace(namespace), 20), \
        "Chromium outlived the killed env service"
    assert not set(pids) & set(chromium_pids())
    client._owned.clear()   # the service is gone: nothing left to delete


def test_browser_sandbox_on_the_kubernetes_backend(tmp_path_factory):
  from orchard_jax.env import Orchestrator, ServiceConfig
  from orchard_jax.env.backends.kubernetes import KubernetesBackend, KubernetesConfig
  from tests.env import fake_kube
  # (a short folder: the fake kubelet's unix sockets live in it; the stand-in CNI routes the
  # driver's control port, which Orchard Env reaches at the pod's IP)
  with fake_kube.FakeCluster(str(tmp_path_factory.mktemp("k8s")),
                             pod_ports=(CONTROL_PORT,)) as cluster:
    backend = KubernetesBackend(KubernetesConfig(namespace="orchard-test",
                                                 agent_image="orchard-agent:test",
                                                 creation_qps=50.0),
                                api_client=cluster.api_client())
    with Orchestrator(backend, config=ServiceConfig(pending_timeout=90)) as service, \
        SandboxClient(service.url, service.api_key) as client:
      config = BrowserConfig(viewport=(320, 320), image="orchard-browser:test",
                             python=sys.executable, pids=None)
      with BrowserSandbox(client, config) as browser:
        task = miniwob_tasks(["click-button"], split="eval")[0]
        result = episode.run_episode(task, browser, solutions.scripted_agent(task))
        assert result.outcome.status == "success", result.outcome
