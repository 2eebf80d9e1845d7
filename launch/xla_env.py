"""XLA:CPU's op schedule for launched processes: the memory-minimising one.

XLA:CPU orders each program's ops with one of two schedulers (DebugOptions
`xla_cpu_enable_concurrency_optimized_scheduler`): by default a breadth-first one that starts
independent work early so the runtime can overlap it ("trading off extra memory pressure", in
XLA's words), or a depth-first memory scheduler that runs each value's consumers soon after
it. In a training step the breadth-first order materialises work of the backward pass during
the forward (zero-initialised gradient accumulators and loop buffers of every layer, recomputed
attention blocks) and holds it: for the `small` preset's forward + backward (4 x 1024 tokens,
float32, launch/benchmarks/model.py's worker) XLA's temp memory is 3.79 GB breadth-first and
2.62 GB depth-first, and the process's peak RSS 5.56 and 4.61 GB. Speed, measured alternately
on a quiet machine (2 cores, `uptime` load 1.6-2.3, other work at nice 19; 1 warm-up + median of
3 steps): depth-first 330 and 301 tokens/s (peak RSS 4.57 and 4.62 GB), breadth-first 300 and
306 (5.75 and 5.75 GB): the depth-first schedule costs no measurable speed here.

The switch is read from XLA_FLAGS when the CPU backend starts; `jax.jit(...,
compiler_options=...)` does not reach the CPU scheduler (JAX 0.10.2, measured), so `configure`
sets the flag in the environment, before the first computation. Environment variable
ORCHARD_JAX_CPU_SCHEDULER: unset or "memory" for the depth-first schedule, "concurrency" for
XLA's default. An XLA_FLAGS that already names the flag is left as it is.
"""
import os
from collections.abc import MutableMapping

ENV = "ORCHARD_JAX_CPU_SCHEDULER"
FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"
CHOICES = ("memory", "concurrency")


def configure(environ: MutableMapping[str, str] = os.environ) -> str:
  """Puts the scheduler ORCHARD_JAX_CPU_SCHEDULER asks for into `environ`'s XLA_FLAGS.

  Call before the process's first JAX computation (the CPU backend reads XLA_FLAGS once), or
  on the environment of a process about to be started.

  Args:
    environ: the environment to read and update (default: this process's).
  Returns:
    "memory", "concurrency", or "XLA_FLAGS" when XLA_FLAGS already set the flag.
  Raises:
    ValueError: ORCHARD_JAX_CPU_SCHEDULER is not one of CHOICES.
  """
  choice = environ.get(ENV, "memory").strip().lower() or "memory"
  if choice not in CHOICES:
    raise ValueError(f"{ENV} is {environ[ENV]!r}; expected one of {list(CHOICES)}")
  flags = environ.get("XLA_FLAGS", "")
  if FLAG in flags:
    return "XLA_FLAGS"
  if choice == "memory":
    environ["XLA_FLAGS"] = f"{flags} --{FLAG}=false".strip()
  return choice
