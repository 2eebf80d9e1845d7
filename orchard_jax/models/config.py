"""`ModelConfig`: every number that shapes a Qwen3 / Qwen3-MoE / Qwen3.5-MoE model, and
`VisionConfig`: the vision front of a Qwen3-VL model (ModelConfig.vision).

The field names follow Hugging Face transformers' config classes (Qwen3Config, Qwen3MoeConfig,
Qwen3_5MoeTextConfig) wherever a field exists there, so `models.hf` maps config.json in both
directions with few renames. Fields that only orchard_jax has (dispatch path, chunk sizes,
dtypes, remat) configure how the same math is computed and never change the result beyond
float rounding (except a capacity factor with `moe_dropless=False`, which drops tokens).
"""
import dataclasses
from typing import Any, Mapping, Optional

from orchard_jax.models.errors import ModelConfigError

ARCHITECTURES = ("qwen3", "qwen3_moe", "qwen3_5_moe")
LAYER_TYPES = ("full_attention", "linear_attention")
MOE_DISPATCH = ("sort", "ragged", "dense", "decode")
EXPERT_LOOPS = ("auto", "einsum", "unrolled")
ATTENTION_IMPLS = ("blocked", "xla", "cudnn")
MOE_GROUPS = ("auto", "row", "batch")
DTYPES = ("float32", "bfloat16", "float16")
VISION_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The vision encoder, merger and DeepStack of a Qwen3-VL model (transformers'
  Qwen3VLVisionConfig, plus the special token ids of Qwen3VLConfig that mark images in text).

  The encoder is a ViT over patch_size x patch_size pixel patches (temporal_patch_size frames
  each; a still image is its frame repeated), with a learned position table of
  num_position_embeddings = side^2 entries bilinearly resampled to each image's patch grid and
  2-D rotary positions (row, column) in every attention block. The merger concatenates each
  spatial_merge_size x spatial_merge_size block of patches and projects it to the language
  model's width (out_hidden_size), one token per block; the blocks in
  deepstack_visual_indexes also feed their own mergers, whose outputs are added to the hidden
  states of the first len(deepstack_visual_indexes) decoder layers at image positions
  (DeepStack, arXiv 2406.04334).

  Attributes (transformers' names):
    depth, hidden_size, intermediate_size, num_heads: the encoder blocks.
    in_channels, patch_size, temporal_patch_size, spatial_merge_size: patching and merging.
    out_hidden_size: the merger's output width; must equal ModelConfig.hidden_size.
    num_position_embeddings: entries of the learned position table (a square number).
    deepstack_visual_indexes: encoder blocks whose outputs feed DeepStack, in order.
    hidden_act: activation of the encoder MLPs ("gelu_pytorch_tanh" in every release).
    rope_theta: base of the 2-D rotary embedding.
    layer_norm_eps: epsilon of the encoder's LayerNorms.
    initializer_range: std of the normal initialiser.
    image_token_id, video_token_id, vision_start_token_id, vision_end_token_id: the text
      tokens of Qwen3VLConfig: a prompt holds <|vision_start|>, one <|image_pad|> per merged
      token of the image, <|vision_end|>.
  """
  depth: int = 24
  hidden_size: int = 1024
  intermediate_size: int = 4096
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 16
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  out_hidden_size: int = 2560
  num_position_embeddings: int = 2304
  deepstack_visual_indexes: tuple[int, ...] = (5, 11, 17)
  hidden_act: str = "gelu_pytorch_tanh"
  rope_theta: float = 10000.0
  layer_norm_eps: float = 1e-6
  initializer_range: float = 0.02
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653

  def __post_init__(self):
    object.__setattr__(self, "deepstack_visual_indexes",
                       tuple(int(i) for i in self.deepstack_visual_indexes))
    self._validate()

  def _validate(self):
    def need(cond, what, seen):
      if not cond:
        raise ModelConfigError(f"VisionConfig: expected {what}; got {seen}")
    for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels",
                 "patch_size", "temporal_patch_size", "spatial_merge_size", "out_hidden_size",
                 "num_position_embeddings"):
      need(getattr(self, name) > 0, f"{name} > 0", getattr(self, name))
    need(self.hidden_size % self.num_heads == 0, "hidden_size divisible by num_heads",
         f"{self.hidden_size} and {self.num_heads}")
    need(self.head_dim % 4 == 0, "a head dim divisible by 4 (2-D rotary embedding)",
         self.head_dim)
    side = self.position_grid_side
    need(side * side == self.num_position_embeddings,
         "a square num_position_embeddings", self.num_position_embeddings)
    need(all(0 <= i < self.depth for i in self.deepstack_visual_indexes),
         f"deepstack_visual_indexes within 0..{self.depth - 1}", self.deepstack_visual_indexes)
    need(self.hidden_act in VISION_ACTIVATIONS, f"hidden_act in {VISION_ACTIVATIONS}",
         repr(self.hidden_act))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def position_grid_side(self) -> int:
    """Side of the square learned position table."""
    return int(round(self.num_position_embeddings ** 0.5))

  @property
  def patch_dim(self) -> int:
    """Values per patch: in_channels * temporal_patch_size * patch_size^2 (the image
    processor's pixel_values width)."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def merge_unit(self) -> int:
    """Patches per merged (language-model) token: spatial_merge_size^2."""
    return self.spatial_merge_size ** 2

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["deepstack_visual_indexes"] = list(self.deepstack_visual_indexes)
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "VisionConfig":
    """Builds a VisionConfig from a mapping; unknown keys are an error (ModelConfigError)."""
    if hasattr(values, "to_dict"):
      values = values.to_dict()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise ModelConfigError(f"VisionConfig.from_dict: unknown fields {unknown}; expected a "
                             f"subset of {sorted(names)}")
    return cls(**dict(values))


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
    vision: the vision front (VisionConfig) of a Qwen3-VL model (transformers'
      Qwen3VLForConditionalGeneration on a qwen3 backbone, Qwen3VLMoeForConditionalGeneration
      on a qwen3_moe one), or None for a text-only model.
    mrope_section: with vision, how the rotary_dim / 2 frequencies split over the temporal,
      height and width position ids of interleaved multimodal RoPE (Qwen3-VL: [24, 20, 20]);
      frequency i follows the height id when i % 3 == 1 and i < 3 * mrope_section[1], the
      width id when i % 3 == 2 and i < 3 * mrope_section[2], else the temporal id (as
      transformers' Qwen3VLTextRotaryEmbedding; the temporal size is implied). Text tokens
      have all three ids equal, where this is plain RoPE.

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
    attention_impl: full-sequence causal attention (no cache): "blocked" (the default,
      models.attention.causal_attention: future key blocks skipped, written-out backward; fast
      on CPU), or jax.nn.dot_product_attention with that implementation: "xla" (any backend)
      or "cudnn" (cuDNN's fused flash attention, NVIDIA GPUs only). Same result up to float
      rounding; decoding over a cache always uses the cached path.
    attention_recompute: "blocked" attention recomputes the softmax probabilities in the
      backward pass instead of storing them (FlashAttention's choice; the default): per
      full-attention layer batch x heads x seq x ~seq/2 floats less activation memory (84 MB
      at the `small` preset's 4 x 1024 tokens, and quadratic in seq) for one more QK^T matmul
      and softmax per block (the attention core's forward + backward from 6 to 7 matmuls).
      Same result; False stores them (faster when memory is plentiful and sequences short).
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
  vision: Optional[VisionConfig] = None
  mrope_section: tuple[int, ...] = ()
  # computation
  moe_dispatch: str = "sort"
  moe_capacity_factor: Optional[float] = None
  moe_dropless: bool = True
  moe_group: str = "auto"
  moe_block_size: int = 256
  moe_expert_loop: str = "auto"
  gdn_chunk_size: int = 64
  attention_block_size: int = 256
  attention_impl: str = "blocked"
  attention_recompute: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False

  def __post_init__(self):
    # Normalise list-valued fields (from JSON or ml_collections) to tuples: the config is
    # hashable and can be a static jit argument.
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    object.__setattr__(self, "layer_types", tuple(str(t) for t in self.layer_types))
    object.__setattr__(self, "mrope_section", tuple(int(i) for i in self.mrope_section))
    if self.vision is not None and not isinstance(self.vision, VisionConfig):
      object.__setattr__(self, "vision", VisionConfig.from_dict(self.vision))
    self._validate()

  def _validate(self):
    def need(cond, what, seen):
      if not cond:
        raise ModelConfigError(f"ModelConfig: expected {what}; got {seen}")
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
    need(self.attention_impl in ATTENTION_IMPLS, f"attention_impl in {ATTENTION_IMPLS}",
         repr(self.attention_impl))
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
    if self.mrope_section:
      need(len(self.mrope_section) == 3 and min(self.mrope_section) >= 0,
           "mrope_section of 3 non-negative sizes (temporal, height, width)", self.mrope_section)
    v = self.vision
    if v is not None:
      need(self.architecture in ("qwen3", "qwen3_moe"),
           "a qwen3 or qwen3_moe backbone for a vision-language model (Qwen3-VL)",
           repr(self.architecture))
      need(bool(self.mrope_section), "mrope_section with vision (Qwen3-VL: [24, 20, 20])",
           self.mrope_section)
      need(v.out_hidden_size == self.hidden_size,
           f"vision.out_hidden_size == hidden_size ({self.hidden_size})", v.out_hidden_size)
      need(len(v.deepstack_visual_indexes) <= self.num_hidden_layers,
           f"at most {self.num_hidden_layers} DeepStack levels (one per decoder layer)",
           len(v.deepstack_visual_indexes))
      for name in ("image_token_id", "video_token_id", "vision_start_token_id",
                   "vision_end_token_id"):
        need(0 <= getattr(v, name) < self.vocab_size, f"vision.{name} within the vocabulary "
             f"[0, {self.vocab_size})", getattr(v, name))

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
  def is_multimodal(self) -> bool:
    """A vision-language model (has a vision front)."""
    return self.vision is not None

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
    out["mrope_section"] = list(self.mrope_section)
    out["vision"] = None if self.vision is None else self.vision.to_dict()
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """Builds a config from a mapping (dict, ConfigDict); unknown keys are an error.

    A "preset" key, when present, names the base preset the other keys override. "vision"
    may be a mapping of VisionConfig fields (or None); a mapping over a preset with vision
    overrides the preset's vision fields it names.

    Raises:
      ModelConfigError: a key is not a ModelConfig field, or the values are inconsistent.
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
      raise ModelConfigError(f"ModelConfig.from_dict: unknown fields {unknown}; expected a "
                             f"subset of {sorted(names)}")
    if isinstance(values.get("vision"), Mapping) or hasattr(values.get("vision"), "to_dict"):
      vision = values["vision"]
      vision = vision.to_dict() if hasattr(vision, "to_dict") else dict(vision)
      values["vision"] = dict(base.get("vision") or {}, **vision)
    base.update(values)
    return cls(**base)
