"""Where a compiled step's time goes: one traced execution, broken down by kind of HLO op.

`profile_step` runs a `jax.stages.Compiled` once under `jax.profiler.trace` (which writes a
Perfetto trace, `perfetto_trace.json.gz`, beside TensorBoard's files: open it in the Perfetto
UI to see every op on its thread) and aggregates the trace into a `Breakdown`:

- XLA:CPU's thunk executor records one trace event per executed HLO instruction of the
  optimised module (`args.hlo_op`, `args.hlo_module`). A while loop's or a conditional's event
  encloses the events of its body, so each event counts its *exclusive* time (its duration
  less that of the events nested in it on the same thread): the sum over events is the time
  spent executing ops, each microsecond counted once. Ops that XLA runs concurrently on
  different threads both count, so shares are of op time ("op-seconds"), which can exceed
  the step's wall time.
- Each instruction is put in one category from the optimised HLO text (`categorize`): a
  fusion by the ops it fuses, in the order of `CATEGORIES` (a fusion holding a dot is a
  matmul whatever else it holds; one holding a dynamic-update-slice and adds is a dynamic
  slice). XLA:CPU's library fusions (YNNPACK's `ynn_fusion`, oneDNN's custom calls) are
  classified by their fused computation like any other fusion.
"""
from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from launch.benchmarks import roofline

# Categories, most specific first: an instruction takes the first whose ops it contains.
CATEGORIES = ("matmul", "sort/scatter/gather", "dynamic-slice/update-slice", "reduce",
              "copy/transpose", "elementwise fusion", "control flow", "other")

_MATMUL = {"dot", "convolution", "ragged-dot"}
_SORT_SCATTER_GATHER = {"sort", "scatter", "gather", "top-k"}
_DYNAMIC_SLICE = {"dynamic-slice", "dynamic-update-slice"}
_REDUCE = {"reduce", "reduce-window", "select-and-scatter", "reduce-precision"}
_DATA_MOVEMENT = {"copy", "transpose", "copy-start", "copy-done", "concatenate", "pad", "slice",
                  "reverse"}
_CONTROL = {"while", "conditional", "call"}
# Ops that only rename a buffer or feed another op: they do not decide a fusion's category.
_NEUTRAL = {"parameter", "constant", "bitcast", "reshape", "broadcast", "get-tuple-element",
            "tuple", "iota"}
_CUSTOM_MATMUL = re.compile(r"matmul|gemm|dot|onednn", re.IGNORECASE)

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)\Z")
_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class OpTime:
  """One HLO instruction's share of a traced step.

  Attributes:
    name: the instruction's name in the optimised module (e.g. "ynn_fusion.3").
    category: one of CATEGORIES.
    seconds: exclusive time summed over its executions (a loop body's op runs once per trip).
    count: how many times it ran.
    source: the JAX operation it came from (HLO metadata op_name), "" when unknown.
  """
  name: str
  category: str
  seconds: float
  count: int
  source: str


@dataclasses.dataclass(frozen=True)
class Breakdown:
  """A traced step's op time by category and by instruction.

  Attributes:
    wall_seconds: wall time of the traced call (tracing overhead included).
    op_seconds: exclusive op time summed over all threads and ops.
    by_category: {category: seconds}, every category of CATEGORIES present (0.0 if unused).
    ops: every instruction that ran, most time first.
    trace_path: the Perfetto trace file, "" when the breakdown was not built from a file.
  """
  wall_seconds: float
  op_seconds: float
  by_category: dict[str, float]
  ops: tuple[OpTime, ...]
  trace_path: str = ""

  def share(self, category: str) -> float:
    """The category's fraction of op time (0..1)."""
    return self.by_category[category] / self.op_seconds if self.op_seconds else 0.0

  def summary(self, top: int = 12) -> dict:
    """A JSON-able digest: seconds and shares by category, the `top` ops by time."""
    return {
        "wall_s": self.wall_seconds, "op_s": self.op_seconds, "trace": self.trace_path,
        "by_category": {c: {"s": s, "share": self.share(c)} for c, s in
                        self.by_category.items()},
        "top_ops": [{"name": o.name, "category": o.category, "s": o.seconds, "count": o.count,
                     "share": o.seconds / self.op_seconds if self.op_seconds else 0.0,
                     "source": o.source} for o in self.ops[:top]],
    }


def format_summary(summary: dict, title: str = "") -> str:
  """`Breakdown.summary()` as a few lines of text for a terminal or a note."""
  lines = [f"{title}step profile: {summary['wall_s']:.3f} s wall, {summary['op_s']:.3f} "
           f"op-seconds traced ({summary['trace'] or 'no trace file'})"]
  ranked = sorted(summary["by_category"].items(), key=lambda kv: -kv[1]["s"])
  lines.append("  by category: " + ", ".join(f"{c} {v['share']:.0%} ({v['s']:.3f} s)"
                                             for c, v in ranked if v["s"] > 0))
  lines.append("  top ops:")
  for op in summary["top_ops"]:
    lines.append(f"    {op['share']:6.1%} {op['s']:8.4f} s x{op['count']:<5d} "
                 f"{op['category']:<26} {op['name']}  {op['source']}")
  return "\n".join(lines)


def profile_step(compiled: Any, args: Sequence[Any], out_dir: str) -> Breakdown:
  """Runs `compiled(*args)` once under jax.profiler.trace into `out_dir` and breaks it down.

  Args:
    compiled: a jax.stages.Compiled (`jax.jit(f).lower(...).compile()`); run it once before
      so that the traced call is a steady-state one.
    args: its positional arguments.
    out_dir: folder for the trace (created); the Perfetto trace lands under it.
  Returns:
    the Breakdown, with `trace_path` the Perfetto trace.
  Raises:
    RuntimeError: the profiler wrote no trace, or the trace holds no op of this program.
  """
  import jax
  os.makedirs(out_dir, exist_ok=True)
  before = set(_trace_files(out_dir))
  with jax.profiler.trace(out_dir, create_perfetto_trace=True):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    wall = time.perf_counter() - start
  written = sorted(set(_trace_files(out_dir)) - before, key=os.path.getmtime)
  if not written:
    raise RuntimeError(f"jax.profiler wrote no perfetto_trace.json.gz under {out_dir}")
  with gzip.open(written[-1], "rt") as f:
    trace = json.load(f)
  text = compiled.as_text()
  return dataclasses.replace(breakdown(trace, text, wall_seconds=wall), trace_path=written[-1])


def breakdown(trace: Any, hlo_text: str, wall_seconds: float = 0.0) -> Breakdown:
  """Aggregates a Chrome/Perfetto JSON trace (dict with "traceEvents", or the list) over the
  instructions of the optimised module `hlo_text` (module docstring).

  Raises:
    RuntimeError: no event of the trace is an instruction of this module.
  """
  module, categories, sources = _module_name(hlo_text), *categorize(hlo_text)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  ops = [e for e in events if e.get("ph") == "X" and isinstance(e.get("args"), dict)
         and e["args"].get("hlo_op") and e["args"].get("hlo_module", module) == module]
  if not ops:
    raise RuntimeError(f"the trace holds no op of HLO module {module!r}")
  seconds: dict[str, float] = {}
  counts: dict[str, int] = {}
  for name, exclusive_us in _exclusive_times(ops):
    seconds[name] = seconds.get(name, 0.0) + exclusive_us * 1e-6
    counts[name] = counts.get(name, 0) + 1
  by_category = {c: 0.0 for c in CATEGORIES}
  times = []
  for name, s in seconds.items():
    category = categories.get(name, "other")
    by_category[category] += s
    times.append(OpTime(name, category, s, counts[name], sources.get(name, "")))
  times.sort(key=lambda o: -o.seconds)
  return Breakdown(wall_seconds=wall_seconds, op_seconds=sum(seconds.values()),
                   by_category=by_category, ops=tuple(times))


def categorize(hlo_text: str) -> tuple[dict[str, str], dict[str, str]]:
  """({instruction name: category}, {instruction name: op_name metadata}) for every
  instruction of an optimised HLO module's text (module docstring)."""
  _, computations, _ = roofline.split_module(hlo_text)
  parsed = {name: [_parse(line) for line in lines[1:]] for name, lines in computations.items()}

  def opcodes(computation: str, seen: frozenset = frozenset()) -> set[str]:
    """The opcodes a computation executes, through the fusions and calls it makes."""
    found = set()
    for entry in parsed.get(computation, ()):
      if entry is None:
        continue
      _, opcode, callee, _, target = entry
      found.add(_custom_opcode(target) if opcode == "custom-call" else opcode)
      if callee and opcode in ("fusion", "call") and callee not in seen:
        found |= opcodes(callee, seen | {computation})
    return found

  categories, sources = {}, {}
  for entries in parsed.values():
    for entry in entries:
      if entry is None:
        continue
      name, opcode, callee, source, target = entry
      if opcode == "fusion" and callee:
        kinds = opcodes(callee)
      elif opcode == "custom-call":
        kinds = {_custom_opcode(target)}
      else:
        kinds = {opcode}
      categories[name] = _category(kinds)
      sources[name] = source
  return categories, sources


def _category(opcodes: set[str]) -> str:
  if opcodes & _MATMUL:
    return "matmul"
  if opcodes & _SORT_SCATTER_GATHER:
    return "sort/scatter/gather"
  if opcodes & _DYNAMIC_SLICE:
    return "dynamic-slice/update-slice"
  if opcodes & _REDUCE:
    return "reduce"
  if opcodes & _CONTROL:
    return "control flow"
  rest = opcodes - _NEUTRAL
  if not rest:
    return "other"                      # iota, broadcast of a constant, a bitcast
  if rest <= _DATA_MOVEMENT:
    return "copy/transpose"
  if "custom-call" in rest or "rng" in rest or rest & {"infeed", "outfeed", "send", "recv"}:
    return "other"
  return "elementwise fusion"


def _custom_opcode(target: str) -> str:
  return "dot" if _CUSTOM_MATMUL.search(target or "") else "custom-call"


def _parse(line: str):
  """(name, opcode, called computation, op_name, custom-call target) of one HLO line."""
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  name, rest = match.groups()
  opcode = _OPCODE.search(rest)
  if not opcode:
    return None
  calls = _CALLS.search(rest)
  source = _OP_NAME.search(rest)
  target = _TARGET.search(rest)
  return (name, opcode.group(1), calls.group(1) if calls else "",
          source.group(1) if source else "", target.group(1) if target else "")


def _module_name(hlo_text: str) -> str:
  first = hlo_text.lstrip().split(None, 2)
  if len(first) < 2 or first[0] != "HloModule":
    raise ValueError("HLO text does not start with 'HloModule NAME'")
  return first[1].rstrip(",")


def _exclusive_times(events: list[dict]) -> list[tuple[str, float]]:
  """(hlo_op, exclusive microseconds) per event: its duration less its children's on the
  same thread (events nest when a loop's event encloses its body's)."""
  out = []
  by_thread: dict[Any, list[dict]] = {}
  for e in events:
    by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
  for thread in by_thread.values():
    thread.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
    stack: list[list] = []          # [end_us, name, exclusive_us]
    for e in thread:
      start, dur = float(e["ts"]), float(e.get("dur", 0.0))
      while stack and stack[-1][0] <= start:
        done = stack.pop()
        out.append((done[1], done[2]))
      if stack:
        stack[-1][2] -= min(dur, stack[-1][0] - start)
      stack.append([start + dur, e["args"]["hlo_op"], dur])
    out.extend((name, exclusive) for _, name, exclusive in stack)
  return out


def _trace_files(out_dir: str) -> list[str]:
  return glob.glob(os.path.join(out_dir, "**", "perfetto_trace.json.gz"), recursive=True)


def profile_compiled_callable(fn: Callable[..., Any], args: Sequence[Any],
                              out_dir: str) -> Breakdown:
  """`profile_step` of `jax.jit(fn)` compiled for `args` (run once untraced first)."""
  import jax
  compiled = jax.jit(fn).lower(*args).compile()
  jax.block_until_ready(compiled(*args))
  return profile_step(compiled, args, out_dir)
