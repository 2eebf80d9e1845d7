"""A small policy taught, in seconds, to make one tool call in a CLI harness's own format.

The real Codex CLI and Claude Code open with an 8-16k-token prompt (their system prompts and
tool schemas). Training the whole small model on such sequences takes minutes a step on two
cores, so this helper trains only what cannot change any cached key or value: the last
layer's attention queries and output projection, its feed-forward block, the final norm and
the LM head. Every key and value of every layer then stays what the random model computes,
so the states this helper reads from one forward pass are exactly those the engine computes
while decoding, and a few hundred Adam steps over the assistant tokens alone (a few hundred
rows attending to the frozen keys) take seconds.

`harness_conversations` builds the target chats from the harness's recorded first call:
its messages and tools, then one tool call, the tool's output (several variants, so the
policy learns "after a tool result, answer") and a short final answer.
"""
from __future__ import annotations

import json
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from orchard_jax.models.attention import dot_product_attention
from orchard_jax.models.layers import apply_rope, rope_tables

TOOL_OUTPUTS = ("", "Process exited with code 0\nOutput:\n", "Exit code: 0\nWall time: 0.1 seconds",
                "(Bash completed with no output)", "ok\n")
FINAL_ANSWER = "Done: hello.txt is created."


def harness_conversations(messages: Sequence[dict], tool: str, arguments: dict) -> list[list[dict]]:
  """Target chats: `messages` (the recorded first call's), a call of `tool` with `arguments`,
  its output (each of TOOL_OUTPUTS), then FINAL_ANSWER."""
  call = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_0", "type": "function",
    "function": {"name": tool, "arguments": json.dumps(arguments)}}]}
  return [list(messages) + [call, {"role": "tool", "tool_call_id": "call_0", "content": out},
                            {"role": "assistant", "content": FINAL_ANSWER}]
          for out in TOOL_OUTPUTS]


class _Trainable(nnx.Module):
  """The parameters trained here (shared with the model, so training updates it)."""

  def __init__(self, model):
    last = model.model.layers[-1]
    self.q_proj, self.o_proj = last.self_attn.q_proj, last.self_attn.o_proj
    self.q_norm = last.self_attn.q_norm
    self.post_norm, self.mlp = last.post_attention_layernorm, last.mlp
    self.norm = model.model.norm
    self.lm_head = model.lm_head
    self.is_moe = last.is_moe


@nnx.jit
def _last_layer_inputs(decoder, inputs, positions, segments):
  cfg = decoder.config
  h = jnp.take(decoder.embed_tokens[...], inputs, axis=0)
  cos, sin = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta)
  ctx = {"cos": cos, "sin": sin, "segment_ids": segments}
  for layer in list(decoder.layers)[:-1]:
    h, _, _ = layer(h, ctx, None)
  last = decoder.layers[-1]
  x = last.input_layernorm(h)
  attn = last.self_attn
  k = apply_rope(attn.k_norm(jnp.einsum("btd,dhk->bthk", x, attn.k_proj[...])), cos, sin)
  v = jnp.einsum("btd,dhk->bthk", x, attn.v_proj[...])
  return h, x, k, v, cos, sin


def _frozen_states(model, ids: np.ndarray):
  """(h_in, x, k, v, cos, sin) of the last layer for a full sequence: the hidden state
  entering it, its normed input, its keys and values (all frozen), and the RoPE tables."""
  inputs = jnp.asarray(ids[None])
  positions = jnp.arange(inputs.shape[1])[None]
  return _last_layer_inputs(model.model, inputs, positions, jnp.ones_like(inputs))


def train_tool_caller(model, tokenizer, conversations: Sequence[Sequence[dict]],
                      tools: Sequence[dict], *, steps: int = 600, learning_rate: float = 1e-2,
                      stop_loss: float = 0.01) -> float:
  """Trains `model` in place (module docstring) on `conversations`; returns the worst loss of
  the last pass (nats per assistant token)."""
  import sys
  import os
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from chat_training import training_example

  examples = []
  for messages in conversations:
    ids, weights = training_example(tokenizer, messages, tools)
    h, x, k, v, cos, sin = _frozen_states(model, ids[:-1])
    rows = np.nonzero(weights[1:])[0]          # positions whose next token is a target
    mask = jnp.asarray(np.arange(len(ids) - 1)[None, :] <= rows[:, None])[None]
    examples.append((h[:, rows], x[:, rows], k, v, cos[:, rows], sin[:, rows], mask,
                     jnp.asarray(ids[1:][rows])[None]))
  trainable = _Trainable(model)
  optimizer = nnx.Optimizer(trainable, optax.adam(learning_rate), wrt=nnx.Param)

  @nnx.jit
  def step(trainable, optimizer, h, x, k, v, cos, sin, mask, targets):
    def loss_fn(t):
      q = apply_rope(t.q_norm(jnp.einsum("btd,dhk->bthk", x, t.q_proj[...])), cos, sin)
      o = dot_product_attention(q, k, v, mask)
      hm = h + jnp.einsum("bthk,hkd->btd", o, t.o_proj[...])
      y = t.post_norm(hm)
      y = t.mlp(y, jnp.ones(y.shape[:2], bool))[0] if t.is_moe else t.mlp(y)
      logits = jnp.einsum("btd,dv->btv", t.norm(hm + y), t.lm_head[...])
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)
      return jnp.mean(nll)

    loss, grads = nnx.value_and_grad(loss_fn)(trainable)
    optimizer.update(trainable, grads)
    return loss

  losses = [float("inf")] * len(examples)
  for i in range(steps):
    j = i % len(examples)
    losses[j] = float(step(trainable, optimizer, *examples[j]))
    if max(losses) < stop_loss:
      break
  return max(losses)
