"""Which transformers tensors make up which orchard_jax parameter, and how (models.hf's
tables).

transformers stores nn.Linear weights as [out, in]; orchard_jax stores [in, ...heads, dim].
Where one transformers tensor holds several orchard_jax parameters (Qwen3.5's q_proj
interleaves per head [query(head_dim), gate(head_dim)]; in_proj_qkv stacks q | k | v rows;
conv1d.weight is [channels, 1, kernel]; the vision encoder's qkv stacks q | k | v), one rule of
the group reads the whole tensor back from all of them (`merge`) and the others write nothing.

Mixture-of-experts weights are read per expert ("mlp.experts.{e}.gate_proj.weight":
transformers' saved Qwen3-MoE form and the Qwen3 releases) or fused: "mlp.experts.gate_up_proj"
[E, 2F, D] with "mlp.experts.down_proj" [E, D, F] (transformers' in-memory form), or their
transposes [E, D, 2F] and [E, F, D] (the Qwen3-VL-MoE releases; transformers transposes them
on load when the shape says so, and so does this). Qwen3-VL-MoE checkpoints are written in the
released (transposed) fused form, the others per expert.

A vision-language model (ModelConfig.vision) is transformers' Qwen3VL(Moe)ForConditionalGeneration:
text tensors under "model.language_model.", the vision tower under "model.visual.", "lm_head".
"""
import dataclasses
from typing import Callable, Optional

import numpy as np

from orchard_jax.models.config import ModelConfig

Flat = dict[tuple, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Rule:
  """One orchard_jax parameter and the transformers tensors it is made of.

  Attributes:
    path: its path in nnx.state(model, nnx.Param).
    names: the transformers tensors it is read from.
    to_ours: tensors (in `names` order) -> the parameter's array.
    to_hf: the parameter's array -> its tensors (in `names` order); None when another rule of
      a group writes them (see `merge`).
    merge: for the rule that writes a group's shared tensor: all parameters (path -> array)
      -> the tensors of `names`.
  """
  path: tuple
  names: tuple[str, ...]
  to_ours: Callable[[list[np.ndarray]], np.ndarray]
  to_hf: Optional[Callable[[np.ndarray], list[np.ndarray]]] = None
  merge: Optional[Callable[[Flat], list[np.ndarray]]] = None

  def export(self, flat: Flat) -> list[np.ndarray]:
    """The transformers tensors this rule writes (empty for a non-writing group member)."""
    if self.merge is not None:
      return self.merge(flat)
    if self.to_hf is None:
      return []
    return self.to_hf(flat[self.path])


def _linear(path, name, out_shape):
  """nn.Linear [out, in] <-> ours [in, *out_shape]."""
  def to_ours(ts):
    w = ts[0]
    return w.T.reshape((w.shape[1],) + tuple(out_shape))
  return Rule(path, (name,), to_ours, lambda a: [a.reshape(a.shape[0], -1).T])


def _linear_in(path, name, in_shape):
  """nn.Linear [out, in] <-> ours [*in_shape, out] (output projections)."""
  def to_ours(ts):
    w = ts[0]
    return w.T.reshape(tuple(in_shape) + (w.shape[0],))
  return Rule(path, (name,), to_ours, lambda a: [a.reshape(-1, a.shape[-1]).T])


def _same(path, name, shape=None):
  """Same array; `shape` reshapes ours (e.g. a bias [heads * dim] <-> ours [heads, dim])."""
  if shape is None:
    return Rule(path, (name,), lambda ts: ts[0], lambda a: [a])
  return Rule(path, (name,), lambda ts: ts[0].reshape(shape), lambda a: [a.reshape(-1)])


def layout(config: ModelConfig, fused_experts: bool = False) -> list[Rule]:
  """Every parameter of CausalLM(config) with its transformers tensors.

  Args:
    config: the model.
    fused_experts: read experts from fused gate_up_proj / down_proj tensors (else per expert).
      Qwen3-VL-MoE models always use the fused form.
  """
  c = config
  t = "model.language_model." if c.vision is not None else "model."
  rules = [_same(("model", "embed_tokens"), t + "embed_tokens.weight"),
           _same(("model", "norm", "weight"), t + "norm.weight")]
  if not c.tie_word_embeddings:
    rules.append(_linear(("lm_head",), "lm_head.weight", (c.vocab_size,)))
  h, kvh, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
  dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
  for i in range(c.num_hidden_layers):
    p = ("model", "layers", i)
    n = f"{t}layers.{i}."
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
      if c.vision is not None:
        rules += _released_fused_expert_rules(m, mn, c.hidden_size, c.moe_intermediate_size)
      else:
        rules += _expert_rules(m, mn, c.num_experts, fused_experts)
      if c.shared_expert_intermediate_size:
        s, sn = m + ("shared_expert",), mn + "shared_expert."
        f = c.shared_expert_intermediate_size
        rules += [_linear(s + ("gate_proj",), sn + "gate_proj.weight", (f,)),
                  _linear(s + ("up_proj",), sn + "up_proj.weight", (f,)),
                  _linear_in(s + ("down_proj",), sn + "down_proj.weight", (f,)),
                  Rule(m + ("shared_expert_gate",), (mn + "shared_expert_gate.weight",),
                       lambda ts: ts[0][0], lambda x: [x[None, :]])]
    else:
      f = c.intermediate_size
      rules += [_linear(m + ("gate_proj",), mn + "gate_proj.weight", (f,)),
                _linear(m + ("up_proj",), mn + "up_proj.weight", (f,)),
                _linear_in(m + ("down_proj",), mn + "down_proj.weight", (f,))]
  if c.vision is not None:
    rules += _vision_rules(c)
  return rules


def _gated_q_rules(a, name, h, hd):
  """Qwen3.5 q_proj [h * 2 * hd, D]: per head, head_dim query rows then head_dim gate rows."""
  def part(idx):
    return lambda ts: ts[0].reshape(h, 2, hd, -1)[:, idx].transpose(2, 0, 1)

  def merge(flat):
    q, gate = flat[a + ("q_proj",)], flat[a + ("gate_proj",)]     # [D, h, hd] each
    d = q.shape[0]
    return [np.stack([q, gate], axis=2).reshape(d, h * 2 * hd).T]
  return [Rule(a + ("q_proj",), (name,), part(0), merge=merge),
          Rule(a + ("gate_proj",), (name,), part(1))]


def _deltanet_rules(a, an, nk, nv, dk, dv):
  key, val = nk * dk, nv * dv

  def qkv_part(start, size, heads, dim):
    return lambda ts: ts[0][start:start + size].T.reshape(-1, heads, dim)

  def conv_part(start, size, heads, dim):
    return lambda ts: ts[0][start:start + size, 0, :].T.reshape(-1, heads, dim)

  def merge_qkv(flat):                   # in_proj_qkv stacks q | k | v rows
    parts = [flat[a + (n,)] for n in ("q_proj", "k_proj", "v_proj")]
    return [np.concatenate([x.reshape(x.shape[0], -1) for x in parts], 1).T]

  def merge_conv(flat):                  # conv1d.weight [channels, 1, kernel]
    parts = [flat[a + (n,)] for n in ("conv_q", "conv_k", "conv_v")]
    w = np.concatenate([x.reshape(x.shape[0], -1) for x in parts], 1)
    return [w.T[:, None, :]]

  qkv, conv = an + "in_proj_qkv.weight", an + "conv1d.weight"
  return [
      Rule(a + ("q_proj",), (qkv,), qkv_part(0, key, nk, dk), merge=merge_qkv),
      Rule(a + ("k_proj",), (qkv,), qkv_part(key, key, nk, dk)),
      Rule(a + ("v_proj",), (qkv,), qkv_part(2 * key, val, nv, dv)),
      Rule(a + ("conv_q",), (conv,), conv_part(0, key, nk, dk), merge=merge_conv),
      Rule(a + ("conv_k",), (conv,), conv_part(key, key, nk, dk)),
      Rule(a + ("conv_v",), (conv,), conv_part(2 * key, val, nv, dv)),
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
    return [Rule(m + ("w_gate",), (gu,), half(0), lambda x: [x]),
            Rule(m + ("w_up",), (gu,), half(1), lambda x: [x]),
            Rule(m + ("w_down",), (dn,), lambda ts: ts[0].transpose(0, 2, 1),
                 lambda x: [x.transpose(0, 2, 1)])]

  def stacked(proj):
    names = tuple(f"{mn}experts.{j}.{proj}.weight" for j in range(e))
    return (names, lambda ts: np.stack([t.T for t in ts]),
            lambda x: [x[j].T for j in range(x.shape[0])])
  return [Rule(m + ("w_gate",), *stacked("gate_proj")),
          Rule(m + ("w_up",), *stacked("up_proj")),
          Rule(m + ("w_down",), *stacked("down_proj"))]


def _released_fused_expert_rules(m, mn, d, f):
  """Qwen3-VL-MoE experts: gate_up_proj [E, D, 2F] (gate columns, then up) and down_proj
  [E, F, D] as released; also read in transformers' in-memory orientation [E, 2F, D] /
  [E, D, F], recognised by shape (that one wins when both fit, as in transformers)."""
  gu, dn = mn + "experts.gate_up_proj", mn + "experts.down_proj"

  def gate_up(ts):                            # -> [E, D, 2F]
    w = ts[0]
    return w.transpose(0, 2, 1) if w.shape[1:] == (2 * f, d) else w

  def half(idx):
    return lambda ts: gate_up(ts)[:, :, idx * f:(idx + 1) * f]

  def down(ts):                               # -> ours [E, F, D]
    w = ts[0]
    return w.transpose(0, 2, 1) if w.shape[1:] == (d, f) else w

  def merge(flat):
    return [np.concatenate([flat[m + ("w_gate",)], flat[m + ("w_up",)]], axis=2)]
  return [Rule(m + ("w_gate",), (gu,), half(0), merge=merge),
          Rule(m + ("w_up",), (gu,), half(1)),
          Rule(m + ("w_down",), (dn,), down, lambda x: [x])]


def _vision_rules(config: ModelConfig) -> list[Rule]:
  """models.vision.VisionEncoder <-> transformers' Qwen3VLVisionModel ("model.visual.")."""
  vc = config.vision
  d, h, hd = vc.hidden_size, vc.num_heads, vc.head_dim
  v, vn = ("visual",), "model.visual."
  kernel = (vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size)
  rules = [
      # Conv3d [hidden, C, T, p, p] with stride = kernel: a linear map of the flat patch.
      Rule(v + ("patch_embed",), (vn + "patch_embed.proj.weight",),
           lambda ts: ts[0].reshape(ts[0].shape[0], -1).T,
           lambda a: [a.T.reshape((a.shape[1],) + kernel)]),
      _same(v + ("patch_bias",), vn + "patch_embed.proj.bias"),
      _same(v + ("pos_embed",), vn + "pos_embed.weight"),
  ]

  def linear(path, name):
    return [Rule(path + ("weight",), (name + ".weight",), lambda ts: ts[0].T, lambda a: [a.T]),
            _same(path + ("bias",), name + ".bias")]

  def norm(path, name):
    return [_same(path + ("weight",), name + ".weight"), _same(path + ("bias",), name + ".bias")]

  for i in range(vc.depth):
    b, bn = v + ("blocks", i), f"{vn}blocks.{i}."
    a, an = b + ("attn",), bn + "attn."
    qkv_w, qkv_b = an + "qkv.weight", an + "qkv.bias"

    def part_w(j):                     # qkv.weight [3 * hidden, hidden], rows (3, heads, hd)
      return lambda ts: ts[0].reshape(3, h, hd, d)[j].transpose(2, 0, 1)

    def part_b(j):
      return lambda ts: ts[0].reshape(3, h, hd)[j]

    def merge_w(flat, a=a):
      return [np.concatenate([flat[a + (f"{x}_proj",)].reshape(d, d) for x in "qkv"], 1).T]

    def merge_b(flat, a=a):
      return [np.concatenate([flat[a + (f"{x}_bias",)].reshape(d) for x in "qkv"])]

    rules += [Rule(a + ("q_proj",), (qkv_w,), part_w(0), merge=merge_w),
              Rule(a + ("k_proj",), (qkv_w,), part_w(1)),
              Rule(a + ("v_proj",), (qkv_w,), part_w(2)),
              Rule(a + ("q_bias",), (qkv_b,), part_b(0), merge=merge_b),
              Rule(a + ("k_bias",), (qkv_b,), part_b(1)),
              Rule(a + ("v_bias",), (qkv_b,), part_b(2)),
              _linear_in(a + ("o_proj",), an + "proj.weight", (h, hd)),
              _same(a + ("o_bias",), an + "proj.bias")]
    rules += norm(b + ("norm1",), bn + "norm1") + norm(b + ("norm2",), bn + "norm2")
    rules += linear(b + ("linear_fc1",), bn + "mlp.linear_fc1")
    rules += linear(b + ("linear_fc2",), bn + "mlp.linear_fc2")
  mergers = [(v + ("merger",), vn + "merger")] + [
      (v + ("deepstack_merger_list", j), f"{vn}deepstack_merger_list.{j}")
      for j in range(len(vc.deepstack_visual_indexes))]
  for path, name in mergers:
    rules += norm(path + ("norm",), name + ".norm")
    rules += linear(path + ("linear_fc1",), name + ".linear_fc1")
    rules += linear(path + ("linear_fc2",), name + ".linear_fc2")
  return rules
