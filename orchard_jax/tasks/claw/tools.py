"""The agent's tools: OpenAI function-calling schemas for every operation of every service.

One tool per service operation (`services.core.Operation`); its `parameters` are exactly the
JSON Schema the service validates calls against, so what the model is shown and what the
service accepts cannot drift apart. Tool names are `<service>_<verb>` and unique across
services, so a name says which service answers it.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Iterable, Sequence

from orchard_jax.tasks.claw import services as _services
from orchard_jax.tasks.claw.errors import TaskFormatError


@dataclasses.dataclass(frozen=True)
class Tool:
  """One tool: the service that answers it and the operation's HTTP path and schema.

  Attributes:
    name: the function name the model calls.
    service: the service name (mail, calendar, ...).
    path: the operation's path on that service (POST, JSON body).
    description: shown to the model.
    parameters: JSON Schema of the arguments.
    mutates: whether a call can change the service's state.
  """
  name: str
  service: str
  path: str
  description: str
  parameters: dict
  mutates: bool

  def openai_schema(self) -> dict[str, Any]:
    """{"type": "function", "function": {name, description, parameters}}."""
    return {"type": "function", "function": {"name": self.name, "description": self.description,
                                             "parameters": self.parameters}}


def _catalogue() -> dict[str, Tool]:
  tools = {}
  for service in _services.SERVICES:
    for spec in _services.operation_specs(service):
      tools[spec["name"]] = Tool(spec["name"], service, spec["path"], spec["description"],
                                 spec["parameters"], spec["mutates"])
  return tools


TOOLS: dict[str, Tool] = _catalogue()
SERVICE_NAMES: tuple[str, ...] = tuple(_services.SERVICES)


def tools_of(services: Iterable[str]) -> list[Tool]:
  """Every tool of the named services, in service then declaration order.

  Raises:
    TaskFormatError: an unknown service name.
  """
  wanted = list(services)
  unknown = [s for s in wanted if s not in _services.SERVICES]
  if unknown:
    raise TaskFormatError(f"unknown service(s) {unknown}; expected some of {list(SERVICE_NAMES)}")
  return [t for t in TOOLS.values() if t.service in wanted]


def select_tools(services: Sequence[str], patterns: Sequence[str] = ()) -> list[Tool]:
  """The tools a task offers: those of `services` whose names match one of `patterns`
  (shell-style, e.g. "mail_*", "calendar_list_events"); all of them when `patterns` is empty.

  Raises:
    TaskFormatError: a pattern matches no tool of these services (a typo would otherwise
      silently offer nothing).
  """
  available = tools_of(services)
  if not patterns:
    return available
  chosen = []
  for pattern in patterns:
    hits = [t for t in available if fnmatch.fnmatchcase(t.name, pattern)]
    if not hits:
      raise TaskFormatError(f"tool pattern {pattern!r} matches no tool of services "
                            f"{list(services)}; they offer {[t.name for t in available]}")
    chosen += [t for t in hits if t not in chosen]
  return [t for t in available if t in chosen]


def openai_tools(tools: Iterable[Tool]) -> list[dict[str, Any]]:
  """The OpenAI `tools` list of a request offering `tools`."""
  return [t.openai_schema() for t in tools]
