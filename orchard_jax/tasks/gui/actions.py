"""The browser agent's 13 tools as OpenAI function tools, and the checking of their arguments.

Orchard-GUI's action space (docs/algorithms.md section 9): click, write, press_keys, scroll,
drag, hover, wait, goto_url, go_back, new_tab, switch_tab, close_tab and done. Screen positions
are normalised to 0-1000 on both axes, whatever the viewport: (0, 0) is the top-left corner of
the page's viewport and (1000, 1000) its bottom-right; `to_pixels` maps x to x / 1000 * width
CSS pixels (clamped to the last pixel), so the same action means the same place at any
resolution.

`parse_action(name, arguments)` checks a call exactly as the model produced it (the JSON text
of its arguments) and returns the `Action`, or raises `ActionFormatError` naming what was
expected and what was seen. A format error is shown to the agent and counted toward the
repeated-format-failure reward (-1); it never reaches the browser and never ends a rollout
by itself. Everything here is a pure function.
"""
from __future__ import annotations

import dataclasses
import json
import math
import urllib.parse
from typing import Any, Mapping, Optional

from orchard_jax.tasks.gui.errors import GUIError

COORDINATE_MAX = 1000
MAX_TEXT_CHARS = 2000
MAX_URL_CHARS = 2048
MAX_WAIT_S = 10.0
MAX_KEYS = 4
DONE = "done"


class ActionFormatError(GUIError, ValueError):
  """A tool call the browser cannot perform as written (the message is what the agent sees)."""


def _coordinate(description: str) -> dict:
  return {"type": "number", "minimum": 0, "maximum": COORDINATE_MAX, "description": description}


_XY = {"x": _coordinate("Horizontal position, 0 (left edge) to 1000 (right edge)."),
       "y": _coordinate("Vertical position, 0 (top edge) to 1000 (bottom edge).")}

# name -> (description, properties, required)
TOOL_SPECS: dict[str, tuple[str, dict, tuple]] = {
    "click": ("Click at a point of the page. Coordinates are 0-1000 on both axes.",
              {**_XY, "button": {"type": "string", "enum": ["left", "right", "middle"],
                                 "description": "Mouse button (default left)."},
               "clicks": {"type": "integer", "minimum": 1, "maximum": 3,
                          "description": "1 for a click, 2 for a double click (default 1)."}},
              ("x", "y")),
    "write": ("Type text with the keyboard into the focused element (click a field first).",
              {"text": {"type": "string", "description": "The text to type."},
               "clear": {"type": "boolean",
                         "description": "Select and delete the field's text first (default "
                                        "false)."},
               "enter": {"type": "boolean", "description": "Press Enter after typing (default "
                                                           "false)."}},
              ("text",)),
    "press_keys": ("Press a key or a key combination, e.g. [\"Enter\"], [\"Control\", \"a\"], "
                   "[\"Shift\", \"Tab\"].",
                   {"keys": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                             "maxItems": MAX_KEYS,
                             "description": "Modifiers first (Control, Shift, Alt, Meta), then "
                                            "one key (Enter, Tab, Escape, Backspace, Delete, "
                                            "ArrowUp/Down/Left/Right, Home, End, PageUp, "
                                            "PageDown, F1-F12, or one character)."}},
                   ("keys",)),
    "scroll": ("Scroll the page (or the element under the point) in a direction.",
               {**_XY, "direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
                "amount": {"type": "number", "minimum": 1, "maximum": COORDINATE_MAX,
                           "description": "How far, in thousandths of the viewport (default "
                                          "500: half a screen)."}},
               ("x", "y", "direction")),
    "drag": ("Press the mouse at one point, move to another and release.",
             {**_XY, "to_x": _coordinate("Where to release, horizontally (0-1000)."),
              "to_y": _coordinate("Where to release, vertically (0-1000).")},
             ("x", "y", "to_x", "to_y")),
    "hover": ("Move the mouse to a point without clicking.", dict(_XY), ("x", "y")),
    "wait": ("Wait for the page to change (animations, loading).",
             {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S,
                          "description": "Seconds to wait (default 1)."}}, ()),
    "goto_url": ("Open a URL in the current tab.",
                 {"url": {"type": "string", "description": "An http:// or https:// URL."}},
                 ("url",)),
    "go_back": ("Go back to the previous page of the current tab.", {}, ()),
    "new_tab": ("Open a new tab (optionally at a URL) and switch to it.",
                {"url": {"type": "string", "description": "An http:// or https:// URL."}}, ()),
    "switch_tab": ("Switch to another tab.",
                   {"index": {"type": "integer", "minimum": 0,
                              "description": "The tab's index (0 is the first)."}}, ("index",)),
    "close_tab": ("Close a tab (the current one by default).",
                  {"index": {"type": "integer", "minimum": 0}}, ()),
    DONE: ("Finish the task. Call this once the task is complete (or cannot be done).",
           {"answer": {"type": "string",
                       "description": "The answer, when the task asks for information."}}, ()),
}
TOOL_NAMES = tuple(TOOL_SPECS)


def openai_tools(names: Optional[tuple] = None) -> list:
  """The tools as OpenAI function tools (all 13 by default, or those named)."""
  chosen = TOOL_NAMES if names is None else tuple(names)
  unknown = [n for n in chosen if n not in TOOL_SPECS]
  if unknown:
    raise ValueError(f"unknown tool(s) {unknown}; tools are {', '.join(TOOL_NAMES)}")
  return [{"type": "function", "function": {
      "name": name, "description": TOOL_SPECS[name][0],
      "parameters": {"type": "object", "properties": TOOL_SPECS[name][1],
                     "required": list(TOOL_SPECS[name][2]), "additionalProperties": False}}}
          for name in chosen]


# ---------------------------------------------------------------------------- keys
MODIFIERS = ("Control", "Shift", "Alt", "Meta")
_NAMED_KEYS = ("Enter", "Tab", "Escape", "Backspace", "Delete", "Insert", "Home", "End",
               "PageUp", "PageDown", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Space",
               *(f"F{i}" for i in range(1, 13)))
_ALIASES = {"ctrl": "Control", "control": "Control", "shift": "Shift", "alt": "Alt",
            "option": "Alt", "meta": "Meta", "cmd": "Meta", "command": "Meta", "super": "Meta",
            "win": "Meta", "return": "Enter", "esc": "Escape", "del": "Delete", "ins": "Insert",
            "pgup": "PageUp", "pgdn": "PageDown", "up": "ArrowUp", "down": "ArrowDown",
            "left": "ArrowLeft", "right": "ArrowRight", "space": "Space", "spacebar": "Space",
            "backspace": "Backspace", "tab": "Tab", "enter": "Enter", "escape": "Escape",
            "delete": "Delete", "insert": "Insert", "home": "Home", "end": "End",
            "pageup": "PageUp", "pagedown": "PageDown", "arrowup": "ArrowUp",
            "arrowdown": "ArrowDown", "arrowleft": "ArrowLeft", "arrowright": "ArrowRight",
            **{f"f{i}": f"F{i}" for i in range(1, 13)}}


def normalise_key(key: Any) -> str:
  """A key name as the browser knows it: a modifier, a named key, or one printable character
  (common aliases such as ctrl, cmd, esc, return accepted).

  Raises:
    ActionFormatError: anything else, naming the key.
  """
  if not isinstance(key, str) or not key:
    raise ActionFormatError(f"press_keys: each key must be a non-empty string, got {key!r}")
  if len(key) == 1:
    if key.isprintable():
      return key
    raise ActionFormatError(f"press_keys: unknown key {key!r} (a control character)")
  name = _ALIASES.get(key.strip().lower())
  if name is None and key in MODIFIERS + _NAMED_KEYS:
    name = key
  if name is None:
    raise ActionFormatError(
        f"press_keys: unknown key {key[:40]!r}; use a modifier ({', '.join(MODIFIERS)}), one "
        f"of {', '.join(_NAMED_KEYS[:14])}, F1-F12, or a single character")
  return name


def parse_keys(value: Any) -> tuple:
  """The keys of a press_keys call: modifiers first, then at most one other key; a string
  "Control+a" is read as ["Control", "a"]. Returns the browser's key names.

  Raises:
    ActionFormatError: not a list of 1-4 known keys in that order.
  """
  if isinstance(value, str):
    value = [value] if value == "+" else [part for part in value.split("+") if part] or [value]
  if not isinstance(value, list) or not 1 <= len(value) <= MAX_KEYS:
    raise ActionFormatError(f"press_keys: 'keys' must be a list of 1-{MAX_KEYS} key names, got "
                            f"{_show(value)}")
  keys = [normalise_key(k) for k in value]
  plain = [k for k in keys if k not in MODIFIERS]
  if len(plain) > 1:
    raise ActionFormatError(f"press_keys: one key at a time besides modifiers, got {keys}; "
                            "press them in separate calls")
  if plain and keys[-1] != plain[0]:
    raise ActionFormatError(f"press_keys: modifiers come first, then the key, got {keys}")
  if len(set(keys)) != len(keys):
    raise ActionFormatError(f"press_keys: a key is repeated in {keys}")
  return tuple(keys)


# ---------------------------------------------------------------------------- parsing
@dataclasses.dataclass(frozen=True)
class Action:
  """A checked tool call: the tool's name and its arguments (coordinates still 0-1000)."""
  name: str
  args: Mapping[str, Any]

  @property
  def is_done(self) -> bool:
    return self.name == DONE


def _show(value: Any) -> str:
  text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _number(tool: str, key: str, value: Any, low: float, high: float) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ActionFormatError(f"{tool}: '{key}' must be a number from {low:g} to {high:g}, got "
                            f"{_show(value)}")
  if not low <= value <= high:
    raise ActionFormatError(f"{tool}: '{key}' must be from {low:g} to {high:g}, got {value:g}")
  return float(value)


def _integer(tool: str, key: str, value: Any, low: int, high: int) -> int:
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
    raise ActionFormatError(f"{tool}: '{key}' must be a whole number from {low} to {high}, got "
                            f"{_show(value)}")
  return value


def _boolean(tool: str, key: str, value: Any) -> bool:
  if not isinstance(value, bool):
    raise ActionFormatError(f"{tool}: '{key}' must be true or false, got {_show(value)}")
  return value


def _text(tool: str, key: str, value: Any, limit: int) -> str:
  if not isinstance(value, str):
    raise ActionFormatError(f"{tool}: '{key}' must be a string, got {_show(value)}")
  if len(value) > limit:
    raise ActionFormatError(f"{tool}: '{key}' may have at most {limit} characters, got "
                            f"{len(value)}")
  if any((ord(c) < 32 and c not in "\n\t") or 0xD800 <= ord(c) <= 0xDFFF for c in value):
    raise ActionFormatError(f"{tool}: '{key}' has control characters or unpaired surrogates")
  return value


def check_url(tool: str, value: Any) -> str:
  """An http(s) URL with a host (other schemes would reach the sandbox's files or the
  browser's own pages)."""
  url = _text(tool, "url", value, MAX_URL_CHARS).strip()
  parts = urllib.parse.urlsplit(url)
  if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
    raise ActionFormatError(f"{tool}: 'url' must be an http:// or https:// URL with a host, "
                            f"got {_show(value)}")
  return url


def parse_action(name: Any, arguments: Any) -> Action:
  """Checks one tool call (module docstring).

  Args:
    name: the tool's name as the model wrote it.
    arguments: the arguments' JSON text as the model wrote it (or an already decoded object).
  Returns:
    The Action, its arguments typed and defaults filled in.
  Raises:
    ActionFormatError: an unknown tool, arguments that are not a JSON object, a missing or
      unknown argument, a value of the wrong type or out of range, an unknown key, a URL that
      is not http(s).
  """
  if not isinstance(name, str) or name not in TOOL_SPECS:
    raise ActionFormatError(f"unknown tool {_show(name)}; the tools are {', '.join(TOOL_NAMES)}")
  if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
    args: Any = {}
  elif isinstance(arguments, (str, bytes)):
    try:
      args = json.loads(arguments)
    except ValueError as e:
      raise ActionFormatError(f"{name}: the arguments are not valid JSON ({e.msg} at position "
                              f"{e.pos})") from None
  else:
    args = arguments
  if not isinstance(args, dict):
    raise ActionFormatError(f"{name}: the arguments must be a JSON object, got {_show(args)}")
  _, properties, required = TOOL_SPECS[name]
  unknown = sorted(k for k in args if k not in properties)
  if unknown:
    known = ", ".join(properties) or "none"
    raise ActionFormatError(f"{name}: unknown argument(s) {', '.join(map(repr, unknown))}; its "
                            f"arguments are {known}")
  missing = [k for k in required if k not in args]
  if missing:
    raise ActionFormatError(f"{name}: missing required argument(s) "
                            f"{', '.join(map(repr, missing))}")
  out: dict[str, Any] = {}
  for key in ("x", "y", "to_x", "to_y"):
    if key in args:
      out[key] = _number(name, key, args[key], 0, COORDINATE_MAX)
  if name == "click":
    out["button"] = args.get("button", "left")
    if out["button"] not in ("left", "right", "middle"):
      raise ActionFormatError(f"click: 'button' must be left, right or middle, got "
                              f"{_show(out['button'])}")
    out["clicks"] = _integer(name, "clicks", args.get("clicks", 1), 1, 3)
  elif name == "write":
    out["text"] = _text(name, "text", args["text"], MAX_TEXT_CHARS)
    out["clear"] = _boolean(name, "clear", args.get("clear", False))
    out["enter"] = _boolean(name, "enter", args.get("enter", False))
  elif name == "press_keys":
    out["keys"] = parse_keys(args["keys"])
  elif name == "scroll":
    if args["direction"] not in ("up", "down", "left", "right"):
      raise ActionFormatError(f"scroll: 'direction' must be up, down, left or right, got "
                              f"{_show(args['direction'])}")
    out["direction"] = args["direction"]
    out["amount"] = _number(name, "amount", args.get("amount", 500), 1, COORDINATE_MAX)
  elif name == "wait":
    out["seconds"] = _number(name, "seconds", args.get("seconds", 1.0), 0, MAX_WAIT_S)
  elif name in ("goto_url", "new_tab"):
    if "url" in args:
      out["url"] = check_url(name, args["url"])
  elif name in ("switch_tab", "close_tab"):
    if "index" in args:
      out["index"] = _integer(name, "index", args["index"], 0, 99)
  elif name == DONE:
    out["answer"] = _text(name, "answer", args.get("answer", ""), MAX_TEXT_CHARS)
  return Action(name, out)


def to_pixel(value: float, size: int) -> float:
  """A 0-1000 coordinate as a CSS pixel of a viewport side of `size` pixels: value / 1000 *
  size, clamped to [0, size - 1]."""
  return min(max(value / COORDINATE_MAX * size, 0.0), size - 1.0)


def to_normalised(pixel: float, size: int) -> int:
  """The 0-1000 coordinate of a CSS pixel (the inverse of to_pixel, rounded)."""
  return int(min(max(round(pixel / size * COORDINATE_MAX), 0), COORDINATE_MAX))


def to_pixels(action: Action, viewport: tuple) -> dict:
  """The driver's form of an action: coordinates in CSS pixels of `viewport` (width, height),
  scrolls as wheel deltas. The done action has no driver form (the harness ends the episode).

  Raises:
    ValueError: for done.
  """
  if action.is_done:
    raise ValueError("done is not a browser action")
  width, height = viewport
  out = {"name": action.name, **{k: v for k, v in action.args.items()
                                 if k not in ("x", "y", "to_x", "to_y", "direction", "amount")}}
  for key, size in (("x", width), ("y", height), ("to_x", width), ("to_y", height)):
    if key in action.args:
      out[key] = to_pixel(action.args[key], size)
  if action.name == "press_keys":
    out["keys"] = list(action.args["keys"])
  if action.name == "scroll":
    amount = action.args["amount"] / COORDINATE_MAX
    direction = action.args["direction"]
    out["dx"] = {"left": -amount * width, "right": amount * width}.get(direction, 0.0)
    out["dy"] = {"up": -amount * height, "down": amount * height}.get(direction, 0.0)
  return out


def call_text(action: Action) -> str:
  """The call as the agent wrote it, for logs: click(x=500, y=120)."""
  args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in action.args.items())
  return f"{action.name}({args})"
