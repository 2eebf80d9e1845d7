"""orbax checkpoints of the train state: periodic, async, atomic, keep-last-K, any-mesh restore.

Each checkpoint is a step directory holding two items: "state" (the train state pytree: params,
optimiser state, step, RNG key) and "meta" (JSON: the data iterator's position and anything else
the trainer needs to resume exactly). orbax writes a step into a temporary directory and renames
it into place only once every file is written, so a run killed during a save leaves the previous
checkpoint as the latest one; the leftover temporary directory is removed on the next start.

Restoring takes an abstract target whose leaves carry the *new* mesh's shardings, so a checkpoint
written on 8 devices restores on 4 or 1 (docs/cases.md 5: without that target orbax fails with a
topology mismatch).
"""
import logging
import os
from typing import Any, Mapping, Optional

import jax
import orbax.checkpoint as ocp

from orchard_jax.train.errors import CheckpointMismatch, TrainError


def abstract_like(tree, shardings=None):
  """ShapeDtypeStructs of `tree`'s arrays with their own (or the given) shardings, to restore into."""
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=getattr(x, "sharding", None)),
                        tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


class _QuietOrbaxInfo(logging.Filter):
  """Drops orbax's per-save INFO chatter (dozens of lines per checkpoint) from absl's log."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or "orbax" not in record.pathname


def quiet_orbax_info_logs() -> None:
  """Installs the filter once on the absl logger (warnings and errors still show)."""
  logger = logging.getLogger("absl")
  if not any(isinstance(f, _QuietOrbaxInfo) for f in logger.filters):
    logger.addFilter(_QuietOrbaxInfo())


def _item_handlers():
  return {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


class Checkpointer:
  """Saves and restores train states under `directory`; a context manager.

  Args:
    directory: where step directories live (created if missing).
    save_every: save when step % save_every == 0 (plus forced saves, e.g. at the end).
    keep: keep the last `keep` checkpoints (None keeps all).
    async_save: write in a background thread; the next save, `wait()` and `close()` wait for it.
  """

  def __init__(self, directory: str, *, save_every: int = 1000, keep: Optional[int] = 3,
               async_save: bool = True):
    if save_every < 1:
      raise TrainError(f"save_every must be >= 1; saw {save_every}")
    if keep is not None and keep < 1:
      raise TrainError(f"keep must be >= 1 or None; saw {keep}")
    self.directory = os.path.abspath(directory)
    self.save_every = save_every
    quiet_orbax_info_logs()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True,
        cleanup_tmp_directories=True, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_handlers=_item_handlers())

  def latest_step(self) -> Optional[int]:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of every complete checkpoint, ascending."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, *, meta: Optional[Mapping[str, Any]] = None,
           force: bool = False) -> bool:
    """Saves when `step` is due (or `force`); returns whether a save started.

    Args:
      step: the number of optimiser updates the state has taken.
      state: a pytree of jax arrays (sharded however the mesh has them).
      meta: JSON-serialisable dict (data iterator position, config, ...).
      force: save even if the step is not a multiple of save_every (e.g. the last step).
    """
    if step in self._manager.all_steps() or not (force or step % self.save_every == 0):
      return False
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              meta=ocp.args.JsonSave(dict(meta or {})))
    # The period is decided here (orbax's default policy would also save the first step).
    return self._manager.save(step, args=args, force=True)

  def restore(self, abstract_state: Any, *, step: Optional[int] = None) -> tuple[Any, dict]:
    """Restores a checkpoint onto the shardings of `abstract_state`.

    Args:
      abstract_state: the train state's tree of jax.ShapeDtypeStruct with the target shardings
        (see `abstract_like`), exactly the structure that was saved.
      step: which checkpoint (default: the latest).
    Returns:
      (state, meta).
    Raises:
      TrainError: there is no checkpoint.
      CheckpointMismatch: a leaf's path, shape or dtype differs between checkpoint and target.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise TrainError(f"no checkpoint to restore in {self.directory}")
    self._check_compatible(step, abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored.state, dict(restored.meta or {})

  def _check_compatible(self, step: int, abstract_state: Any) -> None:
    saved = self._manager.item_metadata(step).state
    if saved is None:  # no metadata written: orbax's own shape check still applies on restore
      return
    saved_leaves = {_path_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(saved)[0]}
    target_leaves = {_path_name(p): v
                     for p, v in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
    missing = sorted(set(target_leaves) - set(saved_leaves))
    extra = sorted(set(saved_leaves) - set(target_leaves))
    if missing or extra:
      raise CheckpointMismatch(
          f"checkpoint step {step} in {self.directory} does not match the model: missing from the "
          f"checkpoint {missing[:5]}{'...' if len(missing) > 5 else ''}; only in the checkpoint "
          f"{extra[:5]}{'...' if len(extra) > 5 else ''}")
    for name, target in target_leaves.items():
      shape = tuple(getattr(saved_leaves[name], "shape", ()) or ())
      if hasattr(target, "shape") and tuple(target.shape) != shape:
        raise CheckpointMismatch(
            f"parameter {name!r} has shape {shape} in the checkpoint and {tuple(target.shape)} "
            f"in the model")

  def wait(self) -> None:
    """Blocks until any background save has been committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases orbax's threads."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
