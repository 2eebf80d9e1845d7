"""GUI tasks: MiniWoB++ episodes (seeded pages with their own reward), local-site tasks
(instructions with a checker of the site's final state), and open tasks (an instruction and a
start page, judged by a WebJudge-style model: tasks/gui/judge.py), in one `GUITask` shape.

Task ids are stable: "miniwob/<task>/<seed>" and "<site>/<family>/<key>". Families are what
results are reported by: each MiniWoB++ task is its own family ("miniwob/click-test"), and each
site template is one ("shop/cheapest"). Splits: MiniWoB++ seeds below 1,000,000 train and the
evaluation seeds start there; a site family's parameter sets are split 3:1 into train and
evaluation by a hash of their key, with at least one in each.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Optional, Sequence

from orchard_jax.tasks.gui import miniwob, sitetasks
from orchard_jax.tasks.gui.errors import TaskFormatError

EVAL_SEED_BASE = 1_000_000
SPLITS = ("train", "eval", "all")
KINDS = ("miniwob", "site", "open")


@dataclasses.dataclass(frozen=True)
class GUITask:
  """One GUI task.

  Attributes:
    id: stable id (module docstring).
    kind: "miniwob", "site" or "open" (no checker: the judge decides).
    family: the family results are reported by ("miniwob/click-test", "shop/cheapest").
    site: "miniwob", or the local site the task runs on ("shop", "mail", "booking").
    start_url: the page the episode opens.
    instruction: what the agent is asked ("" for MiniWoB++: the page's utterance is read when
      the episode starts).
    seed: MiniWoB++'s random seed (0 for sites).
    params: the site template's parameters (what its checker and expert read).
    fixtures: {site: fixtures} the sites start from.
    max_steps: the task's step budget ceiling (the run's step limit applies if smaller).
    split: "train" or "eval".
  """
  id: str
  kind: str
  family: str
  site: str
  start_url: str
  instruction: str = ""
  seed: int = 0
  params: dict = dataclasses.field(default_factory=dict)
  fixtures: dict = dataclasses.field(default_factory=dict)
  max_steps: int = 30
  split: str = "train"

  @property
  def instance_id(self) -> str:   # the name other domains' records use
    return self.id

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def task_from_dict(data: dict) -> GUITask:
  """A task from its dict form (e.g. a run's tasks.json), checked.

  Raises:
    TaskFormatError: a missing or unknown field, or a kind / family that does not exist.
  """
  fields = {f.name for f in dataclasses.fields(GUITask)}
  if not isinstance(data, dict):
    raise TaskFormatError(f"a GUI task must be an object, got {type(data).__name__}")
  unknown = sorted(set(data) - fields)
  missing = [k for k in ("id", "kind", "family", "site", "start_url") if k not in data]
  if unknown or missing:
    raise TaskFormatError(f"GUI task {data.get('id')!r}: unknown field(s) {unknown}, missing "
                          f"{missing}")
  task = GUITask(**data)
  if task.kind == "site" and task.family not in sitetasks.TEMPLATES:
    raise TaskFormatError(f"GUI task {task.id!r}: no site family {task.family!r}; families: "
                          f"{sorted(sitetasks.TEMPLATES)}")
  if task.kind not in KINDS:
    raise TaskFormatError(f"GUI task {task.id!r}: kind must be one of {KINDS}, got "
                          f"{task.kind!r}")
  if task.split not in ("train", "eval"):
    raise TaskFormatError(f"GUI task {task.id!r}: split must be train or eval, got "
                          f"{task.split!r}")
  return task


def open_tasks(path: str) -> list:
  """Open tasks from a JSON-lines file, one object a line: {"id", "instruction", "start_url",
  "sites": [local sites to serve, optional], "split": "train" | "eval", "max_steps"}; they are
  judged (tasks/gui/judge.py), having no checker.

  Raises:
    TaskFormatError: a line that is not such an object (naming the line).
    FileNotFoundError: no such file.
  """
  out = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise TaskFormatError(f"{path}:{number}: not JSON: {e}") from None
      if not isinstance(record, dict) or not all(isinstance(record.get(k), str) and record[k]
                                                 for k in ("id", "instruction", "start_url")):
        raise TaskFormatError(f"{path}:{number}: expected an object with id, instruction and "
                              "start_url strings")
      sites = record.get("sites") or []
      unknown = [s for s in sites if s not in sitetasks.START_URLS]
      if unknown:
        raise TaskFormatError(f"{path}:{number}: unknown site(s) {unknown}; sites: "
                              f"{sorted(sitetasks.START_URLS)}")
      out.append(task_from_dict(dict(
          id=f"open/{record['id']}", kind="open", family=f"open/{sites[0] if sites else 'web'}",
          site=sites[0] if sites else "", start_url=record["start_url"],
          instruction=record["instruction"], fixtures={s: {} for s in sites},
          max_steps=int(record.get("max_steps", 30)), split=record.get("split", "eval"))))
  return out


def _split_of(key: str, index: int) -> str:
  """3:1 train:eval by hash, the first of a family always eval (so every family has one)."""
  if index == 0:
    return "eval"
  return "eval" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 4 == 0 else "train"


def site_tasks(families: Optional[Sequence[str]] = None, split: str = "all") -> list:
  """Every local-site task of the given families (all by default) in the split."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  chosen = list(families) if families else list(sitetasks.TEMPLATES)
  unknown = [f for f in chosen if f not in sitetasks.TEMPLATES]
  if unknown:
    raise ValueError(f"unknown site families {unknown}; families: {sorted(sitetasks.TEMPLATES)}")
  out = []
  for family in chosen:
    template = sitetasks.TEMPLATES[family]
    for index, params in enumerate(template.params()):
      key = template.task_key(params)
      task_split = _split_of(f"{family}/{key}", index)
      if split not in ("all", task_split):
        continue
      out.append(GUITask(
          id=f"{family}/{key}", kind="site", family=family, site=template.site,
          start_url=sitetasks.START_URLS[template.site],
          instruction=template.instruction(params), params=json.loads(json.dumps(params)),
          fixtures={template.site: {}, **template.fixtures(params)}, max_steps=template.steps,
          split=task_split))
  return out


def miniwob_tasks(names: Optional[Sequence[str]] = None, *, seeds_per_task: int = 1,
                  split: str = "train", first_seed: int = 0) -> list:
  """MiniWoB++ tasks: `seeds_per_task` seeds of each named task (default: every task with a
  scripted expert). Train seeds count up from `first_seed`, evaluation seeds from
  EVAL_SEED_BASE + `first_seed`.

  Raises:
    ValueError: an unknown task name or split.
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be train or eval for MiniWoB++, got {split!r}")
  chosen = list(names) if names else list(miniwob.EXPERTS)
  known = set(miniwob.task_names())
  unknown = [n for n in chosen if n not in known]
  if unknown:
    raise ValueError(f"unknown MiniWoB++ task(s) {unknown}; the miniwob package has "
                     f"{len(known)} (e.g. {', '.join(sorted(known)[:5])})")
  base = first_seed + (EVAL_SEED_BASE if split == "eval" else 0)
  return [GUITask(id=f"miniwob/{name}/{seed}", kind="miniwob", family=f"miniwob/{name}",
                  site="miniwob", start_url=miniwob.url(name), seed=seed, max_steps=15,
                  split=split, params={"task": name})
          for name in chosen for seed in range(base, base + seeds_per_task)]


def names_of(value: Any, keywords: Sequence[str] = ()) -> Any:
  """A config's list of names: a sequence, or one comma-separated string ("click-test,
  click-button", what a command-line override gives); one of `keywords` ("all") as it is; ""
  or None: an empty list."""
  if value is None:
    return []
  if isinstance(value, str):
    if value.strip() in keywords:
      return value.strip()
    return [name.strip() for name in value.split(",") if name.strip()]
  return [str(name) for name in value]


def load_tasks(spec: Any) -> list:
  """Tasks from a config block: {"miniwob": names or "experts" or "all", "miniwob_seeds": n,
  "sites": families or "all" or "", "open_file": path, "split": "train" | "eval"}; names are a
  sequence or one comma-separated string.

  Raises:
    ValueError: an unknown MiniWoB++ task or site family.
    TaskFormatError: a malformed open-tasks file.
  """
  split = spec.get("split", "train")
  out = []
  names = names_of(spec.get("miniwob", "experts"), ("experts", "all"))
  if names:
    chosen = (None if names == "experts" else miniwob.task_names() if names == "all"
              else list(names))
    out += miniwob_tasks(chosen, seeds_per_task=int(spec.get("miniwob_seeds", 1)), split=split)
  families = names_of(spec.get("sites", "all"), ("all",))
  if families:
    out += site_tasks(None if families == "all" else list(families), split=split)
  if spec.get("open_file"):
    out += [t for t in open_tasks(spec["open_file"]) if t.split == split]
  return out
