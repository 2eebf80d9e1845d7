"""Rubric judges for rubric-based process reward (RPR; docs/algorithms.md section 5).

Two judges grade a whole SWE trajectory on the SWE rubric set (the paper's seven rubrics,
tasks/swe/rubrics.py; `RUBRIC_SET`) and return raw scores as an `agentic.Judgement`; the loop
snaps, weights and combines them with R_bin through `rl.rpr_reward` with this rubric set
(R' = R_bin + alpha J, and R_bin alone when the judgement failed):

- `LLMJudge`: a model behind an OpenAI-compatible endpoint reads the prompt in
  `prompts/swe_judge.txt` (the rubrics with their weights, the grounding rule, the trajectory
  with observations compacted to 1,200 characters, the submitted patch) and answers JSON
  `{"reasoning", "scores"}`. Orchard's setting: a frontier model at temperature 0.6, 1,024 max
  tokens. Any failure (endpoint down, no JSON, a missing or out-of-range score) is a failed
  judgement, never an exception.
- `EvidenceJudge`: offline and deterministic; scores the same rubrics from what the trajectory
  shows (`evidence.gather_evidence`): a reproduction that failed before the fix and passed
  after it, existing tests run after the change, claims that match the last test run. The gold
  patch and FAIL_TO_PASS ids ground R2, R3 and R5 only, as the rubric rules say.

Both name the submission's test-infrastructure edits in their verdict (`screening.review_patch`:
paths grading refuses or puts back, added code that reaches into the runner), and both hold
them against R1 and R7: the LLM judge sees them in its prompt; the evidence judge scores R1 and
R7 zero for a kind grading refuses and lowers them for an edit that changes how the tests run
(conftest, runner configuration, the hidden test files, the package layout around the tests).

`make_judge(config.judge)` picks one by `kind` ("evidence" or "llm").
"""
from __future__ import annotations

import os
import re
import time
from typing import Sequence

from orchard_jax import rl
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import llm
from orchard_jax.recipes.agentic.domain import Judgement
from orchard_jax.recipes.swe.evidence import Evidence, gather_evidence, render_trajectory
from orchard_jax.tasks.swe import screening
from orchard_jax.tasks.swe.patches import patch_files
from orchard_jax.tasks.swe.rubrics import RUBRICS

PROMPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")
RUBRIC_SET = rl.RubricSet(RUBRICS)

JUDGE_KINDS = ("evidence", "llm")


def parse_judge_reply(text: str) -> tuple[dict[str, float], str]:
  """(scores, reasoning) from a judge's reply: JSON {"reasoning", "scores"} (scores keyed by
  rubric name or R1..R7).

  Raises:
    llm.GraderError: no JSON object, no "scores" object, or scores that `rl.judge_score`
      rejects (missing rubric, not a number, outside [0, 1]).
  """
  reply = llm.extract_json_object(text)
  scores = reply.get("scores")
  if not isinstance(scores, dict):
    raise llm.GraderError(f"the judge's JSON has no 'scores' object; keys {sorted(reply)}")
  try:
    rl.judge_score(scores, RUBRIC_SET)
  except rl.RLError as error:
    raise llm.GraderError(f"unusable rubric scores: {error}") from error
  return RUBRIC_SET.named_scores(scores), str(reply.get("reasoning", ""))


def _names(tests: Sequence[str]) -> list[str]:
  """Test function names of SWE-bench test ids ("path::Class::test_x[param]" -> "test_x")."""
  out = []
  for test in tests:
    name = re.sub(r"\[.*\]$", "", test.split("::")[-1])
    if name and name not in out:
      out.append(name)
  return out


class EvidenceJudge:
  """The offline judge (module docstring). Scores are multiples of 0.1 in [0, 1]."""

  name = "evidence"

  def judge(self, trajectory, instance) -> Judgement:
    start = time.perf_counter()
    ev = gather_evidence(trajectory.messages)
    review = screening.review_patch(trajectory.submission or "", instance)
    scores = evidence_scores(ev, trajectory.submission or "", gold_patch=instance.patch,
                             fail_to_pass=instance.FAIL_TO_PASS, review=review)
    reasoning = infrastructure_verdict(review) + "evidence: " + ", ".join(
        f"{k}={v}" for k, v in ev.summary().items() if v not in (None, False, [], 0))
    return Judgement(scores, reasoning, "", self.name, time.perf_counter() - start)


def infrastructure_verdict(review: screening.Review) -> str:
  """The verdict's sentence on test-infrastructure edits ("" when there are none)."""
  return f"test-infrastructure edits: {'; '.join(review.lines)}. " if review.lines else ""


def evidence_scores(ev: Evidence, submission: str, *, gold_patch: str = "",
                    fail_to_pass: Sequence[str] = (),
                    review: screening.Review | None = None) -> dict[str, float]:
  """The seven rubric scores from a trajectory's evidence (see EvidenceJudge).

  Args:
    ev: `gather_evidence(messages)`.
    submission: the submitted patch ("" for none).
    gold_patch, fail_to_pass: the reference fix and hidden test ids; ground R2, R3, R5 only.
    review: the submission's test-infrastructure edits (R1 and R7).
  Returns:
    {rubric name: score in [0, 1]} for every name in RUBRIC_SET.names.
  """
  steps = ev.steps
  changed = patch_files(submission) if submission.strip() else []
  gold_files = set(patch_files(gold_patch)) if gold_patch else set()
  test_like = [f for f in changed if re.search(r"(^|/)tests?/|(^|/)test_[^/]*\.py$", f)]
  added = sum(1 for line in submission.splitlines()
              if line[:1] in "+-" and not line.startswith(("+++", "---")))
  f2p_names = _names(fail_to_pass)
  repro_text = "\n".join(steps[i].command for i in ev.reproduction_steps)
  grounded = bool(f2p_names) and any(name in repro_text for name in f2p_names)
  covered = (sum(name in repro_text for name in f2p_names) / len(f2p_names)) if f2p_names else 0.0

  # R1: a source change, verified by a failing test that now passes, small, tests untouched.
  fix = 0.0
  if changed:
    fix = 0.4 + 0.3 * bool(ev.fail_to_pass_steps) + 0.2 * (not test_like) + 0.1 * (added <= 40)
    fix -= 0.3 * bool(test_like)
  # R2: a reproduction that ran, failed before the fix, and targets the real bug (grounded).
  repro = 0.0
  if ev.reproduction_steps:
    repro = 0.4 + 0.3 * ev.reproduced_before_fix + 0.3 * grounded
  elif any(s.runs_tests for s in steps):
    repro = 0.2 + 0.2 * ev.reproduced_before_fix
  # R3: the hidden tests' cases exercised, and the change where the bug is (grounded).
  coverage = 0.6 * covered + 0.4 * (bool(gold_files & set(changed)) if gold_files else 0.0)
  # R4: checked its work after changing code; read code before editing.
  rigor = 0.0
  if ev.last_edit is not None:
    reran_repro = any(i > ev.last_edit for i in ev.reproduction_steps)
    read_first = any(not s.edits_source and not s.runs_tests and s.index < (ev.first_edit or 0)
                     for s in steps)
    rigor = 0.4 * ev.verified_after_fix + 0.3 * reran_repro + 0.3 * read_first
  # R5: a test that failed before the fix and passed after it, both visible.
  disc = 0.0
  if ev.reproduced_before_fix and ev.fail_to_pass_steps:
    disc = 0.8 + 0.2 * grounded
  elif ev.reproduced_before_fix:
    disc = 0.3
  elif ev.fail_to_pass_steps:
    disc = 0.4
  # R6: existing tests ran after the change and pass.
  guard = 0.0
  if ev.existing_tests_after_fix:
    guard = 1.0 if ev.existing_tests_passed else 0.3
  # R7: claims agree with the outputs; no submitting over a failing run.
  integrity = 1.0
  integrity -= 0.4 * bool(ev.unsupported_claims)
  integrity -= 0.4 * ev.submitted_with_failing_tests
  integrity -= 0.2 * (ev.claims_success and not any(s.runs_tests for s in steps))
  # R1 and R7: a kind grading refuses is no fix and no honest report; an edit that changes how
  # the tests run (a conftest, the runner's configuration, the hidden tests) is not part of one.
  if review is not None and review.tampering:
    fix = integrity = 0.0
  elif review is not None and review.runner_edits:
    fix -= 0.3
    integrity -= 0.4
  values = (fix, repro, coverage, rigor, disc, guard, integrity)
  return {name: rl.snap_score(min(max(v, 0.0), 1.0))
          for name, v in zip(RUBRIC_SET.names, values)}


class LLMJudge:
  """An LLM judge behind an OpenAI-compatible endpoint (module docstring).

  Args:
    endpoint: ConfigDict with url, model, api_key_env, timeout_s, retries.
    temperature, max_tokens: sampling settings (Orchard: 0.6, 1,024).
    observation_chars: per-observation budget in the prompt (Orchard: 1,200).
    prompt: template file name in recipes/swe/prompts or a path.
  """

  name = "llm"

  def __init__(self, endpoint, *, temperature: float = 0.6, max_tokens: int = 1024,
               observation_chars: int = 1200, prompt: str = "swe_judge.txt"):
    self.endpoint = endpoint
    self.temperature = temperature
    self.max_tokens = max_tokens
    self.observation_chars = observation_chars
    self.template = llm.load_prompt(prompt, PROMPTS_DIR)

  def prompt(self, trajectory, instance) -> str:
    """The judge prompt for one trajectory."""
    return llm.render_prompt(self.template, {
        "problem_statement": instance.problem_statement,
        "gold_patch": instance.patch,
        "fail_to_pass": "\n".join(instance.FAIL_TO_PASS),
        "trajectory": render_trajectory(trajectory.messages,
                                        observation_chars=self.observation_chars),
        "submission": trajectory.submission or "(no change submitted)",
        "test_infrastructure": "\n".join(
            screening.review_patch(trajectory.submission or "", instance).lines) or "(none)"})

  def judge(self, trajectory, instance) -> Judgement:
    start = time.perf_counter()
    try:
      with llm.chat_model(self.endpoint, temperature=self.temperature,
                          max_tokens=self.max_tokens) as model:
        reply = model.complete([{"role": "user", "content": self.prompt(trajectory, instance)}])
      scores, reasoning = parse_judge_reply(reply.content)
      verdict = infrastructure_verdict(screening.review_patch(trajectory.submission or "",
                                                              instance))
    except Exception as error:  # noqa: BLE001 - any failure is a failed judgement (fallback)
      return Judgement(None, "", f"{type(error).__name__}: {error}", self.name,
                       time.perf_counter() - start)
    return Judgement(scores, verdict + reasoning, "", self.name, time.perf_counter() - start)


def make_judge(judge_config):
  """The judge a `judge` ConfigDict names (kind "evidence" or "llm").

  Raises:
    ConfigError (a ValueError): an unknown kind (lists the known ones).
  """
  kind = judge_config.kind
  if kind == "evidence":
    return EvidenceJudge()
  if kind == "llm":
    return LLMJudge(judge_config, temperature=float(judge_config.temperature),
                    max_tokens=int(judge_config.max_tokens),
                    observation_chars=int(judge_config.observation_chars),
                    prompt=judge_config.prompt)
  raise ConfigError(f"judge.kind is {kind!r}; expected one of {JUDGE_KINDS}")
