"""The training loop: one jitted step, periodic async checkpoints, metrics, progress, resume.

    with Trainer(model, SFTLoss(), config, mesh=mesh) as trainer:
      trainer.fit(batch_for_step, eval_fn=...)

`batch_for_step(step) -> packed batch` makes the data order a function of the step alone, so a
resumed run sees exactly the batches the uninterrupted run would have seen; the train state
(params, optimiser moments, step, RNG key) comes back bit for bit from the checkpoint, so the
next losses are identical. Recipes whose data is produced online (RL) call `train_step(batch)`
directly and keep their own position in the checkpoint's meta (`extra_meta`).
"""
import dataclasses
import time
from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding

from orchard_jax import parallel
from orchard_jax.train import checkpoint as ckpt
from orchard_jax.train import step as step_lib
from orchard_jax.train.errors import TrainError
from orchard_jax.train.metrics import MetricsWriter, ProgressBar
from orchard_jax.train.multimodal import IMAGE_KEYS
from orchard_jax.train.optimizer import (OptimizerConfig, frozen_prefixes, learning_rate_schedule,
                                         make_optimizer)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """Everything the trainer does besides the loss and the model.

  Attributes:
    workdir: run directory: checkpoints/, metrics.jsonl, tensorboard/.
    total_steps: optimiser updates of the run.
    optimizer: OptimizerConfig (its total_steps, when left at 0, becomes this run's).
    microbatches: gradient-accumulation steps per update.
    load_balancing_coef: weight of the MoE load-balancing loss (ModelConfig.router_aux_loss_coef
      by convention; the recipe passes it).
    save_every: checkpoint period in steps (a final checkpoint is always written).
    keep_checkpoints: how many recent checkpoints to keep.
    async_checkpoints: write checkpoints in the background.
    eval_every: run eval_fn every this many steps (0: only at the end).
    log_every: write metrics every this many steps.
    seed: the train state's RNG seed.
    tensorboard: also write TensorBoard event files.
    progress: show a progress bar.
  """
  workdir: str
  total_steps: int
  optimizer: OptimizerConfig = OptimizerConfig()
  microbatches: int = 1
  load_balancing_coef: float = 0.0
  save_every: int = 500
  keep_checkpoints: int = 3
  async_checkpoints: bool = True
  eval_every: int = 0
  log_every: int = 1
  seed: int = 0
  tensorboard: bool = True
  progress: bool = True


def _to_host(x):
  array = np.asarray(x)
  return float(array) if array.ndim == 0 else array


class Trainer:
  """Trains one model with one loss on one mesh; a context manager (closes files, waits for saves).

  Args:
    model: an nnx module (CausalLM or ValueModel), params already laid out on `mesh`.
    loss: SFTLoss, PolicyLoss or ValueLoss.
    config: TrainerConfig.
    mesh: the device mesh (parallel.make_mesh; default: all devices data-parallel). Params are
      laid out by their logical axis names under the current rules, whatever devices they
      live on when passed in.
  On entry the latest checkpoint in workdir/checkpoints is restored if there is one. With frozen
  parameters (config.optimizer.frozen / train_last_layers; `frozen` holds the resolved prefixes)
  the checkpoint still holds every parameter; its optimiser state covers the trained ones.
  """

  def __init__(self, model, loss, config: TrainerConfig, *, mesh: Optional[Mesh] = None):
    if config.total_steps < 1:
      raise TrainError(f"total_steps must be >= 1; saw {config.total_steps}")
    self.config = config
    self.loss = loss
    self.mesh = mesh if mesh is not None else parallel.make_mesh({"data": -1})
    self.parts = step_lib.ModelParts.of(model)
    opt_config = config.optimizer
    if opt_config.total_steps == 0:
      opt_config = dataclasses.replace(opt_config, total_steps=config.total_steps)
    self.schedule = learning_rate_schedule(opt_config)
    self.optimizer = make_optimizer(opt_config)
    params = self.parts.pure_params()
    self.frozen = frozen_prefixes(opt_config, params)
    self.shardings = step_lib.state_shardings(self.optimizer, params, self.mesh,
                                              self.parts.param_shardings(self.mesh),
                                              frozen=self.frozen)
    self._abstract_state = jax.eval_shape(
        lambda p: {"step": jax.numpy.zeros((), jax.numpy.int32), "params": p,
                   "opt_state": self.optimizer.init(step_lib.partition_params(p, self.frozen)[0]),
                   "rng": jax.random.PRNGKey(0)}, params)
    self._abstract_state = ckpt.abstract_like(self._abstract_state, self.shardings)
    self._initial_params = params
    self._step_fn = step_lib.build_train_step(
        self.parts, loss, self.optimizer, self.schedule, mesh=self.mesh,
        shardings=self.shardings, microbatches=config.microbatches,
        load_balancing_coef=config.load_balancing_coef, frozen=self.frozen)
    self._eval_fn = step_lib.build_eval_step(self.parts, loss, mesh=self.mesh,
                                             param_shardings=self.shardings["params"])
    self.checkpoints = ckpt.Checkpointer(f"{config.workdir}/checkpoints",
                                         save_every=config.save_every,
                                         keep=config.keep_checkpoints,
                                         async_save=config.async_checkpoints)
    self.state = None
    self.meta: dict = {}
    self.restored_step: Optional[int] = None
    try:
      self._restore_or_init()
    except Exception:
      self.checkpoints.close()
      raise
    self._initial_params = None  # the state holds the params now
    self.metrics = MetricsWriter(config.workdir, tensorboard=config.tensorboard,
                                 start_step=self.step)
    self._progress = ProgressBar(config.total_steps, self.step, enabled=config.progress or False)
    self._logprob_fn = None

  # -- state ---------------------------------------------------------------------------------
  def _restore_or_init(self) -> None:
    latest = self.checkpoints.latest_step()
    if latest is None:
      self.state = step_lib.init_train_state(self.optimizer, self._initial_params,
                                             seed=self.config.seed, shardings=self.shardings,
                                             frozen=self.frozen)
      return
    self.state, self.meta = self.checkpoints.restore(self._abstract_state, step=latest)
    self.restored_step = latest
    logging.info("resumed from %s step %d", self.checkpoints.directory, latest)

  @property
  def step(self) -> int:
    """Optimiser updates taken so far."""
    return int(jax.device_get(self.state["step"]))

  @property
  def params(self) -> dict:
    return self.state["params"]

  def model(self):
    """The model module with the current params (e.g. for sampling or export)."""
    return self.parts.merge(self.state["params"])

  def save(self, *, force: bool = True, extra_meta: Optional[Mapping[str, Any]] = None) -> bool:
    """Checkpoints the current state now (force) or when due."""
    meta = dict(self.meta)
    meta.update(extra_meta or {})
    meta["step"] = self.step
    return self.checkpoints.save(self.step, self.state, meta=meta, force=force)

  # -- steps ---------------------------------------------------------------------------------
  def _put(self, batch: Mapping[str, Any]) -> dict:
    rows = np.shape(next(iter(batch.values())))[0]
    dp = step_lib.data_parallel_size(self.mesh)
    if rows % (self.config.microbatches * dp):
      raise TrainError(f"batch has {rows} rows; it must split evenly into "
                       f"{self.config.microbatches} microbatches over {dp} data-parallel devices "
                       f"(pad with zero-weight rows, docs/cases.md 4)")
    out = {}
    for name, value in batch.items():
      value = np.asarray(value)
      spec = step_lib.batch_partition_spec(self.mesh, value.shape)
      out[name] = jax.device_put(value, NamedSharding(self.mesh, spec))
    return out

  def train_step(self, batch: Mapping[str, Any], *,
                 extra_meta: Optional[Mapping[str, Any]] = None) -> dict:
    """One optimiser update on a packed batch; logs metrics and saves when due.

    Returns:
      The step's metrics as host floats (arrays for expert load).
    """
    start = time.perf_counter()
    self.state, metrics = self._step_fn(self.state, self._put(batch))
    metrics = jax.device_get(metrics)
    elapsed = time.perf_counter() - start
    step = self.step
    out = {name: _to_host(value) for name, value in metrics.items()}
    num_tokens = int(np.sum(np.asarray(batch["segment_ids"]) > 0))
    out["tokens_per_s"] = num_tokens / max(elapsed, 1e-9)
    out["step_time_s"] = elapsed
    if not np.isfinite(out["loss"]):
      raise TrainError(f"loss is {out['loss']} at step {step}; stopping before a bad checkpoint")
    if step % self.config.log_every == 0 or step == self.config.total_steps:
      self.metrics.write(step, out)
    self._progress.update(out)
    if extra_meta:
      self.meta.update(extra_meta)
    if step % self.config.save_every == 0:
      self.save(force=False)
    return out

  def token_logprobs(self, batch: Mapping[str, Any], params: Optional[dict] = None) -> np.ndarray:
    """log-probs [batch, seq] of a packed batch's tokens under `params` (default: the current
    ones), e.g. the reference policy's for the KL term or pi_old before several updates; at
    the batch's `temperatures` when it has them (the distribution the tokens were sampled
    from, which the engine's recorded old log-probs are of)."""
    if self._logprob_fn is None:
      chunk = getattr(self.loss, "chunk_size", 512)
      self._logprob_fn = step_lib.build_logprob_step(
          self.parts, mesh=self.mesh, param_shardings=self.shardings["params"], chunk_size=chunk)
    params = self.state["params"] if params is None else params
    keys = ("input_ids", "positions", "segment_ids", "temperatures") + IMAGE_KEYS
    return np.asarray(jax.device_get(self._logprob_fn(params, self._put(
        {k: batch[k] for k in keys if k in batch}))))

  def evaluate(self, batches) -> dict:
    """Loss over held-out batches, weighted by each batch's normaliser (tokens or sequences)."""
    total, weight, sums, count = 0.0, 0.0, {}, 0
    for batch in batches:
      metrics = jax.device_get(self._eval_fn(self.state["params"], self._put(batch)))
      norm = float(metrics.pop("normalizer"))
      total += float(metrics.pop("loss")) * norm
      weight += norm
      for name, value in metrics.items():
        if np.ndim(value) == 0:
          sums[name] = sums.get(name, 0.0) + float(value)
      count += 1
    if count == 0:
      raise TrainError("evaluate got no batches")
    out = {"loss": total / max(weight, 1e-9)}
    out.update({name: value / count for name, value in sums.items()})
    return out

  def fit(self, batch_for_step: Callable[[int], Mapping[str, Any]], *,
          eval_fn: Optional[Callable[["Trainer"], Mapping[str, float]]] = None,
          stop_loss: float = 0.0) -> dict:
    """Trains from the current step to total_steps, or until the loss falls below stop_loss.

    Args:
      batch_for_step: step index (0-based, the number of updates already taken) -> batch.
      eval_fn: called with the trainer every eval_every steps and at the end; its metrics are
        logged with an "eval/" prefix.
      stop_loss: early stopping on the training loss: > 0 ends the run after the first step
        whose loss is below it (recorded in the checkpoint's meta as "stopped_at", so a
        resumed run does not train on); 0 trains every step.
    Returns:
      The last step's metrics (with the final eval metrics; "stopped_at" when stopped early).
    """
    last: dict = {}
    stopped = self.meta.get("stopped_at")
    while stopped is None and self.step < self.config.total_steps:
      last = self.train_step(batch_for_step(self.step))
      step = self.step
      if stop_loss > 0 and last["loss"] < stop_loss and step < self.config.total_steps:
        stopped = self.meta["stopped_at"] = step
        logging.info("loss %.5f < stop_loss %g at step %d of %d: stopping", last["loss"],
                     stop_loss, step, self.config.total_steps)
        break
      if eval_fn is not None and self.config.eval_every and step % self.config.eval_every == 0 \
          and step < self.config.total_steps:
        self._log_eval(step, eval_fn)
    if eval_fn is not None:
      last.update(self._log_eval(self.step, eval_fn))
    if stopped is not None:
      last["stopped_at"] = stopped
    self.save(force=True)
    return last

  def _log_eval(self, step: int, eval_fn) -> dict:
    metrics = {f"eval/{name}": value for name, value in eval_fn(self).items()}
    self.metrics.write(step, metrics)
    self._progress.update(metrics, steps=0)
    return metrics

  # -- lifecycle -----------------------------------------------------------------------------
  def close(self) -> None:
    self._progress.close()
    self.checkpoints.close()
    self.metrics.close()

  def __enter__(self) -> "Trainer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
