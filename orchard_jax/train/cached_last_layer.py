"""Last-layer fine-tuning on cached key/value states: exact SFT of a causal LM's readout.

Which parameters train. Of the last decoder layer: the query side of its attention (q_proj,
q_norm, the Qwen3.5 output gate gate_proj when present) and its output projection o_proj, its
post-attention norm and its feed-forward block (MoE router and experts, or the dense MLP); then
the final norm and the LM head (not when the head is the tied input embedding: the embedding
feeds every layer). Everything else is frozen: the embedding, every lower layer, and the last
layer's input norm, k_proj, k_norm and v_proj.

Why it is exact. None of the trained parameters changes any key or value of any layer, nor the
hidden state entering the last layer: those are functions of the frozen parameters only. So one
forward pass per sequence computes them once (`cache_rows`): the hidden state entering the
last layer at each position whose next token carries loss, and the last layer's keys/values
of the whole sequence, written through the model's own attention into its own decode cache
(`AttentionCache`). A training step then runs only the loss positions through the model's own
last `DecoderLayer` in cache mode (each position attends to the cached keys/values up to
itself, exactly as the engine decodes), the final norm and the LM head. The last layer's
output at position t depends on the rest of the sequence only through those keys/values
(the feed-forward block, MoE routing included, is per position), so the loss and its
gradient w.r.t. the trained parameters equal the full model's with the other parameters
frozen (tests/train/test_cached_last_layer.py checks both against jax.grad of the full
forward). A step costs [loss positions x sequence length] attention in one layer instead of
a full forward and backward pass: for an external CLI's 8-16k-token prompts with a few hundred
assistant tokens, milliseconds instead of minutes on CPU.

What it cannot do: train anything below the last layer's attention output, so it teaches the
model to read what the frozen layers already represent (a tool-call format, a memorised
edit), not new features of the input.

Unsupported (`check_model` raises CachedLastLayerError naming what it saw): a last layer that
is not full attention (Qwen3.5's Gated DeltaNet: its state is a recurrence over all earlier
tokens, there is no per-position query to train), a vision-language policy (image tokens
would need the vision front in the cached pass), and an MoE with a capacity factor (token
dropping makes a position's routing depend on the other positions in its group).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from orchard_jax.models.attention import cache_mask
from orchard_jax.models.cache import AttentionCache
from orchard_jax.models.layers import dtype_of, rope_tables
from orchard_jax.train.errors import TrainError
from orchard_jax.train.step import ModelParts, merge_params, partition_params


class CachedLastLayerError(TrainError):
  """The model or data cannot be trained by last-layer fine-tuning (module docstring)."""


_LAST_LAYER_TRAINED = ("self_attn/q_proj", "self_attn/q_norm", "self_attn/o_proj",
                       "self_attn/gate_proj", "post_attention_layernorm", "mlp")


def check_model(model) -> None:
  """Raises CachedLastLayerError when `model` (a CausalLM) is not supported (module docstring)."""
  cfg = model.config
  if getattr(model, "visual", None) is not None or getattr(cfg, "vision", None) is not None:
    raise CachedLastLayerError("last-layer fine-tuning expected a text-only causal LM; saw a "
                               "vision-language policy (config.vision is set)")
  last = model.model.layers[-1]
  if last.self_attn is None:
    raise CachedLastLayerError(
        f"last-layer fine-tuning expected the last decoder layer to be full attention; layer "
        f"{cfg.num_hidden_layers - 1} is {last.layer_type!r} (a recurrent Gated DeltaNet has "
        "no per-position query to train on cached keys/values)")
  if last.is_moe and getattr(cfg, "moe_capacity_factor", None) is not None:
    raise CachedLastLayerError(
        f"last-layer fine-tuning expected dropless MoE routing (moe_capacity_factor None); saw "
        f"moe_capacity_factor={cfg.moe_capacity_factor} (token dropping couples positions)")


def trained_parameters(model) -> tuple[str, ...]:
  """Path prefixes ("model/layers/3/mlp", "lm_head", ...) of the parameters this method trains
  (module docstring), as ModelParts.pure_params names them.

  Raises:
    CachedLastLayerError: an unsupported model (check_model).
  """
  check_model(model)
  last = f"model/layers/{model.config.num_hidden_layers - 1}"
  names = [f"{last}/{p}" for p in _LAST_LAYER_TRAINED]
  names += ["model/norm"] + ([] if model.lm_head is None else ["lm_head"])
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  leaves = _leaf_names(params)
  return tuple(n for n in names if any(_under(leaf, n) for leaf in leaves))


def frozen_parameters(model) -> tuple[str, ...]:
  """The complement of `trained_parameters`: every other parameter's full path, usable as
  OptimizerConfig.frozen (so a Trainer checkpoint holds this method's state)."""
  trained = trained_parameters(model)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return tuple(leaf for leaf in _leaf_names(params)
               if not any(_under(leaf, t) for t in trained))


def _leaf_names(params) -> list[str]:
  return ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def _under(name: str, prefix: str) -> bool:
  return name == prefix or name.startswith(prefix + "/")


@dataclasses.dataclass
class CachedRow:
  """One sequence's frozen states for the last layer, at its m loss positions.

  Attributes:
    hidden: [1, m, hidden] the hidden state entering the last layer at each position t whose
      next token carries loss (before its input norm).
    cache: the last layer's keys/values of the whole sequence (AttentionCache, [1, kv_heads,
      head_dim, n] and [1, kv_heads, n, head_dim]; n = sequence length - 1).
    positions: [m] int32 those positions t.
    targets: [m] int32 the next tokens input_ids[t + 1].
    weights: [m] float32 their loss weights.
  """
  hidden: jax.Array
  cache: AttentionCache
  positions: jax.Array
  targets: jax.Array
  weights: jax.Array


jax.tree_util.register_dataclass(CachedRow, data_fields=["hidden", "cache", "positions",
                                                         "targets", "weights"], meta_fields=[])


@nnx.jit(static_argnums=(2,))
def _frozen_pass(model, input_ids, chunk):
  """[1, n] ids -> (hidden entering the last layer [1, n, d], its AttentionCache of length n).

  Lower layers run as in training (the model's own layers); the last layer's attention runs in
  cache mode chunk by chunk (its keys/values written into the cache; the outputs are unused),
  so no [n, n] score matrix is built."""
  decoder, cfg = model.model, model.config
  n = input_ids.shape[1]
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  segments = jnp.ones_like(input_ids)
  h = jnp.take(decoder.embed_tokens[...], input_ids, axis=0).astype(dtype_of(cfg.dtype))
  cos, sin = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta)
  ctx = {"cos": cos, "sin": sin, "segment_ids": segments}
  for layer in list(decoder.layers)[:-1]:
    h, _, _ = layer(h, ctx, None)
  last = decoder.layers[-1]
  x = last.input_layernorm(h)
  dt = dtype_of(cfg.dtype)
  cache = AttentionCache(k=jnp.zeros((1, cfg.num_key_value_heads, cfg.head_dim, n), dt),
                         v=jnp.zeros((1, cfg.num_key_value_heads, n, cfg.head_dim), dt))
  for start in range(0, n, chunk):
    end = min(n, start + chunk)
    slots = positions[:, start:end]
    _, cache = last.self_attn(x[:, start:end], cos[:, start:end], sin[:, start:end],
                              segments[:, start:end], cache_mask(slots, n), cache=cache,
                              write_slots=slots)
  return h, cache


def cache_rows(model, sequences: Sequence[tuple[np.ndarray, np.ndarray]], *,
               chunk_size: int = 512) -> list[CachedRow]:
  """One frozen forward pass per sequence (module docstring).

  Args:
    model: a supported CausalLM (check_model).
    sequences: (input_ids [n] int, loss_weights [n] float) pairs; loss_weights[t] weights
      the prediction of input_ids[t] (docs/contracts.md), so position t - 1 is a loss position.
    chunk_size: query rows per chunk when writing the last layer's cache ([chunk, n] scores
      per head at a time).
  Returns:
    one CachedRow per sequence with at least one loss token.
  Raises:
    CachedLastLayerError: an unsupported model, mismatched lengths, or no loss token at all.
  """
  check_model(model)
  rows = []
  for i, (ids, weights) in enumerate(sequences):
    ids, weights = np.asarray(ids), np.asarray(weights, np.float32)
    if ids.shape != weights.shape or ids.ndim != 1:
      raise CachedLastLayerError(f"sequence {i}: expected input_ids and loss_weights of one "
                                 f"shape [n]; saw {ids.shape} and {weights.shape}")
    positions = np.nonzero(weights[1:])[0].astype(np.int32)
    if not len(positions):
      continue
    hidden, cache = _frozen_pass(model, jnp.asarray(ids[None, :-1], jnp.int32),
                                 max(1, int(chunk_size)))
    rows.append(CachedRow(hidden=hidden[:, positions], cache=cache,
                          positions=jnp.asarray(positions),
                          targets=jnp.asarray(ids[1:][positions], jnp.int32),
                          weights=jnp.asarray(weights[1:][positions])))
  if not rows:
    raise CachedLastLayerError("no sequence has a loss token (loss_weights all 0 after t=0)")
  return rows


def row_nll(model, row: CachedRow) -> jax.Array:
  """[m] negative log-likelihood of each target token of `row` under `model` (float32),
  through the model's own last DecoderLayer (cache mode), final norm and LM head."""
  cfg = model.config
  decoder = model.model
  n = row.cache.v.shape[2]
  positions = row.positions[None]
  cos, sin = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta)
  ctx = {"cos": cos, "sin": sin, "segment_ids": jnp.ones_like(positions),
         "mask": cache_mask(positions, n),
         "write_slots": jnp.full_like(positions, n)}       # slot n: nothing is written
  h, _, _ = decoder.layers[-1](row.hidden, ctx, row.cache)
  logits = model.logits(decoder.norm(h))[0]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, row.targets[:, None], axis=-1)[:, 0]


def loss_and_nll(model, rows: Sequence[CachedRow]) -> tuple[jax.Array, list[jax.Array]]:
  """(token-mean weighted NLL over every row's loss tokens, [m] NLL per row): SFTLoss's
  "token_mean" aggregation over the rows taken as one batch."""
  nll = [row_nll(model, r) for r in rows]
  total = sum(jnp.sum(x * r.weights) for x, r in zip(nll, rows))
  weight = sum(jnp.sum(r.weights) for r in rows)
  return total / jnp.maximum(weight, 1e-9), nll


@dataclasses.dataclass
class FitResult:
  """What `fit` did: steps taken (this call and before), last loss (token mean), the worst
  target token's NLL and probability at the last step, and the step it stopped at by the
  margin rule (None: ran to max_steps)."""
  steps: int
  loss: float
  max_nll: float
  min_target_prob: float
  stopped_at: Optional[int]
  opt_state: object


def fit(model, rows: Sequence[CachedRow], optimizer: optax.GradientTransformation, *,
        max_steps: int, min_target_prob: float = 0.0, opt_state=None, start_step: int = 0,
        on_step: Optional[Callable[[int, dict], None]] = None) -> FitResult:
  """Trains `model`'s last-layer readout (module docstring) in place on the cached rows.

  Every step is one full-batch update over all rows. Stopping rule (a margin on every target
  token, not on the mean): stop after the first step at which the least likely target token
  has probability >= min_target_prob, i.e. max NLL <= -log(min_target_prob); 0 trains
  max_steps steps.

  Args:
    model: the CausalLM the rows were cached from (its frozen parameters must not change
      between cache_rows and fit).
    rows: cache_rows' result.
    optimizer: an optax transformation over the trained parameters' pure dict
      (trained_parameters; e.g. train.make_optimizer).
    max_steps: total steps, counting start_step.
    min_target_prob: the margin rule's threshold in (0, 1], or 0.
    opt_state: the optimizer state to resume (None: a fresh one), at step start_step.
    on_step: called with (step number, {"loss", "max_nll", "min_target_prob"}) after each step.
  Raises:
    CachedLastLayerError: min_target_prob outside [0, 1], or a non-finite loss.
  """
  if not 0.0 <= min_target_prob <= 1.0:
    raise CachedLastLayerError(f"min_target_prob must be in [0, 1]; saw {min_target_prob}")
  parts = ModelParts.of(model)
  trained, frozen = partition_params(parts.pure_params(), frozen_parameters(model))
  opt_state = optimizer.init(trained) if opt_state is None else opt_state
  rows = list(rows)

  @jax.jit
  def step(trained, opt_state, frozen, rows):
    def loss_fn(t):
      loss, nll = loss_and_nll(parts.merge(merge_params(t, frozen)), rows)
      return loss, jnp.max(jnp.concatenate(nll))
    (loss, max_nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(trained)
    updates, opt_state = optimizer.update(grads, opt_state, trained)
    return optax.apply_updates(trained, updates), opt_state, loss, max_nll

  threshold = -math.log(min_target_prob) if min_target_prob > 0 else -1.0
  stopped, metrics, n = None, {"loss": float("nan"), "max_nll": float("nan")}, start_step
  while n < max_steps:
    # The metrics are those of the parameters before the update (what the loss saw).
    new_trained, new_state, loss, max_nll = step(trained, opt_state, frozen, rows)
    metrics = {"loss": float(loss), "max_nll": float(max_nll),
               "min_target_prob": math.exp(-float(max_nll))}
    if not math.isfinite(metrics["loss"]):
      raise CachedLastLayerError(f"loss is {metrics['loss']} at step {n}")
    if min_target_prob > 0 and metrics["max_nll"] <= threshold:
      stopped = n                 # the margin holds already: keep these parameters
      break
    trained, opt_state, n = new_trained, new_state, n + 1
    if on_step is not None:
      on_step(n, metrics)
  nnx.update(model, nnx.state(parts.merge(merge_params(trained, frozen)), nnx.Param))
  return FitResult(steps=n, loss=metrics["loss"], max_nll=metrics["max_nll"],
                   min_target_prob=math.exp(-metrics["max_nll"]), stopped_at=stopped,
                   opt_state=opt_state)
