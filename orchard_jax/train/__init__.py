"""The sharded trainer: train step, optimiser, orbax checkpoints, metrics.

Public API:
  OptimizerConfig, make_optimizer(config), learning_rate_schedule(config)
  SFTLoss, PolicyLoss, ValueLoss, make_loss(name, **settings)
  token_logprobs(model, input_ids, positions, segment_ids, *, chunk_size, with_entropy)
  chunked_token_logprobs(logits_fn, hidden, input_ids, segment_ids, *, chunk_size, ...)
  TrainerConfig, Trainer(model, loss, config, *, mesh)      the loop (context manager):
    fit(batch_for_step, eval_fn=), train_step(batch, extra_meta=), evaluate(batches),
    token_logprobs(batch, params=None), save(), model(), step, state, meta, restored_step
  Checkpointer(directory, *, save_every, keep, async_save), abstract_like (one reader of
  parameters for serving and evaluation: rollout.load_params_from_disk)
  MetricsWriter(directory, *, tensorboard, start_step, enabled), read_metrics(directory),
  ProgressBar (both write on process 0 only)
  ModelParts, build_train_step, build_eval_step, build_logprob_step, state_shardings,
  init_train_state
  TrainError, CheckpointMismatch
  Vision-language batches (train.multimodal): add_images(batch, row_images, images, config, *,
  images_per_row, patches_per_image) puts the images of data.pack_sequences(...,
  images_per_row=K)'s rows and 3-D positions beside a packed batch; the losses and
  token_logprobs(..., images=batch_images(batch)) pass them to the model;
  OptimizerConfig(frozen=("visual",)) freezes the vision tower (frozen_mask);
  OptimizerConfig(train_last_layers=N) trains only a causal LM's top N decoder layers, final
  norm and LM head (partial fine-tuning: last_layers_frozen, frozen_prefixes); the train step
  differentiates the trained params only (partition_params / merge_params).
  train.cached_last_layer: last-layer fine-tuning on cached key/value states (cache_rows,
  fit, trained_parameters): exact SFT of the last layer's readout, final norm and LM head with
  every key/value computed once per sequence (SFT's sft.method "cached_last_layer").
"""
from orchard_jax.train.checkpoint import Checkpointer, abstract_like
from orchard_jax.train.errors import CheckpointMismatch, TrainError
from orchard_jax.train.logprobs import chunked_token_logprobs, segment_starts, token_logprobs
from orchard_jax.train.losses import OPD_MODES, PolicyLoss, SFTLoss, ValueLoss, make_loss
from orchard_jax.train.metrics import MetricsWriter, ProgressBar, read_metrics
from orchard_jax.train.multimodal import IMAGE_KEYS, add_images, batch_images
from orchard_jax.train.optimizer import (SCHEDULES, OptimizerConfig, frozen_mask,
                                         frozen_prefixes, last_layers_frozen,
                                         learning_rate_schedule, make_optimizer)
from orchard_jax.train.step import (ModelParts, batch_partition_spec, build_eval_step,
                                    build_logprob_step, build_train_step, data_parallel_size,
                                    init_train_state, merge_params, partition_params,
                                    state_shardings)
from orchard_jax.train.trainer import Trainer, TrainerConfig
