"""Loading new policy weights from disk for `/update_weights_from_disk`.

Formats (`load_format`):
  "hf" / "safetensors": a Hugging Face folder (config.json + *.safetensors), read with
      `models.hf.load_pretrained`.
  "orbax": an orbax checkpoint holding the parameters as a pure dict (the trainer's form,
      `nnx.to_pure_dict(nnx.state(model, nnx.Param))`), either
        - a CheckpointManager folder whose steps hold an item "state" with key "params" (the
          trainer's `train.checkpoint.Checkpointer` layout; the latest step is read), or
        - one PyTree checkpoint of the parameter dict (`ocp.StandardCheckpointer().save`).
  "auto" / None: "hf" when the folder has config.json and safetensors, "orbax" otherwise.
Restored arrays take the served parameters' shardings, so a checkpoint written on another
mesh restores on this one (docs/cases.md 5).
"""
from __future__ import annotations

import glob
import os
from typing import Any, Optional

import jax
from flax import nnx

from orchard_jax.rollout.errors import WeightUpdateError


def load_params_from_disk(path: str, template: nnx.State, *,
                          load_format: Optional[str] = None) -> dict:
  """Parameters from `path` as a pure dict shaped like `template` (see module docstring).

  Args:
    path: the folder.
    template: the served model's nnx.Param state (shapes, dtypes, shardings to restore to).
    load_format: "auto", "hf", "safetensors" or "orbax".
  Raises:
    WeightUpdateError: no such folder, unknown format, or contents that do not fit.
  """
  if not os.path.isdir(path):
    raise WeightUpdateError(f"weights folder {path!r} does not exist")
  fmt = (load_format or "auto").lower()
  if fmt == "auto":
    has_hf = os.path.exists(os.path.join(path, "config.json")) and glob.glob(
      os.path.join(path, "*.safetensors"))
    fmt = "hf" if has_hf else "orbax"
  if fmt in ("hf", "safetensors"):
    return _load_hf(path)
  if fmt == "orbax":
    return _load_orbax(path, template)
  raise WeightUpdateError(
    f"load_format {load_format!r} is not supported; expected 'auto', 'hf', 'safetensors' or "
    "'orbax'")


def _load_hf(path: str) -> dict:
  from orchard_jax.models import ModelError
  from orchard_jax.models import hf

  try:
    _, model = hf.load_pretrained(path)
  except ModelError as e:
    raise WeightUpdateError(f"cannot load Hugging Face weights from {path!r}: {e}") from e
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _abstract(template: nnx.State) -> dict:
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
    nnx.to_pure_dict(template))


def _load_orbax(path: str, template: nnx.State) -> dict:
  import orbax.checkpoint as ocp

  abstract = _abstract(template)
  path = os.path.abspath(path)
  restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), abstract)
  try:
    manager = ocp.CheckpointManager(path, item_names=("state", "meta"),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    try:
      step = manager.latest_step()
      if step is not None:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item={"params": abstract}, restore_args={"params": restore_args},
          partial_restore=True)))
        return restored.state["params"]
    finally:
      manager.close()
    with ocp.PyTreeCheckpointer() as checkpointer:
      return checkpointer.restore(path, args=ocp.args.PyTreeRestore(
        item=abstract, restore_args=restore_args))
  except WeightUpdateError:
    raise
  except Exception as e:  # noqa: BLE001 - orbax raises many kinds; all mean "does not fit"
    raise WeightUpdateError(
      f"cannot restore parameters from orbax checkpoint {path!r}: {type(e).__name__}: {e}"
    ) from e


def save_params(path: str, params: Any) -> None:
  """Write parameters (nnx.State or pure dict) as one orbax PyTree checkpoint at `path`, a
  folder `load_params_from_disk(path, ..., load_format="orbax")` reads."""
  import orbax.checkpoint as ocp

  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  with ocp.PyTreeCheckpointer() as checkpointer:
    checkpointer.save(os.path.abspath(path), params, force=True)
