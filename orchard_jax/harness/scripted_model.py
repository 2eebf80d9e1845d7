"""A scripted model that plays a fixed plan of shell commands through an external harness.

Training inside a harness starts from a policy that already speaks the harness's format: its
system prompt, its tool schemas, its shell tool's arguments.
`ScriptedHarnessModel` records such a demonstration of a known solution: put behind the
recording proxy as its text-level upstream, it answers each of the harness's model calls
with the plan's next step, a short thought and one call of the harness's own shell tool
(Codex's `exec_command`, Claude Code's `Bash`), and, once the plan is done, a final answer
without a tool call, which ends the harness's run. The harness executes each call in its
sandbox and sends the output back, so the proxy records the demonstration exactly as the
harness would show it to a model: the harness's messages and tools on the harness's wire,
the scripted answers as each call's response (text-only records, which SFT tokenises with the
policy's chat template).

The step is read from the request (the number of assistant turns in its history), so a
harness that retries a call gets the same answer again.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Optional, Sequence

from orchard_jax.harness.cli_harness import CLIHarness
from orchard_jax.harness.errors import HarnessError


@dataclasses.dataclass(frozen=True)
class ScriptStep:
  """One planned turn: `thought` (the assistant's text) and the shell `command` it runs."""
  thought: str
  command: str


class ScriptedHarnessModel:
  """A text-level upstream of `rollout.RecordingProxy` that plays `steps` (module docstring).

  Args:
    harness: the CLI harness whose shell tool the calls use (`CLIHarness.shell_tool`).
    steps: the plan, in order (may be set later, before the harness's first call).
    final_answer: the last turn's text (no tool call).
    model: the model name reported in the answers.
  Raises:
    HarnessError: the harness offers the model no shell function tool.
  """
  text_only = True

  def __init__(self, harness: CLIHarness, steps: Sequence[ScriptStep] = (), *,
               final_answer: str = "The change is made and the tests pass.",
               model: str = "scripted-expert"):
    if harness.shell_tool is None:
      raise HarnessError(f"harness {harness.name!r} offers no shell function tool to script")
    self.harness, self.steps = harness, list(steps)
    self.final_answer, self.model = final_answer, model

  @property
  def description(self) -> str:
    return f"scripted:{self.harness.name}"

  def answer(self, messages: Sequence[dict], tools: Optional[Sequence[dict]]) -> dict[str, Any]:
    """The assistant message for a call whose history is `messages` (OpenAI chat format).

    Raises:
      HarnessError: the request does not offer the harness's shell tool.
    """
    step = sum(1 for m in messages if m.get("role") == "assistant")
    if step >= len(self.steps):
      return {"role": "assistant", "content": self.final_answer}
    planned = self.steps[step]
    name, arguments = self.harness.shell_tool(planned.command, planned.thought)
    offered = {(t.get("function") or {}).get("name") for t in tools or ()}
    if name not in offered:
      raise HarnessError(f"the {self.harness.name} request offers no {name!r} tool (it offers "
                         f"{sorted(n for n in offered if n)}); cannot play the plan")
    return {"role": "assistant", "content": planned.thought, "tool_calls": [{
        "id": f"call_{step}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)}}]}

  async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat completion (the `OpenAIUpstream.chat` contract) answering `body`."""
    message = self.answer(body.get("messages") or [], body.get("tools"))
    step = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
    return {"id": f"scripted-{step}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}

  def release_session(self, session_id: str) -> None:
    del session_id

  async def aclose(self) -> None:
    return None


__all__ = ["ScriptStep", "ScriptedHarnessModel"]
