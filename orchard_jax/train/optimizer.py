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
      Orchard-GUI's SFT freezes them; "visual/blocks": the encoder only). The train step
      takes gradients only with respect to the other parameters and the optimiser state holds
      moments for those alone, so a frozen parameter never moves (no weight decay either) and
      no backward pass runs through a frozen vision tower.
    train_last_layers: partial fine-tuning (layer freezing) of a causal LM: when > 0, only the
      last this many decoder layers, the final norm and the LM head are trained; the token
      embedding, the lower decoder layers and any other tower are added to `frozen`
      (`last_layers_frozen`). With the embedding frozen, no gradient flows below the lowest
      trained layer: a step costs the forward pass plus the backward pass of the trained top.
      0 trains every parameter not in `frozen`.
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
  train_last_layers: int = 0

  def __post_init__(self):
    object.__setattr__(self, "frozen", tuple(str(p).strip("/") for p in self.frozen))
    if self.train_last_layers < 0:
      raise TrainError(f"train_last_layers must be >= 0 (0 trains every layer); saw "
                       f"{self.train_last_layers}")
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


def last_layers_frozen(params, train_last_layers: int) -> tuple[str, ...]:
  """The `frozen` prefixes of partial fine-tuning: every parameter of a causal LM's `params`
  (ModelParts.pure_params: "lm_head", "model/embed_tokens", "model/layers/<i>/...",
  "model/norm", and e.g. "visual") except the last `train_last_layers` decoder layers, the
  final norm and the LM head. 0 gives ().

  Raises:
    TrainError: the params have no separate LM head (tied embeddings: training the head would
      train the input embedding and back-propagate through every layer) or no decoder layers,
      or train_last_layers exceeds their count.
  """
  if train_last_layers == 0:
    return ()
  tree = dict(params)
  layers = dict(tree.get("model", {})).get("layers")
  if "lm_head" not in tree or not layers:
    raise TrainError(f"train_last_layers={train_last_layers} needs a causal LM with its own "
                     f"lm_head and model/layers (tied embeddings would train every layer); "
                     f"saw top-level parameters {sorted(map(str, tree))}")
  count = len(layers)
  if train_last_layers > count:
    raise TrainError(f"train_last_layers is {train_last_layers}; the model has {count} decoder "
                     f"layers")
  frozen = [f"model/layers/{i}" for i in sorted(layers) if int(i) < count - train_last_layers]
  frozen += [f"model/{name}" for name in sorted(map(str, tree["model"]))
             if name not in ("layers", "norm")]
  frozen += [str(name) for name in sorted(map(str, tree)) if name not in ("model", "lm_head")]
  return tuple(frozen)


def frozen_prefixes(config: OptimizerConfig, params) -> tuple[str, ...]:
  """All parameters `config` leaves untrained: config.frozen plus those train_last_layers
  freezes (`last_layers_frozen`), each once."""
  extra = last_layers_frozen(params, config.train_last_layers)
  return tuple(dict.fromkeys(config.frozen + extra))


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
  """AdamW (decoupled weight decay on matrices) after global-norm clipping, with the schedule.

  It is applied to the trained parameters only: with frozen parameters (`frozen_prefixes`) the
  train step (step.build_train_step, step.init_train_state) partitions them out of the
  gradients, the optimiser state and the update. The optimiser state records the step count,
  so the schedule resumes where a checkpoint left it.
  """
  parts = []
  if config.max_grad_norm:
    parts.append(optax.clip_by_global_norm(config.max_grad_norm))
  parts.append(optax.adamw(learning_rate_schedule(config), b1=config.b1, b2=config.b2,
                           eps=config.eps, weight_decay=config.weight_decay, mask=_decay_mask))
  return optax.chain(*parts)
