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
import os
import sys

from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from chat_training import train_on_chats, training_example  # noqa: E402  (tests/ helper)

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


def train_agent(model: nnx.Module, tokenizer, *, steps: int = 300, stop_loss: float = 0.02,
                learning_rate: float = 3e-3) -> float:
  """Train `model` in place on the conversation; returns the final loss (nats per token)."""
  example = training_example(tokenizer, conversation(), [BASH_TOOL])
  return train_on_chats(model, [example], steps=steps, stop_loss=stop_loss,
                        learning_rate=learning_rate)
