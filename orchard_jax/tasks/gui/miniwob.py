"""MiniWoB++ tasks from the `miniwob` package, each scored by its own page.

The `miniwob` wheel ships every task page (html/miniwob/<task>.html with its core.js); the
browser sandbox serves them at http://miniwob.test/miniwob/<task>.html. An episode opens the
page, seeds the task's random generator and starts the episode the way the MiniWoB++
environment does (`Math.seedrandom(seed); core.startEpisodeReal()`), with the episode's own
time limit raised from the page's 10-20 s to `episode_seconds` (a policy on CPU thinks slower
than a person), and reads the task's reward from the page after every action (the probe:
WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON). The page's own reward decides
success: raw reward > 0 once the page says the episode is done (MiniWoB++'s success rate). The
instruction is the page's utterance (core.getUtterance()). Each task is its own family.

`EXPERTS` holds scripted programs (orchard_jax.tasks.gui.expert) for the tasks listed there,
with a wrong program for each: the CI check that the task's reward tells them apart, and the
scripted demonstrations of SFT.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterator, Optional

from orchard_jax.tasks.gui.expert import Call, ExpertError, PageView, click, fill

BASE_URL = "http://miniwob.test/miniwob/"
PROBE = ("(typeof WOB_DONE_GLOBAL === 'undefined') ? null : ({done: WOB_DONE_GLOBAL, "
         "reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON})")
DEFAULT_EPISODE_SECONDS = 3600.0


def task_names(html_dir: Optional[str] = None) -> list:
  """Every MiniWoB++ task the package ships (sorted), from its html/miniwob folder.

  Raises:
    FileNotFoundError: the package is not installed (pip install miniwob).
  """
  from orchard_jax.tasks.gui.sandbox import default_miniwob_dir
  folder = html_dir or default_miniwob_dir()
  if folder is None:
    raise FileNotFoundError("the miniwob package is not installed: pip install miniwob")
  return sorted(name[:-5] for name in os.listdir(os.path.join(folder, "miniwob"))
                if name.endswith(".html"))


def url(task: str) -> str:
  return f"{BASE_URL}{task}.html"


def setup_script(seed: int, episode_seconds: float = DEFAULT_EPISODE_SECONDS) -> str:
  """JavaScript that starts a seeded episode on a loaded task page (waits for the page's
  WOB_TASK_READY, as the MiniWoB++ environment does)."""
  ms = int(min(episode_seconds, 2_000_000) * 1000)   # setTimeout's limit is 2^31 - 1 ms
  return (f"(async () => {{ core.EPISODE_MAX_TIME = {ms}; Math.seedrandom({json.dumps(str(seed))});"
          f" core.startEpisodeReal(); for (let i = 0; i < 200 && !WOB_TASK_READY; i++) "
          f"await new Promise(r => setTimeout(r, 25)); return core.getUtterance(); }})()")


def is_over(probe) -> bool:
  """The page says the episode ended (success or not)."""
  return isinstance(probe, dict) and bool(probe.get("done"))


def reward(probe) -> Optional[float]:
  """The page's raw reward once the episode is done, else None."""
  if not is_over(probe):
    return None
  try:
    return float(probe.get("reward"))
  except (TypeError, ValueError):
    return None


# ---------------------------------------------------------------------------- experts
def _quoted(text: str, n: int = 0) -> str:
  found = re.findall(r'"([^"]*)"', text)
  if len(found) <= n:
    raise ExpertError(f"expected a quoted value in the instruction {text!r}")
  return found[n]


def _bold(view: PageView, n: int = 0) -> str:
  return view.js(f"document.querySelectorAll('#query .bold')[{n}].textContent")


def _submit(view: PageView) -> Iterator[Call]:
  yield from click(view, "#subbtn")


def click_test(view):
  yield from click(view, "#subbtn")


def click_test_wrong(view):
  yield ("click", {"x": 990, "y": 990})
  yield ("click", {"x": 5, "y": 990})


def click_test_2(view):
  yield from click(view, "#subbtn")


def click_test_2_wrong(view):
  yield from click(view, "#subbtn2")


def click_button(view):
  yield from click(view, "#area button", text=_quoted(view.text("#query")))


def click_button_wrong(view):
  target = _quoted(view.text("#query"))
  others = view.js("[...document.querySelectorAll('#area button')].map(b => b.textContent)")
  wrong = next((b for b in others if b != target), None)
  if wrong is None:   # only the right button exists: fail by typing nonsense and finishing
    yield ("press_keys", {"keys": ["Tab"]})
    return
  yield from click(view, "#area button", text=wrong)


def click_button_sequence(view):
  yield from click(view, "#subbtn")
  yield from click(view, "#subbtn2")


def click_button_sequence_wrong(view):
  yield from click(view, "#subbtn2")
  yield from click(view, "#subbtn")


def click_link(view):
  yield from click(view, "#area .alink", text=_quoted(view.text("#query")))


def click_link_wrong(view):
  target = _quoted(view.text("#query"))
  words = view.js("[...document.querySelectorAll('#area .alink')].map(e => e.textContent)")
  wrong = next((w for w in words if w != target), None)
  if wrong is not None:
    yield from click(view, "#area .alink", text=wrong)


def click_dialog(view):
  yield from click(view, ".ui-dialog-titlebar-close")


def click_dialog_wrong(view):
  yield from click(view, ".ui-dialog-content")


def click_dialog_2(view):
  label = _quoted(view.text("#query"))
  if label == "x":
    yield from click(view, ".ui-dialog-titlebar-close")
  else:
    yield from click(view, ".ui-dialog-buttonpane button", text=label)


def click_dialog_2_wrong(view):
  label = _quoted(view.text("#query"))
  yield from click(view, ".ui-dialog-buttonpane button", text="OK" if label != "OK" else "Cancel")


def _checkbox_names(view) -> list:
  query = view.text("#query")
  match = re.match(r"Select (.*) and click Submit\.", query)
  if not match:
    raise ExpertError(f"unexpected instruction {query!r}")
  return [] if match.group(1) == "nothing" else match.group(1).split(", ")


def click_checkboxes(view):
  for name in _checkbox_names(view):
    yield from click(view, "#boxes label", text=name)
  yield from _submit(view)


def click_checkboxes_wrong(view):
  names = set(_checkbox_names(view))
  labels = view.js("[...document.querySelectorAll('#boxes label')].map(e => e.textContent)")
  for label in labels:   # check exactly the boxes not asked for
    if label not in names:
      yield from click(view, "#boxes label", text=label)
  yield from _submit(view)


def click_option(view):
  yield from click(view, "#boxes label", text=_checkbox_names(view)[0])
  yield from _submit(view)


def click_option_wrong(view):
  target = _checkbox_names(view)[0]
  labels = view.js("[...document.querySelectorAll('#boxes label')].map(e => e.textContent)")
  wrong = next((label for label in labels if label != target), None)
  if wrong is not None:
    yield from click(view, "#boxes label", text=wrong)
  yield from _submit(view)


def click_tab(view):
  number = re.search(r"Tab #(\d)", view.text("#query")).group(1)
  yield from click(view, f"#area ul a[href='#tabs-{number}']")


def click_tab_wrong(view):
  number = int(re.search(r"Tab #(\d)", view.text("#query")).group(1))
  yield from click(view, f"#area ul a[href='#tabs-{number % 3 + 1}']")


def click_collapsible(view):
  yield from click(view, "#area h3")
  yield from _submit(view)


def click_collapsible_wrong(view):
  yield from _submit(view)


def click_widget(view):
  kind = _quoted(view.text("#query"))
  yield from click(view, f"#area [data-type='{kind}']")


def click_widget_wrong(view):
  kind = _quoted(view.text("#query"))
  kinds = view.js("[...document.querySelectorAll('#area [data-type]')].map(e => e.dataset.type)")
  wrong = next((k for k in kinds if k != kind), None)
  if wrong is not None:
    yield from click(view, f"#area [data-type='{wrong}']")


def enter_text(view):
  yield from fill(view, "#tt", _bold(view))
  yield from _submit(view)


def enter_text_wrong(view):
  yield from fill(view, "#tt", _bold(view) + "x")
  yield from _submit(view)


def _case(view) -> str:
  query = view.text("#query")
  text = _bold(view)
  return text.upper() if "upper case" in query else text.lower()


def enter_text_2(view):
  yield from fill(view, "#tt", _case(view))
  yield from _submit(view)


def enter_text_2_wrong(view):
  yield from fill(view, "#tt", _bold(view))   # the text as shown, not in the asked case
  yield from _submit(view)


def enter_password(view):
  password = _bold(view)
  yield from fill(view, "#password", password)
  yield from fill(view, "#verify", password)
  yield from _submit(view)


def enter_password_wrong(view):
  password = _bold(view)
  yield from fill(view, "#password", password)
  yield from fill(view, "#verify", password[::-1] + "9")
  yield from _submit(view)


def focus_text(view):
  yield from click(view, "#tt")


def focus_text_wrong(view):
  yield ("click", {"x": 990, "y": 990})
  yield ("press_keys", {"keys": ["Escape"]})


def focus_text_2(view):
  position = re.search(r"(\d)(st|nd|rd) input", view.text("#query")).group(1)
  yield from click(view, f"#tt{position}")


def focus_text_2_wrong(view):
  position = int(re.search(r"(\d)(st|nd|rd) input", view.text("#query")).group(1))
  yield from click(view, f"#tt{position % 3 + 1}")


def login_user(view):
  query = view.text("#query")
  yield from fill(view, "#username", _quoted(query, 0))
  yield from fill(view, "#password", _quoted(query, 1))
  yield from _submit(view)


def login_user_wrong(view):
  query = view.text("#query")
  yield from fill(view, "#username", _quoted(query, 1))   # swapped
  yield from fill(view, "#password", _quoted(query, 0))
  yield from _submit(view)


def _arithmetic(text: str) -> int:
  a, op, b = re.match(r"\s*(-?\d+)\s*([-+x])\s*(-?\d+)", text).groups()
  a, b = int(a), int(b)
  return a + b if op == "+" else a - b if op == "-" else a * b


def simple_arithmetic(view):
  yield from fill(view, "#math-answer", str(_arithmetic(view.text("#math-problem"))))
  yield from _submit(view)


def simple_arithmetic_wrong(view):
  yield from fill(view, "#math-answer", str(_arithmetic(view.text("#math-problem")) + 1))
  yield from _submit(view)


def _algebra(text: str) -> int:
  text = text.replace(" ", "")
  match = re.fullmatch(r"x([-+])(\d+)=(-?\d+)", text)
  if match:
    op, d, total = match.group(1), int(match.group(2)), int(match.group(3))
    return total - d if op == "+" else total + d
  d, op, total = re.fullmatch(r"(\d+)([-+])x=(-?\d+)", text).groups()
  return int(total) - int(d) if op == "+" else int(d) - int(total)


def simple_algebra(view):
  yield from fill(view, "#math-answer", str(_algebra(view.text("#math-problem"))))
  yield from _submit(view)


def simple_algebra_wrong(view):
  yield from fill(view, "#math-answer", str(-_algebra(view.text("#math-problem")) - 1))
  yield from _submit(view)


def click_color(view):
  colour = view.js("core.getUtterance()").split("Click on the ")[1].split(" colored")[0]
  yield from click(view, f"#area .color[data-color='{colour}']")


def click_color_wrong(view):
  colour = view.js("core.getUtterance()").split("Click on the ")[1].split(" colored")[0]
  colours = view.js("[...document.querySelectorAll('#area .color')].map(e => e.dataset.color)")
  yield from click(view, f"#area .color[data-color='{next(c for c in colours if c != colour)}']")


def identify_shape(view):
  kind = view.js("(() => { const t = document.querySelector('#area_svg text'); if (t) "
                 "return /[0-9]/.test(t.textContent) ? 'digit' : 'letter'; const s = "
                 "document.querySelector('#area_svg circle, #area_svg rect, #area_svg polygon');"
                 " return {circle: 'circle', rect: 'rectangle', polygon: 'triangle'}"
                 "[s.tagName.toLowerCase()]; })()")
  yield from click(view, f"#area-buttons button[data-type='{kind}']")


def identify_shape_wrong(view):
  kind = view.js("(() => { const t = document.querySelector('#area_svg text'); return t ? "
                 "'x' : 'digit'; })()")
  yield from click(view, "#area-buttons button[data-type='"
                   f"{'rectangle' if kind == 'x' else 'letter'}']")


def odd_or_even(view):
  numbers = view.js("[...document.querySelectorAll('.display-number')].map(e => +e.textContent)")
  for i, number in enumerate(numbers):
    yield from click(view, ".odd" if number % 2 else ".even", index=i)
  yield from click(view, "#submit")


def odd_or_even_wrong(view):
  numbers = view.js("[...document.querySelectorAll('.display-number')].map(e => +e.textContent)")
  for i, number in enumerate(numbers):
    yield from click(view, ".even" if number % 2 else ".odd", index=i)
  yield from click(view, "#submit")


def use_autocomplete(view):
  query = view.text("#query")
  start = _quoted(query, 0)
  end = _quoted(query, 1) if query.count('"') >= 4 else ""
  item = view.js(f"ui_utils.COUNTRIES.find(c => c.startsWith({json.dumps(start)}) && "
                 f"c.endsWith({json.dumps(end)}))")
  yield from fill(view, "#tags", item)
  yield ("press_keys", {"keys": ["Escape"]})   # close the suggestion list over the button
  yield from _submit(view)


def use_autocomplete_wrong(view):
  yield from fill(view, "#tags", "Zzyzx")
  yield ("press_keys", {"keys": ["Escape"]})
  yield from _submit(view)


def choose_list(view):
  target = re.match(r"Select (.*) from the list", view.text("#query")).group(1)
  yield from click(view, "#options")
  yield ("press_keys", {"keys": ["Escape"]})  # the native list closes; the select keeps focus
  options = view.js("[...document.querySelectorAll('#options option')].map(o => o.textContent)")
  current = view.js("document.querySelector('#options').selectedIndex")
  goal = options.index(target)
  for _ in range(abs(goal - current)):
    yield ("press_keys", {"keys": ["ArrowDown" if goal > current else "ArrowUp"]})
  yield from click(view, "#area button", text="Submit")


def choose_list_wrong(view):
  target = re.match(r"Select (.*) from the list", view.text("#query")).group(1)
  options = view.js("[...document.querySelectorAll('#options option')].map(o => o.textContent)")
  current = view.js("document.querySelector('#options').selectedIndex")
  if options[current] == target:   # move off the right one
    yield from click(view, "#options")
    yield ("press_keys", {"keys": ["Escape"]})
    yield ("press_keys", {"keys": ["ArrowDown" if current == 0 else "ArrowUp"]})
  yield from click(view, "#area button", text="Submit")


def navigate_tree(view):
  target = _quoted(view.text("#query"))
  for _ in range(10):
    if view.find("#tree span", text=target) and view.find("#tree span", text=target).width > 0:
      break
    # open the first collapsed folder (its hitarea)
    yield from click(view, "#tree .expandable-hitarea")
  yield from click(view, "#tree span", text=target)


def navigate_tree_wrong(view):
  target = _quoted(view.text("#query"))
  names = view.js("[...document.querySelectorAll('#tree > li > span.file')].map(e => e.textContent)")
  wrong = next((n for n in names if n != target), None)
  if wrong is not None:
    yield from click(view, "#tree > li > span.file", text=wrong)


EXPERTS = {
    "click-test": (click_test, click_test_wrong),
    "click-test-2": (click_test_2, click_test_2_wrong),
    "click-button": (click_button, click_button_wrong),
    "click-button-sequence": (click_button_sequence, click_button_sequence_wrong),
    "click-link": (click_link, click_link_wrong),
    "click-dialog": (click_dialog, click_dialog_wrong),
    "click-dialog-2": (click_dialog_2, click_dialog_2_wrong),
    "click-checkboxes": (click_checkboxes, click_checkboxes_wrong),
    "click-option": (click_option, click_option_wrong),
    "click-tab": (click_tab, click_tab_wrong),
    "click-collapsible-nodelay": (click_collapsible, click_collapsible_wrong),
    "click-widget": (click_widget, click_widget_wrong),
    "enter-text": (enter_text, enter_text_wrong),
    "enter-text-2": (enter_text_2, enter_text_2_wrong),
    "enter-password": (enter_password, enter_password_wrong),
    "focus-text": (focus_text, focus_text_wrong),
    "focus-text-2": (focus_text_2, focus_text_2_wrong),
    "login-user": (login_user, login_user_wrong),
    "simple-arithmetic": (simple_arithmetic, simple_arithmetic_wrong),
    "simple-algebra": (simple_algebra, simple_algebra_wrong),
    "click-color": (click_color, click_color_wrong),
    "identify-shape": (identify_shape, identify_shape_wrong),
    "odd-or-even": (odd_or_even, odd_or_even_wrong),
    "use-autocomplete-nodelay": (use_autocomplete, use_autocomplete_wrong),
    "choose-list": (choose_list, choose_list_wrong),
    "navigate-tree": (navigate_tree, navigate_tree_wrong),
}
