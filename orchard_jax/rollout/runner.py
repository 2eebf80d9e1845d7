"""The engine's jitted model calls: chunked prefill, multi-step decode, cache re-layout.

`ModelRunner` holds the policy as an NNX (graphdef, state) pair and compiles three functions:
  prefill(state, cache, ids [B, C], ...)   one chunk of prompt tokens for some rows, returning
                                           the log-prob of every next prompt token and the
                                           logits at each row's last prompt position;
  decode(state, cache, ...)                `num_steps` one-token steps in a lax.scan, sampling
                                           inside (see sampling.py), for every active row (a
                                           row that samples a stop id freezes);
  sample(logits [B, V], ...)               the first output token after a prefill.
Shapes come from a small set of buckets chosen by the engine (batch rows, prefill chunk, cache
length), so serving compiles once per bucket, never per request. `compile_count` counts traces
(one per new shape or static setting) and is reported by /get_model_info.

Rows are independent sequences in one `DecodeCache` (models/cache.py): a call leaves a row
untouched where its segment_ids are 0, so prefill of new rows and decode of running rows use the
same cache (continuous batching).

Several schedulers (the engine's data parallelism) call one runner from their own threads, each
with its own cache. JAX traces and compiles a jitted function once even when two threads first
call it with the same shapes at the same moment (the second waits for the first), so
`compile_count` stays exact; execution is asynchronous, so the programs run side by side.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard_jax.rollout.errors import WeightUpdateError
from orchard_jax.rollout.sampling import (
  SamplingMode, logprob_temperature, row_keys, sample_next, top_logprobs)


class ModelRunner:
  """Compiled forward passes of one policy model over a shared decode cache.

  Args:
    model: a `models.CausalLM` (any NNX module with the docs/contracts.md call signature
      `model(ids, positions, segment_ids, cache=cache) -> (logits, aux, cache)` and
      `model.init_cache(batch, max_len)`).
    decode_moe_dispatch: MoE dispatch path for decode steps ("dense", "sort", "ragged"; see
      ModelConfig.moe_dispatch), or None to keep the model's. A decode step routes one token
      per row, where "sort"'s per-expert capacity buffers are mostly empty; the same math runs
      through another path (results equal up to float rounding). Prefill keeps the model's.

  Attributes:
    compile_count: number of traces of the jitted functions so far.
  """

  def __init__(self, model: nnx.Module, decode_moe_dispatch: Optional[str] = None,
               image_cache_bytes: int = 1 << 30):
    self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)
    self.decode_graphdef = self.graphdef
    config = getattr(model, "config", None)
    self.config = config
    if (decode_moe_dispatch and config is not None and getattr(config, "num_experts", 0)
        and config.moe_dispatch != decode_moe_dispatch):
      twin_config = dataclasses.replace(config, moe_dispatch=decode_moe_dispatch)
      twin = nnx.eval_shape(lambda: type(model)(twin_config, rngs=nnx.Rngs(0)))
      self.decode_graphdef = nnx.split(twin, nnx.Param, ...)[0]
    self._model_for_cache = model
    self.compile_count = 0
    self._lock = threading.Lock()
    self._prefill = jax.jit(self._prefill_impl,
                            static_argnames=("top_k_num", "prompt_logprobs"),
                            donate_argnums=(1,))
    self._decode = jax.jit(self._decode_impl,
                           static_argnames=("num_steps", "mode", "top_k_num"),
                           donate_argnums=(1,))
    self._sample = jax.jit(self._sample_impl, static_argnames=("mode", "top_k_num"))
    self._reset = jax.jit(self._reset_impl, donate_argnums=(0,))
    self._truncate = jax.jit(self._truncate_impl, donate_argnums=(0,))
    # A vision-language model's image encoder and feature cache (rollout.multimodal).
    self.vision = None
    if getattr(config, "vision", None) is not None:
      from orchard_jax.rollout.multimodal import ImageEncoder
      self.vision = ImageEncoder(self, image_cache_bytes)

  # ------------------------------------------------------------------ weights

  def swap_params(self, params: Any) -> None:
    """Replace the model's parameters.

    Args:
      params: an `nnx.State` of the model's nnx.Param variables (`nnx.state(model, nnx.Param)`)
        or the same as a pure dict (`nnx.to_pure_dict(...)`, what the trainer holds).
    Raises:
      WeightUpdateError: a parameter is missing or extra, or its shape or dtype differs.
    """
    if isinstance(params, nnx.State):
      params = nnx.to_pure_dict(params)
    template = nnx.to_pure_dict(self.params)
    old = dict(_flatten(template))
    new = dict(_flatten(params))
    missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if missing or extra:
      raise WeightUpdateError(
        f"new weights do not match the served model: missing {missing[:5]}, unexpected "
        f"{extra[:5]} ({len(missing)} missing, {len(extra)} unexpected)")
    for path, value in new.items():
      ref = old[path]
      if tuple(np.shape(value)) != tuple(ref.shape):
        raise WeightUpdateError(
          f"parameter {path} has shape {tuple(np.shape(value))} in the new weights and "
          f"{tuple(ref.shape)} in the served model")
    placed = _rebuild(template, new)
    state = jax.tree.map(lambda x: x, self.params)
    nnx.replace_by_pure_dict(state, placed)
    self.params = state
    if self.vision is not None:
      self.vision.clear()      # image features came from the old weights

  # ------------------------------------------------------------------ cache

  def init_cache(self, batch: int, max_len: int) -> Any:
    """A fresh cache of `batch` rows and `max_len` positions."""
    return self._model_for_cache.init_cache(batch, max_len)

  def reset_rows(self, cache: Any, rows: np.ndarray) -> Any:
    """Empty the rows where `rows` [batch] bool is True, in place of a new request."""
    return self._reset(cache, jnp.asarray(rows))

  def truncate_rows(self, cache: Any, keep: np.ndarray) -> Any:
    """Shorten each row b to its first keep[b] tokens (prefix cache reuse).

    Args:
      keep: [batch] int; a row keeps min(keep[b], its length) tokens, so a large value leaves
        it unchanged and 0 empties it (DeltaNet state zeroed, as reset_rows). Attention entries
        beyond the new length stay in place but are never read (masked by `lengths`) and are
        overwritten by the row's next tokens. A recurrent (DeltaNet) state cannot be rolled
        back: the caller keeps such a row whole or empties it.
    """
    return self._truncate(cache, jnp.asarray(keep, dtype=jnp.int32))

  def relayout(self, cache: Any, rows: np.ndarray, batch: int, max_len: int) -> Any:
    """A cache of shape (batch, max_len) whose row i is old row rows[i] (rows[i] < 0: empty).

    Every leaf has the batch on axis 0; attention leaves hold positions on their max_len axis
    (keys [batch, kv_heads, head_dim, max_len], values [batch, kv_heads, max_len, head_dim];
    models.AttentionCache), the only axis whose size differs between the old and new cache.
    Positions beyond a row's length are never read, so cutting or zero-padding that axis is
    safe as long as max_len covers every kept row's length.
    """
    fresh = self.init_cache(batch, max_len)
    take = jnp.asarray(np.where(rows >= 0, rows, 0), dtype=jnp.int32)

    def move(new, old):
      if getattr(old, "ndim", 0) == 0:
        return new
      picked = old[take]
      index = tuple(slice(0, min(a, b)) for a, b in zip(new.shape, picked.shape))
      return new.at[index].set(picked[index].astype(new.dtype))

    moved = jax.tree.map(move, fresh, cache)
    return moved.reset_rows(jnp.asarray(rows < 0))

  # ------------------------------------------------------------------ compiled steps

  def _count_trace(self) -> None:
    with self._lock:
      self.compile_count += 1

  def _reset_impl(self, cache, rows):
    self._count_trace()
    return cache.reset_rows(rows)

  def _truncate_impl(self, cache, keep):
    self._count_trace()
    cache = cache.reset_rows(keep <= 0)
    return cache.replace(lengths=jnp.minimum(cache.lengths, keep))

  def _prefill_impl(self, params, cache, ids, positions, segment_ids, next_ids, last_col,
                    visual, temperature, *, top_k_num: int, prompt_logprobs: bool):
    self._count_trace()
    model = nnx.merge(self.graphdef, params, self.rest)
    rows = jnp.arange(ids.shape[0])
    # Image tokens (vision-language models) are passed only to chunks that hold some.
    extra = {} if visual is None else {"visual": visual}
    if not prompt_logprobs and _has_lm_head(model):
      # Only the last column's logits are needed: the LM head runs on [batch, hidden] instead
      # of [batch, chunk, hidden] (for a small model it is most of a prefill's work).
      hidden, _, cache = model.model(ids, positions, segment_ids, cache=cache, **extra)
      return cache, {"last_logits": model.logits(hidden[rows, last_col]).astype(jnp.float32)}
    logits, _, cache = model(ids, positions, segment_ids, cache=cache, **extra)
    logits = logits.astype(jnp.float32)
    last_logits = logits[rows, last_col]
    # Prompt log-probs of each row's distribution: logits / its log-prob temperature.
    logp = jax.nn.log_softmax(logits / logprob_temperature(temperature)[:, None, None], axis=-1)
    next_lp = jnp.take_along_axis(logp, next_ids[..., None], axis=-1)[..., 0]
    out = {"next_logprobs": next_lp, "last_logits": last_logits}
    if top_k_num:
      values, top_ids = jax.lax.top_k(logp, min(top_k_num, logp.shape[-1]))
      out["top_values"], out["top_ids"] = values, top_ids.astype(jnp.int32)
    return cache, out

  def _sample_impl(self, logits, seeds, positions, temperature, top_k, top_p, min_p, *,
                   mode: SamplingMode, top_k_num: int):
    self._count_trace()
    keys = row_keys(seeds, positions)
    tokens, lp = sample_next(logits, keys, temperature, top_k, top_p, min_p, mode)
    out = {"tokens": tokens, "logprobs": lp}
    if top_k_num:
      out["top_values"], out["top_ids"] = top_logprobs(logits, top_k_num, temperature)
    return out

  def _decode_impl(self, params, cache, tokens, positions, remaining, stop_ids, seeds,
                   temperature, top_k, top_p, min_p, rope_offset, *, num_steps: int,
                   mode: SamplingMode, top_k_num: int):
    self._count_trace()
    model = nnx.merge(self.decode_graphdef, params, self.rest)

    def step(carry, s):
      cache, tok, pos, stopped = carry
      # A row that sampled one of its stop ids stays frozen for the rest of the call, so its
      # cache holds exactly prompt + output[:-1] (the prefix cache reuses it).
      active = (s < remaining) & ~stopped
      # RoPE positions: token index + the row's M-RoPE offset (0 for text); sampling keys
      # stay on the token index.
      logits, _, cache = model(tok[:, None], (pos + rope_offset)[:, None],
                               active[:, None].astype(jnp.int32), cache=cache)
      logits = logits[:, 0].astype(jnp.float32)
      keys = row_keys(seeds, pos + 1)
      new_tok, lp = sample_next(logits, keys, temperature, top_k, top_p, min_p, mode)
      out = {"tokens": new_tok, "logprobs": lp}
      if top_k_num:
        out["top_values"], out["top_ids"] = top_logprobs(logits, top_k_num, temperature)
      tok = jnp.where(active, new_tok, tok)
      pos = jnp.where(active, pos + 1, pos)
      stopped = stopped | (active & jnp.any(new_tok[:, None] == stop_ids, axis=-1))
      return (cache, tok, pos, stopped), out

    carry = (cache, tokens, positions, jnp.zeros(tokens.shape, bool))
    (cache, _, _, _), outs = jax.lax.scan(step, carry, jnp.arange(num_steps))
    # scan stacks on axis 0: [steps, batch, ...] -> [batch, steps, ...]
    outs = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), outs)
    return cache, outs

  # ------------------------------------------------------------------ host-facing calls

  def prefill(self, cache, ids: np.ndarray, positions: np.ndarray, segment_ids: np.ndarray,
              next_ids: np.ndarray, last_col: np.ndarray, top_k_num: int = 0,
              prompt_logprobs: bool = True, visual: Any = None,
              temperature: Optional[np.ndarray] = None):
    """One prefill chunk. Arrays are [batch, chunk] int32 (last_col [batch]); positions
    [batch, chunk, 3] for a vision-language model.

    Args:
      prompt_logprobs: compute the prompt tokens' log-probs (scoring, input_token_logprobs);
        False computes logits at last_col only.
      visual: the chunk's image tokens (models.VisualTokens, rollout.multimodal.chunk_visual),
        or None.
      temperature: [batch] float32 sampling temperature of each row: prompt log-probs are of
        logits / logprob_temperature(temperature) (sampling.py); None is 1 for every row.
    Returns:
      (cache, out) with out["last_logits"] [batch, vocab] (raw) at column last_col[b], and
      when prompt_logprobs out["next_logprobs"] [batch, chunk] = log p_T(next_ids[b, c] |
      tokens up to column c) and, when top_k_num > 0, out["top_values"], out["top_ids"]
      [batch, chunk, k].
    """
    if visual is not None:
      visual = jax.tree.map(jnp.asarray, visual)
    if temperature is None:
      temperature = np.ones(ids.shape[0], np.float32)
    return self._prefill(self.params, cache, jnp.asarray(ids), jnp.asarray(positions),
                         jnp.asarray(segment_ids), jnp.asarray(next_ids),
                         jnp.asarray(last_col), visual, jnp.asarray(temperature, jnp.float32),
                         top_k_num=top_k_num if prompt_logprobs else 0,
                         prompt_logprobs=prompt_logprobs)

  def sample(self, logits, seeds, positions, temperature, top_k, top_p, min_p, *,
             mode: SamplingMode, top_k_num: int = 0):
    """Sample one token per row from [batch, vocab] logits (see sampling.sample_next)."""
    return self._sample(logits, jnp.asarray(seeds), jnp.asarray(positions),
                        jnp.asarray(temperature), jnp.asarray(top_k), jnp.asarray(top_p),
                        jnp.asarray(min_p), mode=mode, top_k_num=top_k_num)

  def decode(self, cache, tokens, positions, remaining, seeds, temperature, top_k, top_p, min_p,
             *, num_steps: int, mode: SamplingMode, top_k_num: int = 0,
             stop_ids: Optional[np.ndarray] = None, rope_offset: Optional[np.ndarray] = None):
    """`num_steps` decode steps for every row with remaining > step that has not stopped.

    Args:
      tokens: [batch] int32 last token of each row (not yet in the cache), at `positions`.
      remaining: [batch] int32 tokens each row may still generate (0 = inactive row).
      stop_ids: [batch, n] int32 stop token ids of each row, padded with -1 (None: no stops).
        A row that samples one stops for the rest of the call: the stop token is returned but
        never fed, so the row's cache holds exactly its prompt and output but the last token.
      rope_offset: [batch] int32 added to the positions for RoPE only (a vision-language
        row's M-RoPE offset after its images; None: zeros).
    Returns:
      (cache, out) with out["tokens"], out["logprobs"] [batch, num_steps] and, when
      top_k_num > 0, out["top_values"], out["top_ids"] [batch, num_steps, k].
    """
    if stop_ids is None:
      stop_ids = np.full((len(tokens), 1), -1, np.int32)
    if rope_offset is None:
      rope_offset = np.zeros(len(tokens), np.int32)
    return self._decode(self.params, cache, jnp.asarray(tokens), jnp.asarray(positions),
                        jnp.asarray(remaining), jnp.asarray(stop_ids, dtype=jnp.int32),
                        jnp.asarray(seeds), jnp.asarray(temperature),
                        jnp.asarray(top_k), jnp.asarray(top_p), jnp.asarray(min_p),
                        jnp.asarray(rope_offset, dtype=jnp.int32),
                        num_steps=num_steps, mode=mode, top_k_num=top_k_num)


def _has_lm_head(model: Any) -> bool:
  """The model exposes its backbone (`model.model(...) -> (hidden, aux, cache)`) and
  `model.logits(hidden)`, as models.CausalLM does."""
  return callable(getattr(model, "model", None)) and callable(getattr(model, "logits", None))


def bucket(value: int, buckets: tuple[int, ...]) -> Optional[int]:
  """The smallest bucket >= value, or None when value exceeds the largest."""
  for b in buckets:
    if b >= value:
      return b
  return None


def _flatten(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
  if isinstance(tree, dict):
    out = []
    for key, value in tree.items():
      out.extend(_flatten(value, f"{prefix}/{key}" if prefix else str(key)))
    return out
  return [(prefix, tree)]


def _rebuild(template: Any, flat: dict[str, Any], prefix: str = "") -> Any:
  """`template`'s tree with each leaf replaced by flat[path], cast and placed like the leaf."""
  if isinstance(template, dict):
    return {k: _rebuild(v, flat, f"{prefix}/{k}" if prefix else str(k))
            for k, v in template.items()}
  value = jnp.asarray(flat[prefix], dtype=template.dtype)
  sharding = getattr(template, "sharding", None)
  if sharding is None or not getattr(template, "committed", True):
    # An uncommitted leaf stays uncommitted: jit keys its compiled programs on commitment,
    # so committing here recompiled every engine program after the first weight update.
    return value
  return jax.device_put(value, sharding)
