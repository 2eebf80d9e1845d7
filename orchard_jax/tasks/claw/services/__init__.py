"""The assistant services: small HTTP services over SQLite, one per kind of personal data.

Each service (mail, calendar, contacts, todos, notes, files) is a `core.Service` subclass with
its state in an in-memory SQLite database, `/reset` and `/audit` control routes, fault
injection, and one `core.Operation` per tool. This package uses the Python standard library
only: it is copied into each rollout's sandbox as a zip application and runs there
(`python3 services.pyz start`, see `__main__`), so no two rollouts share state. Service
modules are imported on first use, so a sandbox running only mail never loads the calendar.

Public API:
  SERVICES                     name -> Service class (imported when looked up)
  DEFAULT_PORTS                name -> the port a service listens on inside its sandbox
  operation_specs(name)        the operations of a service as JSON-able dicts
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Iterator, List, Mapping

from .core import CONTROL_HEADER, Operation, Service  # noqa: F401 - re-exported

_CLASSES = {"mail": ("mail", "MailService"), "calendar": ("calendars", "CalendarService"),
            "contacts": ("contacts", "ContactsService"), "todos": ("todos", "TodosService"),
            "notes": ("notes", "NotesService"), "files": ("files", "FilesService")}
DEFAULT_PORTS = {"mail": 8101, "calendar": 8102, "contacts": 8103, "todos": 8104,
                 "notes": 8105, "files": 8106}


class _Registry(Mapping):
  """name -> Service class, importing a service's module when it is first looked up."""

  def __getitem__(self, name: str) -> type:
    if name not in _CLASSES:
      raise KeyError(name)
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(f".{module}", __name__), cls)

  def __iter__(self) -> Iterator[str]:
    return iter(_CLASSES)

  def __len__(self) -> int:
    return len(_CLASSES)


SERVICES: Mapping[str, type] = _Registry()


def operation_specs(name: str) -> List[Dict[str, Any]]:
  """The operations of service `name` (`Operation.spec()` dicts), in declaration order.

  Raises:
    KeyError: unknown service (the message lists the known ones).
  """
  if name not in _CLASSES:
    raise KeyError(f"unknown service {name!r}; expected one of {', '.join(_CLASSES)}")
  cls = SERVICES[name]
  return [op.spec() for op in cls.operations(cls.__new__(cls))]
