"""The services' argument validator against the `jsonschema` library (Draft 2020-12) as the
independent reference, over every tool's real schema and generated arguments; plus the formats,
which jsonschema treats as annotations and the services enforce."""
import copy

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax.tasks.claw.services import schema
from orchard_jax.tasks.claw.tools import TOOLS

json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | \
    st.floats(allow_nan=False, allow_infinity=False, width=32) | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=6), inner, max_size=4), max_leaves=12)


def _strip_formats(node):
  if isinstance(node, dict):
    return {k: _strip_formats(v) for k, v in node.items() if k != "format"}
  if isinstance(node, list):
    return [_strip_formats(v) for v in node]
  return node


def _value_for(sub: dict):
  """Values that often match `sub` (its type, enum members, item shapes) and sometimes not."""
  kind = sub.get("type")
  options = [json_values]
  if "enum" in sub:
    options.append(st.sampled_from(sub["enum"]))
  if kind == "string":
    options.append(st.text(max_size=20) | st.sampled_from(["", "a@b.co", "2026-03-02", "x" * 600]))
  elif kind == "integer":
    options.append(st.integers(-5, 300) | st.floats(-5, 300).map(float))
  elif kind == "boolean":
    options.append(st.booleans())
  elif kind == "array":
    options.append(st.lists(_value_for(sub.get("items") or {}), max_size=4))
  elif kind == "object":
    options.append(_arguments(sub))
  return st.one_of(*options)


def _arguments(params: dict):
  props = params.get("properties") or {}
  keys = st.lists(st.sampled_from(sorted(props) + ["unknown_field"]) if props else
                  st.just("unknown_field"), unique=True, max_size=len(props) + 1)
  return keys.flatmap(lambda chosen: st.fixed_dictionaries(
      {k: _value_for(props.get(k, {})) for k in chosen}))


tool_and_arguments = st.sampled_from(sorted(TOOLS)).flatmap(
    lambda name: st.tuples(st.just(name), _arguments(TOOLS[name].parameters) | json_values))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_and_arguments)
def test_validator_agrees_with_jsonschema(case):
  name, arguments = case
  params = _strip_formats(copy.deepcopy(TOOLS[name].parameters))
  reference = jsonschema.Draft202012Validator(params)
  expected_ok = reference.is_valid(arguments)
  try:
    schema.validate(arguments, params)
    ok = True
  except schema.SchemaViolation as e:
    ok = False
    assert str(e).startswith("arguments"), str(e)
    assert "\n" not in str(e)
  assert ok == expected_ok, (name, arguments, list(reference.iter_errors(arguments))[:1])


def test_every_tool_schema_is_a_valid_json_schema():
  for tool in TOOLS.values():
    jsonschema.Draft202012Validator.check_schema(tool.parameters)
    assert tool.parameters["type"] == "object"
    assert tool.parameters["additionalProperties"] is False


@pytest.mark.parametrize("fmt,good,bad", [
    ("email", ["a@b.co", "first.last+tag@mail.example.org"], ["bob", "a@b", "a b@c.de", "@x.io"]),
    ("date", ["2026-03-02", "2024-02-29"], ["2026-3-2", "2026-02-30", "02/03/2026", ""]),
    ("date-time", ["2026-03-02T09:00", "2026-03-02T09:00:00Z", "2026-03-02T09:00:00+05:30",
                   "2026-03-02"], ["2026-03-02T25:00", "tomorrow", "2026-03-02T09:00+25:00"]),
    ("time-zone", ["UTC", "Europe/Berlin", "America/New_York"], ["Mars/Base", "../etc", "",
                                                                 "Europe/../../etc/passwd"]),
])
def test_formats(fmt, good, bad):
  for value in good:
    schema.validate(value, {"type": "string", "format": fmt})
  for value in bad:
    with pytest.raises(schema.SchemaViolation):
      schema.validate(value, {"type": "string", "format": fmt})


def test_booleans_are_not_numbers_in_enums():
  with pytest.raises(schema.SchemaViolation):
    schema.validate(True, {"enum": [1, 2]})
  schema.validate(1.0, {"enum": [1, 2]})
  assert not jsonschema.Draft202012Validator({"enum": [1, 2]}).is_valid(True)


def test_messages_name_the_field_and_what_was_seen():
  params = TOOLS["mail_send"].parameters
  with pytest.raises(schema.SchemaViolation, match=r"arguments\.to\[1\]: expected an email "
                     r"address such as name@example.com, got string 'bob'"):
    schema.validate({"to": ["a@b.co", "bob"], "subject": "s", "body": "b"}, params)
  with pytest.raises(schema.SchemaViolation, match="missing required field"):
    schema.validate({"to": ["a@b.co"]}, params)
  with pytest.raises(schema.SchemaViolation, match=r"unknown field\(s\) recipients"):
    schema.validate({"to": ["a@b.co"], "subject": "s", "body": "b", "recipients": []}, params)
