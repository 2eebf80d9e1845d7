"""Hugging Face checkpoints (config.json + *.safetensors) <-> orchard_jax models, both ways.

Reads what transformers writes and what the Qwen releases publish:
  - model_type "qwen3", "qwen3_moe", "qwen3_5_moe_text", and the composite "qwen3_5_moe"
    (text_config is used; "model.language_model." weights are read, vision and MTP weights
    skipped);
  - experts stored per expert ("mlp.experts.{e}.gate_proj.weight", transformers' saved form
    and the Qwen3 releases) or fused ("mlp.experts.gate_up_proj" [E, 2F, D],
    "mlp.experts.down_proj" [E, D, F], transformers' in-memory form);
  - one model.safetensors or shards listed by model.safetensors.index.json.
Writes the per-expert form, sharded with an index when larger than `max_shard_bytes`, with a
config.json that transformers' AutoConfig / AutoModelForCausalLM load (Qwen3ForCausalLM,
Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM).

Layout conversions (transformers stores nn.Linear weights as [out, in]; orchard_jax stores
[in, ...heads, dim]): q_proj of Qwen3.5 interleaves per head [query(head_dim), gate(head_dim)];
in_proj_qkv stacks q | k | v rows; conv1d.weight is [channels, 1, kernel].
"""
import dataclasses
import json
import os
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from orchard_jax.models.config import ModelConfig
from orchard_jax.models.decoder import CausalLM
from orchard_jax.models.errors import CheckpointError, CheckpointMismatch, ConfigError

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_SKIP_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.vision_tower.")

# ---------------------------------------------------------------------------------------------
# config.json


def config_from_hf(hf: dict[str, Any], **overrides) -> ModelConfig:
  """ModelConfig from a transformers config.json dict (qwen3, qwen3_moe, qwen3_5_moe[_text]).

  Args:
    hf: the parsed config.json.
    **overrides: ModelConfig fields to set (e.g. dtype="float32", moe_dispatch="ragged").
  Raises:
    ConfigError: an unsupported model type or feature (attention bias, sliding window, RoPE
      scaling, an activation other than silu).
  """
  model_type = hf.get("model_type")
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
    raise ConfigError(f"config.json model_type {model_type!r} is not supported; expected one of "
                      "qwen3, qwen3_moe, qwen3_5_moe, qwen3_5_moe_text")
  if hf.get("hidden_act", "silu") != "silu":
    raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported; expected 'silu'")
  if hf.get("attention_bias", False):
    raise ConfigError("attention_bias=true is not supported; expected false (all Qwen3 releases)")
  if hf.get("use_sliding_window", False):
    raise ConfigError("use_sliding_window=true is not supported; expected false")
  rope = dict(hf.get("rope_parameters") or {})
  legacy_scaling = hf.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", legacy_scaling.get("rope_type", legacy_scaling.get("type",
                                                                                     "default")))
  if rope_type not in ("default", None):
    raise ConfigError(f"rope_type {rope_type!r} is not supported; expected 'default'")
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


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
  """transformers config.json dict for `config` (the CausalLM class of its architecture)."""
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


# ---------------------------------------------------------------------------------------------
# parameter layout


@dataclasses.dataclass(frozen=True)
class _Rule:
  """One orchard_jax parameter and the transformers tensors it is made of."""
  path: tuple                                  # path in nnx.state(model, nnx.Param)
  names: tuple[str, ...]                       # transformers tensor names
  to_ours: Callable[[list[np.ndarray]], np.ndarray]
  to_hf: Callable[[np.ndarray], list[np.ndarray]]


def _linear(path, name, out_shape):
  """nn.Linear [out, in] <-> ours [in, *out_shape]."""
  def to_ours(ts):
    w = ts[0]
    return w.T.reshape((w.shape[1],) + tuple(out_shape))

  def to_hf(a):
    return [a.reshape(a.shape[0], -1).T]
  return _Rule(path, (name,), to_ours, to_hf)


def _linear_in(path, name, in_shape):
  """nn.Linear [out, in] <-> ours [*in_shape, out] (output projections)."""
  def to_ours(ts):
    w = ts[0]
    return w.T.reshape(tuple(in_shape) + (w.shape[0],))

  def to_hf(a):
    return [a.reshape(-1, a.shape[-1]).T]
  return _Rule(path, (name,), to_ours, to_hf)


def _same(path, name):
  return _Rule(path, (name,), lambda ts: ts[0], lambda a: [a])


def _layout(config: ModelConfig, fused_experts: bool = False) -> list[_Rule]:
  c = config
  rules = [_same(("model", "embed_tokens"), "model.embed_tokens.weight"),
           _same(("model", "norm", "weight"), "model.norm.weight")]
  if not c.tie_word_embeddings:
    rules.append(_linear(("lm_head",), "lm_head.weight", (c.vocab_size,)))
  h, kvh, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
  dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
  for i in range(c.num_hidden_layers):
    p = ("model", "layers", i)
    n = f"model.layers.{i}."
    rules += [_same(p + ("input_layernorm", "weight"), n + "input_layernorm.weight"),
              _same(p + ("post_attention_layernorm", "weight"),
                    n + "post_attention_layernorm.weight")]
    if c.layer_type(i) == "full_attention":
      a, an = p + ("self_attn",), n + "self_attn."
      if c.attention_output_gate:
        rules += _gated_q_rules(a, an + "q_proj.weight", h, hd)
      else:
        rules.append(_linear(a + ("q_proj",), an + "q_proj.weight", (h, hd)))
      rules += [_linear(a + ("k_proj",), an + "k_proj.weight", (kvh, hd)),
                _linear(a + ("v_proj",), an + "v_proj.weight", (kvh, hd)),
                _linear_in(a + ("o_proj",), an + "o_proj.weight", (h, hd)),
                _same(a + ("q_norm", "weight"), an + "q_norm.weight"),
                _same(a + ("k_norm", "weight"), an + "k_norm.weight")]
    else:
      a, an = p + ("linear_attn",), n + "linear_attn."
      rules += _deltanet_rules(a, an, nk, nv, dk, dv)
    m, mn = p + ("mlp",), n + "mlp."
    if c.is_moe_layer(i):
      rules.append(_linear(m + ("router",), mn + "gate.weight", (c.num_experts,)))
      rules += _expert_rules(m, mn, c.num_experts, fused_experts)
      if c.shared_expert_intermediate_size:
        s, sn = m + ("shared_expert",), mn + "shared_expert."
        f = c.shared_expert_intermediate_size
        rules += [_linear(s + ("gate_proj",), sn + "gate_proj.weight", (f,)),
                  _linear(s + ("up_proj",), sn + "up_proj.weight", (f,)),
                  _linear_in(s + ("down_proj",), sn + "down_proj.weight", (f,)),
                  _Rule(m + ("shared_expert_gate",), (mn + "shared_expert_gate.weight",),
                        lambda ts: ts[0][0], lambda x: [x[None, :]])]
    else:
      f = c.intermediate_size
      rules += [_linear(m + ("gate_proj",), mn + "gate_proj.weight", (f,)),
                _linear(m + ("up_proj",), mn + "up_proj.weight", (f,)),
                _linear_in(m + ("down_proj",), mn + "down_proj.weight", (f,))]
  return rules


def _gated_q_rules(a, name, h, hd):
  """Qwen3.5 q_proj [h * 2 * hd, D]: per head, head_dim query rows then head_dim gate rows."""
  def part(idx):
    return lambda ts: ts[0].reshape(h, 2, hd, -1)[:, idx].transpose(2, 0, 1)
  # Both orchard_jax params come from one tensor; to_hf of the query returns the full tensor
  # and needs the gate, so the gate rule carries it (see _merge_gated_q).
  return [_Rule(a + ("q_proj",), (name,), part(0), lambda x: [x]),
          _Rule(a + ("gate_proj",), (name,), part(1), lambda x: [x])]


def _merge_gated_q(q: np.ndarray, gate: np.ndarray) -> np.ndarray:
  """ours q, gate [D, h, hd] -> transformers q_proj.weight [h * 2 * hd, D]."""
  d, h, hd = q.shape
  both = np.stack([q, gate], axis=2)                       # [D, h, 2, hd]
  return both.reshape(d, h * 2 * hd).T


def _deltanet_rules(a, an, nk, nv, dk, dv):
  key, val = nk * dk, nv * dv

  def qkv_part(start, size, heads, dim):
    return lambda ts: ts[0][start:start + size].T.reshape(-1, heads, dim)

  def conv_part(start, size, heads, dim):
    return lambda ts: ts[0][start:start + size, 0, :].T.reshape(-1, heads, dim)

  qkv, conv = an + "in_proj_qkv.weight", an + "conv1d.weight"
  ident = lambda x: [x]  # noqa: E731  (merged in _to_hf_tensors)
  return [
      _Rule(a + ("q_proj",), (qkv,), qkv_part(0, key, nk, dk), ident),
      _Rule(a + ("k_proj",), (qkv,), qkv_part(key, key, nk, dk), ident),
      _Rule(a + ("v_proj",), (qkv,), qkv_part(2 * key, val, nv, dv), ident),
      _Rule(a + ("conv_q",), (conv,), conv_part(0, key, nk, dk), ident),
      _Rule(a + ("conv_k",), (conv,), conv_part(key, key, nk, dk), ident),
      _Rule(a + ("conv_v",), (conv,), conv_part(2 * key, val, nv, dv), ident),
      _linear(a + ("z_proj",), an + "in_proj_z.weight", (nv, dv)),
      _linear(a + ("b_proj",), an + "in_proj_b.weight", (nv,)),
      _linear(a + ("a_proj",), an + "in_proj_a.weight", (nv,)),
      _same(a + ("dt_bias",), an + "dt_bias"),
      _same(a + ("A_log",), an + "A_log"),
      _same(a + ("norm",), an + "norm.weight"),
      _linear_in(a + ("out_proj",), an + "out_proj.weight", (nv, dv)),
  ]


def _expert_rules(m, mn, e, fused):
  if fused:
    gu, dn = mn + "experts.gate_up_proj", mn + "experts.down_proj"

    def half(idx):
      def f(ts):
        w = ts[0]                                           # [E, 2F, D]
        ff = w.shape[1] // 2
        return w[:, idx * ff:(idx + 1) * ff].transpose(0, 2, 1)
      return f
    return [_Rule(m + ("w_gate",), (gu,), half(0), lambda x: [x]),
            _Rule(m + ("w_up",), (gu,), half(1), lambda x: [x]),
            _Rule(m + ("w_down",), (dn,), lambda ts: ts[0].transpose(0, 2, 1),
                  lambda x: [x.transpose(0, 2, 1)])]

  def stacked(proj):
    names = tuple(f"{mn}experts.{j}.{proj}.weight" for j in range(e))
    return (names, lambda ts: np.stack([t.T for t in ts]),
            lambda x: [x[j].T for j in range(x.shape[0])])
  return [_Rule(m + ("w_gate",), *stacked("gate_proj")),
          _Rule(m + ("w_up",), *stacked("up_proj")),
          _Rule(m + ("w_down",), *stacked("down_proj"))]


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
  """The model's parameters as transformers-named numpy arrays (per-expert layout).

  On a multi-host mesh every process must call this (parameters sharded across hosts are
  gathered collectively); each gets the full arrays.
  """
  config = model.config
  flat = {tuple(p): _to_host(v[...])
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  out: dict[str, np.ndarray] = {}
  for rule in _layout(config):
    arr = flat[rule.path]
    owner, leaf = (rule.path[-2] if len(rule.path) > 1 else ""), rule.path[-1]
    if owner == "self_attn" and leaf == "gate_proj":
      continue                                   # written together with q_proj
    if owner == "self_attn" and leaf == "q_proj" and config.attention_output_gate:
      out[rule.names[0]] = np.ascontiguousarray(
          _merge_gated_q(arr, flat[rule.path[:-1] + ("gate_proj",)]))
      continue
    if owner == "linear_attn" and leaf in ("q_proj", "k_proj", "v_proj"):
      if leaf == "q_proj":                       # in_proj_qkv stacks q | k | v rows
        parts = [flat[rule.path[:-1] + (n,)] for n in ("q_proj", "k_proj", "v_proj")]
        out[rule.names[0]] = np.ascontiguousarray(
            np.concatenate([x.reshape(x.shape[0], -1) for x in parts], 1).T)
      continue
    if owner == "linear_attn" and leaf in ("conv_q", "conv_k", "conv_v"):
      if leaf == "conv_q":                       # conv1d.weight [channels, 1, kernel]
        parts = [flat[rule.path[:-1] + (n,)] for n in ("conv_q", "conv_k", "conv_v")]
        w = np.concatenate([x.reshape(x.shape[0], -1) for x in parts], 1)
        out[rule.names[0]] = np.ascontiguousarray(w.T[:, None, :])
      continue
    for name, tensor in zip(rule.names, rule.to_hf(arr)):
      out[name] = np.ascontiguousarray(tensor)
  return out


class _TensorReader:
  """Random access to the tensors of a checkpoint folder (single file or sharded index)."""

  def __init__(self, folder: str):
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
    ConfigError: the architecture is not supported.
  """
  config_path = os.path.join(folder, "config.json")
  if not os.path.exists(config_path):
    raise CheckpointError(f"no config.json in {folder!r}")
  with open(config_path) as f:
    config = config_from_hf(json.load(f), **config_overrides)
  reader = _TensorReader(folder)
  model = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  load_params(model, reader, mesh=mesh)
  return config, model


def load_params(model: CausalLM, source, *, mesh: Optional[jax.sharding.Mesh] = None) -> None:
  """Fills `model`'s parameters (in place) from a checkpoint folder or _TensorReader.

  The model may be abstract (nnx.eval_shape); every parameter is replaced.
  """
  reader = source if isinstance(source, _TensorReader) else _TensorReader(source)
  config = model.config
  names = reader.names()
  fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
  rules = _layout(config, fused_experts=fused)
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
    ConfigError: config differs from the model's.
  """
  if config != model.config:
    raise ConfigError("save_pretrained: config differs from model.config")
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
