"""`ModelConfig`: every number that shapes a Qwen3 / Qwen3-MoE / Qwen3.5-MoE model.

The field names follow Hugging Face transformers' config classes (Qwen3Config, Qwen3MoeConfig,
Qwen3_5MoeTextConfig) wherever a field exists there, so `models.hf` maps config.json in both
directions with few renames. Fields that only orchard_jax has (dispatch path, chunk sizes,
dtypes, remat) configure how the same math is computed and never change the result beyond
float rounding (except a capacity factor with `moe_dropless=False`, which drops tokens).
"""
import dataclasses
from typing import Any, Mapping, Optional

from orchard_jax.models.errors import ConfigError

ARCHITECTURES = ("qwen3", "qwen3_moe", "qwen3_5_moe")
LAYER_TYPES = ("full_attention", "linear_attention")
MOE_DISPATCH = ("sort", "ragged", "dense", "decode")
EXPERT_LOOPS = ("auto", "einsum", "unrolled")
MOE_GROUPS = ("auto", "row", "batch")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only policy / value backbone.

  Architectures:
    - "qwen3": dense Qwen3 (transformers' Qwen3ForCausalLM): GQA attention with q/k RMSNorm and
      RoPE, SwiGLU MLP in every layer.
    - "qwen3_moe": Qwen3-MoE (Qwen3MoeForCausalLM): as qwen3, with a softmax top-k router and
      routed SwiGLU experts in every `decoder_sparse_step`-th layer not in `mlp_only_layers`.
    - "qwen3_5_moe": the Qwen3.5-MoE text model (Qwen3_5MoeForCausalLM): `layer_types` mixes
      Gated DeltaNet ("linear_attention") and gated full attention ("full_attention") layers;
      partial RoPE; routed experts plus a sigmoid-gated shared expert; zero-centred (1 + w)
      RMSNorms.

  Use `dataclasses.replace(config, field=value)` for overrides, `to_dict`/`from_dict` to move
  through ml_collections configs, and `models.get_preset(name)` for the named sizes.

  Attributes (model shape; transformers' names):
    architecture: one of ARCHITECTURES.
    vocab_size, hidden_size, num_hidden_layers: as in transformers.
    num_attention_heads, num_key_value_heads, head_dim: full-attention layers (GQA).
    intermediate_size: width of dense SwiGLU MLP layers.
    moe_intermediate_size: width of each routed expert.
    num_experts: routed experts per MoE layer (0 = dense model).
    num_experts_per_tok: top-k.
    norm_topk_prob: renormalise the k selected router probabilities to sum to 1.
    decoder_sparse_step, mlp_only_layers: which layers are MoE (qwen3_moe rule: layer i is
      MoE when num_experts > 0, i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0).
    shared_expert_intermediate_size: width of the always-on shared expert (0 = none).
    layer_types: per layer "full_attention" or "linear_attention" (qwen3_5_moe); empty means
      every layer is full attention.
    linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
    linear_conv_kernel_dim: Gated DeltaNet shapes.
    rope_theta: RoPE base. partial_rotary_factor: fraction of head_dim that is rotated.
    rms_norm_eps: epsilon of every RMSNorm.
    tie_word_embeddings: the LM head reuses the token embedding matrix.
    max_position_embeddings: longest context the model was trained for (informational).
    initializer_range: std of the normal initialiser for weight matrices.
    router_aux_loss_coef: weight of the load-balancing loss; the model returns the loss
      un-weighted and the trainer adds coef * loss.

  Attributes (computation; orchard_jax only):
    moe_dispatch: "sort" (sort-and-group into per-expert capacity buffers; the default, fast
      on CPU and shardable over the expert axis), "ragged" (jax.lax.ragged_dot over tokens
      sorted by expert; for GPU/TPU, on CPU it lowers to a masked dense matmul), "dense"
      (every expert on every token, weighted; the test reference), "decode" (for a few
      tokens per call, what the inference engine uses for decode steps; models.decode).
    moe_capacity_factor: None (default): the "sort" path is dropless, with per-expert
      blocks of moe_block_size rows (or capacity n under a multi-device mesh). A float:
      buffer size per expert and dispatch group of n tokens is ceil(factor * n * k /
      num_experts) (at most n).
    moe_dropless: with a capacity factor, switch at run time to twice the capacity or to n
      when an expert overflows, so no token is ever dropped; False drops overflowing
      assignments (Switch Transformer behaviour).
    moe_group: dispatch groups of the "sort" path: "row" (each batch row), "batch" (the
      whole batch: smaller relative load spread, so less capacity padding), "auto" (rows
      under a multi-device mesh, else the batch).
    moe_block_size: rows per block of the dropless blocked layout.
    moe_expert_loop: how the "sort" path multiplies buffers by expert weights: "einsum" (one
      batched matmul; use under expert parallelism and on accelerators), "unrolled" (one 2-D
      matmul per expert; faster on XLA:CPU), "auto" (unrolled on a CPU without an expert
      mesh axis, einsum otherwise).
    gdn_chunk_size: chunk length of the chunked Gated DeltaNet used for multi-token calls.
    attention_block_size: query block length of full-sequence causal attention; key blocks
      wholly in a query block's future are skipped.
    dtype: activation / matmul dtype. param_dtype: storage dtype of parameters. Norms, softmax,
      router and the DeltaNet recurrence always run in float32.
    remat: rematerialise each decoder layer in the backward pass (saves activation memory at
      about one extra forward).
  """
  architecture: str = "qwen3_moe"
  vocab_size: int = 151936
  hidden_size: int = 2048
  num_hidden_layers: int = 48
  num_attention_heads: int = 32
  num_key_value_heads: int = 4
  head_dim: int = 128
  intermediate_size: int = 6144
  moe_intermediate_size: int = 768
  num_experts: int = 128
  num_experts_per_tok: int = 8
  norm_topk_prob: bool = True
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  shared_expert_intermediate_size: int = 0
  layer_types: tuple[str, ...] = ()
  linear_num_key_heads: int = 16
  linear_num_value_heads: int = 32
  linear_key_head_dim: int = 128
  linear_value_head_dim: int = 128
  linear_conv_kernel_dim: int = 4
  rope_theta: float = 1_000_000.0
  partial_rotary_factor: float = 1.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 40960
  initializer_range: float = 0.02
  router_aux_loss_coef: float = 0.001
  # computation
  moe_dispatch: str = "sort"
  moe_capacity_factor: Optional[float] = None
  moe_dropless: bool = True
  moe_group: str = "auto"
  moe_block_size: int = 256
  moe_expert_loop: str = "auto"
  gdn_chunk_size: int = 64
  attention_block_size: int = 256
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False

  def __post_init__(self):
    # Normalise list-valued fields (from JSON or ml_collections) to tuples: the config is
    # hashable and can be a static jit argument.
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    object.__setattr__(self, "layer_types", tuple(str(t) for t in self.layer_types))
    self._validate()

  def _validate(self):
    def need(cond, what, seen):
      if not cond:
        raise ConfigError(f"ModelConfig: expected {what}; got {seen}")
    need(self.architecture in ARCHITECTURES, f"architecture in {ARCHITECTURES}",
         repr(self.architecture))
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim"):
      need(getattr(self, name) > 0, f"{name} > 0", getattr(self, name))
    need(self.num_attention_heads % self.num_key_value_heads == 0,
         "num_attention_heads divisible by num_key_value_heads",
         f"{self.num_attention_heads} and {self.num_key_value_heads}")
    need(self.num_experts >= 0, "num_experts >= 0", self.num_experts)
    if self.num_experts:
      need(0 < self.num_experts_per_tok <= self.num_experts,
           "0 < num_experts_per_tok <= num_experts",
           f"{self.num_experts_per_tok} of {self.num_experts}")
      need(self.moe_intermediate_size > 0, "moe_intermediate_size > 0",
           self.moe_intermediate_size)
    if self.architecture == "qwen3":
      need(self.num_experts == 0, "num_experts == 0 for the dense qwen3 architecture",
           self.num_experts)
    if self.architecture != "qwen3_5_moe":
      need(all(t == "full_attention" for t in self.layer_types),
           f"only full_attention layers for {self.architecture}", self.layer_types)
    if self.layer_types:
      need(len(self.layer_types) == self.num_hidden_layers,
           f"{self.num_hidden_layers} layer_types (one per layer)", len(self.layer_types))
      need(all(t in LAYER_TYPES for t in self.layer_types), f"layer_types from {LAYER_TYPES}",
           self.layer_types)
    if "linear_attention" in self.layer_types:
      need(self.linear_num_value_heads % self.linear_num_key_heads == 0,
           "linear_num_value_heads divisible by linear_num_key_heads",
           f"{self.linear_num_value_heads} and {self.linear_num_key_heads}")
      need(self.linear_conv_kernel_dim >= 1, "linear_conv_kernel_dim >= 1",
           self.linear_conv_kernel_dim)
      need(self.gdn_chunk_size >= 1, "gdn_chunk_size >= 1", self.gdn_chunk_size)
    need(self.attention_block_size >= 1, "attention_block_size >= 1", self.attention_block_size)
    need(0 < self.partial_rotary_factor <= 1, "0 < partial_rotary_factor <= 1",
         self.partial_rotary_factor)
    need(self.rotary_dim % 2 == 0, "an even rotary dimension (head_dim * partial_rotary_factor)",
         self.rotary_dim)
    need(all(0 <= i < self.num_hidden_layers for i in self.mlp_only_layers),
         f"mlp_only_layers within 0..{self.num_hidden_layers - 1}", self.mlp_only_layers)
    need(self.decoder_sparse_step >= 1, "decoder_sparse_step >= 1", self.decoder_sparse_step)
    need(self.moe_dispatch in MOE_DISPATCH, f"moe_dispatch in {MOE_DISPATCH}",
         repr(self.moe_dispatch))
    need(self.moe_block_size >= 1, "moe_block_size >= 1", self.moe_block_size)
    need(self.moe_group in MOE_GROUPS, f"moe_group in {MOE_GROUPS}", repr(self.moe_group))
    need(self.moe_expert_loop in EXPERT_LOOPS, f"moe_expert_loop in {EXPERT_LOOPS}",
         repr(self.moe_expert_loop))
    need(self.moe_capacity_factor is None or self.moe_capacity_factor > 0,
         "moe_capacity_factor None or > 0", self.moe_capacity_factor)
    need(self.dtype in DTYPES, f"dtype in {DTYPES}", repr(self.dtype))
    need(self.param_dtype in DTYPES, f"param_dtype in {DTYPES}", repr(self.param_dtype))

  # ---- derived quantities -------------------------------------------------------------------

  @property
  def rotary_dim(self) -> int:
    """Number of leading head dimensions RoPE rotates (transformers: int(head_dim * factor))."""
    return int(self.head_dim * self.partial_rotary_factor)

  def layer_type(self, i: int) -> str:
    """"full_attention" or "linear_attention" for layer i."""
    return self.layer_types[i] if self.layer_types else "full_attention"

  def is_moe_layer(self, i: int) -> bool:
    """Whether layer i has routed experts (else a dense SwiGLU MLP)."""
    if self.num_experts == 0 or i in self.mlp_only_layers:
      return False
    if self.architecture == "qwen3_5_moe":
      return True
    return (i + 1) % self.decoder_sparse_step == 0

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """Indices of the MoE layers, in order (the rows of aux["expert_load"])."""
    return tuple(i for i in range(self.num_hidden_layers) if self.is_moe_layer(i))

  @property
  def has_linear_attention(self) -> bool:
    return "linear_attention" in self.layer_types

  @property
  def zero_centered_norm(self) -> bool:
    """Qwen3.5 RMSNorms scale by (1 + w) with w initialised to 0; Qwen3's by w (init 1)."""
    return self.architecture == "qwen3_5_moe"

  @property
  def attention_output_gate(self) -> bool:
    """Qwen3.5 full attention multiplies its output by sigmoid(a per-head gate projection)."""
    return self.architecture == "qwen3_5_moe"

  # ---- dict round trip ------------------------------------------------------------------------

  def to_dict(self) -> dict[str, Any]:
    """All fields as plain Python values (tuples become lists), e.g. for an ml_collections
    ConfigDict or JSON."""
    out = dataclasses.asdict(self)
    out["mlp_only_layers"] = list(self.mlp_only_layers)
    out["layer_types"] = list(self.layer_types)
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """Builds a config from a mapping (dict, ConfigDict); unknown keys are an error.

    A "preset" key, when present, names the base preset the other keys override.

    Raises:
      ConfigError: a key is not a ModelConfig field, or the values are inconsistent.
    """
    if hasattr(values, "to_dict"):
      values = values.to_dict()
    values = dict(values)
    base = {}
    if "preset" in values:
      from orchard_jax.models.presets import get_preset
      base = get_preset(values.pop("preset")).to_dict()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise ConfigError(f"ModelConfig.from_dict: unknown fields {unknown}; expected a subset of "
                        f"{sorted(names)}")
    base.update(values)
    return cls(**base)
