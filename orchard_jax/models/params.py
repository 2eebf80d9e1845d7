"""Parameter counts of a config without allocating it (jax.eval_shape)."""
import dataclasses
import math

from flax import nnx

from orchard_jax.models.config import ModelConfig
from orchard_jax.models.decoder import CausalLM


@dataclasses.dataclass(frozen=True)
class ParamCount:
  """Parameter counts of a CausalLM.

  Attributes:
    total: every parameter.
    active: parameters used for one token: total minus the routed experts a token does not
      use ((num_experts - k) experts per MoE layer); includes embedding and LM head, as the
      Qwen model cards count "activated" parameters.
    embedding: the token embedding matrix (and the LM head when untied).
    vision: the vision front of a vision-language model (encoder, merger, DeepStack
      mergers; counted in total and active), 0 for a text-only model.
  """
  total: int
  active: int
  embedding: int
  vision: int = 0


def count_params(config: ModelConfig) -> ParamCount:
  """Counts the parameters of CausalLM(config) with nnx.eval_shape (no memory is used)."""
  model = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  total = 0
  expert = 0
  vision = 0
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    n = math.prod(var.shape)
    total += n
    if path[-1] in ("w_gate", "w_up", "w_down"):
      expert += n
    if path[0] == "visual":
      vision += n
  embedding = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
  inactive = 0
  if config.num_experts:
    inactive = expert * (config.num_experts - config.num_experts_per_tok) // config.num_experts
  return ParamCount(total=total, active=total - inactive, embedding=embedding, vision=vision)
