"""The matmuls of a compiled step, timed alone at their own shapes: the ceiling XLA's kernels
set on the step's roofline fraction.

The roofline (roofline.py) prices every FLOP at the float32 peak of one large square matmul
(2048^3). A training step's matmuls are not that shape: an MoE layer multiplies each expert's
block of a few hundred tokens by its weights, a Gated DeltaNet layer multiplies 64 x 64 chunks,
and XLA:CPU's kernels run such shapes below the square peak. This module lists every dot of a
step's optimised HLO with how many times one step executes it (while-loop bodies weighted by
their known trip count, as in roofline.py), compiles each distinct dot alone (same shapes,
dimension numbers and dtype, random operands) and times it in the calling process. The sum,
count x best time, is what the step's matmuls cost even if every other op were free, so

    ceiling = roofline seconds / matmul seconds

is the largest roofline fraction the step can reach with these kernels at these shapes: a
measured limit of the implementation's kernels, not of the hardware. A dot timed alone can
differ from the same dot inside the step (operands hot or cold in cache, a transpose XLA fused
into it there), so the ceiling is an estimate, stated as such where it is printed.
"""
from __future__ import annotations

import dataclasses
import math
import re

from launch.benchmarks import common, roofline

_SHAPE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]")
_DOT = re.compile(r"\bdot\(%?([\w.\-]+), %?([\w.\-]+)\)")
_DIMS = {name: re.compile(name + r"=\{([\d,]*)\}") for name in (
    "lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims")}
_CALLS = re.compile(r"\b(?:calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_LISTS = re.compile(r"\b(?:branch_computations|called_computations|calls)=\{([^}]*)\}")
_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


@dataclasses.dataclass(frozen=True)
class Dot:
  """One dot_general's operands and dimension numbers (HLO `dot`).

  Attributes:
    dtype: operand dtype as numpy names it ("float32", "bfloat16", ...).
    lhs, rhs: operand shapes.
    lhs_contracting, rhs_contracting, lhs_batch, rhs_batch: dimension numbers.
  """
  dtype: str
  lhs: tuple[int, ...]
  rhs: tuple[int, ...]
  lhs_contracting: tuple[int, ...]
  rhs_contracting: tuple[int, ...]
  lhs_batch: tuple[int, ...] = ()
  rhs_batch: tuple[int, ...] = ()

  @property
  def flops(self) -> float:
    """2 x batch x lhs free x rhs free x contracted FLOPs (a multiply-add is 2): the lhs holds
    batch x lhs free x contracted elements, the rhs batch x contracted x rhs free."""
    contracted = math.prod(self.lhs[d] for d in self.lhs_contracting)
    batch = math.prod(self.lhs[d] for d in self.lhs_batch)
    return 2.0 * math.prod(self.lhs) * math.prod(self.rhs) / (contracted * batch)


@dataclasses.dataclass(frozen=True)
class Ceiling:
  """The step's matmuls timed alone.

  Attributes:
    seconds: sum over distinct dots of executions per step x best time alone, seconds.
    flops: the dots' FLOPs per step.
    dots: distinct dots found.
    executions: dot executions per step (loops weighted by trip count).
    unknown_trip_loops: loops whose trip count XLA does not know (their dots counted once).
    breakdown: (dot, executions per step, best seconds alone) for every distinct dot, the
      largest total time first.
  """
  seconds: float
  flops: float
  dots: int
  executions: int
  unknown_trip_loops: int
  breakdown: tuple[tuple[Dot, int, float], ...] = ()

  def flops_per_s(self) -> float:
    """The dots' FLOPs over their time alone, FLOP/s (0.0 for a step without dots)."""
    return self.flops / self.seconds if self.seconds else 0.0

  def format_top(self, top: int = 6) -> str:
    """The `top` dots by total time, one line each: share of the matmul time, executions,
    GFLOP/s alone, shapes."""
    lines = []
    for dot, count, best in self.breakdown[:top]:
      share = count * best / self.seconds if self.seconds else 0.0
      lines.append(f"  {share:6.1%}  x{count:<5d} {dot.flops / best / 1e9:7.1f} GF/s  "
                   f"{dot.dtype} {list(dot.lhs)} . {list(dot.rhs)} contracting "
                   f"{list(dot.lhs_contracting)}/{list(dot.rhs_contracting)} batch "
                   f"{list(dot.lhs_batch)}/{list(dot.rhs_batch)}")
    return "\n".join(lines)


def step_dots(text: str) -> tuple[dict[Dot, int], int]:
  """Every float dot of an optimised HLO module (`Compiled.as_text()`) with its executions per
  run of the module, and the number of while loops with an unknown trip count (counted once).

  Raises:
    ValueError: the text has no ENTRY computation.
  """
  _, computations, entry = roofline.split_module(text)
  order = list(computations)
  # HLO text defines a computation before any computation that calls it, so walking the list
  # backwards from ENTRY visits every caller before its callees: multiplicities are final.
  times = {name: 0 for name in order}
  times[entry] = 1
  unknown = 0
  for name in reversed(order):
    if not times[name]:
      continue
    for line in computations[name]:
      loop = roofline.while_loop(line)
      if loop:
        body, trip = loop
        unknown += trip is None
        if body in times:
          times[body] += times[name] * (1 if trip is None else trip)
        continue
      callees = set(_CALLS.findall(line))
      for group in _LISTS.findall(line):
        callees.update(n.strip().lstrip("%") for n in group.split(","))
      for callee in callees:
        if callee in times:
          times[callee] += times[name]
  dots: dict[Dot, int] = {}
  for name in order:
    if not times[name]:
      continue
    shapes = {}
    for line in computations[name]:
      shape = _SHAPE.match(line)
      if shape:
        dims = tuple(int(d) for d in shape.group(3).split(",") if d)
        shapes[shape.group(1)] = (shape.group(2), dims)
      dot = _DOT.search(line)
      if not dot or dot.group(1) not in shapes or dot.group(2) not in shapes:
        continue
      (dtype, lhs), (_, rhs) = shapes[dot.group(1)], shapes[dot.group(2)]
      if dtype not in _DTYPES:
        continue
      numbers = {key: tuple(int(d) for d in (pattern.search(line).group(1).split(",")
                                             if pattern.search(line) else []) if d)
                 for key, pattern in _DIMS.items()}
      key = Dot(_DTYPES[dtype], lhs, rhs, numbers["lhs_contracting_dims"],
                numbers["rhs_contracting_dims"], numbers["lhs_batch_dims"],
                numbers["rhs_batch_dims"])
      dots[key] = dots.get(key, 0) + times[name]
  return dots, unknown


def measure(text: str, repeats: int = 3) -> Ceiling:
  """Finds the dots of an optimised HLO module (`step_dots`), compiles each alone through XLA
  in this process and sums executions x best time (module docstring).

  Args:
    text: `Compiled.as_text()` of the step.
    repeats: timed calls per dot after one warm-up; the best counts.
  Returns:
    the Ceiling.
  Raises:
    ValueError: the text has no ENTRY computation.
  """
  dots, unknown = step_dots(text)
  import jax
  import jax.numpy as jnp
  import numpy as np
  rng = np.random.default_rng(0)
  breakdown = []
  for dot, count in dots.items():
    lhs = jnp.asarray(rng.standard_normal(dot.lhs, dtype=np.float32), dot.dtype)
    rhs = jnp.asarray(rng.standard_normal(dot.rhs, dtype=np.float32), dot.dtype)
    numbers = ((dot.lhs_contracting, dot.rhs_contracting), (dot.lhs_batch, dot.rhs_batch))
    fn = jax.jit(lambda a, b, numbers=numbers: jax.lax.dot_general(a, b, numbers))
    best = min(common.time_calls(lambda: fn(lhs, rhs).block_until_ready(), warmup=1,
                                 repeats=repeats))
    breakdown.append((dot, count, best))
  breakdown.sort(key=lambda item: -item[1] * item[2])
  return Ceiling(seconds=sum(count * best for _, count, best in breakdown),
                 flops=sum(d.flops * c for d, c in dots.items()), dots=len(dots),
                 executions=sum(dots.values()), unknown_trip_loops=unknown,
                 breakdown=tuple(breakdown))
