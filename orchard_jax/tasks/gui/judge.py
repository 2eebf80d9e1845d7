"""A WebJudge-style judge for tasks without a checker: an LLM/VLM behind any OpenAI-compatible
endpoint decides SUCCESS or NOT SUCCESS from the task, the agent's actions and its screenshots.

WebJudge (Online-Mind2Web, arXiv 2504.01382) judges in three steps, each one model call:
  1. key points: the task's requirements, listed from the task alone;
  2. key screenshots: each of the episode's last screenshots is scored 1-5 for how much it
     shows about those key points; those scoring at least `threshold` are kept;
  3. outcome: from the task, the key points, the action history, the answer and the kept
     screenshots, the judge answers "Status: success" or "Status: failure".
A reply that names no status (or a screenshot score that is not 1-5) raises `GraderError`,
which the episode reports as a `grader_error` outcome, never a silent failure. The model is
any object with `complete(messages) -> reply with .content` (the recipe passes a
`harness.ChatModel`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from orchard_jax.tasks.gui.errors import GraderError

KEY_POINTS = ("You will judge whether a web agent completed a task. First, list the key points "
              "of the task: every requirement a correct result must meet (items, quantities, "
              "names, dates, options, filters). Do not add requirements the task does not state."
              "\n\nTask: {task}\n\nReply with the key points, one per line, numbered.")
SCREENSHOT_SCORE = ("Task: {task}\n\nKey points:\n{key_points}\n\nThe image is one screenshot "
                    "from the agent's episode. How much does it show about whether the key "
                    "points were met? Score 1 (nothing relevant) to 5 (decisive evidence).\n"
                    "Reply with the reasoning in one or two sentences, then a last line "
                    "'Score: N'.")
OUTCOME = ("You judge whether a web agent completed its task.\n\nTask: {task}\n\nKey points:\n"
           "{key_points}\n\nThe agent's actions, in order:\n{actions}\n\nThe agent's final "
           "answer: {answer}\n\nThe images are the screenshots that show the most about the "
           "result (the last one is the final page). The task is a success only if every key "
           "point is met by what the agent did (not merely by what it says). Explain briefly, "
           "then end with a last line that is exactly 'Status: success' or 'Status: failure'.")


@dataclasses.dataclass(frozen=True)
class JudgeVerdict:
  """The judge's decision: success, the reasoning, and what it was based on."""
  success: bool
  reason: str
  key_points: str = ""
  kept_screenshots: int = 0


def _image_part(url: str) -> dict:
  return {"type": "image_url", "image_url": {"url": url}}


def _screenshots(messages: list) -> list:
  """The image URLs of a run's messages, in order."""
  out = []
  for message in messages or []:
    content = message.get("content")
    if isinstance(content, list):
      out += [p["image_url"]["url"] for p in content
              if isinstance(p, dict) and p.get("type") == "image_url"]
  return out


def _actions(messages: list, limit: int = 60) -> str:
  lines = []
  for message in messages or []:
    for call in message.get("tool_calls") or []:
      fn = call.get("function") or {}
      lines.append(f"{len(lines) + 1}. {fn.get('name')}({fn.get('arguments')})")
  if len(lines) > limit:
    lines = lines[:limit // 2] + [f"... {len(lines) - limit} more ..."] + lines[-limit // 2:]
  return "\n".join(lines) or "(no actions)"


class WebJudge:
  """The three-step judge (module docstring).

  Args:
    model: has `complete(messages) -> reply with .content`.
    max_screenshots: the last screenshots considered (the final page always among them).
    threshold: the lowest 1-5 score a screenshot is kept with.
    always: judge every task (True), or only tasks without a checker (False).
  """

  def __init__(self, model: Any, *, max_screenshots: int = 5, threshold: int = 3,
               always: bool = False):
    if not 1 <= threshold <= 5:
      raise ValueError(f"threshold must be 1-5, got {threshold}")
    self.model, self.max_screenshots, self.threshold = model, int(max_screenshots), threshold
    self.always = always

  def _ask(self, content: Any) -> str:
    try:
      reply = self.model.complete([{"role": "user", "content": content}])
    except Exception as e:  # noqa: BLE001 - an endpoint failure is a grader error
      raise GraderError(f"the judge's endpoint failed: {type(e).__name__}: {e}") from e
    text = getattr(reply, "content", None)
    if not isinstance(text, str) or not text.strip():
      raise GraderError("the judge's reply was empty")
    return text

  def judge(self, instruction: str, run: Any, browser: Any = None) -> JudgeVerdict:
    """Judges one episode.

    Args:
      instruction: the task.
      run: the agent's run (its `messages` hold the screenshots and calls; `answer`).
      browser: the BrowserSandbox, whose last observation is the final page (optional).
    Raises:
      GraderError: the endpoint failed or a reply could not be read.
    """
    messages = getattr(run, "messages", []) or []
    shots = _screenshots(messages)
    final = getattr(browser, "last", None) if browser is not None else None
    if final is not None and final.screenshot is not None:
      shots.append(final.data_url)
    shots = list(dict.fromkeys(shots))[-self.max_screenshots:]
    key_points = self._ask(KEY_POINTS.format(task=instruction)).strip()
    kept = []
    for i, url in enumerate(shots):
      text = self._ask([{"type": "text", "text": SCREENSHOT_SCORE.format(
          task=instruction, key_points=key_points)}, _image_part(url)])
      match = re.search(r"score\s*[:=]\s*([1-5])\b", text, re.IGNORECASE)
      if match is None:
        raise GraderError(f"screenshot {i}: expected a last line 'Score: 1-5', got "
                          f"{text.strip()[-120:]!r}")
      if int(match.group(1)) >= self.threshold or i == len(shots) - 1:
        kept.append(url)   # the final page is always shown
    answer = json.dumps(getattr(run, "answer", "") or "")
    text = self._ask([{"type": "text", "text": OUTCOME.format(
        task=instruction, key_points=key_points, actions=_actions(messages), answer=answer)}]
        + [_image_part(url) for url in kept])
    statuses = re.findall(r"status\s*:\s*\**\s*(success|failure|not success)", text,
                          re.IGNORECASE)
    if not statuses:
      raise GraderError(f"expected a last line 'Status: success' or 'Status: failure', got "
                        f"{text.strip()[-160:]!r}")
    success = statuses[-1].lower() == "success"
    return JudgeVerdict(success, text.strip()[-1000:], key_points, len(kept))

