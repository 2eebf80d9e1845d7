"""The roofline of a compiled step on the machine that runs it, measured in the same run.

A step of F FLOPs that moves B bytes cannot take less than max(F / P, B / W) seconds on a
machine whose matmul peak is P FLOP/s and whose memory bandwidth is W bytes/s (Williams,
Waterman and Patterson, "Roofline", CACM 2009). The fraction of the roofline a step reaches is
that bound over its measured time: 1.0 is the hardware's limit.

- F comes from XLA's own cost model (HloCostAnalysis, what `jax.stages.Compiled.
  cost_analysis()` reports) applied to the optimised HLO of the step. XLA's analysis counts the
  body of a while loop once whatever its trip count (a lax.scan over 16 chunks of the LM head,
  a fori_loop over MoE blocks), so `compiled_cost` runs the same analysis on every loop body
  and weights it by the loop's trip count (`known_trip_count`, which XLA records for scans and
  fori_loops with static bounds). A loop whose trip count XLA does not know counts once, and
  is reported in `Cost.unknown_trip_loops`.
- P is the best time of a float32 matmul of `n`^3 through XLA (the kernel every matmul of ours
  runs through), W the best time of a jitted STREAM triad (a = b + s c, Stream benchmark,
  McCalpin 1995) over arrays far larger than the caches, 3 arrays x 4 bytes x elements moved.
  Both run in the calling process, so they see its threads and its share of a loaded machine.

- B is the step's compulsory traffic: every argument read once and every output written once
  (an output that aliases a donated argument, such as a KV cache updated in place, counts
  once), from XLA's buffer assignment (`Compiled.memory_analysis()`). This is the roofline's
  DRAM traffic (Williams et al.: the bytes that must cross the memory bus); intermediates that
  fit in cache are not counted, so B / W is a lower bound on the memory time and the fraction
  of the roofline cannot exceed 1 for want of cache effects.

XLA's `bytes accessed` (the sum over HLO ops of the bytes each reads and writes, cache traffic
included) is kept in `Cost.bytes_accessed` and printed by the benches, but it is not a bound:
for a decode step of the tiny model it counts the weights once per op that reads them, and a
roofline built on it was exceeded (fractions above 1).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from launch.benchmarks import common


@dataclasses.dataclass(frozen=True)
class Cost:
  """XLA's cost of one execution of a compiled program, loops weighted by trip count.

  Attributes:
    flops: floating-point operations (a multiply-add is 2).
    bytes_accessed: bytes read and written by all HLO ops (XLA's count; cache traffic too).
    compulsory_bytes: arguments + outputs - aliased outputs, bytes: the traffic the program
      cannot avoid (module docstring). 0.0 when unknown (a Cost built from HLO text alone).
    transcendentals: exp / log / tanh ... evaluations.
    unknown_trip_loops: while loops counted once because XLA did not know their trip count.
  """
  flops: float
  bytes_accessed: float
  compulsory_bytes: float = 0.0
  transcendentals: float = 0.0
  unknown_trip_loops: int = 0


@dataclasses.dataclass(frozen=True)
class Machine:
  """This process's measured limits.

  Attributes:
    matmul_flops_per_s: float32 matmul peak through XLA, FLOP/s.
    bytes_per_s: memory bandwidth (STREAM triad through XLA), bytes/s.
  """
  matmul_flops_per_s: float
  bytes_per_s: float

  def seconds(self, cost: Cost) -> float:
    """The roofline time of `cost`: max(flops / peak, compulsory bytes / bandwidth), seconds."""
    return max(cost.flops / self.matmul_flops_per_s, cost.compulsory_bytes / self.bytes_per_s)

  def bound(self, cost: Cost) -> str:
    """'compute' or 'memory': which side of the roofline `cost` sits on."""
    compute = cost.flops / self.matmul_flops_per_s
    return "compute" if compute >= cost.compulsory_bytes / self.bytes_per_s else "memory"

  def fraction(self, cost: Cost, seconds: float) -> float:
    """Roofline time of `cost` over a measured `seconds` (1.0 = the hardware's limit)."""
    return self.seconds(cost) / seconds


def measure_machine(matmul_n: int = 2048, stream_elements: int = 1 << 25,
                    repeats: int = 8) -> Machine:
  """Measures the float32 matmul peak and the memory bandwidth in this process.

  Args:
    matmul_n: side of the square matmul (2 n^3 FLOPs).
    stream_elements: float32 elements per STREAM array (default 32 Mi: 128 MiB per array,
      three arrays, far beyond any CPU cache).
    repeats: timed calls after 2 warm-ups; the best one counts.
  Returns:
    the Machine.
  """
  import jax.numpy as jnp
  a = jnp.asarray(np.random.default_rng(0).standard_normal((matmul_n, matmul_n),
                                                           dtype=np.float32))
  matmul_s = _best_time(lambda x: x @ x, (a,), repeats)
  return Machine(matmul_flops_per_s=2.0 * matmul_n ** 3 / matmul_s,
                 bytes_per_s=measure_bandwidth(3 * 4 * stream_elements, repeats))


def measure_bandwidth(footprint_bytes: float, repeats: int = 8) -> float:
  """Bandwidth in bytes/s of a jitted STREAM triad (a = b + 3 c) whose three arrays together
  hold `footprint_bytes` (at least 3 MiB): the bandwidth of the memory level where a working
  set of that size lives once warm (a cache, or DRAM for sets beyond the caches). The roofline
  of a step whose compulsory bytes fit in a cache is bounded by this, not by DRAM's (the
  cache-aware roofline, Ilic, Pratas and Sousa, IEEE CAL 2014); for sets beyond the caches it
  equals the DRAM triad of `measure_machine`.

  `a` is donated, so every call writes its result into the same buffer, as STREAM's triad
  does. Without donation each call would write a freshly allocated output: once the C
  library maps such buffers afresh (launch/host_malloc.py), the triad times the kernel's
  page faults (one per 4 KiB page, each zeroing it) instead of the memory.
  Raises ValueError for a footprint that is not positive."""
  if not footprint_bytes > 0:
    raise ValueError(f"footprint_bytes must be > 0, got {footprint_bytes}")
  elements = max(1 << 18, int(footprint_bytes) // 12)
  run, _ = stream_triad(elements)
  return 3 * 4 * elements / min(common.time_calls(run, warmup=2, repeats=repeats))


def stream_triad(elements: int) -> tuple[Callable[[], None], Callable[[], Any]]:
  """STREAM's triad over float32 arrays of `elements`: (run, result). run() computes
  a = b + 3 c with b = 1 and c = 2, writing into a's own buffer (a is donated to the jitted
  triad), and waits for it; result() is a's current array (7.0 everywhere after a run)."""
  import jax
  import jax.numpy as jnp
  b = jnp.ones((elements,), jnp.float32)
  c = jnp.full((elements,), 2.0, jnp.float32)
  # keep_unused: `a` is not read, and jit would otherwise drop it (and with it the donation).
  triad = jax.jit(lambda a, b, c: b + 3.0 * c, donate_argnums=0, keep_unused=True)
  a = [jnp.zeros((elements,), jnp.float32)]

  def run() -> None:
    a[0] = triad(a[0], b, c)
    a[0].block_until_ready()

  return run, lambda: a[0]


def _best_time(fn: Callable[..., Any], args: tuple, repeats: int) -> float:
  import jax
  jitted = jax.jit(fn)
  return min(common.time_calls(lambda: jitted(*args).block_until_ready(), warmup=2,
                               repeats=repeats))


def program_cost(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Cost:
  """The Cost of `jax.jit(fn)(*args, **kwargs)` (compiles it; runs nothing). `fn` may already
  be jitted (its own static and donated arguments then apply)."""
  import jax
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  return compiled_cost(jitted.lower(*args, **kwargs).compile())


def compiled_cost(compiled: Any) -> Cost:
  """The Cost of a `jax.stages.Compiled`: FLOPs with loops weighted by trip count and the
  compulsory bytes from its buffer assignment (module docstring)."""
  memory = compiled.memory_analysis()
  compulsory = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                - memory.alias_size_in_bytes)
  return dataclasses.replace(hlo_cost(compiled.as_text()), compulsory_bytes=float(compulsory))


# ---- loops weighted by trip count -------------------------------------------------------

_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(")
_REFERENCE = re.compile(r"\b(?:calls|to_apply|condition|true_computation|false_computation|select"
                        r"|scatter|body)=%?([\w.\-]+)")
_LISTS = re.compile(r"\b(?:branch_computations|called_computations|calls)=\{([^}]*)\}")
_WHILE = re.compile(r"\bwhile\(.*\bbody=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def hlo_cost(text: str) -> Cost:
  """The Cost of an optimised HLO module given as text (`Compiled.as_text()`)."""
  preamble, computations, entry = split_module(text)
  calls = {name: _callees(body) for name, body in computations.items()}

  @functools.cache
  def own(name: str) -> Cost:
    """XLA's cost of computation `name` as a module of its own (loops once)."""
    return _xla_cost(_module_text(preamble, computations, calls, name))

  @functools.cache
  def extra(name: str) -> Cost:
    """What XLA's count of `name` misses: each loop's body (trip count - 1) more times."""
    total, unknown, bodies = _zero(), 0, set()
    for line in computations[name]:
      loop = while_loop(line)
      if loop:
        body, n = loop
        bodies.add(body)
        if n is None:
          unknown += 1
          total = _add(total, extra(body))
        else:
          total = _add(total, _scale(own(body), n - 1), _scale(extra(body), n))
    for callee in calls[name] - bodies:       # calls, branches, fusions: once each
      if callee in computations:
        total = _add(total, extra(callee))
    return dataclasses.replace(total, unknown_trip_loops=total.unknown_trip_loops + unknown)

  return _add(own(entry), extra(entry))


def while_loop(line: str) -> tuple[str, int | None] | None:
  """(body computation, trip count or None when XLA does not know it) of an HLO `while`
  instruction line; None for any other line."""
  loop = _WHILE.search(line)
  if loop is None:
    return None
  trip = _TRIP.search(line)
  return loop.group(1), int(trip.group(1)) if trip else None


def split_module(text: str) -> tuple[list[str], dict[str, list[str]], str]:
  """Splits an HLO module's text into (lines before the first computation, {name: lines from
  its header to its closing brace} in the order printed, entry name). HLO text defines a
  computation before any computation that calls it.

  Raises:
    ValueError: the text has no ENTRY computation.
  """
  preamble, computations, entry, current = [], {}, None, None
  for line in text.splitlines():
    if current is None:
      match = _HEADER.match(line)
      if match and line.rstrip().endswith("{"):
        current = match.group(2)
        computations[current] = [line[len("ENTRY "):] if match.group(1) else line]
        if match.group(1):
          entry = current
      elif not computations:
        preamble.append(line)
    else:
      computations[current].append(line)
      if line.startswith("}"):
        current = None
  if entry is None:
    raise ValueError("HLO text has no ENTRY computation")
  return preamble, computations, entry


def _callees(lines: list[str]) -> set[str]:
  names = set()
  for line in lines[1:]:
    names.update(_REFERENCE.findall(line))
    for group in _LISTS.findall(line):
      names.update(n.strip().lstrip("%") for n in group.split(","))
  return names


def _module_text(preamble: list[str], computations: dict[str, list[str]],
                 calls: dict[str, set[str]], entry: str) -> str:
  """A module whose ENTRY is computation `entry`, with every computation it reaches."""
  reached, stack = [], [entry]
  while stack:
    name = stack.pop()
    if name in reached or name not in computations:
      continue
    reached.append(name)
    stack.extend(calls[name])
  header = ["HloModule cost_of_" + entry.replace(".", "_")]
  body = []
  for name, lines in computations.items():        # definitions before uses, as XLA printed
    if name in reached:
      first = ("ENTRY " + lines[0]) if name == entry else lines[0]
      body.extend([first] + lines[1:] + [""])
  return "\n".join(header + preamble[1:] + body)


def _xla_cost(module_text: str) -> Cost:
  import jax
  import jaxlib._hlo as hlo
  from jax._src.lib import _jax
  module = hlo.hlo_module_from_text(module_text)
  analysis = _jax.hlo_module_cost_analysis(jax.devices()[0].client, module)
  return Cost(flops=float(analysis.get("flops", 0.0)),
              bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
              transcendentals=float(analysis.get("transcendentals", 0.0)))


def _zero() -> Cost:
  return Cost(0.0, 0.0)


def _scale(cost: Cost, factor: int) -> Cost:
  return Cost(cost.flops * factor, cost.bytes_accessed * factor,
              transcendentals=cost.transcendentals * factor,
              unknown_trip_loops=cost.unknown_trip_loops)


def _add(*costs: Cost) -> Cost:
  return Cost(sum(c.flops for c in costs), sum(c.bytes_accessed for c in costs),
              transcendentals=sum(c.transcendentals for c in costs),
              unknown_trip_loops=sum(c.unknown_trip_loops for c in costs))
