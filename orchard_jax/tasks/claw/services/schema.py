"""Validation of tool arguments against the JSON Schema subset the operations are written in.

Every operation declares its parameters as a JSON Schema object (the same object the OpenAI
function-calling tool schema carries), and the service validates each call's arguments against
it before running anything, so a bad call is refused with one 400 line naming the field, what
was expected and what was seen, and changes no state.

Supported keywords (JSON Schema draft 2020-12 meanings): type (one name or a list; "integer"
accepts 3 and 3.0 but never booleans), enum, const, properties, required,
additionalProperties (only `false` is used), items, minItems, maxItems, uniqueItems,
minLength, maxLength, pattern, minimum, maximum, format ("email", "date", "date-time",
"time-zone"), description and default (ignored). Standard library only: this module runs inside
the sandbox.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, List

from . import timeutil

_EMAIL_RE = re.compile(r"^[^@\s<>(),;:\"\[\]]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+$")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "array": "an array", "object": "an object",
               "null": "null"}


class SchemaViolation(ValueError):
  """Arguments that do not match the schema; `str()` is the one-line reason."""


def describe(value: Any, limit: int = 60) -> str:
  """A short rendering of a seen value for error messages: its JSON type and its text."""
  kind = json_type(value)
  text = repr(value)
  if len(text) > limit:
    text = text[:limit - 3] + "..."
  return f"{kind} {text}"


def _names(names) -> str:
  """Field names for a message: plain ones as they are, others quoted and escaped, so a name
  holding a newline or a comma cannot break the one-line message."""
  shown = [n if isinstance(n, str) and _PLAIN_NAME.match(n) else json.dumps(n) for n in names]
  return ", ".join(shown) or "none"


def json_type(value: Any) -> str:
  """The JSON type name of a decoded JSON value."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, int):
    return "integer"
  if isinstance(value, float):
    return "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, list):
    return "array"
  if isinstance(value, dict):
    return "object"
  return type(value).__name__


def json_equal(a: Any, b: Any) -> bool:
  """Equality of JSON values: booleans never equal numbers (Python has True == 1); 1 == 1.0."""
  if isinstance(a, bool) or isinstance(b, bool):
    return isinstance(a, bool) and isinstance(b, bool) and a == b
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
  return type(a) in (int, float) and type(b) in (int, float) and a == b or (
      type(a) is type(b) and a == b)


def _is_type(value: Any, name: str) -> bool:
  if name == "null":
    return value is None
  if name == "boolean":
    return isinstance(value, bool)
  if name == "integer":
    if isinstance(value, bool):
      return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)
                                      and value.is_integer())
  if name == "number":
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(float(value)))
  if name == "string":
    return isinstance(value, str)
  if name == "array":
    return isinstance(value, list)
  if name == "object":
    return isinstance(value, dict)
  raise ValueError(f"unknown schema type {name!r}")


def _check_format(fmt: str, value: str) -> str:
  """'' when `value` has the format, else what was expected."""
  if fmt == "email":
    return "" if _EMAIL_RE.match(value) else "an email address such as name@example.com"
  if fmt == "date":
    try:
      timeutil.parse_date(value)
      return ""
    except ValueError:
      return "a date YYYY-MM-DD"
  if fmt == "date-time":
    try:
      timeutil.parse_datetime(value)
      return ""
    except ValueError:
      return "a date-time YYYY-MM-DDTHH:MM[:SS][+HH:MM|Z]"
  if fmt == "time-zone":
    return "" if timeutil.is_time_zone(value) else "an IANA time zone such as Europe/Paris"
  return ""


def validate(value: Any, schema: dict, where: str = "arguments") -> None:
  """Checks `value` against `schema`; returns None or raises SchemaViolation.

  Args:
    value: decoded JSON (the call's arguments object, or a part of it).
    schema: a JSON Schema object in the supported subset (module docstring).
    where: the path of `value` in the call, used in the message ("arguments.to[1]").
  Raises:
    SchemaViolation: "<where>: expected <what>, got <type> <value>" (the first problem found;
      properties are checked in schema order, then unknown ones).
  """
  types = schema.get("type")
  if types is not None:
    names = [types] if isinstance(types, str) else list(types)
    if not any(_is_type(value, name) for name in names):
      wanted = " or ".join(_TYPE_NAMES[name] for name in names)
      raise SchemaViolation(f"{where}: expected {wanted}, got {describe(value)}")
  if "const" in schema and not json_equal(value, schema["const"]):
    raise SchemaViolation(f"{where}: expected {schema['const']!r}, got {describe(value)}")
  if "enum" in schema and not any(json_equal(value, v) for v in schema["enum"]):
    choices = ", ".join(repr(v) for v in schema["enum"])
    raise SchemaViolation(f"{where}: expected one of {choices}, got {describe(value)}")
  if isinstance(value, str):
    _validate_string(value, schema, where)
  elif isinstance(value, (int, float)) and not isinstance(value, bool):
    if "minimum" in schema and value < schema["minimum"]:
      raise SchemaViolation(f"{where}: expected a number >= {schema['minimum']}, got {value!r}")
    if "maximum" in schema and value > schema["maximum"]:
      raise SchemaViolation(f"{where}: expected a number <= {schema['maximum']}, got {value!r}")
  elif isinstance(value, list):
    _validate_array(value, schema, where)
  elif isinstance(value, dict):
    _validate_object(value, schema, where)


def _validate_string(value: str, schema: dict, where: str) -> None:
  if "minLength" in schema and len(value) < schema["minLength"]:
    what = "a non-empty string" if schema["minLength"] == 1 else \
        f"a string of at least {schema['minLength']} characters"
    raise SchemaViolation(f"{where}: expected {what}, got {describe(value)}")
  if "maxLength" in schema and len(value) > schema["maxLength"]:
    raise SchemaViolation(f"{where}: expected at most {schema['maxLength']} characters, got "
                          f"{len(value)}")
  if "pattern" in schema and not re.search(schema["pattern"], value):
    raise SchemaViolation(f"{where}: expected text matching {schema['pattern']!r}, got "
                          f"{describe(value)}")
  if "format" in schema:
    wanted = _check_format(schema["format"], value)
    if wanted:
      raise SchemaViolation(f"{where}: expected {wanted}, got {describe(value)}")


def _validate_array(value: list, schema: dict, where: str) -> None:
  if "minItems" in schema and len(value) < schema["minItems"]:
    raise SchemaViolation(f"{where}: expected at least {schema['minItems']} item(s), got "
                          f"{len(value)}")
  if "maxItems" in schema and len(value) > schema["maxItems"]:
    raise SchemaViolation(f"{where}: expected at most {schema['maxItems']} item(s), got "
                          f"{len(value)}")
  items = schema.get("items")
  if isinstance(items, dict):
    for i, item in enumerate(value):
      validate(item, items, f"{where}[{i}]")
  if schema.get("uniqueItems"):
    seen: List[Any] = []
    for i, item in enumerate(value):
      if any(json_equal(item, other) for other in seen):
        raise SchemaViolation(f"{where}: expected unique items, item {i} repeats "
                              f"{describe(item)}")
      seen.append(item)


def _validate_object(value: dict, schema: dict, where: str) -> None:
  properties = schema.get("properties") or {}
  missing = [name for name in schema.get("required") or () if name not in value]
  if missing:
    raise SchemaViolation(f"{where}: missing required field(s) {_names(missing)}; got "
                          f"{_names(sorted(value))}")
  for name, sub in properties.items():
    if name in value:
      validate(value[name], sub, f"{where}.{name}")
  if schema.get("additionalProperties") is False:
    unknown = sorted(k for k in value if k not in properties)
    if unknown:
      raise SchemaViolation(f"{where}: unknown field(s) {_names(unknown)}; expected some of "
                            f"{_names(properties)}")
