"""A tiny policy briefly trained (in the test run) to act as a bash agent on one fixed task.

A random tiny model writes no tool calls, so no harness would get past its first step. This
module trains the small test policy for a few hundred Adam steps on one rendered conversation in
mini-swe-agent's tool-calling format: the task, then three `bash` tool calls, each after the
previous command's output:
  echo one  ->  "one\\n"  ->  echo two  ->  "two\\n"  ->  echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
Loss is on the assistant turns only. Greedy decoding then reproduces the calls, so a harness
talking to the engine through the proxy takes three real steps and submits.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

BASH_TOOL = {"type": "function", "function": {
  "name": "bash", "description": "Execute a bash command",
  "parameters": {"type": "object", "properties": {
    "command": {"type": "string", "description": "The bash command to execute"}},
    "required": ["command"]}}}
SYSTEM = "You are a shell agent. Run one command per turn."
TASK = "Print one, then two, then submit."
COMMANDS = ("echo one", "echo two", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
OUTPUTS = ("one\n", "two\n")


def conversation(call_ids=("call_0", "call_1", "call_2")) -> list[dict]:
  """The full target chat (OpenAI format, arguments as JSON strings as clients send them)."""
  messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
  for i, command in enumerate(COMMANDS):
    messages.append({"role": "assistant", "content": None, "tool_calls": [{
      "id": call_ids[i], "type": "function",
      "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]})
    if i < len(OUTPUTS):
      messages.append({"role": "tool", "tool_call_id": call_ids[i], "content": OUTPUTS[i]})
  return messages


def _training_example(tokenizer) -> tuple[np.ndarray, np.ndarray]:
  """(ids, weights): the rendered chat encoded at once, weight 1 on each assistant turn's
  tokens up to and including its <|im_end|>, 0 elsewhere."""
  messages = conversation()
  text = tokenizer.render_chat_text(messages, [BASH_TOOL], add_generation_prompt=False)
  spans = []
  for i, message in enumerate(messages):
    if message["role"] == "assistant":
      start = len(tokenizer.render_chat_text(messages[:i], [BASH_TOOL],
                                             add_generation_prompt=True))
      spans.append((start, text.index("<|im_end|>", start) + len("<|im_end|>")))
  encoding = tokenizer.hf(text, add_special_tokens=False, return_offsets_mapping=True)
  ids = encoding["input_ids"]
  weights = [1.0 if any(a <= lo and hi <= b for a, b in spans) else 0.0
             for lo, hi in encoding["offset_mapping"]]
  assert ids == tokenizer.encode(text)
  return np.asarray(ids, np.int32), np.asarray(weights, np.float32)


def train_agent(model: nnx.Module, tokenizer, *, steps: int = 300, stop_loss: float = 0.02,
                learning_rate: float = 3e-3) -> float:
  """Train `model` in place on the conversation; returns the final loss (nats per token)."""
  ids, weights = _training_example(tokenizer)
  inputs = jnp.asarray(ids[None, :-1])
  targets = jnp.asarray(ids[None, 1:])
  mask = jnp.asarray(weights[None, 1:])
  positions = jnp.arange(inputs.shape[1])[None]
  segments = jnp.ones_like(inputs)
  optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    def loss_fn(model):
      logits, _ = model(inputs, positions, segments)
      logp = jax.nn.log_softmax(logits, axis=-1)
      nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
      return jnp.sum(nll * mask) / jnp.sum(mask)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  loss = None
  for _ in range(steps):
    loss = step(model, optimizer)
    if float(loss) < stop_loss:
      break
  return float(loss)
