"""Briefly trains a small test policy on rendered chats, so it acts in a fixed format.

A random tiny model writes no tool calls, so no harness gets past its first step. The tests
that need an acting policy train the small test model for a few hundred Adam steps on one or
more rendered conversations (the chat template's text of the messages and tools), with loss
on the assistant turns only; greedy decoding then reproduces those turns. Used by the bash
agent fixture (tests/rollout/agent_fixture.py) and the CLI harness tests (tests/harness).
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def training_example(tokenizer, messages: Sequence[dict], tools: Optional[Sequence[dict]],
                     **template_kwargs) -> tuple[np.ndarray, np.ndarray]:
  """(ids, weights): the rendered chat encoded at once, weight 1 on each assistant turn's
  tokens up to and including its <|im_end|>, 0 elsewhere."""
  messages = list(messages)
  text = tokenizer.render_chat_text(messages, tools, add_generation_prompt=False,
                                    **template_kwargs)
  spans = []
  for i, message in enumerate(messages):
    if message["role"] == "assistant":
      start = len(tokenizer.render_chat_text(messages[:i], tools, add_generation_prompt=True,
                                             **template_kwargs))
      spans.append((start, text.index("<|im_end|>", start) + len("<|im_end|>")))
  encoding = tokenizer.hf(text, add_special_tokens=False, return_offsets_mapping=True)
  ids = encoding["input_ids"]
  weights = [1.0 if any(a <= lo and hi <= b for a, b in spans) else 0.0
             for lo, hi in encoding["offset_mapping"]]
  assert ids == tokenizer.encode(text)
  return np.asarray(ids, np.int32), np.asarray(weights, np.float32)


def train_on_chats(model: nnx.Module, examples: Sequence[tuple[np.ndarray, np.ndarray]], *,
                   steps: int = 300, stop_loss: float = 0.02,
                   learning_rate: float = 3e-3) -> float:
  """Trains `model` in place on `examples` ((ids, weights) pairs, one sequence each, cycled
  one per step); returns the last full pass's worst loss (nats per weighted token)."""
  optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
  batches = []
  for ids, weights in examples:
    inputs = jnp.asarray(ids[None, :-1])
    batches.append((inputs, jnp.asarray(ids[None, 1:]), jnp.asarray(weights[None, 1:]),
                    jnp.arange(inputs.shape[1])[None], jnp.ones_like(inputs)))

  @nnx.jit
  def step(model, optimizer, inputs, targets, mask, positions, segments):
    def loss_fn(model):
      logits, _ = model(inputs, positions, segments)
      logp = jax.nn.log_softmax(logits, axis=-1)
      nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
      return jnp.sum(nll * mask) / jnp.sum(mask)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float("inf")] * len(batches)
  for i in range(steps):
    k = i % len(batches)
    losses[k] = float(step(model, optimizer, *batches[k]))
    if max(losses) < stop_loss:
      break
  return max(losses)
