"""The optional LLM rubric grader: a judge model decides rubric items the state checks cannot
(tone, whether a reply answers the question), from the instruction, the agent's tool calls and
its final answer.

The judge is any OpenAI-compatible endpoint, reached through an object with
`complete(messages) -> reply with .content` (the recipe passes a `harness.ChatModel`). It must
answer with a JSON object `{"items": [{"index": 1, "satisfied": true, "reason": "..."}, ...]}`
covering every item; anything else raises `GraderError`, which `grading.grade` reports as a
`grader_error` outcome (never a silent 0). Each item becomes a completion check of weight 1.
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

from orchard_jax.tasks.claw.checks import CheckResult
from orchard_jax.tasks.claw.errors import GraderError
from orchard_jax.tasks.claw.task import Task

PROMPT = """You grade a personal assistant's work against rubric items.

The user asked:
<instruction>
{instruction}
</instruction>

What the assistant did (its tool calls and their results, in order):
<transcript>
{transcript}
</transcript>

Its final answer to the user:
<answer>
{answer}
</answer>

Decide each rubric item from this evidence only:
{items}

Reply with one JSON object and nothing else:
{{"items": [{{"index": 1, "satisfied": true, "reason": "one sentence"}}, ...]}}
with one entry per item, "satisfied" true or false."""


def render_transcript(messages: Sequence[dict], limit: int) -> str:
  """The assistant's tool calls with their results, one block each, cut to `limit` chars."""
  lines = []
  for m in messages:
    if m.get("role") == "assistant":
      for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        lines.append(f"CALL {fn.get('name')} {fn.get('arguments')}")
    elif m.get("role") == "tool":
      content = m.get("content")
      text = content if isinstance(content, str) else json.dumps(content)
      lines.append(f"RESULT {text[:600]}")
  text = "\n".join(lines) or "(no tool calls)"
  if len(text) > limit:
    half = limit // 2
    text = f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"
  return text


class RubricGrader:
  """Judges a task's rubric items with a model (module docstring).

  Args:
    model: has `complete(messages) -> reply with .content`.
    transcript_chars: longest transcript shown to the judge.
  """

  def __init__(self, model: Any, *, transcript_chars: int = 12000):
    self.model = model
    self.transcript_chars = transcript_chars

  def prompt(self, task: Task, transcript: Sequence[dict], answer: str) -> str:
    items = "\n".join(f"{i}. {item}" for i, item in enumerate(task.rubric, 1))
    return PROMPT.format(instruction=task.instruction, answer=answer or "(none)", items=items,
                         transcript=render_transcript(transcript, self.transcript_chars))

  def grade(self, task: Task, transcript: Sequence[dict], answer: str) -> list[CheckResult]:
    """One CheckResult per rubric item.

    Raises:
      GraderError: the endpoint failed, or the reply is not the JSON asked for.
    """
    if not task.rubric:
      return []
    try:
      reply = self.model.complete([{"role": "user", "content": self.prompt(task, transcript,
                                                                           answer)}])
    except Exception as e:  # noqa: BLE001 - any endpoint failure is this grader's failure
      raise GraderError(f"the rubric judge could not be reached: {type(e).__name__}: {e}") from e
    verdicts = parse_verdicts(getattr(reply, "content", "") or "", len(task.rubric))
    return [CheckResult("rubric", item, verdicts[i][0], 1.0, verdicts[i][1])
            for i, item in enumerate(task.rubric)]


def parse_verdicts(text: str, n: int) -> list[tuple[bool, str]]:
  """[(satisfied, reason)] for items 1..n from the judge's reply. Raises GraderError."""
  fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
  body = fenced.group(1) if fenced else text[text.find("{"):text.rfind("}") + 1]
  try:
    data = json.loads(body)
  except ValueError:
    raise GraderError(f"the rubric judge's reply is not a JSON object: {text[:200]!r}") from None
  items = data.get("items") if isinstance(data, dict) else None
  if not isinstance(items, list):
    raise GraderError(f"the rubric judge's reply has no list 'items': {text[:200]!r}")
  found: dict[int, tuple[bool, str]] = {}
  for entry in items:
    if not isinstance(entry, dict) or not isinstance(entry.get("satisfied"), bool) or \
        not isinstance(entry.get("index"), int) or not 1 <= entry["index"] <= n:
      raise GraderError(f"a rubric verdict must be {{index: 1..{n}, satisfied: true/false}}, got "
                        f"{json.dumps(entry)[:200]}")
    found[entry["index"] - 1] = (entry["satisfied"], str(entry.get("reason", ""))[:500])
  missing = [i + 1 for i in range(n) if i not in found]
  if missing:
    raise GraderError(f"the rubric judge gave no verdict for item(s) {missing}")
  return [found[i] for i in range(n)]
