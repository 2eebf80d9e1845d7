"""The decoder stack (Qwen3 / Qwen3-MoE / Qwen3.5-MoE) and the causal language model.

Layer i (pre-norm residual, as transformers' Qwen3MoeDecoderLayer / Qwen3_5MoeDecoderLayer):
  h = h + mixer(RMSNorm(h))        mixer: Attention, or GatedDeltaNet for "linear_attention"
  h = h + ffn(RMSNorm(h))          ffn: MoE for MoE layers, else the SwiGLU MLP
Final RMSNorm, then the LM head (or the tied embedding matrix).

A vision-language config (ModelConfig.vision, Qwen3-VL) adds a vision front (models.vision)
to the same stack, with two hooks here: image tokens replace the placeholder tokens'
embeddings and DeepStack features are added to the outputs of the first layers at those
positions (transformers' Qwen3VLTextModel._deepstack_process), and positions may be 3-D
(temporal, height, width) ids for interleaved multimodal RoPE (layers.mrope_tables).
"""
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from orchard_jax.models.attention import Attention, cache_mask, cache_slots
from orchard_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache
from orchard_jax.models.config import ModelConfig
from orchard_jax.models.errors import ModelError
from orchard_jax.models.gated_deltanet import GatedDeltaNet
from orchard_jax.models.layers import (MLP, RMSNorm, dtype_of, mrope_tables, normal, param,
                                      rope_tables)
from orchard_jax.models.moe import MoE, load_balancing_loss
from orchard_jax.models.vision import VisionEncoder
from orchard_jax.models.vision_inputs import (ImagePatches, VisualTokens, scatter_visual_tokens,
                                              valid_token_mask)
from orchard_jax.parallel.rules import constrain

Aux = dict[str, jax.Array]


class DecoderLayer(nnx.Module):
  """One pre-norm residual block: token mixer then feed-forward."""

  def __init__(self, config: ModelConfig, index: int, *, rngs: nnx.Rngs):
    pdt = dtype_of(config.param_dtype)
    norm = dict(eps=config.rms_norm_eps, zero_centered=config.zero_centered_norm, param_dtype=pdt,
                rngs=rngs)
    self.layer_type = config.layer_type(index)
    self.is_moe = config.is_moe_layer(index)
    self.input_layernorm = RMSNorm(config.hidden_size, **norm)
    self.post_attention_layernorm = RMSNorm(config.hidden_size, **norm)
    if self.layer_type == "linear_attention":
      self.linear_attn = GatedDeltaNet(config, rngs=rngs)
      self.self_attn = None
    else:
      self.self_attn = Attention(config, rngs=rngs)
      self.linear_attn = None
    if self.is_moe:
      self.mlp = MoE(config, rngs=rngs)
    else:
      self.mlp = MLP(config.hidden_size, config.intermediate_size, config=config, rngs=rngs)

  def __call__(self, h: jax.Array, ctx: dict[str, Any], cache=None):
    """h [batch, seq, hidden] -> (h, moe statistics or None, updated layer cache or None)."""
    x = self.input_layernorm(h)
    if self.linear_attn is not None:
      mixed, cache = self.linear_attn(x, ctx["segment_ids"], cache=cache)
    else:
      mixed, cache = self.self_attn(x, ctx["cos"], ctx["sin"], ctx["segment_ids"],
                                    ctx.get("mask"), cache=cache,
                                    write_slots=ctx.get("write_slots"))
    h = h + mixed.astype(h.dtype)
    x = self.post_attention_layernorm(h)
    stats = None
    if self.is_moe:
      y, stats = self.mlp(x, ctx["segment_ids"] != 0)
    else:
      y = self.mlp(x)
    h = h + y.astype(h.dtype)
    return constrain(h, ("batch", "seq", "act_embed")), stats, cache


class Decoder(nnx.Module):
  """Token embedding, decoder layers and final norm: the backbone shared by CausalLM and
  ValueModel."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    pdt = dtype_of(config.param_dtype)
    self.config = config
    self.embed_tokens = param(rngs, normal(config.initializer_range),
                              (config.vocab_size, config.hidden_size), ("vocab", "embed"), pdt)
    self.layers = nnx.List([DecoderLayer(config, i, rngs=rngs)
                            for i in range(config.num_hidden_layers)])
    self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps,
                        zero_centered=config.zero_centered_norm, param_dtype=pdt, rngs=rngs)

  def __call__(self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array, *,
               cache: Optional[DecodeCache] = None, visual: Optional[VisualTokens] = None
               ) -> tuple[jax.Array, Aux, Optional[DecodeCache]]:
    """Runs the backbone.

    Args:
      input_ids, positions, segment_ids: [batch, seq] int32 (see CausalLM.__call__);
        positions may be [batch, seq, 3] multimodal ids for a config with mrope_section.
      cache: decoding state, or None for a full-sequence (training) call.
      visual: image tokens aligned with input_ids (vision-language configs), or None.
    Returns:
      hidden [batch, seq, hidden] after the final norm, aux (see CausalLM), new cache or None.
    """
    cfg = self.config
    _check_inputs(input_ids, positions, segment_ids, cfg)
    if cache is not None and len(cache.layers) != cfg.num_hidden_layers:
      raise ModelError(f"cache has {len(cache.layers)} layers; the model has "
                       f"{cfg.num_hidden_layers} (make it with model.init_cache)")
    dt = dtype_of(cfg.dtype)
    h = jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(dt)
    deepstack = ()
    if visual is not None:
      h = jnp.where(visual.mask[..., None], visual.embeds.astype(dt), h)
      deepstack = visual.deepstack
    h = constrain(h, ("batch", "seq", "act_embed"))
    if positions.ndim == 3:
      cos, sin = mrope_tables(positions, cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section)
    else:
      cos, sin = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta)
    ctx: dict[str, Any] = {"cos": cos, "sin": sin, "segment_ids": segment_ids}
    if cache is not None:
      max_len = cache.max_len
      write_slots, query_slots = cache_slots(cache.lengths, segment_ids, max_len)
      ctx["mask"] = cache_mask(query_slots, max_len)
      ctx["write_slots"] = write_slots

    stats = []
    new_layers = []
    for i, layer in enumerate(self.layers):
      layer_cache = None if cache is None else cache.layers[i]
      if cfg.remat and cache is None:
        h, s, c = nnx.remat(lambda lyr, hh, cc: lyr(hh, cc))(layer, h, ctx)
      else:
        h, s, c = layer(h, ctx, layer_cache)
      if i < len(deepstack):
        h = jnp.where(visual.mask[..., None], h + deepstack[i].astype(h.dtype), h)
      if s is not None:
        stats.append(s)
      new_layers.append(c)
    h = self.norm(h)
    aux = _aux(stats, cfg)
    new_cache = None
    if cache is not None:
      new_cache = DecodeCache(lengths=cache.lengths + jnp.sum(segment_ids != 0, axis=1,
                                                              dtype=jnp.int32),
                              layers=tuple(new_layers))
    return h, aux, new_cache

  def init_cache(self, batch: int, max_len: int, dtype: Optional[str] = None) -> DecodeCache:
    """Empty decoding state for `batch` rows of up to `max_len` tokens each.

    Args:
      batch: rows (independent sequences).
      max_len: attention cache capacity per row, in tokens (prompt + generated).
      dtype: storage dtype of keys, values and conv inputs; default the model's dtype. The
        DeltaNet recurrent state is always float32.
    """
    cfg = self.config
    dt = dtype_of(dtype or cfg.dtype)
    layers = []
    for i in range(cfg.num_hidden_layers):
      if cfg.layer_type(i) == "linear_attention":
        channels = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + (
            cfg.linear_num_value_heads * cfg.linear_value_head_dim)
        layers.append(DeltaNetCache(
            conv=jnp.zeros((batch, cfg.linear_conv_kernel_dim - 1, channels), dt),
            recurrent=jnp.zeros((batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                 cfg.linear_value_head_dim), jnp.float32)))
      else:
        kvh, hd = cfg.num_key_value_heads, cfg.head_dim
        layers.append(AttentionCache(k=jnp.zeros((batch, kvh, hd, max_len), dt),
                                     v=jnp.zeros((batch, kvh, max_len, hd), dt)))
    return DecodeCache(lengths=jnp.zeros((batch,), jnp.int32), layers=tuple(layers))


def _check_inputs(input_ids, positions, segment_ids, cfg: ModelConfig):
  shapes = {"input_ids": input_ids.shape, "positions": positions.shape[:2],
            "segment_ids": segment_ids.shape}
  if len(input_ids.shape) != 2 or len(set(shapes.values())) != 1:
    raise ModelError(f"expected input_ids, positions and segment_ids of one shape [batch, seq]; "
                     f"got {shapes}")
  if positions.ndim == 3 and not (cfg.mrope_section and positions.shape[2] == 3):
    raise ModelError(f"positions of shape {positions.shape}: [batch, seq, 3] multimodal ids need "
                     "a config with mrope_section (a vision-language model); expected [batch, "
                     "seq]")
  if positions.ndim not in (2, 3):
    raise ModelError(f"expected positions [batch, seq] (or [batch, seq, 3]); got "
                     f"{positions.shape}")
  for name, arr in (("input_ids", input_ids), ("positions", positions),
                    ("segment_ids", segment_ids)):
    if not jnp.issubdtype(arr.dtype, jnp.integer):
      raise ModelError(f"expected integer {name}; got dtype {arr.dtype}")


def _aux(stats: list[dict[str, jax.Array]], cfg: ModelConfig) -> Aux:
  if not stats:
    zero = jnp.zeros((), jnp.float32)
    return {"load_balancing_loss": zero,
            "expert_load": jnp.zeros((0, max(cfg.num_experts, 0)), jnp.float32)}
  counts = jnp.stack([s["counts"] for s in stats])
  prob_sum = jnp.stack([s["prob_sum"] for s in stats])
  tokens = jnp.stack([s["tokens"] for s in stats])
  load = counts / jnp.maximum(jnp.sum(counts, axis=-1, keepdims=True), 1.0)
  return {"load_balancing_loss": load_balancing_loss(counts, prob_sum, tokens),
          "expert_load": load}


class CausalLM(nnx.Module):
  """Decoder-only language model: the policy; with ModelConfig.vision, the vision-language
  policy (Qwen3-VL: `visual` holds the vision encoder, merger and DeepStack mergers).

  Call:
    logits, aux = model(input_ids, positions, segment_ids)
    logits, aux, cache = model(input_ids, positions, segment_ids, cache=cache)
    logits, aux = model(input_ids, positions3, segment_ids, images=patches)   # with images
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.visual = VisionEncoder(config, rngs=rngs) if config.vision is not None else None
    self.model = Decoder(config, rngs=rngs)
    if config.tie_word_embeddings:
      self.lm_head = None
    else:
      self.lm_head = param(rngs, normal(config.initializer_range),
                           (config.hidden_size, config.vocab_size), ("embed", "vocab"),
                           dtype_of(config.param_dtype))

  def __call__(self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array, *,
               cache: Optional[DecodeCache] = None, images: Optional[ImagePatches] = None,
               visual: Optional[VisualTokens] = None):
    """Next-token logits.

    Args:
      input_ids: [batch, seq] int32 token ids.
      positions: [batch, seq] int32 RoPE positions (restart at 0 per packed segment); for a
        vision-language model [batch, seq, 3] multimodal position ids
        (vision_inputs.mrope_positions; [batch, seq] means all three equal, as for text).
      segment_ids: [batch, seq] int32; 0 = padding; a token attends only to earlier tokens
        with the same non-zero id, and Gated DeltaNet state and conv reset at every segment
        start. With a cache each row is one sequence (see models.cache).
      cache: decoding state from init_cache (or a previous call), or None.
      images: the images whose placeholders appear in input_ids, in order of appearance
        (row-major over the batch), or None. Vision-language models only.
      visual: image tokens already encoded and aligned with input_ids (`visual_tokens`), as
        the inference engine passes them per prefill chunk; exclusive with images.
    Returns:
      logits [batch, seq, vocab] float32; aux {"load_balancing_loss": scalar float32
      (un-weighted), "expert_load": [num_moe_layers, num_experts] fraction of routed
      assignments per expert}; and the updated cache when one was given.
    Raises:
      ModelError: inputs are not [batch, seq] integer arrays of one shape; images for a
        text-only model.
    """
    visual = self._visual(input_ids, images, visual)
    h, aux, new_cache = self.model(input_ids, positions, segment_ids, cache=cache, visual=visual)
    logits = self.logits(h)
    if cache is None:
      return logits, aux
    return logits, aux, new_cache

  def hidden_states(self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array, *,
                    return_aux: bool = False, images: Optional[ImagePatches] = None):
    """Final-norm hidden states [batch, seq, hidden] (and aux when return_aux), so a trainer
    can compute log-probs chunk by chunk with `logits` without a [batch, seq, vocab] array.
    images as in __call__."""
    visual = self._visual(input_ids, images, None)
    h, aux, _ = self.model(input_ids, positions, segment_ids, visual=visual)
    return (h, aux) if return_aux else h

  def encode_images(self, images: ImagePatches) -> tuple[jax.Array, jax.Array]:
    """Runs the vision front once: (tokens [images, per_image, hidden], deepstack [levels,
    images, per_image, hidden]); rows past an image's token count are padding.

    Raises:
      ModelError: the model has no vision front.
    """
    if self.visual is None:
      raise ModelError("images were given to a text-only model (its config has no vision)")
    return self.visual(images)

  def visual_tokens(self, input_ids: jax.Array, images: ImagePatches) -> VisualTokens:
    """Encodes `images` and places them at input_ids' image placeholders (in order)."""
    tokens, deepstack = self.encode_images(images)
    valid = valid_token_mask(images, self.config.vision.merge_unit)
    return scatter_visual_tokens(input_ids, tokens, deepstack, valid,
                                 self.config.vision.image_token_id)

  def _visual(self, input_ids, images, visual) -> Optional[VisualTokens]:
    if images is not None and visual is not None:
      raise ModelError("pass images or visual, not both")
    if images is not None:
      return self.visual_tokens(input_ids, images)
    if visual is not None and self.visual is None:
      raise ModelError("image tokens were given to a text-only model (its config has no "
                       "vision)")
    return visual

  def head_matrix(self) -> jax.Array:
    """The LM head as a [hidden, vocab] matrix in the compute dtype (the transposed token
    embedding when tie_word_embeddings); what `logits` multiplies by."""
    dt = dtype_of(self.config.dtype)
    if self.lm_head is None:
      return self.model.embed_tokens[...].astype(dt).T
    return self.lm_head[...].astype(dt)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """[..., hidden] -> [..., vocab] float32 (LM head, or the tied embedding)."""
    dt = dtype_of(self.config.dtype)
    w = self.head_matrix()
    out = jnp.einsum("...d,dv->...v", hidden.astype(dt), w, preferred_element_type=jnp.float32)
    if out.ndim == 3:
      out = constrain(out, ("batch", "seq", "act_vocab"))
    return out

  def init_cache(self, batch: int, max_len: int, dtype: Optional[str] = None) -> DecodeCache:
    """Empty DecodeCache for `batch` rows and `max_len` tokens (see Decoder.init_cache)."""
    return self.model.init_cache(batch, max_len, dtype)
