"""Multi-host JAX: join one program spread over several hosts with `jax.distributed`.

On a cluster every host (a pod of the training Job, launch/k8s/training.py) runs the same
`launch/run.py` command; `initialize_from_env()` runs first and connects the processes:

  JAX_COORDINATOR_ADDRESS  host:port of process 0 (every process connects to it)
  JAX_NUM_PROCESSES        how many processes take part
  JAX_PROCESS_ID           this process's index, 0 .. JAX_NUM_PROCESSES - 1

After it, `jax.devices()` lists the devices of every host and `jax.local_devices()` this
host's; meshes built from `jax.devices()` span the hosts, and a jitted step over such a mesh is
one SPMD program, so the trainer runs unchanged. With none of the variables set (a laptop, a
test, one GPU node) it does nothing. On CPU hosts the collectives between processes use gloo.
"""
import os
from typing import Mapping, Optional

import jax

COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAX_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_PROCESS_ID"


class DistributedConfigError(ValueError):
  """The multi-host environment variables are incomplete or inconsistent."""


def _int_env(environ: Mapping[str, str], name: str) -> int:
  text = environ.get(name)
  if text is None or text == "":
    raise DistributedConfigError(
        f"{COORDINATOR_ENV} is set but {name} is not; a multi-host run needs "
        f"{COORDINATOR_ENV}, {NUM_PROCESSES_ENV} and {PROCESS_ID_ENV}")
  try:
    return int(text)
  except ValueError:
    raise DistributedConfigError(f"{name} is {text!r}; expected an integer") from None


def initialize_from_env(environ: Optional[Mapping[str, str]] = None, *,
                        timeout_seconds: int = 300) -> bool:
  """Calls `jax.distributed.initialize` when the environment describes a multi-host run.

  Must run before anything touches a JAX device (the first `jax.devices()` fixes the backend).
  Calling it again after a successful initialisation is a no-op.

  Args:
    environ: the variables to read (default os.environ).
    timeout_seconds: how long to wait for every process to reach the coordinator.
  Returns:
    True when this process joined a multi-host program, False when there is none to join
    (no JAX_COORDINATOR_ADDRESS, or JAX_NUM_PROCESSES is 1).
  Raises:
    DistributedConfigError: the coordinator is set but the count or index is missing, not an
      integer, or out of range.
  """
  environ = os.environ if environ is None else environ
  address = environ.get(COORDINATOR_ENV, "")
  if not address:
    return False
  num_processes = _int_env(environ, NUM_PROCESSES_ENV)
  process_id = _int_env(environ, PROCESS_ID_ENV)
  if num_processes < 1 or not 0 <= process_id < num_processes:
    raise DistributedConfigError(
        f"{PROCESS_ID_ENV}={process_id} with {NUM_PROCESSES_ENV}={num_processes}; expected "
        f"0 <= {PROCESS_ID_ENV} < {NUM_PROCESSES_ENV}")
  if ":" not in address:
    raise DistributedConfigError(f"{COORDINATOR_ENV} is {address!r}; expected host:port")
  if num_processes == 1:
    return False
  if is_initialized():
    return True
  if _platforms(environ) == {"cpu"}:
    # Cross-process collectives on CPU devices (tests, CPU clusters).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=address, num_processes=num_processes, process_id=process_id,
      initialization_timeout=timeout_seconds, cluster_detection_method="deactivate")
  return True


def _platforms(environ: Mapping[str, str]) -> set[str]:
  text = environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
  return {p.strip() for p in text.split(",") if p.strip()}


def is_initialized() -> bool:
  """True when this process has joined a multi-host program."""
  return jax.distributed.is_initialized()


def is_leader() -> bool:
  """True on process 0, the one that writes logs, summaries and the trajectory store."""
  return jax.process_index() == 0


def broadcast_from_leader(tree):
  """Every process gets process 0's value of `tree` (a pytree of arrays or numbers).

  For host-side data that must agree everywhere before it enters a jitted step, e.g. the
  rollout batch the leader assembled. On one process it returns `tree` unchanged.
  """
  if jax.process_count() == 1:
    return tree
  from jax.experimental import multihost_utils
  return multihost_utils.broadcast_one_to_all(tree)


def barrier(name: str) -> None:
  """Blocks until every process reaches the barrier called `name` (a no-op on one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def shutdown() -> None:
  """Leaves the multi-host program (safe to call when none was joined)."""
  if is_initialized():
    jax.distributed.shutdown()
