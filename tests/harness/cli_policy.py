"""A small policy taught, in seconds, to make one tool call in a CLI harness's own format.

The real Codex CLI and Claude Code open with an 8-16k-token prompt (their system prompts and
tool schemas). Training the whole small model on such sequences takes minutes a step on two
cores, so this helper trains only the last layer's readout on cached keys/values
(train.cached_last_layer: exact, every key and value stays what the random model computes,
so the engine decodes with the states the training saw), until every target token has
probability >= MIN_TARGET_PROB (a margin on each token: a mean-loss rule once let greedy
decoding emit a stop token inside the tool call's JSON).

`harness_conversations` builds the target chats from the harness's recorded first call:
its messages and tools, then one tool call, the tool's output (several variants, so the
policy learns "after a tool result, answer") and a short final answer.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Sequence

import optax

from orchard_jax.train import cached_last_layer

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


MIN_TARGET_PROB = 0.97


def train_tool_caller(model, tokenizer, conversations: Sequence[Sequence[dict]],
                      tools: Sequence[dict], *, steps: int = 600, learning_rate: float = 1e-2,
                      min_target_prob: float = MIN_TARGET_PROB) -> float:
  """Trains `model` in place (module docstring) on `conversations` until every assistant
  token has probability >= min_target_prob (or `steps` full-batch steps); returns the worst
  assistant token's NLL (nats)."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from chat_training import training_example

  rows = cached_last_layer.cache_rows(
      model, [training_example(tokenizer, messages, tools) for messages in conversations])
  result = cached_last_layer.fit(model, rows, optax.adam(learning_rate), max_steps=steps,
                                 min_target_prob=min_target_prob)
  return result.max_nll
