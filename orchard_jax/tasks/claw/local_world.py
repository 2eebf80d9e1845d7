"""A world whose services run in this process: the same service code as `ClawWorld`, no sandbox.

For what needs the services' behaviour but not isolation from the agent: validating synthesised
tasks by running their scripted reference solutions (thousands of calls in seconds), unit tests,
and debugging a task. A model-driven rollout, or any agent that could touch the host, uses
`ClawWorld` (one sandbox per rollout). Tool calls, results, audit log and evidence have the same
form in both, so graders cannot tell them apart.
"""
from __future__ import annotations

import json
import time
from typing import Any, Mapping, Sequence

from orchard_jax.tasks.claw import services as _services
from orchard_jax.tasks.claw.errors import ServicesError
from orchard_jax.tasks.claw.services.core import ServiceError
from orchard_jax.tasks.claw.tools import TOOLS, Tool
from orchard_jax.tasks.claw.world import (Evidence, ServiceTools, ToolResult, tool_result,
                                          unknown_tool)


class LocalWorld:
  """In-process services seeded with `resets` ({service: reset body}); a context manager like
  `ClawWorld` (module docstring).

  Raises (on entering):
    ServicesError: a reset body the service refuses (the message has its reason).
  """

  def __init__(self, resets: Mapping[str, dict]):
    unknown = [s for s in resets if s not in _services.SERVICES]
    if unknown or not resets:
      raise ServicesError(f"services to start must be some of {list(_services.SERVICES)}, got "
                          f"{list(resets)}")
    self.resets = {name: dict(body or {}) for name, body in resets.items()}
    self.services: dict = {}
    self.startup_s = 0.0

  def __enter__(self) -> "LocalWorld":
    t0 = time.perf_counter()
    for name, body in self.resets.items():
      service = _services.SERVICES[name]()
      try:
        service.reset(json.loads(json.dumps(body)))
      except ServiceError as e:
        raise ServicesError(f"the {name} service refused its reset: {e.message}") from None
      self.services[name] = service
    self.startup_s = time.perf_counter() - t0
    return self

  def __exit__(self, *exc) -> None:
    for service in self.services.values():
      service.db.close()
    self.services = {}

  def call(self, tool: str, arguments: Any) -> ToolResult:
    """As `ClawWorld.call`."""
    t0 = time.perf_counter()
    spec = TOOLS.get(tool)
    if spec is None or spec.service not in self.services:
      return unknown_tool(tool, self.services)
    content = arguments if isinstance(arguments, (str, bytes)) else json.dumps(arguments)
    if isinstance(content, str):
      content = content.encode("utf-8")
    status, body, _ = self.services[spec.service].call(spec.path, content)
    return tool_result(tool, status, json.loads(json.dumps(body)), time.perf_counter() - t0)

  def backend(self, tools: Sequence[Tool]) -> ServiceTools:
    return ServiceTools(self, list(tools))

  def audit(self, service: str) -> list:
    return json.loads(json.dumps(self.services[service].audit))

  def state(self, service: str) -> dict:
    return json.loads(json.dumps(self.services[service].snapshot()))

  def evidence(self) -> Evidence:
    audit = [e for name in self.services for e in self.audit(name)]
    audit.sort(key=lambda e: (e.get("ts", 0.0), e.get("service", ""), e.get("seq", 0)))
    return Evidence(audit, {name: self.state(name) for name in self.services},
                    {name: True for name in self.services})
