"""The frame every assistant service is built on: operations, state, audit log, faults, HTTP.

A service (mail, calendar, ...) is a subclass of `Service`: a SQLite schema, a fixture loader
and a list of `Operation`s. Each operation is one tool an agent can call: a name
(`mail_send`), a path (`POST /messages/send`), a description and a JSON Schema of its
arguments, which is both what the OpenAI tool schema shows the model and what the service
validates calls against.

HTTP surface of one service (`make_server`):
  POST /<operation path>   a tool call: JSON object body -> 200 JSON result, or a JSON error
                           {"error": {"type", "message"}} with 400 (bad arguments), 404
                           (unknown id or path), 405, 409 (conflict), 413 (body too large),
                           429 / 500 (injected faults)
  GET  /health             {"service", "ok": true}
  GET  /tools              the operations' names, paths, descriptions and schemas
  POST /reset              control: {"fixtures", "faults", "now", "seed"} -> fresh state
  GET  /audit              control: every tool call since the reset, in order
  GET  /state              control: every table as a list of records (what graders read)
Control routes need the `X-Claw-Control` header to equal the token the service was started
with, so an agent that shares the sandbox (an external harness) can neither reset nor read the
grader's view; the token reaches the service on its standard input, never on its command line
or environment. Tool calls are audited (arguments as sent, status, result, injected fault);
control calls are not.

Faults (`FaultConfig`, from the reset body) are decided per tool call, before the operation
runs, so a faulted call changes nothing: `fail_first` fails the first n calls of each listed
operation, `error_rate` fails calls at random (seeded by the reset's `seed`, so a given call
order always meets the same faults), `latency_ms` delays answers, and `crash_after` makes the
service process exit when its (n+1)-th tool call arrives: the service is gone mid-episode.

Standard library only: this package is copied into sandboxes and runs on their Python.
"""
from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import schema as _schema
from . import timeutil

MAX_BODY_BYTES = 1 << 20
MAX_AUDIT_RESULT_CHARS = 20000
CONTROL_HEADER = "X-Claw-Control"
DEFAULT_NOW = "2026-03-02T09:00:00Z"
FAULT_STATUSES = (429, 500, 503)


class ServiceError(Exception):
  """An error answer of a tool call: HTTP status, machine-readable type and a one-line message."""
  status = 400
  type = "invalid_request"

  def __init__(self, message: str, *, status: Optional[int] = None,
               type: Optional[str] = None):
    super().__init__(message)
    self.message = message
    if status is not None:
      self.status = status
    if type is not None:
      self.type = type


class BadArguments(ServiceError):
  status, type = 400, "invalid_arguments"


class NotFound(ServiceError):
  status, type = 404, "not_found"


class Conflict(ServiceError):
  status, type = 409, "conflict"


class Operation:
  """One tool of a service.

  Attributes:
    name: tool name, `<service>_<verb>` (the OpenAI function name).
    path: HTTP path under the service (always POST with a JSON object body).
    description: what it does, for the model (one or two sentences).
    parameters: JSON Schema object of the arguments (`schema` module's subset).
    handler: `handler(service, arguments) -> JSON-able result`; raises ServiceError.
    mutates: whether it can change state (safety rules and graders use it).
  """

  def __init__(self, name: str, path: str, description: str, parameters: Dict[str, Any],
               handler: Callable, *, mutates: bool = False):
    self.name, self.path, self.description = name, path, description
    self.parameters = dict(parameters)
    self.parameters.setdefault("type", "object")
    self.parameters.setdefault("properties", {})
    self.parameters.setdefault("additionalProperties", False)
    self.handler, self.mutates = handler, mutates

  def spec(self) -> Dict[str, Any]:
    """JSON-able description: name, method, path, description, parameters, mutates."""
    return {"name": self.name, "method": "POST", "path": self.path,
            "description": self.description, "parameters": self.parameters,
            "mutates": self.mutates}


def obj(properties: Dict[str, Any], required: Sequence[str] = ()) -> Dict[str, Any]:
  """A JSON Schema object of `properties` with `required` fields and no others."""
  out: Dict[str, Any] = {"type": "object", "properties": properties,
                         "additionalProperties": False}
  if required:
    out["required"] = list(required)
  return out


def string(description: str, **extra) -> Dict[str, Any]:
  return {"type": "string", "description": description, **extra}


def integer(description: str, **extra) -> Dict[str, Any]:
  return {"type": "integer", "description": description, **extra}


def boolean(description: str) -> Dict[str, Any]:
  return {"type": "boolean", "description": description}


def array(items: Dict[str, Any], description: str, **extra) -> Dict[str, Any]:
  return {"type": "array", "items": items, "description": description, **extra}


class FaultConfig:
  """Fault injection of one service (module docstring).

  Attributes:
    error_rate: probability that a tool call fails with one of `statuses`.
    statuses: the HTTP statuses injected failures use (429, 500, 503).
    fail_first: the first n calls of each operation in `operations` fail (in order of
      `statuses`, cycling), whatever error_rate says.
    latency_ms: (low, high): every tool call waits a uniform time in this range first.
    operations: the operations faults apply to (empty: all).
    crash_after: the process exits when tool call number crash_after + 1 arrives (None: never).
  """

  def __init__(self, error_rate: float = 0.0, statuses: Sequence[int] = (429, 500),
               fail_first: int = 0, latency_ms: Sequence[float] = (0, 0),
               operations: Sequence[str] = (), crash_after: Optional[int] = None):
    self.error_rate, self.statuses, self.fail_first = error_rate, tuple(statuses), fail_first
    self.latency_ms, self.operations, self.crash_after = (
        tuple(latency_ms), tuple(operations), crash_after)

  _SCHEMA = obj({
      "error_rate": {"type": "number", "minimum": 0, "maximum": 1},
      "statuses": {"type": "array", "items": {"type": "integer", "enum": list(FAULT_STATUSES)},
                   "minItems": 1},
      "fail_first": {"type": "integer", "minimum": 0, "maximum": 100},
      "latency_ms": {"type": ["number", "array"], "minimum": 0,
                     "items": {"type": "number", "minimum": 0, "maximum": 60000},
                     "minItems": 2, "maxItems": 2},
      "operations": {"type": "array", "items": {"type": "string"}},
      "crash_after": {"type": ["integer", "null"], "minimum": 0}})

  @classmethod
  def from_dict(cls, data: Optional[Dict[str, Any]],
                known_operations: Sequence[str] = ()) -> "FaultConfig":
    """Checks and builds a config; raises BadArguments naming the field."""
    data = dict(data or {})
    try:
      _schema.validate(data, cls._SCHEMA, "faults")
    except _schema.SchemaViolation as e:
      raise BadArguments(str(e)) from None
    latency = data.get("latency_ms", 0)
    if not isinstance(latency, (list, tuple)):
      latency = (latency, latency)
    if latency[0] > latency[1]:
      raise BadArguments(f"faults.latency_ms: expected [low, high] with low <= high, got {latency}")
    unknown = [op for op in data.get("operations", ()) if op not in known_operations]
    if unknown and known_operations:
      raise BadArguments(f"faults.operations: unknown operation(s) {', '.join(unknown)}; this "
                         f"service has {', '.join(known_operations)}")
    return cls(error_rate=float(data.get("error_rate", 0.0)),
               statuses=data.get("statuses", (429, 500)), fail_first=data.get("fail_first", 0),
               latency_ms=latency, operations=data.get("operations", ()),
               crash_after=data.get("crash_after"))


class Service:
  """Base class of the services: state in an in-memory SQLite database, audit log, faults.

  Subclasses set `name`, `tables` (table -> SQL column list, JSON columns named in
  `json_columns`), `id_prefixes` (table -> prefix of generated ids), `operations()` and
  `load_fixtures(fixtures)`.
  """
  name = ""
  tables: Dict[str, str] = {}
  json_columns: Dict[str, Sequence[str]] = {}
  id_prefixes: Dict[str, str] = {}

  def __init__(self):
    self.lock = threading.RLock()
    self.db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    self.db.row_factory = sqlite3.Row
    self.ops = {op.name: op for op in self.operations()}
    self.routes = {op.path: op for op in self.ops.values()}
    self.audit: List[Dict[str, Any]] = []
    self.faults = FaultConfig()
    self.rng = random.Random(0)
    self.calls_per_op: Dict[str, int] = {}
    self.calls = 0
    self.now_text = DEFAULT_NOW
    self.user: Dict[str, Any] = {}
    self.reset({})

  # ---------------------------------------------------------------- subclass surface
  def operations(self) -> List[Operation]:
    raise NotImplementedError

  def load_fixtures(self, fixtures: Dict[str, Any]) -> None:
    raise NotImplementedError

  # ---------------------------------------------------------------- state
  def reset(self, body: Dict[str, Any]) -> Dict[str, Any]:
    """Fresh state from `body` = {"fixtures", "faults", "now", "seed", "user"}.

    Raises:
      BadArguments: a malformed body or fixture (nothing of the old state is lost then).
    """
    if not isinstance(body, dict):
      raise BadArguments(f"reset body: expected an object, got {_schema.describe(body)}")
    unknown = sorted(set(body) - {"fixtures", "faults", "now", "seed", "user"})
    if unknown:
      raise BadArguments(f"reset body: unknown field(s) {', '.join(unknown)}; expected fixtures, "
                         "faults, now, seed, user")
    faults = FaultConfig.from_dict(body.get("faults"), list(self.ops))
    now = body.get("now") or DEFAULT_NOW
    try:
      now_text = timeutil.to_utc_text(timeutil.parse_datetime(now))
    except ValueError as e:
      raise BadArguments(f"reset body: now: {e}") from None
    fixtures = body.get("fixtures") or {}
    if not isinstance(fixtures, dict):
      raise BadArguments(f"reset body: fixtures: expected an object, got "
                         f"{_schema.describe(fixtures)}")
    user = body.get("user") or {}
    with self.lock:
      old = (self.db, self.now_text, self.user)
      self.db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
      self.db.row_factory = sqlite3.Row
      self.now_text, self.user = now_text, dict(user)
      try:
        for table, columns in self.tables.items():
          self.db.execute(f"CREATE TABLE {table} ({columns})")
        self.load_fixtures(fixtures)
      except (ServiceError, KeyError, TypeError, ValueError, sqlite3.Error) as e:
        self.db.close()
        self.db, self.now_text, self.user = old
        message = e.message if isinstance(e, ServiceError) else f"{type(e).__name__}: {e}"
        raise BadArguments(f"fixtures of {self.name}: {message}") from None
      old[0].close()
      self.faults = faults
      self.rng = random.Random(int(body.get("seed") or 0))
      self.audit, self.calls_per_op, self.calls = [], {}, 0
      return {"service": self.name, "ok": True, "counts": self.counts()}

  def counts(self) -> Dict[str, int]:
    return {table: self.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in self.tables}

  def snapshot(self) -> Dict[str, List[Dict[str, Any]]]:
    """Every table as a list of records, JSON columns decoded, in insertion order."""
    with self.lock:
      return {table: [self.record(table, row) for row in
                      self.db.execute(f"SELECT * FROM {table} ORDER BY rowid")]
              for table in self.tables}

  def record(self, table: str, row: sqlite3.Row) -> Dict[str, Any]:
    out = dict(row)
    for column in self.json_columns.get(table, ()):
      if out.get(column) is not None:
        out[column] = json.loads(out[column])
    return out

  def insert(self, table: str, values: Dict[str, Any]) -> Dict[str, Any]:
    """Inserts a record (JSON columns encoded; a missing id is generated) and returns it."""
    values = dict(values)
    if values.get("id") is None and table in self.id_prefixes:
      values["id"] = self.new_id(table)
    for column in self.json_columns.get(table, ()):
      if column in values and values[column] is not None:
        values[column] = json.dumps(values[column], ensure_ascii=False)
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    self.db.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", list(values.values()))
    return self.get(table, values["id"]) if "id" in values else values

  def update(self, table: str, record_id: Any, values: Dict[str, Any]) -> Dict[str, Any]:
    values = dict(values)
    for column in self.json_columns.get(table, ()):
      if column in values and values[column] is not None:
        values[column] = json.dumps(values[column], ensure_ascii=False)
    if values:
      sets = ", ".join(f"{k} = ?" for k in values)
      self.db.execute(f"UPDATE {table} SET {sets} WHERE id = ?", [*values.values(), record_id])
    return self.get(table, record_id)

  def get(self, table: str, record_id: Any, what: str = "") -> Dict[str, Any]:
    """The record with this id; raises NotFound naming `what` (default: the table)."""
    row = self.db.execute(f"SELECT * FROM {table} WHERE id = ?", (record_id,)).fetchone()
    if row is None:
      raise NotFound(f"no {what or table.rstrip('s')} with id {record_id!r}")
    return self.record(table, row)

  def select(self, table: str, where: str = "1", params: Sequence[Any] = (),
             order: str = "rowid") -> List[Dict[str, Any]]:
    return [self.record(table, row) for row in
            self.db.execute(f"SELECT * FROM {table} WHERE {where} ORDER BY {order}", params)]

  def new_id(self, table: str) -> str:
    prefix = self.id_prefixes[table]
    n = self.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] + 1
    while self.db.execute(f"SELECT 1 FROM {table} WHERE id = ?", (f"{prefix}{n}",)).fetchone():
      n += 1
    return f"{prefix}{n}"

  def now(self) -> str:
    """The service's clock: the reset's `now` plus one second per tool call so far, so
    records made later have later times and every run of a task sees the same times."""
    moment = timeutil.utc(self.now_text)
    return timeutil.to_utc_text(moment + timeutil.dt.timedelta(seconds=self.calls))

  # ---------------------------------------------------------------- tool calls
  def decide_fault(self, op_name: str) -> Optional[int]:
    """The injected status of this call (None: no fault). Counts the call."""
    self.calls += 1
    n = self.calls_per_op.get(op_name, 0)
    self.calls_per_op[op_name] = n + 1
    f = self.faults
    if f.operations and op_name not in f.operations:
      return None
    if n < f.fail_first:
      return f.statuses[n % len(f.statuses)]
    if f.error_rate > 0 and self.rng.random() < f.error_rate:
      return self.rng.choice(f.statuses)
    return None

  def call(self, path: str, raw_body: bytes) -> tuple:
    """Runs one tool call and audits it: (status, JSON-able body, headers)."""
    op = self.routes.get(path)
    try:
      arguments: Any = json.loads(raw_body.decode("utf-8")) if raw_body.strip() else {}
    except (UnicodeDecodeError, ValueError) as e:
      arguments = raw_body.decode("utf-8", errors="replace")
      invalid: Optional[str] = f"the body is not valid JSON: {e}"
    else:
      invalid = None
    with self.lock:
      name = op.name if op else None
      if self.faults.crash_after is not None and self.calls >= self.faults.crash_after:
        os._exit(70)   # the injected crash: the process goes away without answering
      fault = self.decide_fault(name or path)
    if fault is None and self.faults.latency_ms[1] > 0:
      low, high = self.faults.latency_ms
      time.sleep(self.rng.uniform(low, high) / 1000.0)
    headers: Dict[str, str] = {}
    with self.lock:
      if fault is not None:
        status, body = fault, {"error": _fault_error(fault)}
        if fault == 429:
          headers["Retry-After"] = "1"
      elif op is None:
        known = ", ".join(sorted(self.routes))
        status, body = 404, {"error": {"type": "not_found", "message":
                                       f"no operation at {path}; this service has {known}"}}
      elif invalid is not None:
        status, body = 400, {"error": {"type": "invalid_json", "message": invalid}}
      else:
        status, body = self._run(op, arguments)
      self.audit.append({
          "seq": len(self.audit), "service": self.name, "operation": name, "path": path,
          "arguments": arguments, "status": status, "ok": 200 <= status < 300,
          "fault": fault is not None, "time": self.now(), "ts": time.time(),
          "result": _clip(body)})
    return status, body, headers

  def _run(self, op: Operation, arguments: Any) -> tuple:
    try:
      if not isinstance(arguments, dict):
        raise BadArguments(f"arguments: expected an object, got {_schema.describe(arguments)}")
      try:
        _schema.validate(arguments, op.parameters)
      except _schema.SchemaViolation as e:
        raise BadArguments(str(e)) from None
      self.db.execute("SAVEPOINT op")
      try:
        result = op.handler(self, arguments)
      except BaseException:
        self.db.execute("ROLLBACK TO op")
        self.db.execute("RELEASE op")
        raise
      self.db.execute("RELEASE op")
      return 200, result
    except ServiceError as e:
      return e.status, {"error": {"type": e.type, "message": e.message}}
    except Exception as e:  # noqa: BLE001 - a service bug is a 500 naming it, never a hang
      return 500, {"error": {"type": "internal_error",
                             "message": f"{op.name} failed: {type(e).__name__}: {e}"}}


def _fault_error(status: int) -> Dict[str, str]:
  if status == 429:
    return {"type": "rate_limited", "message": "rate limit exceeded; retry after 1 second"}
  if status == 503:
    return {"type": "unavailable", "message": "service temporarily unavailable; try again"}
  return {"type": "internal_error", "message": "internal server error; try again"}


def _clip(body: Any) -> Any:
  text = json.dumps(body, ensure_ascii=False)
  if len(text) <= MAX_AUDIT_RESULT_CHARS:
    return body
  return {"clipped": True, "text": text[:MAX_AUDIT_RESULT_CHARS]}
