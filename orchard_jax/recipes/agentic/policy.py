"""The policy a config names: built fresh from a preset, or read from a checkpoint or a Hugging
Face folder. One checkpoint lookup and one parameter reader serve every job (the RL and SFT
policy, the OPD and distillation teachers, evaluation, the value model's backbone).

A checkpoint path may be:
  - a Hugging Face folder (config.json + *.safetensors), read with `models.hf.load_pretrained`;
  - a run folder (its `rl/checkpoints`, else `sft/checkpoints`, else `checkpoints`), a trainer
    folder (`checkpoints/`), or a checkpoints folder itself (step subfolders): the latest step's
    parameters, restored onto the model's own shardings (any mesh; docs/cases.md 5);
  - one orbax PyTree of the parameter dict (`rollout.save_params`).
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
from typing import Any, Optional

from flax import nnx

from orchard_jax import data, models, parallel
from orchard_jax.recipes import ConfigError, load_tokenizer as _load_tokenizer
from orchard_jax.models import hf  # a submodule: `models.hf` exists only once imported

_log = logging.getLogger(__name__)

_POLICY_FIELDS = ("preset", "init", "tokenizer", "tool_call_parser")
# Where a run folder keeps its checkpoints, most trained first.
_CHECKPOINT_FOLDERS = ("rl/checkpoints", "sft/checkpoints", "checkpoints", "")


class PolicyError(ConfigError):
  """The policy config names something that cannot be built or loaded."""


def model_overrides(policy_config) -> dict[str, Any]:
  """ModelConfig fields the policy block sets over its preset: every key other than preset,
  init, tokenizer and tool_call_parser (dtype, max_position_embeddings, moe_dispatch, ...).

  Raises:
    PolicyError: a key that is not a ModelConfig field.
  """
  fields = {f.name for f in dataclasses.fields(models.ModelConfig)}
  out = {}
  for name, value in policy_config.items():
    if name in _POLICY_FIELDS:
      continue
    if name not in fields:
      raise PolicyError(f"policy.{name} is neither a policy setting {_POLICY_FIELDS} nor a "
                        f"ModelConfig field")
    out[name] = tuple(value) if isinstance(value, list) else value
  return out


def load_tokenizer(policy_config, *, field: str = "policy.tokenizer") -> data.Tokenizer:
  """The tokenizer `policy.tokenizer` names.

  Raises:
    ConfigError: nothing loadable there (the message names the field).
  """
  return _load_tokenizer(policy_config.tokenizer, field=field)


def find_checkpoint_dir(path: str) -> Optional[str]:
  """The orbax CheckpointManager folder under `path`, or None when `path` holds none.

  Accepts a run folder (prefers `rl/checkpoints`, then `sft/checkpoints`), a trainer workdir
  (`checkpoints/`), or a checkpoints folder itself (step subfolders).
  """
  for sub in _CHECKPOINT_FOLDERS:
    folder = os.path.join(path, sub) if sub else path
    if os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder)):
      return folder
  return None


def is_hf_folder(path: str) -> bool:
  """`path` holds a Hugging Face model (config.json and *.safetensors)."""
  return os.path.isfile(os.path.join(path, "config.json")) and bool(
      glob.glob(os.path.join(path, "*.safetensors")))


def check_checkpoint(path: str, *, field: str) -> None:
  """Checks, before anything is built, that `path` (the config field `field`) is a Hugging
  Face folder or holds an orbax checkpoint (a run folder, trainer folder or checkpoints/).

  Raises:
    PolicyError: it is neither (the message names the field and the path).
  """
  if not (is_hf_folder(path) or find_checkpoint_dir(path)):
    raise PolicyError(f"{field}: {_no_checkpoint(path)}")


def _no_checkpoint(path: str) -> str:
  if not os.path.exists(path):
    return (f"{path!r} does not exist; expected a Hugging Face model folder or an orbax "
            "checkpoint (a run folder, trainer folder or checkpoints/)")
  return (f"{path!r} holds neither a Hugging Face model (config.json + safetensors) nor an "
          "orbax checkpoint (a run folder, trainer folder or checkpoints/)")


def tokenizer_near(path: str) -> Optional[str]:
  """The `tokenizer` folder the recipes save beside a checkpoint (in `path`, or up to two
  levels above its checkpoints folder), or None."""
  folder = find_checkpoint_dir(path) or path
  parent = os.path.dirname(os.path.abspath(folder))
  for candidate in (path, folder, parent, os.path.dirname(parent)):
    if os.path.isfile(os.path.join(candidate, "tokenizer", "tokenizer.json")):
      return os.path.join(candidate, "tokenizer")
  return None


def build_policy(policy_config, mesh, *, vocab_size: int, seed: int = 0,
                 init: Optional[str] = None) -> models.CausalLM:
  """The policy model, its parameters laid out on `mesh`.

  Args:
    policy_config: a `policy` block (preset, init, model field overrides).
    mesh: the device mesh.
    vocab_size: the tokenizer's vocabulary size (the model's must be at least this).
    seed: initialisation seed of a fresh model.
    init: overrides policy_config.init: "" fresh, an HF folder, or a checkpoint folder.
  Raises:
    PolicyError: an init path that is neither an HF folder nor holds a checkpoint, or a model
      vocabulary smaller than the tokenizer's.
    rollout.WeightUpdateError: a checkpoint whose parameters do not fit the preset.
  """
  init = policy_config.init if init is None else init
  overrides = model_overrides(policy_config)
  if init and is_hf_folder(init):
    _, model = hf.load_pretrained(init, mesh=mesh, **overrides)
    _check_vocab(model.config, vocab_size)
    return model
  config = dataclasses.replace(models.get_preset(policy_config.preset), **overrides)
  _check_vocab(config, vocab_size)
  model = parallel.create_sharded(lambda: models.CausalLM(config, rngs=nnx.Rngs(seed)), mesh)
  if init:
    load_params(model, init, mesh)
  return model


def _check_vocab(config, vocab_size: int) -> None:
  if config.vocab_size < vocab_size:
    raise PolicyError(f"the model's vocab_size is {config.vocab_size}; the tokenizer needs "
                      f"{vocab_size}")


def load_params(model: nnx.Module, path: str, mesh=None) -> None:
  """Fills `model`'s parameters (a policy or a value model) from the latest checkpoint under
  `path` (module docstring), in place.

  Args:
    model: the module.
    path: the checkpoint (module docstring).
    mesh: lay every parameter out on this mesh by its logical axes first (e.g. a value head
      added to a sharded backbone); None keeps the model's own placement.
  Raises:
    PolicyError: `path` does not exist.
    rollout.WeightUpdateError: the checkpoint's parameters do not fit the model.
  """
  import jax
  from orchard_jax.rollout.weights import load_params_from_disk   # deferred: orbax import
  if not os.path.isdir(path):
    raise PolicyError(_no_checkpoint(path))
  folder = find_checkpoint_dir(path) or path
  state = nnx.state(model, nnx.Param)
  if mesh is not None:
    state = jax.device_put(state, parallel.state_shardings(state, mesh))
  nnx.replace_by_pure_dict(state, load_params_from_disk(folder, state, load_format="orbax"))
  nnx.update(model, state)
  _log.info("parameters from %s", folder)
