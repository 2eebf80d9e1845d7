"""Matching records and call arguments: the small query language of task graders.

A `where` clause maps field names to conditions, Mongo-style:

  where: {folder: sent, recipients: {$contains: dana@acme.com},
          subject: {$icontains: invoice}, attendees: {$any: {email: bo@x.io,
                                                              response: accepted}}}

A plain value means equality (JSON equality: true is not 1). Operators (keys starting with `$`):
  $eq, $ne                 equal / not equal
  $in, $nin                one of / none of a list
  $contains                a string contains the text, or a list holds the value
  $icontains               case-insensitive: a string contains the text, or some list item does
  $all_icontains           every text of a list is $icontains-true
  $startswith, $endswith   string prefix / suffix (case-insensitive)
  $matches                 a regular expression (Python `re.search`, case-insensitive)
  $gt, $gte, $lt, $lte     order; ISO 8601 date-times are compared as instants
  $len                     a list's or string's length equals n (or matches a condition)
  $empty                   true: "" / [] / null; false: anything else
  $exists                  the field is (true) / is not (false) present and not null
  $any, $all               some / every item of a list satisfies a condition (a `where` for
                           lists of objects, a condition for lists of values)
  $set_eq                  a list holds exactly these values, in any order (case-insensitive)
  $not                     negation of a condition
Several operators in one condition must all hold. Dotted names (`organizer.email`) reach into
nested objects.

`check_where` validates a clause when a task file is loaded, so a typo is a TaskFormatError
naming the file and field, not a grader failure later.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping

from orchard_jax.tasks.claw.services import timeutil
from orchard_jax.tasks.claw.services.schema import json_equal

OPERATORS = ("$eq", "$ne", "$in", "$nin", "$contains", "$icontains", "$all_icontains",
             "$startswith", "$endswith", "$matches", "$gt", "$gte", "$lt", "$lte", "$len",
             "$empty", "$exists", "$any", "$all", "$set_eq", "$not")
_MISSING = object()


class PredicateError(ValueError):
  """A malformed condition (raised when a task is loaded) or one that cannot be applied."""


def _is_condition(value: Any) -> bool:
  return isinstance(value, Mapping) and bool(value) and all(
      isinstance(k, str) and k.startswith("$") for k in value)


def check_where(where: Any, field: str = "where") -> None:
  """Validates a where clause. Raises PredicateError naming `field` and the problem."""
  if not isinstance(where, Mapping):
    raise PredicateError(f"{field}: expected a mapping of field -> condition, got "
                         f"{type(where).__name__}")
  for name, condition in where.items():
    if not isinstance(name, str) or not name or name.startswith("$"):
      raise PredicateError(f"{field}: {name!r} is not a field name (operators go inside a "
                           "field's condition)")
    check_condition(condition, f"{field}.{name}")


def check_condition(condition: Any, field: str) -> None:
  """Validates one condition (a plain value or an operator mapping)."""
  if not isinstance(condition, Mapping):
    return
  if not _is_condition(condition):
    if any(isinstance(k, str) and k.startswith("$") for k in condition):
      raise PredicateError(f"{field}: mixes operators and field names: {sorted(condition)}")
    return  # a plain mapping compared for equality
  for op, arg in condition.items():
    if op not in OPERATORS:
      raise PredicateError(f"{field}: unknown operator {op!r}; expected one of "
                           f"{', '.join(OPERATORS)}")
    where = f"{field}.{op}"
    if op in ("$in", "$nin", "$all_icontains", "$set_eq") and not isinstance(arg, list):
      raise PredicateError(f"{where}: expected a list, got {type(arg).__name__}")
    if op in ("$icontains", "$startswith", "$endswith", "$matches") and not isinstance(arg, str):
      raise PredicateError(f"{where}: expected text, got {type(arg).__name__}")
    if op == "$matches":
      try:
        re.compile(arg)
      except re.error as e:
        raise PredicateError(f"{where}: not a regular expression: {e}") from None
    if op in ("$empty", "$exists") and not isinstance(arg, bool):
      raise PredicateError(f"{where}: expected true or false, got {arg!r}")
    if op in ("$any", "$all"):
      if isinstance(arg, Mapping) and not _is_condition(arg):
        check_where(arg, where)
      else:
        check_condition(arg, where)
    if op in ("$not", "$len"):
      check_condition(arg, where)


def lookup(record: Any, name: str) -> Any:
  """record["a"]["b"] for name "a.b"; _MISSING when absent."""
  value = record
  for part in name.split("."):
    if isinstance(value, Mapping) and part in value:
      value = value[part]
    else:
      return _MISSING
  return value


def matches(record: Mapping, where: Mapping) -> bool:
  """Whether `record` satisfies every field condition of `where`."""
  return all(satisfies(lookup(record, name), condition) for name, condition in where.items())


def _instant(value: Any):
  if isinstance(value, str) and len(value) >= 10 and value[4:5] == "-" and value[7:8] == "-":
    try:
      return timeutil.parse_datetime(value)
    except ValueError:
      return None
  return None


def _order_key(a: Any, b: Any):
  ia, ib = _instant(a), _instant(b)
  if ia is not None and ib is not None:
    return ia, ib
  if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
    return a, b
  if isinstance(a, str) and isinstance(b, str):
    return a, b
  return None


def _lower(value: Any) -> Any:
  return value.lower() if isinstance(value, str) else value


def satisfies(value: Any, condition: Any) -> bool:
  """Whether a field's value meets a condition (module docstring for the operators)."""
  if not _is_condition(condition):
    if value is _MISSING:
      return False
    if isinstance(condition, (dt.date, dt.datetime)):
      condition = condition.isoformat()
    return json_equal(value, condition)
  return all(_apply(op, arg, value) for op, arg in condition.items())


def _apply(op: str, arg: Any, value: Any) -> bool:
  present = value is not _MISSING and value is not None
  if op == "$exists":
    return present == arg
  if op == "$empty":
    return (not present or value in ("", [], {})) == arg
  if op == "$not":
    return not satisfies(value, arg)
  if value is _MISSING:
    return op in ("$ne", "$nin")
  if op == "$eq":
    return json_equal(value, arg)
  if op == "$ne":
    return not json_equal(value, arg)
  if op == "$in":
    return any(json_equal(value, a) for a in arg)
  if op == "$nin":
    return not any(json_equal(value, a) for a in arg)
  if op == "$contains":
    if isinstance(value, str):
      return isinstance(arg, str) and arg in value
    return isinstance(value, list) and any(json_equal(v, arg) for v in value)
  if op == "$icontains":
    if isinstance(value, list):
      return any(isinstance(v, str) and arg.lower() in v.lower() for v in value)
    return isinstance(value, str) and arg.lower() in value.lower()
  if op == "$all_icontains":
    return all(_apply("$icontains", a, value) for a in arg)
  if op == "$startswith":
    return isinstance(value, str) and value.lower().startswith(arg.lower())
  if op == "$endswith":
    return isinstance(value, str) and value.lower().endswith(arg.lower())
  if op == "$matches":
    return isinstance(value, str) and re.search(arg, value, re.IGNORECASE) is not None
  if op in ("$gt", "$gte", "$lt", "$lte"):
    pair = _order_key(value, arg)
    if pair is None:
      return False
    a, b = pair
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]
  if op == "$len":
    return isinstance(value, (list, str)) and satisfies(len(value), arg)
  if op in ("$any", "$all"):
    if not isinstance(value, list):
      return False
    if isinstance(arg, Mapping) and not _is_condition(arg):
      test = [isinstance(v, Mapping) and matches(v, arg) for v in value]
    else:
      test = [satisfies(v, arg) for v in value]
    return any(test) if op == "$any" else all(test)
  if op == "$set_eq":
    return isinstance(value, list) and sorted(map(str, map(_lower, value))) == sorted(
        map(str, map(_lower, arg)))
  raise PredicateError(f"unknown operator {op!r}")
