"""The optimiser: AdamW with warmup + cosine decay and global-norm clipping (optax).

Gradient accumulation is done by the train step (a scan over microbatches whose losses share the
global batch's normaliser, so the summed gradient equals the full-batch gradient exactly), not by
optax.MultiSteps, which would take one optimiser step per microbatch call.
"""
import dataclasses
from typing import Any

import jax
import optax

from orchard_jax.train.errors import TrainError

SCHEDULES = ("cosine", "constant", "linear")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW and its learning-rate schedule.

  Attributes:
    learning_rate: peak learning rate (after warmup).
    end_learning_rate: the value the decay ends at (cosine: 1e-5 -> 1e-6 in Orchard's SFT).
    warmup_steps: linear warmup from 0 to learning_rate.
    total_steps: steps of warmup + decay; after it the rate stays at end_learning_rate. 0 means
      "the run's length": Trainer fills in TrainerConfig.total_steps.
    schedule: "cosine" (warmup + cosine decay), "constant" (warmup, then flat: Orchard's OPD),
      or "linear" (warmup + linear decay).
    weight_decay: AdamW's decoupled weight decay, applied to matrices only (ndim >= 2), not to
      norms' scales or biases.
    b1, b2, eps: Adam's moments and epsilon.
    max_grad_norm: clip the global gradient norm to this (0 or None disables).
    frozen: parameters that are not trained, as path prefixes of the model's parameters
      ("visual": a vision-language model's vision encoder, merger and DeepStack mergers, as
      Orchard-GUI's SFT freezes them; "visual/blocks": the encoder only). They get no update
      (no weight decay either) and the train step stops gradients at them, so no backward
      pass runs through a frozen vision tower.
  """
  learning_rate: float = 3e-4
  end_learning_rate: float = 3e-5
  warmup_steps: int = 100
  total_steps: int = 0
  schedule: str = "cosine"
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  max_grad_norm: float = 1.0
  frozen: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "frozen", tuple(str(p).strip("/") for p in self.frozen))
    if self.schedule not in SCHEDULES:
      raise TrainError(f"schedule is {self.schedule!r}; expected one of {SCHEDULES}")
    if self.warmup_steps < 0 or self.total_steps < 0:
      raise TrainError(f"need warmup_steps >= 0 and total_steps >= 0; saw {self.warmup_steps}, "
                       f"{self.total_steps}")
    if self.learning_rate < 0 or self.end_learning_rate < 0:
      raise TrainError(f"learning rates must be >= 0; saw {self.learning_rate}, "
                       f"{self.end_learning_rate}")


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
  """step -> learning rate: linear warmup over warmup_steps, then the configured decay.

  Raises:
    TrainError: total_steps is 0 (left for the Trainer to fill in, but used directly).
  """
  if config.total_steps < 1:
    raise TrainError("OptimizerConfig.total_steps is 0; set it, or let Trainer fill it in with "
                     "the run's total_steps")
  warmup = min(config.warmup_steps, config.total_steps)
  decay_steps = max(config.total_steps - warmup, 1)
  peak, end = config.learning_rate, config.end_learning_rate
  if config.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak if peak else 0.0)
  elif config.schedule == "linear":
    decay = optax.linear_schedule(peak, end, decay_steps)
  else:
    decay = optax.constant_schedule(peak)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _decay_mask(params):
  return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                  for k in path)


def _is_frozen(name: str, prefixes) -> bool:
  return any(name == p or name.startswith(p + "/") for p in prefixes)


def frozen_mask(params, prefixes) -> Any:
  """A pytree of bools over params: True for parameters under one of the path prefixes
  ("visual", "model/layers/0"; path components joined by "/").

  Raises:
    TrainError: a prefix names no parameter (a typo would silently train everything).
  """
  prefixes = tuple(prefixes)
  names = [_path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  missing = [p for p in prefixes if not any(_is_frozen(n, (p,)) for n in names)]
  if missing:
    top = sorted({n.split("/")[0] for n in names})
    raise TrainError(f"frozen {missing} name no parameter of the model; its top-level names "
                     f"are {top}")
  return jax.tree_util.tree_map_with_path(lambda p, _: _is_frozen(_path_name(p), prefixes),
                                          params)


def _zero_frozen(prefixes) -> optax.GradientTransformation:
  """Zeroes the updates of parameters under the prefixes (after AdamW, so weight decay does
  not move them either). Decided from each update's path, so the transformation holds no
  state and optax.tree_map_params sees AdamW's state unchanged."""
  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda p, u: jax.numpy.zeros_like(u) if _is_frozen(_path_name(p), prefixes) else u,
        updates), state
  return optax.GradientTransformation(init, update)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
  """AdamW (decoupled weight decay on matrices) after global-norm clipping, with the schedule;
  parameters under `config.frozen` get zero updates (their gradients are zero too, since the
  train step stops them; their Adam moments stay zero).

  The optimiser state records the step count, so the schedule resumes where a checkpoint left it.
  """
  parts = []
  if config.max_grad_norm:
    parts.append(optax.clip_by_global_norm(config.max_grad_norm))
  parts.append(optax.adamw(learning_rate_schedule(config), b1=config.b1, b2=config.b2,
                           eps=config.eps, weight_decay=config.weight_decay, mask=_decay_mask))
  if config.frozen:
    parts.append(_zero_frozen(config.frozen))
  return optax.chain(*parts)
