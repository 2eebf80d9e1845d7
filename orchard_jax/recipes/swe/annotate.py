"""Value annotators for credit-assignment SFT (docs/algorithms.md section 1).

An annotator sees a whole trajectory and its final outcome and gives V(s_t) = P(resolve |
history up to step t, outcome) at a few key steps; `rl.credit_assignment_sft` interpolates
between them, takes credits c_t = V(s_{t+1}) - V(s_t) and trains the actions in rise segments
of unresolved trajectories. State s_t is the history before action t, so the evidence an action
produces (its observation) shows in V(s_{t+1}).

- `LLMAnnotator`: a teacher model behind an OpenAI-compatible endpoint, with the prompt in
  `prompts/swe_annotator.txt`, answering JSON {"reasoning", "annotations": [{"step", "value"}]}.
  A failed call or an unusable answer falls back to the evidence annotator (counted).
- `EvidenceAnnotator`: offline. V holds flat until evidence changes it: a reproduction that
  fails before any edit (the bug is confirmed) raises it, an edit whose test goes from failing
  to passing raises it a lot, a test still failing after an edit lowers it, existing tests
  passing after the fix raise it, and the last state agrees with the outcome. Both ends of every
  change are annotated, so credit lands on the action that produced the evidence.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional

from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import llm
from orchard_jax.recipes.agentic.domain import Annotation
from orchard_jax.recipes.swe.evidence import gather_evidence, read_steps, render_trajectory

ANNOTATOR_KINDS = ("evidence", "llm")
PROMPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")


class EvidenceAnnotator:
  """The offline annotator (module docstring).

  Args:
    prior: V(s_0), before any action.
    reproduced: V after a reproduction confirms the bug (before any edit).
    fixed: V after an edit whose test went from failing to passing.
    resolved_end, unresolved_end: V of the last state, by outcome.
  """

  name = "evidence"

  def __init__(self, *, prior: float = 0.3, reproduced: float = 0.45, fixed: float = 0.8,
               resolved_end: float = 0.95, unresolved_end: float = 0.05):
    self.prior, self.reproduced, self.fixed = prior, reproduced, fixed
    self.resolved_end, self.unresolved_end = resolved_end, unresolved_end

  def annotate(self, trajectory, instance=None) -> Annotation:
    start = time.perf_counter()
    ev = gather_evidence(trajectory.messages)
    num_steps = len(ev.steps)
    if num_steps == 0:
      return Annotation([], [], 0, self.name, "no actions", "", time.perf_counter() - start)
    marks: dict[int, float] = {0: self.prior}
    value = self.prior
    notes = []

    def change(step: int, new: float, why: str):
      nonlocal value
      if step + 1 >= num_steps or abs(new - value) < 1e-9:
        return
      marks.setdefault(step, value)   # flat up to the action that produced the evidence
      marks[step + 1] = new
      value = new
      notes.append(f"step {step}: {why} -> {new:.2f}")

    edits: list[int] = []
    for step in ev.steps:
      if step.edits_source or step.reverts:
        edits.append(step.index)
      if not step.runs_tests or step.returncode is None:
        continue
      passed = bool(step.tests_passed)
      cause = edits[-1] if edits else None   # the change this run tests
      if cause is None:
        if not passed and value < self.reproduced:
          change(step.index, self.reproduced, "bug reproduced")
      elif passed and cause in ev.fail_to_pass_steps and value < self.fixed:
        if cause + 1 <= max(marks):           # evidence already placed after the cause
          change(step.index, self.fixed, "a failing test now passes")
        else:
          change(cause, self.fixed, "this edit makes a failing test pass")
      elif passed and value >= self.fixed and step.index > (ev.last_edit or 0) \
          and ev.existing_tests_passed:
        change(step.index, min(value + 0.1, self.resolved_end), "existing tests pass")
      elif not passed and value > 0.1:
        lower = max(min(value, self.reproduced) - 0.2, 0.1)
        if cause + 1 <= max(marks):
          change(step.index, lower, "still failing after an edit")
        else:
          change(cause, lower, "this edit leaves the test failing")
    resolved = bool(trajectory.resolved)
    end = self.resolved_end if resolved else self.unresolved_end
    last = num_steps - 1
    if last >= 1:
      marks.setdefault(last - 1, value)   # the outcome shows only at the end
    marks[last] = end
    steps = sorted(marks)
    return Annotation(steps, [float(marks[s]) for s in steps], num_steps, self.name,
                      "; ".join(notes) or "no test evidence", "", time.perf_counter() - start)


def parse_annotation_reply(text: str, num_steps: int) -> tuple[list[int], list[float], str]:
  """(steps, values, reasoning) from an annotator's JSON reply, validated.

  Raises:
    llm.GraderError: no JSON, no "annotations" list, a step outside [0, num_steps), repeated
      steps, or a value that is not a number in [0, 1].
  """
  reply = llm.extract_json_object(text)
  items = reply.get("annotations")
  if not isinstance(items, list) or not items:
    raise llm.GraderError(f"the annotator's JSON has no non-empty 'annotations' list; keys "
                          f"{sorted(reply)}")
  marks: dict[int, float] = {}
  for item in items:
    try:
      step, value = int(item["step"]), float(item["value"])
    except (KeyError, TypeError, ValueError) as error:
      raise llm.GraderError(f"annotation {item!r} is not {{'step': int, 'value': float}}") \
          from error
    if not 0 <= step < num_steps:
      raise llm.GraderError(f"annotated step {step} is outside [0, {num_steps})")
    if not 0.0 <= value <= 1.0:
      raise llm.GraderError(f"annotated value {value} at step {step} is outside [0, 1]")
    if step in marks:
      raise llm.GraderError(f"step {step} is annotated twice")
    marks[step] = value
  steps = sorted(marks)
  return steps, [marks[s] for s in steps], str(reply.get("reasoning", ""))


class LLMAnnotator:
  """A teacher-model annotator behind an OpenAI-compatible endpoint (module docstring).

  Args:
    endpoint: ConfigDict with url, model, api_key_env, timeout_s, retries.
    temperature, max_tokens: sampling settings.
    observation_chars: per-observation budget in the prompt.
    prompt: template file name in recipes/swe/prompts or a path.
    fallback: the annotator used when the LLM fails (default EvidenceAnnotator()).
  """

  name = "llm"

  def __init__(self, endpoint, *, temperature: float = 0.2, max_tokens: int = 1024,
               observation_chars: int = 1200, prompt: str = "swe_annotator.txt",
               fallback: Optional[EvidenceAnnotator] = None):
    self.endpoint = endpoint
    self.temperature, self.max_tokens = temperature, max_tokens
    self.observation_chars = observation_chars
    self.template = llm.load_prompt(prompt, PROMPTS_DIR)
    self.fallback = fallback or EvidenceAnnotator()

  def prompt(self, trajectory, instance, num_steps: int) -> str:
    outcome = {True: "RESOLVED: the hidden tests pass.",
               False: "NOT RESOLVED: the hidden tests fail.",
               None: "not evaluated"}[trajectory.resolved]
    return llm.render_prompt(self.template, {
        "problem_statement": getattr(instance, "problem_statement", "") or "(not given)",
        "trajectory": render_trajectory(trajectory.messages,
                                        observation_chars=self.observation_chars),
        "outcome": outcome, "num_steps": num_steps, "last_step": max(num_steps - 1, 0)})

  def annotate(self, trajectory, instance=None) -> Annotation:
    start = time.perf_counter()
    num_steps = len(read_steps(trajectory.messages))
    try:
      with llm.chat_model(self.endpoint, temperature=self.temperature,
                          max_tokens=self.max_tokens) as model:
        reply = model.complete([{"role": "user",
                                 "content": self.prompt(trajectory, instance, num_steps)}])
      steps, values, reasoning = parse_annotation_reply(reply.content, num_steps)
    except Exception as error:  # noqa: BLE001 - any failure falls back to the evidence
      fallback = self.fallback.annotate(trajectory, instance)
      return dataclasses.replace(fallback, source="evidence_fallback",
                                 failure=f"{type(error).__name__}: {error}",
                                 seconds=time.perf_counter() - start)
    return Annotation(steps, values, num_steps, self.name, reasoning, "",
                      time.perf_counter() - start)


def make_annotator(annotator_config):
  """The annotator an `annotator` ConfigDict names (kind "evidence" or "llm").

  Raises:
    ConfigError (a ValueError): an unknown kind.
  """
  kind = annotator_config.kind
  if kind == "evidence":
    return EvidenceAnnotator()
  if kind == "llm":
    return LLMAnnotator(annotator_config, temperature=float(annotator_config.temperature),
                        max_tokens=int(annotator_config.max_tokens),
                        observation_chars=int(annotator_config.observation_chars),
                        prompt=annotator_config.prompt)
  raise ConfigError(f"annotator.kind is {kind!r}; expected one of {ANNOTATOR_KINDS}")
