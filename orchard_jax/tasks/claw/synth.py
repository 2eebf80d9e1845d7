"""Training tasks, synthesised offline from templates and fixtures (and optionally by a teacher).

Each template (`synth_templates`) draws people, companies, topics, dates and distractors and
writes the instruction, the fixtures, the grader checks and a scripted reference solution
together, so the three always agree. About a fifth of the tasks get injected faults
(429/500/503 on an operation the solution depends on), so training sees recovery. A task offers
the tools its solution uses plus `distractors` others of its services (Claw-Eval tasks also name
their tools). `synthesize(n, seed)` is deterministic: the same arguments give the same tasks.

A synthesised task is kept only when (1) it loads (`task_from_dict`: every field checked, the
fixtures seeded into the real services), (2) it does not coincide with an evaluation task
(same id, fingerprint or instruction text, `task.overlap`), and (3) its reference solution,
played through the harness against the services, passes (`validate`, with the caller's
`play(task) -> outcome`). The dates of the synthetic world (April-September 2026) and its names
are disjoint from the evaluation tasks' (March 2026).

`teacher_tasks` asks a model behind an OpenAI-compatible endpoint for more tasks in the same
JSON form, shown two synthesised examples; its proposals go through the same three gates.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import re
from typing import Any, Callable, Iterable, Optional, Sequence

from orchard_jax.tasks.claw.errors import TaskFormatError
from orchard_jax.tasks.claw.synth_templates import FIRST, LAST, TEMPLATES, ZONES, World
from orchard_jax.tasks.claw.task import Task, overlap, task_from_dict
from orchard_jax.tasks.claw.tools import tools_of

FAULTY_FRACTION = 0.2         # drafts that get injected faults on an operation they depend on

def _world(rng: random.Random) -> World:
  tz = rng.choice(ZONES)
  day = dt.date(2026, 4, 6) + dt.timedelta(days=rng.randrange(0, 170))
  while day.weekday() > 4:
    day += dt.timedelta(days=1)
  first, last = rng.choice(FIRST), rng.choice(LAST)
  user = {"name": f"{first} {last}", "email": f"{first.lower()}@home.example", "timezone": tz}
  return World(rng, dt.datetime.combine(day, dt.time(rng.randint(8, 10))), tz, user)


def draft(template: str, index: int, seed: int = 0, distractors: int = 2) -> dict:
  """The task dict of template `template`, variant `index` (deterministic in the four), offering
  the tools its solution uses plus `distractors` other tools of its services."""
  rng = random.Random(f"{template}/{index}/{seed}")
  world = _world(rng)
  spec = TEMPLATES[template](world)
  fault_ops = spec.pop("fault_ops")
  reference = spec.pop("reference")
  if "tools" not in spec:   # what the solution uses plus distractors of its services
    used = sorted({step["call"] for step in reference if "call" in step})
    spare = sorted(t.name for t in tools_of(spec["services"]) if t.name not in used)
    spec["tools"] = used + rng.sample(spare, min(distractors, len(spare)))
  task = {"id": f"train_{template}_{index:03d}", "split": "train", "template": template,
          "category": spec["services"][0] if len(spec["services"]) == 1 else "multi",
          "user": world.user, "now": world.now_text, **spec,
          "solutions": {"reference": reference}}
  if rng.random() < FAULTY_FRACTION:
    service = rng.choice(sorted(fault_ops))
    task["faults"] = {service: {"fail_first": rng.randint(1, 2),
                                "statuses": rng.sample([429, 500, 503], 2),
                                "operations": fault_ops[service]}}
  return task


def synthesize(n: int = 240, seed: int = 0, evaluation: Iterable[Task] = (),
               distractors: int = 2) -> list[Task]:
  """`n` distinct training tasks, templates taken in turn; each loaded (checked), kept out of
  the evaluation set, and dropped when it repeats an earlier draft (same fingerprint: a small
  template can draw the same instruction and fixtures twice). Solutions are not played here
  (see `validate`).

  Raises:
    TaskFormatError: a template produced an invalid task (a bug in the template), or the
      templates cannot make `n` distinct tasks.
  """
  names = sorted(TEMPLATES)
  evaluation = list(evaluation)
  tasks: list[Task] = []
  seen: set[str] = set()
  index = dict.fromkeys(names, 0)
  for turn in range(20 * n):
    if len(tasks) >= n:
      return tasks
    template = names[turn % len(names)]
    task = task_from_dict(draft(template, index[template], seed, distractors),
                          f"synth:{template}")
    index[template] += 1
    if task.fingerprint() not in seen and not overlap([task], evaluation):
      seen.add(task.fingerprint())
      tasks.append(task)
  if len(tasks) < n:
    raise TaskFormatError(f"the templates made only {len(tasks)} distinct tasks of {n} asked")
  return tasks


@dataclasses.dataclass
class Validation:
  """Which tasks' reference solutions passed, and why the others were dropped."""
  kept: list
  dropped: dict


def validate(tasks: Sequence[Task], play: Callable[[Task], Any]) -> Validation:
  """Keeps the tasks whose reference solution passes: `play(task)` returns its outcome
  (`grading.Outcome`); anything but "passed" drops the task with the outcome's reason."""
  kept, dropped = [], {}
  for task in tasks:
    outcome = play(task)
    if outcome.passed:
      kept.append(task)
    else:
      dropped[task.id] = outcome.error or "; ".join(outcome.failures()) or outcome.status
  return Validation(kept, dropped)


def cache_dir() -> str:
  """Where validated task sets are kept: $XDG_CACHE_HOME/orchard_jax/claw (or ~/.cache/...)."""
  import os
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "orchard_jax", "claw")


def training_set(n: int, seed: int, play: Callable[[Task], Any], *,
                 evaluation: Iterable[Task] = (), folder: Optional[str] = None,
                 distractors: int = 2,
                 progress: Optional[Callable[[str], None]] = None) -> tuple[list[Task], str]:
  """The validated synthetic training set for (n, seed, distractors), built once and cached as
  JSON lines.

  The file name carries a digest of this module and the services (their sources decide what a
  template produces and whether its solution passes), so a change rebuilds the set.

  Returns:
    (tasks, path of the cached file).
  Raises:
    TaskFormatError: fewer than half of the drafts survived validation (a broken template).
  """
  import hashlib
  import os
  from orchard_jax.tasks.claw import bundle
  from orchard_jax.tasks.claw.task import load_tasks
  with open(__file__, "rb") as f:
    digest = hashlib.sha256(f.read() + bundle.bundle_digest().encode()).hexdigest()[:12]
  folder = folder or cache_dir()
  path = os.path.join(folder, f"train-n{n}-s{seed}-d{distractors}-{digest}.jsonl")
  if os.path.exists(path):
    return load_tasks(path), path
  drafts = synthesize(n, seed, evaluation, distractors)
  result = validate(drafts, play)
  if len(result.kept) < len(drafts) // 2:
    raise TaskFormatError(f"only {len(result.kept)} of {len(drafts)} synthesised tasks passed "
                          f"their reference solution; first failures: "
                          f"{dict(list(result.dropped.items())[:3])}")
  os.makedirs(folder, exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for task in result.kept:
      f.write(json.dumps(task.to_dict(), ensure_ascii=False) + "\n")
  os.replace(tmp, path)
  if progress:
    progress(f"synthesised {len(result.kept)} training tasks ({len(result.dropped)} dropped) "
             f"-> {path}")
  return result.kept, path


# ----------------------------------------------------------------------------- teacher
TEACHER_PROMPT = """You write training tasks for a personal-assistant agent that works through tools on mail, calendar, contacts, to-dos, notes and files services. Reply with ONE new task as a JSON object in exactly the form of these examples (same keys; "split": "train"; a new "id" starting with "teacher_"). The fixtures must hold every record the instruction refers to, the grader checks must follow from the instruction, and solutions.reference must be the tool calls that complete the task, ending with an answer step. Use dates between April and September 2026.

Example 1:
$example1

Example 2:
$example2
"""


def teacher_tasks(model: Any, n: int, *, evaluation: Iterable[Task] = (), seed: int = 0,
                  max_attempts: Optional[int] = None) -> tuple[list[Task], dict]:
  """Up to `n` tasks proposed by a teacher model (module docstring), loaded and checked.

  Args:
    model: has `complete(messages) -> .content` (`harness.ChatModel` for the endpoint).
    n: tasks wanted.
    evaluation: tasks the proposals may not coincide with.
    max_attempts: model calls at most (default 3 n).
  Returns:
    (tasks, rejected): rejected maps the attempt number to why its proposal was refused.
  """
  import string
  evaluation = list(evaluation)
  names = sorted(TEMPLATES)
  tasks: list[Task] = []
  rejected: dict[int, str] = {}
  seen: set[str] = set()
  for attempt in range(max_attempts or 3 * n):
    if len(tasks) >= n:
      break
    a, b = names[attempt % len(names)], names[(attempt + 7) % len(names)]
    prompt = string.Template(TEACHER_PROMPT).substitute(
        example1=json.dumps(draft(a, 900 + attempt, seed), ensure_ascii=False),
        example2=json.dumps(draft(b, 950 + attempt, seed), ensure_ascii=False))
    try:
      reply = model.complete([{"role": "user", "content": prompt}]).content
      raw = _json_object(reply)
      raw["split"] = "train"
      task = task_from_dict(raw, f"teacher:{attempt}")
    except (TaskFormatError, ValueError) as e:
      rejected[attempt] = str(e)[:300]
      continue
    if task.id in seen or overlap([task], evaluation + tasks):
      rejected[attempt] = f"{task.id}: duplicates an existing task"
      continue
    seen.add(task.id)
    tasks.append(task)
  return tasks, rejected


def _json_object(text: str) -> dict:
  """The JSON object in a reply (a fenced block or the outermost braces). Raises ValueError."""
  fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
  body = fenced.group(1) if fenced else text[text.find("{"):text.rfind("}") + 1]
  value = json.loads(body)
  if not isinstance(value, dict):
    raise ValueError(f"expected a JSON object, got {type(value).__name__}")
  return value
