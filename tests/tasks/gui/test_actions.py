"""The browser tools' argument checks: every malformed call is an ActionFormatError with a
one-line message naming the tool and what was expected, never another exception; well-formed
calls keep their values; 0-1000 coordinates map onto pixels as x / 1000 * width."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from orchard_jax.tasks.gui import actions
from orchard_jax.tasks.gui.actions import ActionFormatError, parse_action

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() |
                    st.text(max_size=20), lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def test_thirteen_openai_function_tools():
  tools = actions.openai_tools()
  assert len(tools) == 13
  names = [t["function"]["name"] for t in tools]
  assert names == list(actions.TOOL_NAMES)
  for name in ("click", "write", "press_keys", "scroll", "drag", "hover", "goto_url", "done",
               "new_tab", "switch_tab", "close_tab", "go_back", "wait"):
    assert name in names
  for tool in tools:   # valid JSON Schema objects as OpenAI expects them
    assert tool["type"] == "function"
    params = tool["function"]["parameters"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert set(params["required"]) <= set(params["properties"])
  click = next(t for t in tools if t["function"]["name"] == "click")
  assert click["function"]["parameters"]["properties"]["x"]["maximum"] == 1000


@pytest.mark.parametrize("name, arguments, expected", [
    ("click", '{"x": 1200, "y": 10}', "click: 'x' must be from 0 to 1000, got 1200"),
    ("click", '{"x": -1, "y": 10}', "'x' must be from 0 to 1000"),
    ("click", '{"x": 10}', "click: missing required argument(s) 'y'"),
    ("click", '{"x": "10", "y": 5}', "'x' must be a number from 0 to 1000"),
    ("click", '{"x": true, "y": 5}', "'x' must be a number"),
    ("click", '{"x": 1, "y": 2, "z": 3}', "unknown argument(s) 'z'"),
    ("click", '{"x": 1, "y": 2, "clicks": 4}', "'clicks' must be a whole number from 1 to 3"),
    ("click", '{"x": 1, "y": 2, "button": "side"}', "'button' must be left, right or middle"),
    ("click", '{"x": 1, "y": ', "arguments are not valid JSON"),
    ("click", '[1, 2]', "arguments must be a JSON object"),
    ("press_keys", '{"keys": ["Control", "Hyperspace"]}', "unknown key 'Hyperspace'"),
    ("press_keys", '{"keys": []}', "'keys' must be a list of 1-4 key names"),
    ("press_keys", '{"keys": ["a", "b"]}', "one key at a time besides modifiers"),
    ("press_keys", '{"keys": ["a", "Control"]}', "modifiers come first"),
    ("press_keys", '{"keys": ["\\u0007"]}', "control character"),
    ("goto_url", '{"url": "file:///etc/passwd"}', "'url' must be an http:// or https:// URL"),
    ("goto_url", '{"url": "javascript:alert(1)"}', "http:// or https://"),
    ("goto_url", '{"url": "chrome://crash"}', "http:// or https://"),
    ("scroll", '{"x": 5, "y": 5, "direction": "sideways"}', "'direction' must be up, down"),
    ("wait", '{"seconds": 60}', "'seconds' must be from 0 to 10"),
    ("write", '{"text": 42}', "'text' must be a string"),
    ("switch_tab", '{"index": -1}', "'index' must be a whole number from 0 to 99"),
    ("fly", '{}', "unknown tool 'fly'; the tools are click, write"),
])
def test_bad_arguments_are_format_errors_naming_what_was_expected(name, arguments, expected):
  with pytest.raises(ActionFormatError) as info:
    parse_action(name, arguments)
  assert expected in str(info.value)
  assert "\n" not in str(info.value)


@given(name=st.sampled_from(actions.TOOL_NAMES + ("", "clik", None, 3)),
       arguments=JSON.map(json.dumps) | st.text(max_size=40) | JSON)
@settings(max_examples=400, deadline=None)
def test_any_call_is_an_action_or_a_format_error(name, arguments):
  try:
    action = parse_action(name, arguments)
  except ActionFormatError as e:
    assert str(e) and "\n" not in str(e)
    return
  assert action.name in actions.TOOL_NAMES
  for key in ("x", "y", "to_x", "to_y"):
    if key in action.args:
      assert 0 <= action.args[key] <= 1000


@given(x=st.floats(0, 1000), y=st.floats(0, 1000), width=st.integers(64, 4096),
       height=st.integers(64, 4096))
def test_coordinates_map_to_pixels_proportionally(x, y, width, height):
  action = parse_action("click", {"x": x, "y": y})
  px = actions.to_pixels(action, (width, height))
  assert px["x"] == pytest.approx(min(x / 1000 * width, width - 1))
  assert px["y"] == pytest.approx(min(y / 1000 * height, height - 1))
  assert 0 <= px["x"] <= width - 1 and 0 <= px["y"] <= height - 1
  # and back: the normalised coordinate of the pixel is within one unit of where we started
  if x / 1000 * width <= width - 1:
    assert abs(actions.to_normalised(px["x"], width) - x) <= 0.5 + 1e-9 + 1000 / width


def test_well_formed_calls_keep_their_values_and_fill_defaults():
  assert parse_action("click", '{"x": 500, "y": 250}').args == {
      "x": 500.0, "y": 250.0, "button": "left", "clicks": 1}
  assert parse_action("write", {"text": "héllo\n"}).args == {
      "text": "héllo\n", "clear": False, "enter": False}
  assert parse_action("press_keys", {"keys": ["ctrl", "A"]}).args["keys"] == ("Control", "A")
  assert parse_action("press_keys", {"keys": "Control+Shift+Tab"}).args["keys"] == (
      "Control", "Shift", "Tab")
  assert parse_action("press_keys", {"keys": ["esc"]}).args["keys"] == ("Escape",)
  assert parse_action("done", None).args == {"answer": ""}
  assert parse_action("goto_url", {"url": " http://shop.test/cart "}).args["url"] == \
      "http://shop.test/cart"
  scroll = actions.to_pixels(parse_action("scroll", {"x": 500, "y": 500, "direction": "up"}),
                             (800, 600))
  assert (scroll["dx"], scroll["dy"]) == (0.0, -300.0)   # half the viewport by default
  with pytest.raises(ValueError):
    actions.to_pixels(parse_action("done", {}), (800, 600))


@given(st.text(min_size=1, max_size=12))
def test_key_names_are_known_keys_or_refused(key):
  try:
    name = actions.normalise_key(key)
  except ActionFormatError:
    return
  assert (len(name) == 1 and name.isprintable()) or name in actions.MODIFIERS + \
      actions._NAMED_KEYS
