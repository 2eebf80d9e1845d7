"""Flax NNX policy and value models (Qwen3-MoE, Qwen3.5-MoE, dense Qwen3, and the Qwen3-VL
vision-language policy on the dense or MoE backbone), presets and Hugging Face I/O.

Public API (docs/contracts.md "Model API"):

  ModelConfig                      frozen dataclass; dataclasses.replace for overrides;
                                   ModelConfig.from_dict(mapping) / config.to_dict()
  get_preset(name) -> ModelConfig  "tiny", "small", "tiny_qwen3_5", "small_qwen3_5",
                                   "tiny_dense", "qwen3_30b_a3b", "qwen3_5_35b_a3b", "qwen3_4b",
                                   and vision-language "tiny_vl", "small_vl", "qwen3_vl_4b",
                                   "qwen3_vl_30b_a3b"
  CausalLM(config, *, rngs)
    logits, aux = model(input_ids, positions, segment_ids)          # [batch, seq] int32 each
    logits, aux, cache = model(input_ids, positions, segment_ids, cache=cache)
        logits [batch, seq, vocab] float32;
        aux = {"load_balancing_loss": scalar (un-weighted; the trainer adds
               config.router_aux_loss_coef * loss), "expert_load": [num_moe_layers, experts]}
    model.hidden_states(input_ids, positions, segment_ids, *, return_aux=False)
        -> [batch, seq, hidden]  (or (hidden, aux) with return_aux=True)
    model.logits(hidden) -> [..., vocab] float32
    model.head_matrix() -> [hidden, vocab] (the LM head, or the transposed tied embedding)
  next_token_loss(model, input_ids, positions, segment_ids, *, chunk_size=1024)
    -> (mean next-token NLL, aux), with the fused LM-head cross-entropy
  fused_cross_entropy(hidden, head, targets, weights, *, chunk_size=1024) -> weighted NLL sum
    (logits and their gradient one [chunk, vocab] block at a time; models.losses)
    model.init_cache(batch, max_len, dtype=None) -> DecodeCache
  DecodeCache (pytree: lengths [batch] + per-layer AttentionCache / DeltaNetCache), with
    cache.reset_rows(rows_mask) for continuous batching. Fixed shapes: jit- and donate-able.
  ValueModel(config, *, rngs): values = vm(input_ids, positions, segment_ids) [batch, seq]
    float32 logits of P(resolved | prefix); ValueModel.from_policy(policy, *, rngs).
  count_params(config) -> ParamCount(total, active, embedding)    (jax.eval_shape; no memory)
  models.hf.load_pretrained(folder) -> (config, model);
  models.hf.save_pretrained(model, config, folder)
  ModelError (base), ModelConfigError, CheckpointError, CheckpointMismatch.

Semantics: segment_ids 0 = padding; a token attends only to earlier tokens with the same
non-zero segment id; Gated DeltaNet state and conv reset at every segment start. With a cache,
each row is one sequence whose valid tokens in a call are contiguous (right padding for rows
that already hold tokens); see models.cache.

Vision-language models (ModelConfig.vision: VisionConfig; Qwen3-VL): the same CausalLM with
a vision front `model.visual` (models.vision) and two optional call arguments:
    logits, aux = model(input_ids, positions3, segment_ids, images=patches)
  positions3 [batch, seq, 3] int32 multimodal RoPE ids (vision_inputs.mrope_positions; a
  [batch, seq] array means text positions), images an ImagePatches batch
  (vision_inputs.image_patches from the image processor's pixel values and grids) of the
  images whose placeholder runs appear in input_ids, in order. For serving:
    tokens, deepstack = model.encode_images(patches)        # once per image
    visual = model.visual_tokens(input_ids, patches)          # VisualTokens aligned with ids
    logits, aux, cache = model(ids, positions, seg, cache=cache, visual=visual_chunk)
  hidden_states(..., images=patches) likewise.

Additions beyond the contract (none of the contract is changed): `hidden_states` takes
`return_aux` so the trainer gets the load-balancing loss from the same forward; the config's
`moe_dispatch` ("sort" | "ragged" | "dense" | "decode"), `moe_capacity_factor`, `moe_dropless`,
`gdn_chunk_size`, `remat`, `dtype`, `param_dtype` choose how the same math is computed.

Sharding: every parameter carries logical axis names (nnx.Param metadata `logical_axes`);
orchard_jax.parallel maps them to the ("data", "fsdp", "tensor", "expert") mesh and creates
models with parameters already sharded.
"""
from orchard_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache
from orchard_jax.models.config import ModelConfig, VisionConfig
from orchard_jax.models.decoder import CausalLM, Decoder
from orchard_jax.models.errors import (CheckpointError, CheckpointMismatch, ModelConfigError,
                                       ModelError)
from orchard_jax.models.losses import fused_cross_entropy, next_token_loss
from orchard_jax.models.presets import PRESETS, get_preset
from orchard_jax.models.vision_inputs import (ImagePatches, VisualTokens, grid_tokens,
                                              image_patches, mrope_positions)

__all__ = [
    "AttentionCache",
    "CausalLM",
    "CheckpointError",
    "CheckpointMismatch",
    "ModelConfigError",
    "DecodeCache",
    "Decoder",
    "DeltaNetCache",
    "ImagePatches",
    "ModelConfig",
    "ModelError",
    "PRESETS",
    "VisionConfig",
    "VisualTokens",
    "fused_cross_entropy",
    "get_preset",
    "grid_tokens",
    "image_patches",
    "mrope_positions",
    "next_token_loss",
]
