"""Hugging Face checkpoints (config.json + *.safetensors) <-> orchard_jax models, both ways.

Reads what transformers writes and what the Qwen releases publish:
  - model_type "qwen3", "qwen3_moe", "qwen3_5_moe_text", and the composite "qwen3_5_moe"
    (text_config is used; "model.language_model." weights are read, vision and MTP weights
    skipped);
  - the vision-language "qwen3_vl" (Qwen3-VL-4B ...: dense text model) and "qwen3_vl_moe"
    (Qwen3-VL-30B-A3B ...: MoE text model), vision tower included (ModelConfig.vision);
  - experts per expert or fused, in either orientation (models.hf_layout);
  - one model.safetensors or shards listed by model.safetensors.index.json.
Writes sharded safetensors with an index when larger than `max_shard_bytes`, with a
config.json that transformers' AutoConfig / AutoModelForCausalLM (or, for vision-language
models, AutoModelForImageTextToText) load: Qwen3ForCausalLM, Qwen3MoeForCausalLM,
Qwen3_5MoeForCausalLM, Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration.
Which tensor makes which parameter, and the layout conversions, are in models.hf_layout.
"""
import json
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from orchard_jax.models.config import ModelConfig, VisionConfig
from orchard_jax.models.decoder import CausalLM
from orchard_jax.models.errors import CheckpointError, CheckpointMismatch, ModelConfigError
from orchard_jax.models.hf_layout import layout

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_SKIP_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.vision_tower.")

# ---------------------------------------------------------------------------------------------
# config.json


def config_from_hf(hf: dict[str, Any], **overrides) -> ModelConfig:
  """ModelConfig from a transformers config.json dict (qwen3, qwen3_moe, qwen3_5_moe[_text],
  qwen3_vl, qwen3_vl_moe).

  Args:
    hf: the parsed config.json.
    **overrides: ModelConfig fields to set (e.g. dtype="float32", moe_dispatch="ragged").
  Raises:
    ModelConfigError: an unsupported model type or feature (attention bias, sliding window, RoPE
      scaling, an activation other than silu).
  """
  model_type = hf.get("model_type")
  if model_type in ("qwen3_vl", "qwen3_vl_moe"):
    return _vl_config_from_hf(hf, **overrides)
  tie = hf.get("tie_word_embeddings", False)
  if model_type == "qwen3_5_moe":
    tie = hf.get("tie_word_embeddings", hf.get("text_config", {}).get("tie_word_embeddings",
                                                                         False))
    hf = dict(hf.get("text_config") or {})
    model_type = "qwen3_5_moe_text"
    hf.setdefault("tie_word_embeddings", tie)
  arch = {"qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen3_5_moe_text": "qwen3_5_moe"}.get(
      model_type)
  if arch is None:
    raise ModelConfigError(f"config.json model_type {model_type!r} is not supported; expected "
                           "one of qwen3, qwen3_moe, qwen3_5_moe, qwen3_5_moe_text, qwen3_vl, "
                           "qwen3_vl_moe")
  if hf.get("hidden_act", "silu") != "silu":
    raise ModelConfigError(f"hidden_act {hf['hidden_act']!r} is not supported; expected 'silu'")
  if hf.get("attention_bias", False):
    raise ModelConfigError("attention_bias=true is not supported; expected false (all Qwen3 "
                           "releases)")
  if hf.get("use_sliding_window", False):
    raise ModelConfigError("use_sliding_window=true is not supported; expected false")
  rope = dict(hf.get("rope_parameters") or {})
  legacy_scaling = hf.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", legacy_scaling.get("rope_type", legacy_scaling.get("type",
                                                                                     "default")))
  if rope_type not in ("default", None):
    raise ModelConfigError(f"rope_type {rope_type!r} is not supported; expected 'default'")
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
  partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor",
                                                       0.25 if arch == "qwen3_5_moe" else 1.0))
  num_layers = hf["num_hidden_layers"]
  heads = hf["num_attention_heads"]
  values = dict(
      architecture=arch, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_hidden_layers=num_layers, num_attention_heads=heads,
      num_key_value_heads=hf.get("num_key_value_heads", heads),
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      intermediate_size=hf.get("intermediate_size", 0) or 0,
      rope_theta=float(theta), partial_rotary_factor=float(partial),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_word_embeddings=bool(tie),
      max_position_embeddings=hf.get("max_position_embeddings", 32768),
      initializer_range=hf.get("initializer_range", 0.02),
      router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))
  if arch == "qwen3":
    values.update(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0)
  else:
    values.update(
        num_experts=hf.get("num_experts", hf.get("num_local_experts")),
        num_experts_per_tok=hf["num_experts_per_tok"],
        moe_intermediate_size=hf["moe_intermediate_size"],
        norm_topk_prob=True if arch == "qwen3_5_moe" else bool(hf.get("norm_topk_prob", False)))
  if arch == "qwen3_moe":
    values.update(decoder_sparse_step=hf.get("decoder_sparse_step", 1),
                  mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()))
  if arch == "qwen3_5_moe":
    layer_types = hf.get("layer_types")
    if not layer_types:
      interval = hf.get("full_attention_interval", 4)
      layer_types = ["linear_attention" if (i + 1) % interval else "full_attention"
                     for i in range(num_layers)]
    values.update(
        layer_types=tuple(layer_types),
        shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0),
        linear_num_key_heads=hf["linear_num_key_heads"],
        linear_num_value_heads=hf["linear_num_value_heads"],
        linear_key_head_dim=hf["linear_key_head_dim"],
        linear_value_head_dim=hf["linear_value_head_dim"],
        linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4))
  dtype = hf.get("dtype", hf.get("torch_dtype"))
  if dtype in ("float32", "bfloat16", "float16"):
    values.update(dtype=dtype, param_dtype=dtype)
  values.update(overrides)
  return ModelConfig(**values)


def _vl_config_from_hf(hf: dict[str, Any], **overrides) -> ModelConfig:
  """A Qwen3-VL composite config: text_config (qwen3_vl_text / qwen3_vl_moe_text) as the
  qwen3 / qwen3_moe backbone, vision_config, the vision token ids, interleaved M-RoPE."""
  moe = hf["model_type"] == "qwen3_vl_moe"
  text = dict(hf.get("text_config") or {})
  rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
  section = rope.get("mrope_section")
  if not section:
    raise ModelConfigError("a qwen3_vl config.json without text_config.rope_parameters."
                           "mrope_section; expected e.g. [24, 20, 20]")
  text["model_type"] = "qwen3_moe" if moe else "qwen3"
  # The composite's tie_word_embeddings is the one transformers applies to lm_head.
  text["tie_word_embeddings"] = hf.get("tie_word_embeddings", False)
  if moe:
    text["norm_topk_prob"] = True        # Qwen3VLMoeTextTopKRouter always renormalises
  dtype = text.get("dtype") or hf.get("dtype") or hf.get("torch_dtype")
  if dtype:
    text["dtype"] = dtype
  vision = dict(hf.get("vision_config") or {})
  act = vision.get("hidden_act", "gelu_pytorch_tanh")
  vrope = dict(vision.get("rope_parameters") or {})
  defaults = VisionConfig()
  try:
    vc = VisionConfig(
        depth=vision.get("depth", defaults.depth),
        hidden_size=vision.get("hidden_size", defaults.hidden_size),
        intermediate_size=vision.get("intermediate_size", defaults.intermediate_size),
        num_heads=vision.get("num_heads", defaults.num_heads),
        in_channels=vision.get("in_channels", 3),
        patch_size=vision.get("patch_size", 16),
        temporal_patch_size=vision.get("temporal_patch_size", 2),
        spatial_merge_size=vision.get("spatial_merge_size", 2),
        out_hidden_size=vision.get("out_hidden_size", text.get("hidden_size")),
        num_position_embeddings=vision.get("num_position_embeddings", 2304),
        deepstack_visual_indexes=tuple(vision.get("deepstack_visual_indexes", (8, 16, 24))),
        hidden_act=act, rope_theta=float(vrope.get("rope_theta", 10000.0)),
        initializer_range=vision.get("initializer_range", 0.02),
        image_token_id=hf.get("image_token_id", defaults.image_token_id),
        video_token_id=hf.get("video_token_id", defaults.video_token_id),
        vision_start_token_id=hf.get("vision_start_token_id", defaults.vision_start_token_id),
        vision_end_token_id=hf.get("vision_end_token_id", defaults.vision_end_token_id))
  except TypeError as e:
    raise ModelConfigError(f"qwen3_vl vision_config is malformed: {e}") from e
  return config_from_hf(text, vision=vc, mrope_section=tuple(section), **overrides)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
  """transformers config.json dict for `config` (the CausalLM class of its architecture, or
  Qwen3VL(Moe)ForConditionalGeneration for a vision-language config)."""
  if config.vision is not None:
    return _vl_config_to_hf(config)
  c = config
  out: dict[str, Any] = dict(
      vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
      head_dim=c.head_dim, intermediate_size=c.intermediate_size, hidden_act="silu",
      max_position_embeddings=c.max_position_embeddings, initializer_range=c.initializer_range,
      rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings,
      attention_bias=False, attention_dropout=0.0, dtype=c.param_dtype, use_cache=True,
      rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta})
  if c.architecture == "qwen3":
    out.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], use_sliding_window=False,
               sliding_window=None, layer_types=["full_attention"] * c.num_hidden_layers)
  elif c.architecture == "qwen3_moe":
    out.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
               use_sliding_window=False, sliding_window=None, num_experts=c.num_experts,
               num_experts_per_tok=c.num_experts_per_tok,
               moe_intermediate_size=c.moe_intermediate_size, norm_topk_prob=c.norm_topk_prob,
               decoder_sparse_step=c.decoder_sparse_step,
               mlp_only_layers=list(c.mlp_only_layers),
               router_aux_loss_coef=c.router_aux_loss_coef, output_router_logits=False)
  else:
    out["rope_parameters"]["partial_rotary_factor"] = c.partial_rotary_factor
    out.update(model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"],
               layer_types=[c.layer_type(i) for i in range(c.num_hidden_layers)],
               num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
               moe_intermediate_size=c.moe_intermediate_size,
               shared_expert_intermediate_size=c.shared_expert_intermediate_size,
               linear_num_key_heads=c.linear_num_key_heads,
               linear_num_value_heads=c.linear_num_value_heads,
               linear_key_head_dim=c.linear_key_head_dim,
               linear_value_head_dim=c.linear_value_head_dim,
               linear_conv_kernel_dim=c.linear_conv_kernel_dim,
               router_aux_loss_coef=c.router_aux_loss_coef, output_router_logits=False)
  return out


def _vl_config_to_hf(config: ModelConfig) -> dict[str, Any]:
  c, v = config, config.vision
  moe = c.architecture == "qwen3_moe"
  text: dict[str, Any] = dict(
      model_type="qwen3_vl_moe_text" if moe else "qwen3_vl_text", vocab_size=c.vocab_size,
      hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
      head_dim=c.head_dim, intermediate_size=c.intermediate_size, hidden_act="silu",
      max_position_embeddings=c.max_position_embeddings, initializer_range=c.initializer_range,
      rms_norm_eps=c.rms_norm_eps, attention_bias=False, attention_dropout=0.0,
      dtype=c.param_dtype, use_cache=True, tie_word_embeddings=c.tie_word_embeddings,
      rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                       "mrope_section": list(c.mrope_section), "mrope_interleaved": True})
  if moe:
    text.update(num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                moe_intermediate_size=c.moe_intermediate_size,
                decoder_sparse_step=c.decoder_sparse_step,
                mlp_only_layers=list(c.mlp_only_layers),
                router_aux_loss_coef=c.router_aux_loss_coef)
  vision = dict(
      model_type="qwen3_vl_moe_vision" if moe else "qwen3_vl_vision", depth=v.depth,
      hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_heads=v.num_heads,
      in_channels=v.in_channels, patch_size=v.patch_size,
      temporal_patch_size=v.temporal_patch_size, spatial_merge_size=v.spatial_merge_size,
      out_hidden_size=v.out_hidden_size, num_position_embeddings=v.num_position_embeddings,
      deepstack_visual_indexes=list(v.deepstack_visual_indexes), hidden_act=v.hidden_act,
      initializer_range=v.initializer_range,
      rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
  return dict(
      model_type="qwen3_vl_moe" if moe else "qwen3_vl",
      architectures=["Qwen3VLMoeForConditionalGeneration" if moe
                     else "Qwen3VLForConditionalGeneration"],
      text_config=text, vision_config=vision, tie_word_embeddings=c.tie_word_embeddings,
      image_token_id=v.image_token_id, video_token_id=v.video_token_id,
      vision_start_token_id=v.vision_start_token_id, vision_end_token_id=v.vision_end_token_id,
      dtype=c.param_dtype)


# ---------------------------------------------------------------------------------------------
# tensors <-> params


def _to_host(value: jax.Array) -> np.ndarray:
  """A parameter as one numpy array on this host.

  A parameter sharded across hosts (multi-host FSDP) is not addressable from one process:
  it is gathered with multihost_utils.process_allgather, a collective that every process
  must reach (so every process calls params_to_hf / save_pretrained, see save_pretrained).
  """
  if getattr(value, "is_fully_addressable", True):
    return np.asarray(jax.device_get(value))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def params_to_hf(model: CausalLM) -> dict[str, np.ndarray]:
  """The model's parameters as transformers-named numpy arrays (models.hf_layout).

  On a multi-host mesh every process must call this (parameters sharded across hosts are
  gathered collectively); each gets the full arrays.
  """
  flat = {tuple(p): _to_host(v[...])
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  out: dict[str, np.ndarray] = {}
  for rule in layout(model.config):
    for name, tensor in zip(rule.names, rule.export(flat)):
      out[name] = np.ascontiguousarray(tensor)
  return out


class _TensorReader:
  """Random access to the tensors of a checkpoint folder (single file or sharded index).

  Names are transformers' for the text model ("model.layers...."; a composite checkpoint's
  "model.language_model." is read as "model.", its vision and MTP tensors skipped), or, with
  `multimodal`, exactly as stored (a Qwen3-VL model reads its vision tower too).
  """

  def __init__(self, folder: str, multimodal: bool = False):
    index_path = os.path.join(folder, _INDEX)
    if os.path.exists(index_path):
      with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    else:
      files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors"))
      if not files:
        raise CheckpointError(f"no *.safetensors files in {folder!r}")
      weight_map = {}
      for file in files:
        with safe_open(os.path.join(folder, file), "numpy") as f:
          weight_map.update({k: file for k in f.keys()})
    self.folder = folder
    self.weight_map: dict[str, tuple[str, str]] = {}   # our name -> (file, stored name)
    for stored, file in weight_map.items():
      if multimodal:
        self.weight_map[stored] = (file, stored)
        continue
      if stored.startswith(_SKIP_PREFIXES):
        continue
      name = stored
      if name.startswith("model.language_model."):
        name = "model." + name[len("model.language_model."):]
      elif name.startswith("language_model."):
        name = name[len("language_model."):]
      self.weight_map[name] = (file, stored)
    self._handles: dict[str, Any] = {}

  def names(self) -> set[str]:
    return set(self.weight_map)

  def get(self, name: str) -> np.ndarray:
    if name not in self.weight_map:
      raise CheckpointMismatch(f"tensor {name!r} is missing from the checkpoint in "
                               f"{self.folder!r}")
    file, original = self.weight_map[name]
    if file not in self._handles:
      self._handles[file] = safe_open(os.path.join(self.folder, file), "numpy")
    return self._handles[file].get_tensor(original)


def load_pretrained(folder: str, *, mesh: Optional[jax.sharding.Mesh] = None,
                    **config_overrides) -> tuple[ModelConfig, CausalLM]:
  """Reads a transformers checkpoint folder into a CausalLM.

  Args:
    folder: contains config.json and model.safetensors or sharded *.safetensors (with
      model.safetensors.index.json).
    mesh: when given, each parameter is placed with its NamedSharding on this mesh
      (parallel.rules), one tensor at a time.
    **config_overrides: ModelConfig fields to set, e.g. dtype="float32".
  Returns:
    (config, model).
  Raises:
    CheckpointError: the folder has no config.json or no safetensors.
    CheckpointMismatch: a tensor is missing, unexpected or of the wrong shape.
    ModelConfigError: the architecture is not supported.
  """
  config_path = os.path.join(folder, "config.json")
  if not os.path.exists(config_path):
    raise CheckpointError(f"no config.json in {folder!r}")
  with open(config_path) as f:
    config = config_from_hf(json.load(f), **config_overrides)
  reader = _TensorReader(folder, multimodal=config.vision is not None)
  model = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  load_params(model, reader, mesh=mesh)
  return config, model


def load_params(model: CausalLM, source, *, mesh: Optional[jax.sharding.Mesh] = None) -> None:
  """Fills `model`'s parameters (in place) from a checkpoint folder or _TensorReader.

  The model may be abstract (nnx.eval_shape); every parameter is replaced.
  """
  config = model.config
  reader = source if isinstance(source, _TensorReader) else _TensorReader(
      source, multimodal=config.vision is not None)
  names = reader.names()
  fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
  rules = layout(config, fused_experts=fused)
  expected = {n for r in rules for n in r.names}
  unexpected = sorted(names - expected)
  if unexpected:
    raise CheckpointMismatch(f"checkpoint has {len(unexpected)} tensors the "
                             f"{config.architecture} model does not use, e.g. {unexpected[:3]}")
  state = nnx.state(model, nnx.Param)
  flat = dict(nnx.to_flat_state(state))
  from orchard_jax.parallel.rules import logical_to_spec
  for rule in rules:
    var = flat[rule.path]
    tensors = [reader.get(n) for n in rule.names]
    try:
      arr = rule.to_ours(tensors)
    except ValueError:            # a reshape that cannot work: the sizes disagree
      arr = None
    if arr is None or tuple(arr.shape) != tuple(var.shape):
      seen = tuple(arr.shape) if arr is not None else f"from {tuple(tensors[0].shape)}"
      raise CheckpointMismatch(
          f"parameter {'/'.join(map(str, rule.path))} has shape {seen} in the checkpoint "
          f"({', '.join(rule.names[:2])}) and {tuple(var.shape)} in the model")
    arr = np.asarray(arr).astype(var.dtype)
    if mesh is not None:
      spec = logical_to_spec(var.get_metadata().get("logical_axes") or (None,) * arr.ndim,
                             mesh_shape=dict(mesh.shape), shape=arr.shape)
      value = jax.device_put(arr, jax.sharding.NamedSharding(mesh, spec))
    else:
      value = jnp.asarray(arr)
    var.set_value(value)
  nnx.update(model, state)


def save_pretrained(model: CausalLM, config: ModelConfig, folder: str, *,
                    max_shard_bytes: int = 5 * 2 ** 30,
                    write: Optional[bool] = None) -> list[str]:
  """Writes config.json and safetensors that transformers loads (see module docstring).

  Multi-host: call it on every process (parameters sharded across hosts are gathered with a
  collective); only the writing process (process 0 by default) touches the folder.

  Args:
    model: the CausalLM to save (params are fetched to host).
    config: its config (must equal model.config).
    folder: created if missing.
    max_shard_bytes: split into model-0000i-of-0000n.safetensors + index above this size.
    write: whether this process writes the files; None: jax.process_index() == 0.
  Returns:
    The safetensors file names written (empty on a process that does not write).
  Raises:
    ModelConfigError: config differs from the model's.
  """
  if config != model.config:
    raise ModelConfigError("save_pretrained: config differs from model.config")
  hf_tensors = params_to_hf(model)                 # collective on a multi-host mesh
  if not (jax.process_index() == 0 if write is None else write):
    return []
  os.makedirs(folder, exist_ok=True)
  # safetensors writes raw buffers: every tensor must be C-contiguous.
  tensors = {k: np.ascontiguousarray(v) for k, v in hf_tensors.items()}
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config_to_hf(config), f, indent=2)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = tensors[name]
    size += nbytes
  meta = {"format": "pt"}
  if len(shards) == 1:
    save_file(shards[0], os.path.join(folder, _SINGLE), metadata=meta)
    return [_SINGLE]
  files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  weight_map = {}
  for file, shard in zip(files, shards):
    save_file(shard, os.path.join(folder, file), metadata=meta)
    weight_map.update({name: file for name in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(folder, _INDEX), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  return files
