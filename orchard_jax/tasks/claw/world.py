"""A rollout's world: its services running inside its own Orchard Env sandbox.

`ClawWorld` creates one sandbox, copies the services' zip application into it, starts the
services the task names (each its own process, seeded from the task's fixtures, with the
task's faults) with one exec, and publishes each service's port through Orchard Env's exposed
URLs. Nothing is shared between rollouts: state, audit log and faults live in that sandbox's
processes, and the sandbox's network namespace keeps its ports private (an external harness
running in the same sandbox reaches them at `http://127.0.0.1:<port>`).

Tool calls go `ClawWorld.call(name, arguments)` -> exposed URL -> the service, and come back as
a `ToolResult`: a 2xx answer's JSON, or the service's error (4xx for bad arguments, injected
429/500/503) as text the agent can read and recover from. A service that stops answering (its
process died: Orchard Env answers 502 for its port) gives a result with `abort` set, which ends
the episode as aborted with that reason.

```python
with ClawWorld(env_client, task.service_resets(seed=0)) as world:
  backend = world.backend(task.tools)            # .tools (OpenAI schemas), .call(name, args)
  ... run an agent ...
  evidence = world.evidence()                    # audit log + final state of every service
```
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
import time
from typing import Any, Iterable, Mapping, Optional, Sequence

import httpx

from orchard_jax.tasks.claw import bundle
from orchard_jax.tasks.claw import services as _services
from orchard_jax.tasks.claw.services.client import error_text, result_text  # noqa: F401
from orchard_jax.tasks.claw.errors import ServiceDied, ServicesError
from orchard_jax.tasks.claw.tools import TOOLS, Tool
from orchard_jax.tasks.sandbox_app.host import SandboxApp

CONTROL_HEADER = _services.CONTROL_HEADER
CLAW_COMMAND = "/tmp/claw/bin/claw"


@dataclasses.dataclass
class ToolResult:
  """What one tool call returned.

  Attributes:
    tool: the tool name.
    status: the service's HTTP status (0 when the call never reached a service).
    body: the decoded JSON answer (None when there was none).
    content: the text the agent sees: the JSON answer, or `Error <status> (<type>): <message>`.
    is_error: not a 2xx answer.
    abort: why the episode must end (the service died), or None.
    seconds: wall time of the call.
  """
  tool: str
  status: int
  body: Any
  content: str
  is_error: bool
  abort: Optional[str] = None
  seconds: float = 0.0


@dataclasses.dataclass
class Evidence:
  """What graders read after an episode: per service, the audit log and the final state.

  Attributes:
    audit: every tool call of every service, in the order they were answered (entries carry
      service, operation, arguments, status, ok, fault, result, time, ts).
    state: {service: {table: [record, ...]}}.
    alive: {service: whether it still answered at the end}.
  """
  audit: list
  state: dict
  alive: dict

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def tool_result(tool: str, status: int, body: Any, seconds: float) -> ToolResult:
  """The result of a call the service answered with `status` and `body`."""
  if 200 <= status < 300:
    return ToolResult(tool, status, body, result_text(body), False, seconds=seconds)
  return ToolResult(tool, status, body, error_text(status, body), True, seconds=seconds)


def unknown_tool(tool: str, services: Iterable[str]) -> ToolResult:
  """The result of a call to a tool no running service has."""
  names = set(services)
  offered = sorted(t for t, s in TOOLS.items() if s.service in names)
  return ToolResult(tool, 0, None, f"Error: unknown tool {tool!r}; the tools here are "
                    f"{', '.join(offered)}", True)


class ClawWorld(SandboxApp):
  """The services of one rollout in one sandbox (see the module docstring).

  Args:
    env_client: an Orchard Env `SandboxClient`.
    resets: {service name: reset body ({"fixtures", "faults", "now", "seed", "user"})} for the
      services to start.
    image, cpu, memory, disk, timeout_s: the sandbox to create (timeout_s is its TTL).
    egress: endpoints the sandbox may reach (Orchard Env's allow-list), e.g. the recording
      proxy for a harness running inside it; `box.egress_url(url)` is how it reaches them.
    call_timeout_s: how long one tool call may take before the agent is told it timed out.
    start_timeout_s: how long starting the services may take.
    ports: service -> port inside the sandbox (default services.DEFAULT_PORTS).
  Raises (on entering):
    ServicesError: the sandbox or the services did not start; the message has the reason.
  """

  error = ServicesError
  noun = "the services"

  def __init__(self, env_client, resets: Mapping[str, dict], *, image: str = "host",
               cpu: float = 1.0, memory: str = "512Mi", disk: str = "128Mi",
               timeout_s: float = 3600.0, call_timeout_s: float = 30.0,
               start_timeout_s: float = 60.0, ports: Optional[Mapping[str, int]] = None,
               egress: Sequence[str] = ()):
    unknown = [s for s in resets if s not in _services.SERVICES]
    if unknown or not resets:
      raise ServicesError(f"services to start must be some of {list(_services.SERVICES)}, got "
                          f"{list(resets)}")
    sandbox_kwargs = dict(image=image, cpu=cpu, memory=memory, disk=disk, timeout=timeout_s)
    if egress:
      sandbox_kwargs["egress"] = list(egress)
    super().__init__(env_client, sandbox_kwargs)
    self.resets = {name: dict(body or {}) for name, body in resets.items()}
    self.call_timeout_s, self.start_timeout_s = call_timeout_s, start_timeout_s
    self.ports = {name: (ports or _services.DEFAULT_PORTS)[name] for name in self.resets}
    self.token = secrets.token_hex(16)
    self.urls: dict[str, str] = {}
    self.pids: dict[str, int] = {}
    self._dead: dict[str, str] = {}

  def _start(self) -> None:
    config = {"services": {name: {"port": self.ports[name], "reset": body}
                           for name, body in self.resets.items()},
              "control_token": self.token, "log": "/tmp/claw/services.log"}
    answer = self.start_app(bundle.SANDBOX_PATH, bundle.services_zipapp(),
                            ["python3", "-S", bundle.SANDBOX_PATH, "start"], config,
                            timeout_s=self.start_timeout_s)
    self.pids = dict(answer.get("pids") or {})
    for name, port in self.ports.items():
      self.urls[name] = self.box.expose_port(port, ttl=self.sandbox_kwargs["timeout"])["url"]
    self._http = httpx.Client(timeout=self.call_timeout_s)

  @property
  def internal_urls(self) -> dict[str, str]:
    """Each service's base URL as seen from inside the sandbox (for an in-sandbox harness)."""
    return {name: f"http://127.0.0.1:{port}" for name, port in self.ports.items()}

  def install_tools(self, tools: Sequence[Tool]) -> str:
    """Publishes `tools` inside the sandbox for an in-sandbox harness: the tool list and the
    `claw` command (`services.client`: `claw tools`, `claw call NAME JSON`, `claw mcp`).
    Returns the command's path."""
    from orchard_jax.tasks.claw.services.client import TOOLS_FILE
    catalogue = {"tools": [{"name": t.name, "service": t.service, "path": t.path,
                            "description": t.description, "parameters": t.parameters}
                           for t in tools],
                 "ports": {name: self.ports[name] for name in {t.service for t in tools}}}
    self.box.upload(TOOLS_FILE, json.dumps(catalogue))
    self.box.upload(CLAW_COMMAND, f"#!/bin/sh\nexec python3 -S {bundle.SANDBOX_PATH} \"$@\"\n",
                    mode=0o755)
    return CLAW_COMMAND

  # ------------------------------------------------------------------ tool calls
  def call(self, tool: str, arguments: Any) -> ToolResult:
    """Calls a tool; `arguments` is the JSON text the model produced (passed on unchanged, so
    the service judges it) or an already decoded object. Never raises for what the service
    answers; a dead service gives a result with `abort` set."""
    t0 = time.perf_counter()
    spec = TOOLS.get(tool)
    if spec is None or spec.service not in self.urls:
      return unknown_tool(tool, self.urls)
    if spec.service in self._dead:
      return self._abort(tool, spec.service, self._dead[spec.service], t0)
    content = arguments if isinstance(arguments, (str, bytes)) else json.dumps(arguments)
    url = self.urls[spec.service] + spec.path.lstrip("/")
    try:
      response = self._client().post(url, content=content,
                                     headers={"Content-Type": "application/json"})
    except httpx.TimeoutException:
      return ToolResult(tool, 0, None, f"Error: the {spec.service} service did not answer within "
                        f"{self.call_timeout_s:g} s; the call may or may not have taken effect",
                        True, seconds=time.perf_counter() - t0)
    except httpx.TransportError as e:
      return self._abort(tool, spec.service, f"cannot reach Orchard Env for the {spec.service} "
                         f"service: {type(e).__name__}: {e}", t0)
    try:
      body = response.json()
    except ValueError:
      body = response.text
    if _gateway_failure(response, body):
      return self._abort(tool, spec.service, self._death_reason(spec.service, body), t0)
    return tool_result(tool, response.status_code, body, time.perf_counter() - t0)

  def _client(self) -> httpx.Client:
    if self._http is None:
      raise ServicesError("the world is not running (use it inside its `with` block)")
    return self._http

  def _abort(self, tool: str, service: str, reason: str, t0: float) -> ToolResult:
    self._dead.setdefault(service, reason)
    return ToolResult(tool, 0, None, f"Error: {reason}", True, abort=reason,
                      seconds=time.perf_counter() - t0)

  def _death_reason(self, service: str, body: Any) -> str:
    detail = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
      detail = body["error"].get("message", "")
    return f"the {service} service stopped answering mid-episode ({detail or 'no answer'})"

  def backend(self, tools: Sequence[Tool]) -> "ServiceTools":
    """The tool backend an agent uses: offers `tools`, refuses any other name."""
    return ServiceTools(self, list(tools))

  # ------------------------------------------------------------------ control
  def _control(self, service: str, method: str, route: str, body: Any = None) -> Any:
    url = self.urls[service] + route
    try:
      response = self._client().request(method, url, headers={CONTROL_HEADER: self.token},
                                        content=None if body is None else json.dumps(body))
    except httpx.HTTPError as e:
      raise ServiceDied(f"the {service} service did not answer {method} /{route}: "
                        f"{type(e).__name__}: {e}") from e
    try:
      data = response.json()
    except ValueError:
      data = response.text
    if _gateway_failure(response, data):
      raise ServiceDied(self._death_reason(service, data))
    if response.status_code != 200:
      raise ServicesError(f"{method} /{route} of {service}: {error_text(response.status_code, data)}")
    return data

  def reset(self, service: str, body: dict) -> dict:
    """Re-seeds one service (`/reset`); its audit log starts empty again."""
    return self._control(service, "POST", "reset", body)

  def audit(self, service: str) -> list:
    return self._control(service, "GET", "audit")["entries"]

  def state(self, service: str) -> dict:
    return self._control(service, "GET", "state")["tables"]

  def alive(self, service: str) -> bool:
    try:
      self._control(service, "GET", "health")
      return True
    except ServicesError:
      return False

  def evidence(self) -> Evidence:
    """Audit logs and final states of every service; a dead service contributes an empty
    state and whatever is known (nothing) of its log, and `alive` says so."""
    audit, state, alive = [], {}, {}
    for name in self.resets:
      try:
        audit += self.audit(name)
        state[name] = self.state(name)
        alive[name] = True
      except ServicesError:
        state[name], alive[name] = {}, False
    audit.sort(key=lambda e: (e.get("ts", 0.0), e.get("service", ""), e.get("seq", 0)))
    return Evidence(audit, state, alive)

  def kill(self, service: str) -> None:
    """Kills one service's process (the fault-injection test of a service dying)."""
    pid = self.pids.get(service)
    if pid is None:
      raise ServicesError(f"no process for service {service!r}")
    self.box.exec(f"kill -9 {shlex.quote(str(pid))}", timeout=30)


def _gateway_failure(response: httpx.Response, body: Any) -> bool:
  """Orchard Env's own answer that the port is gone (its sandbox or process died), as opposed
  to an answer of the service (which never uses 502, or 404 with `code`)."""
  if response.status_code not in (404, 410, 502):
    return False
  error = body.get("error") if isinstance(body, dict) else None
  return isinstance(error, dict) and "code" in error


class ServiceTools:
  """A tool backend over a world (what `harness.ToolAgent` drives).

  Attributes:
    tools: the OpenAI schemas offered.
  """

  def __init__(self, world: Any, tools: Sequence[Tool]):
    self.world = world
    self.offered = {t.name for t in tools}
    self.tools = [t.openai_schema() for t in tools]

  def call(self, name: str, arguments: Any) -> ToolResult:
    """One call of an offered tool; any other name is refused with the list of offered ones."""
    if name not in self.offered:
      return ToolResult(name, 0, None, f"Error: there is no tool named {name!r}; use one of "
                        f"{', '.join(sorted(self.offered))}", True)
    return self.world.call(name, arguments)
