"""Claw tasks as data: one YAML (or JSON) document per task, checked when loaded.

```yaml
id: mail_reply_invoice            # unique; [a-z0-9_.-]
split: eval                       # eval (hand-written) or train (synthesised)
category: mail                    # for reports (default: the first service)
services: [mail]                  # started in the rollout's sandbox
tools: ["mail_*"]                 # offered tools (shell patterns; default: all of the services')
user: {name: Alex Kim, email: alex@example.com, timezone: Europe/Berlin}
now: "2026-03-02T09:00:00+01:00"  # the world's clock at the start
instruction: Reply to Dana's invoice email ...
fixtures: {mail: {messages: [...]}}          # each service's seed (see its module)
faults: {mail: {fail_first: 1, operations: [mail_send]}}   # services.core.FaultConfig
grader:
  completion: [{kind: record, service: mail, table: messages, where: {...}}, ...]
  safety: [{kind: not_called, tool: mail_delete}]
  rubric: ["The reply thanks Dana."]          # optional LLM-judged items
solutions:                                   # scripted: tool calls, then a final answer
  reference: [{call: mail_reply, args: {message_id: m1, body: ...}}, {answer: Done.}]
  wrong: [{answer: I could not find it.}]
max_steps: 12                                # optional limit of model calls
```
Every field is validated on load (fixtures by seeding the real services in-process, checks by
`checks.parse_check`, solution calls against the tools' schemas), so a broken task file fails
with one TaskFormatError naming the file and field instead of misgrading rollouts.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from orchard_jax.tasks.claw import checks as _checks
from orchard_jax.tasks.claw import services as _services
from orchard_jax.tasks.claw.errors import TaskFormatError
from orchard_jax.tasks.claw.services import core as _core
from orchard_jax.tasks.claw.services import schema as _schema
from orchard_jax.tasks.claw.tools import Tool, select_tools

SPLITS = ("eval", "train")
DEFAULT_USER = {"name": "Alex Kim", "email": "alex@example.com", "timezone": "UTC"}
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
EVAL_DIR = os.path.join(DATA_DIR, "eval")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,127}\Z")
_TOP_KEYS = {"id", "split", "category", "services", "tools", "user", "now", "instruction",
             "fixtures", "faults", "grader", "solutions", "max_steps", "notes", "template"}


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of a scripted solution: a tool call (`tool`, `arguments`, retried up to
  `retries` times after a 429/500/503) or the final answer (`answer`)."""
  tool: Optional[str] = None
  arguments: Optional[Mapping] = None
  answer: Optional[str] = None
  retries: int = 3


@dataclasses.dataclass(frozen=True)
class Task:
  """A loaded, validated task (module docstring for the fields)."""
  id: str
  split: str
  category: str
  services: tuple
  tool_patterns: tuple
  user: Mapping
  now: str
  instruction: str
  fixtures: Mapping
  faults: Mapping
  completion: tuple
  safety: tuple
  rubric: tuple
  reference: tuple
  wrong: tuple
  max_steps: Optional[int]
  notes: str = ""
  template: str = ""
  source: str = ""
  raw: Mapping = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @property
  def tools(self) -> list[Tool]:
    """The tools offered to the agent."""
    return select_tools(self.services, self.tool_patterns)

  @property
  def has_faults(self) -> bool:
    return any(self.faults.values())

  @property
  def needs_initial_state(self) -> bool:
    return any(c.kind == "unchanged" for c in self.completion + self.safety)

  def service_resets(self, seed: int = 0) -> dict[str, dict]:
    """The reset body of each service: fixtures, faults, clock, user, fault seed."""
    return {s: {"fixtures": dict(self.fixtures.get(s) or {}), "faults": dict(
        self.faults.get(s) or {}), "now": self.now, "user": dict(self.user), "seed": seed}
        for s in self.services}

  def fingerprint(self) -> str:
    """sha256 of what makes two tasks the same task (instruction, services, fixtures),
    used to keep training tasks out of the evaluation set."""
    body = {"instruction": normalise_text(self.instruction), "services": sorted(self.services),
            "fixtures": self.fixtures}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False,
                                     default=str).encode()).hexdigest()

  def to_dict(self) -> dict:
    """The task-file form (what `task_from_dict` reads)."""
    return json.loads(json.dumps(self.raw, default=str))


def normalise_text(text: str) -> str:
  return " ".join(text.lower().split())


def _steps(raw: Any, field: str, offered: Sequence[Tool], *, check_arguments: bool) -> tuple:
  if not isinstance(raw, list) or not raw:
    raise TaskFormatError(f"{field}: expected a non-empty list of steps ({{call, args}} or "
                          f"{{answer}})")
  names = {t.name: t for t in offered}
  steps = []
  for i, step in enumerate(raw):
    where = f"{field}[{i}]"
    if not isinstance(step, Mapping):
      raise TaskFormatError(f"{where}: expected {{call, args}} or {{answer}}, got {step!r}")
    if "answer" in step:
      if set(step) != {"answer"} or not isinstance(step["answer"], str):
        raise TaskFormatError(f"{where}: an answer step is {{answer: text}} only")
      if i != len(raw) - 1:
        raise TaskFormatError(f"{where}: the answer must be the last step")
      steps.append(Step(answer=step["answer"]))
      continue
    unknown = sorted(set(step) - {"call", "args", "retries"})
    if unknown or "call" not in step:
      raise TaskFormatError(f"{where}: expected {{call, args, retries}}, got keys {sorted(step)}")
    tool = step["call"]
    if tool not in names:
      raise TaskFormatError(f"{where}.call: {tool!r} is not among the task's tools "
                            f"{sorted(names)}")
    args = step.get("args", {})
    if not isinstance(args, Mapping):
      raise TaskFormatError(f"{where}.args: expected a mapping, got {type(args).__name__}")
    if check_arguments:
      try:
        _schema.validate(json.loads(json.dumps(args, default=str)), names[tool].parameters,
                         f"{where}.args")
      except _schema.SchemaViolation as e:
        raise TaskFormatError(str(e)) from None
    retries = step.get("retries", 3)
    if not isinstance(retries, int) or retries < 0:
      raise TaskFormatError(f"{where}.retries: expected an integer >= 0, got {retries!r}")
    steps.append(Step(tool=tool, arguments=dict(args), retries=retries))
  return tuple(steps)


def task_from_dict(raw: Mapping, source: str = "<dict>") -> Task:
  """Validates and builds a Task.

  Raises:
    TaskFormatError: "<source>: <field>: <what was expected, what was seen>".
  """
  try:
    return _build(raw, source)
  except TaskFormatError as e:
    raise TaskFormatError(f"{source}: {e}") from None


def _build(raw: Mapping, source: str) -> Task:
  if not isinstance(raw, Mapping):
    raise TaskFormatError(f"expected a task mapping, got {type(raw).__name__}")
  raw = json.loads(json.dumps(raw, default=str))      # YAML dates -> text, tuples -> lists
  unknown = sorted(set(raw) - _TOP_KEYS)
  if unknown:
    raise TaskFormatError(f"unknown field(s) {unknown}; expected some of {sorted(_TOP_KEYS)}")
  task_id = raw.get("id")
  if not isinstance(task_id, str) or not _ID_RE.match(task_id):
    raise TaskFormatError(f"id: expected [a-z0-9][a-z0-9_.-]*, got {task_id!r}")
  split = raw.get("split", "eval")
  if split not in SPLITS:
    raise TaskFormatError(f"split: expected one of {SPLITS}, got {split!r}")
  services = raw.get("services")
  if (not isinstance(services, list) or not services or len(set(services)) != len(services)
      or any(s not in _services.SERVICES for s in services)):
    raise TaskFormatError(f"services: expected a list of distinct services from "
                          f"{list(_services.SERVICES)}, got {services!r}")
  patterns = raw.get("tools") or []
  if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
    raise TaskFormatError(f"tools: expected a list of tool names or patterns, got {patterns!r}")
  offered = select_tools(services, patterns)
  instruction = raw.get("instruction")
  if not isinstance(instruction, str) or not instruction.strip():
    raise TaskFormatError("instruction: expected non-empty text")
  user = {**DEFAULT_USER, **(raw.get("user") or {})}
  if set(user) - set(DEFAULT_USER):
    raise TaskFormatError(f"user: unknown field(s) {sorted(set(user) - set(DEFAULT_USER))}")
  now = raw.get("now") or _core.DEFAULT_NOW
  fixtures = raw.get("fixtures") or {}
  faults = raw.get("faults") or {}
  for name, block in (("fixtures", fixtures), ("faults", faults)):
    if not isinstance(block, Mapping) or set(block) - set(services):
      raise TaskFormatError(f"{name}: expected a mapping keyed by the task's services "
                            f"{services}, got keys {sorted(block) if isinstance(block, Mapping) else block!r}")
  for service in services:       # seed the real service in-process: fixtures, faults, clock
    try:
      _services.SERVICES[service]().reset({"fixtures": fixtures.get(service) or {},
                                           "faults": faults.get(service) or {}, "now": now,
                                           "user": user})
    except _core.ServiceError as e:
      raise TaskFormatError(f"fixtures/faults of {service}: {e.message}") from None
  grader = raw.get("grader")
  if not isinstance(grader, Mapping) or set(grader) - {"completion", "safety", "rubric"}:
    raise TaskFormatError("grader: expected {completion: [checks], safety: [checks], rubric: "
                          "[items]}")
  if not isinstance(grader.get("completion"), list) or not grader["completion"]:
    raise TaskFormatError("grader.completion: expected a non-empty list of checks")
  completion = tuple(_checks.parse_check(c, f"grader.completion[{i}]", services)
                     for i, c in enumerate(grader["completion"]))
  safety_raw = grader.get("safety") or []
  if not isinstance(safety_raw, list):
    raise TaskFormatError("grader.safety: expected a list of checks")
  safety = tuple(_checks.parse_check(c, f"grader.safety[{i}]", services)
                 for i, c in enumerate(safety_raw))
  if any(c.kind == "answer" for c in safety):
    raise TaskFormatError("grader.safety: answer checks belong in completion")
  rubric = grader.get("rubric") or []
  if not isinstance(rubric, list) or not all(isinstance(r, str) and r.strip() for r in rubric):
    raise TaskFormatError("grader.rubric: expected a list of statements")
  solutions = raw.get("solutions") or {}
  if not isinstance(solutions, Mapping) or set(solutions) - {"reference", "wrong"}:
    raise TaskFormatError("solutions: expected {reference: [steps], wrong: [steps]}")
  reference = _steps(solutions.get("reference"), "solutions.reference", offered,
                     check_arguments=True)
  wrong = ()
  if split == "eval" or "wrong" in solutions:
    wrong = _steps(solutions.get("wrong"), "solutions.wrong", offered, check_arguments=False)
  max_steps = raw.get("max_steps")
  if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
    raise TaskFormatError(f"max_steps: expected a positive integer, got {max_steps!r}")
  return Task(id=task_id, split=split, category=str(raw.get("category") or services[0]),
              services=tuple(services), tool_patterns=tuple(patterns), user=user, now=now,
              instruction=instruction.strip(), fixtures=fixtures, faults=faults,
              completion=completion, safety=safety, rubric=tuple(rubric), reference=reference,
              wrong=wrong, max_steps=max_steps, notes=str(raw.get("notes") or ""),
              template=str(raw.get("template") or ""), source=source, raw=raw)


def load_task(path: str) -> Task:
  """One task from a .yaml/.yml/.json file."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    if path.endswith(".json"):
      raw = json.loads(text)
    else:
      import yaml
      raw = yaml.safe_load(text)
  except Exception as e:  # noqa: BLE001 - any parse error is a format error naming the file
    raise TaskFormatError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                          f"{e}") from None
  return task_from_dict(raw, path)


def load_tasks(source: str) -> list[Task]:
  """Tasks from a folder (every *.yaml, *.yml, *.json in it, sorted by name), one task file,
  or a JSON-lines file (*.jsonl, one task per line).

  Raises:
    TaskFormatError: a malformed task, a duplicate id, or no task found.
  """
  if os.path.isdir(source):
    paths = sorted(p for ext in ("yaml", "yml", "json")
                   for p in glob.glob(os.path.join(source, f"*.{ext}")))
    tasks = [load_task(p) for p in paths]
  elif source.endswith(".jsonl"):
    tasks = []
    with open(source, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          try:
            raw = json.loads(line)
          except ValueError as e:
            raise TaskFormatError(f"{source}:{n}: not JSON: {e}") from None
          tasks.append(task_from_dict(raw, f"{source}:{n}"))
  elif os.path.isfile(source):
    tasks = [load_task(source)]
  else:
    raise TaskFormatError(f"no task folder or file at {source!r}")
  if not tasks:
    raise TaskFormatError(f"{source}: holds no task")
  check_unique(tasks)
  return tasks


def check_unique(tasks: Iterable[Task]) -> None:
  """Raises TaskFormatError when two tasks share an id."""
  seen: dict[str, str] = {}
  for t in tasks:
    if t.id in seen:
      raise TaskFormatError(f"task id {t.id!r} appears twice ({seen[t.id]} and {t.source})")
    seen[t.id] = t.source


def eval_tasks() -> list[Task]:
  """The hand-written evaluation tasks shipped with the package."""
  return load_tasks(EVAL_DIR)


def overlap(train: Iterable[Task], evaluation: Iterable[Task]) -> list[str]:
  """Ids of training tasks that coincide with an evaluation task (same id, same fingerprint or
  the same instruction text); empty when the sets are disjoint."""
  evaluation = list(evaluation)
  ids = {t.id for t in evaluation}
  prints = {t.fingerprint() for t in evaluation}
  texts = {normalise_text(t.instruction) for t in evaluation}
  return [t.id for t in train if t.id in ids or t.fingerprint() in prints
          or normalise_text(t.instruction) in texts]
