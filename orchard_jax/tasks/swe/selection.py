"""Choosing the SWE training subset: all instances, the first N, or the N whose replay-expert
trajectories are shortest (what a tiny model on a CPU can learn in the time budget), at most a
number per package."""
from __future__ import annotations

from typing import Sequence

from orchard_jax.tasks.errors import TaskError
from orchard_jax.tasks.swe.instance import SWEInstance

SELECTIONS = ("all", "first", "shortest_expert")


def expert_cost(instance: SWEInstance, tokenizer) -> int:
  """Tokens the replay expert's gold plan generates, estimated without a sandbox: the
  reproduction it writes (the FAIL_TO_PASS tests sliced from the hidden test file) plus the
  edit snippets (about the gold patch's size).

  Args:
    instance: the instance.
    tokenizer: anything with `encode(text) -> ids` (the policy's tokenizer).
  """
  from orchard_jax.tasks.swe.expert import slice_tests
  hidden: dict[str, list[str]] = {}
  path, creating = None, False
  for line in instance.test_patch.splitlines():
    if line.startswith("--- "):
      creating = line[4:].strip() == "/dev/null"
    elif line.startswith("+++ "):
      path = line[4:].strip().removeprefix("b/")
      if creating:
        hidden[path] = []
    elif creating and path in hidden and line.startswith("+"):
      hidden[path].append(line[1:])
  names: dict[str, list[str]] = {}
  for test in instance.FAIL_TO_PASS:
    file, _, rest = test.partition("::")
    if file in hidden and rest:
      names.setdefault(file, []).append(rest.split("[")[0])
  reproduction = ""
  if names:
    file, tests = next(iter(names.items()))
    try:
      reproduction = slice_tests("\n".join(hidden[file]) + "\n", list(dict.fromkeys(tests))[:3])
    except SyntaxError:
      reproduction = "\n".join(hidden[file])
  return len(tokenizer.encode(reproduction)) + len(tokenizer.encode(instance.patch))


def training_subset(instances: Sequence[SWEInstance], *, count: int, selection: str,
                    per_package: int = 0, tokenizer=None) -> list[SWEInstance]:
  """The training subset of `instances`, in the order chosen.

  Args:
    instances: the training instances.
    count: how many (0 or less: all).
    selection: "all", "first" (the first `count`), or "shortest_expert" (the `count` with the
      cheapest replay-expert trajectories, `expert_cost`; needs `tokenizer`).
    per_package: at most this many per package (0: no limit).
    tokenizer: for "shortest_expert".
  Raises:
    TaskError: an unknown selection.
  """
  if selection not in SELECTIONS:
    raise TaskError(f"tasks.selection is {selection!r}; expected 'all', 'first' or "
                    "'shortest_expert'")
  if selection == "all" or count <= 0:
    return list(instances)
  ordered = list(instances)
  if selection == "shortest_expert":
    ordered.sort(key=lambda i: (expert_cost(i, tokenizer), i.instance_id))
  chosen, taken = [], {}
  for instance in ordered:
    if per_package and taken.get(instance.repo, 0) >= per_package:
      continue
    chosen.append(instance)
    taken[instance.repo] = taken.get(instance.repo, 0) + 1
    if len(chosen) == count:
      break
  return chosen
