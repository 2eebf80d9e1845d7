"""The house's import rules (docs/design.md, "Import rules"), checked over every import in the
package, the ones inside functions included (a deferred import still ties two modules together):

  launch -> recipes -> {train, rollout, env, tasks, harness, rl} -> {models, parallel, data}

- each room imports only the rooms ALLOWED names for it (env standalone; rl only data types; a
  harness never models or train: it reaches the model over HTTP);
- the agentic loop (recipes/agentic) imports no domain: no other recipes subpackage, no tasks;
- no import cycle between rooms, and none between modules.
Imports are read with `ast`, so nothing is executed; `from pkg import name` counts as an import
of the submodule pkg.name when there is one, else of pkg.
"""
import ast
import collections
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# room -> the rooms it may import (itself always). recipes may import every library room.
LIBRARY = {"models", "parallel", "data", "rl", "train", "rollout", "env", "tasks", "harness"}
ALLOWED = {
    "data": set(),
    "parallel": set(),
    "models": {"parallel"},
    "rl": {"data"},
    "train": {"models", "parallel", "data", "rl"},
    "rollout": {"models", "parallel", "data"},
    "env": set(),
    "harness": {"data"},
    "tasks": {"env", "harness", "data"},
    "recipes": LIBRARY,
}
# Cycles among one room's own modules that its owner keeps (none in the rooms this rule was
# written for): models.config's ModelConfig.from_dict looks a "preset" key up in models.presets,
# whose table is made of ModelConfigs.
ROOM_INTERNAL_CYCLES = {frozenset({"orchard_jax.models.config", "orchard_jax.models.presets"})}


def _modules(package_dir: str, prefix: str) -> dict[str, str]:
  out = {}
  for folder, _, files in os.walk(package_dir):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[dotted.removesuffix(".__init__")] = path
  return {m: p for m, p in out.items() if m.startswith(prefix)}


MODULES = _modules(os.path.join(ROOT, "orchard_jax"), "orchard_jax")
LAUNCH = _modules(os.path.join(ROOT, "launch"), "launch")


def _imports(module: str, path: str, known: dict[str, str]) -> set[str]:
  """The orchard_jax modules `module` imports (at any depth of its code)."""
  is_package = path.endswith("__init__.py")
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
    names = []
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = module if is_package else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
          package = package.rsplit(".", 1)[0]
        base = f"{package}.{base}" if base else package
      names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
               for alias in node.names]
    for name in names:
      while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
      if name in known and name != module:
        out.add(name)
  return out


GRAPH = {m: _imports(m, p, MODULES) for m, p in MODULES.items()}


def room(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "orchard_jax"


def _edges(rule) -> list[str]:
  return sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets if rule(a, b))


def test_the_package_is_read():
  assert "orchard_jax.recipes.agentic.jobs" in GRAPH and "orchard_jax.rl.rpr" in GRAPH
  assert GRAPH["orchard_jax.recipes.agentic.jobs"] >= {"orchard_jax.recipes.agentic.policy"}


@pytest.mark.parametrize("source", sorted(ALLOWED))
def test_each_room_imports_only_what_the_rules_allow(source):
  bad = _edges(lambda a, b: room(a) == source and room(b) != source
               and room(b) not in ALLOWED[source] and room(b) != "orchard_jax")
  assert not bad, f"{source} may import only {sorted(ALLOWED[source])}; found:\n" + "\n".join(bad)


def test_no_room_imports_launch_or_the_package_root_pulls_nothing():
  assert not _edges(lambda a, b: room(b) == "orchard_jax" and room(a) != "orchard_jax")
  for module, path in MODULES.items():
    assert "launch" not in {n.split(".")[0] for n in _raw_imports(path)}, module


def _raw_imports(path: str) -> set[str]:
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.add(node.module)
  return out


def test_the_loop_imports_no_domain():
  loop = "orchard_jax.recipes.agentic"
  bad = _edges(lambda a, b: (a == loop or a.startswith(loop + ".")) and (
      room(b) == "tasks" or (b.startswith("orchard_jax.recipes.")
                             and not b.startswith(loop))))
  assert not bad, "the agentic loop imports a domain:\n" + "\n".join(bad)


def test_rl_imports_only_data_types():
  bad = _edges(lambda a, b: room(a) == "rl" and room(b) not in ("rl", "data"))
  assert not bad
  # And of data, only its types (records, sequences), never the store or the tokenizer.
  used = {b for a, targets in GRAPH.items() if room(a) == "rl" for b in targets
          if room(b) == "data"}
  assert used <= {"orchard_jax.data.records", "orchard_jax.data.sequences"}, used


def test_no_cycle_between_rooms():
  rooms = collections.defaultdict(set)
  for a, targets in GRAPH.items():
    rooms[room(a)] |= {room(b) for b in targets if room(b) != room(a)}
  assert not _cycles(rooms), _cycles(rooms)


def test_no_cycle_between_modules():
  cycles = [c for c in _cycles(GRAPH) if frozenset(c) not in ROOM_INTERNAL_CYCLES]
  assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def test_launch_is_the_top():
  """launch/ runs jobs through recipes (benchmarks may reach any room directly: launch sits
  above every room), and no room imports launch."""
  graph = {m: _imports(m, p, {**MODULES, **LAUNCH}) for m, p in LAUNCH.items()}
  assert "orchard_jax.recipes" in graph["launch.run"]
  assert not any(m.startswith("launch") for targets in GRAPH.values() for m in targets)


def _cycles(graph) -> list[list[str]]:
  """Strongly connected components of more than one node (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(component)

  for v in list(graph):
    if v not in index:
      visit(v)
  return out
