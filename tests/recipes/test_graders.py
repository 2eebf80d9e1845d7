"""Evidence reading, the RPR judges and the credit annotators on trajectories whose evidence
can be checked by eye (tests/recipes/trajectories.py). Rubric weights, snapping and the
combination R' = R_bin + alpha J are written again here from docs/algorithms.md section 5."""
import json
import math

import ml_collections
import pytest

from orchard_jax import data, rl
from orchard_jax.recipes.agentic import llm
from orchard_jax.recipes.swe import annotate as swe_annotate
from orchard_jax.recipes.swe import evidence as swe_evidence
from orchard_jax.recipes.swe import judge as swe_judge
from tests.recipes import trajectories as T
from tests.recipes.scripted_llm import ScriptedLLM

WEIGHTS = {"fix_quality": 0.15, "reproduction": 0.18, "coverage": 0.12, "rigor": 0.15,
           "discriminativeness": 0.14, "regression_guard": 0.12, "verification_integrity": 0.14}


def reference_j(scores: dict) -> float:
  """J = clamp(sum_k w_k snap(R_k), 0, 1), snapping to 0.1 half up (docs/algorithms.md 5)."""
  total = sum(WEIGHTS[k] * math.floor(scores[k] * 10 + 0.5 + 1e-9) / 10 for k in WEIGHTS)
  return min(max(total, 0.0), 1.0)


class _Instance:
  patch = T.PATCH
  problem_statement = "Fix the bug in mod.add."
  FAIL_TO_PASS = ["tests/test_mod.py::test_add_numbers"]


def _reward(judgement, *, resolved):
  """R' as the loop combines a judgement with the SWE rubric set (agentic/rollouts.py)."""
  return rl.rpr_reward(resolved, None if judgement.failed else judgement.scores,
                       rubrics=swe_judge.RUBRIC_SET, alpha=0.5, failure=judgement.failure)


def _trajectory(messages, resolved, submission=""):
  return data.Trajectory(trajectory_id="t", task_id="pkg-1", messages=messages,
                         submission=submission, outcome={"resolved": resolved})


def test_evidence_of_a_careful_and_a_careless_run():
  careful = swe_evidence.gather_evidence(T.careful())
  assert [s.index for s in careful.steps] == list(range(7))
  assert careful.steps[1].writes_test and not careful.steps[1].edits_source
  assert careful.steps[2].edits_source and careful.steps[2].written_files == ("pkg/mod.py",)
  assert careful.reproduced_before_fix and careful.fail_to_pass_steps == [2]
  assert careful.reproduction_steps == [1, 3]
  assert careful.existing_tests_after_fix and careful.existing_tests_passed
  assert careful.unsupported_claims == [] and not careful.submitted_with_failing_tests

  careless = swe_evidence.gather_evidence(T.careless())
  assert careless.reproduced_before_fix and careless.fail_to_pass_steps == []
  assert careless.last_test_passed is False and careless.submitted_with_failing_tests
  assert careless.unsupported_claims == [3]


def test_heredoc_bodies_are_not_commands():
  """`mock.patch` or `> x.py` inside a test file being written is not a patch or an edit."""
  command = ("cat > tests/test_repro.py <<'EOF'\nfrom unittest import mock\n"
             "with mock.patch('a.b'):\n    print('x' > 'y.py')\nEOF\npython -m pytest -q "
             "tests/test_repro.py")
  [step] = swe_evidence.read_steps(T.header() + [T.action("repro", command),
                                                 T.observation(1, "1 failed")])
  assert step.writes_test and not step.edits_source and step.runs_tests
  assert step.written_files == ("tests/test_repro.py",)


def test_evidence_judge_rewards_the_process_not_the_outcome():
  judge = swe_judge.EvidenceJudge()
  good = judge.judge(_trajectory(T.careful(), True, T.PATCH), _Instance())
  bad = judge.judge(_trajectory(T.careless(), False, ""), _Instance())
  assert not good.failed and not bad.failed
  assert set(good.scores) == set(WEIGHTS)
  # Textbook process: fail -> fix -> pass visible, existing tests pass, claims supported.
  assert good.scores["discriminativeness"] == 1.0
  assert good.scores["regression_guard"] == 1.0
  assert good.scores["verification_integrity"] == 1.0
  # Reproduced but never passing, no existing tests, claims success over a failing run.
  assert bad.scores["discriminativeness"] == pytest.approx(0.3)
  assert bad.scores["regression_guard"] == 0.0
  assert bad.scores["verification_integrity"] == pytest.approx(0.2)
  assert bad.scores["fix_quality"] == 0.0   # nothing submitted
  assert reference_j(good.scores) > reference_j(bad.scores)
  for scores in (good.scores, bad.scores):
    assert all(abs(v * 10 - round(v * 10)) < 1e-9 for v in scores.values())  # 0.1 steps
  reward = _reward(good, resolved=True)
  assert reward.reward == pytest.approx(1.0 + 0.5 * reference_j(good.scores))


CONFTEST = ("diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/conftest.py\n@@ -0,0 +1 @@\n+import pytest\n")
SHADOW = ("diff --git a/pytest.py b/pytest.py\nnew file mode 100644\n--- /dev/null\n"
          "+++ b/pytest.py\n@@ -0,0 +1 @@\n+raise SystemExit(0)\n")


@pytest.mark.parametrize("extra, fix, integrity, named", [
    ("", 1.0, 1.0, None),
    (CONFTEST, 0.7, 0.6, "restored conftest.py from the base (conftest"),
    (SHADOW, 0.0, 0.0, "rejected pytest.py (runner_shadow"),
])
def test_evidence_judge_names_and_holds_test_infrastructure_edits(extra, fix, integrity, named):
  # The careful trajectory with the same source fix, plus an edit of the test infrastructure:
  # put back (a conftest) or refused (a module that shadows pytest) by grading, named here.
  judgement = swe_judge.EvidenceJudge().judge(
      _trajectory(T.careful(), True, T.PATCH + extra), _Instance())
  assert judgement.scores["fix_quality"] == pytest.approx(fix)
  assert judgement.scores["verification_integrity"] == pytest.approx(integrity)
  if named is None:
    assert "test-infrastructure" not in judgement.reasoning
  else:
    assert judgement.reasoning.startswith("test-infrastructure edits: " + named)


def test_parse_judge_reply_accepts_names_r_keys_and_fences():
  names = {k: 0.34 for k in WEIGHTS}
  scores, reasoning = swe_judge.parse_judge_reply(
      "Here you go:\n```json\n" + json.dumps({"reasoning": "ok {braces}", "scores": names})
      + "\n```")
  assert scores == names and reasoning == "ok {braces}"
  r_keys = {f"R{k + 1}": 0.5 for k in range(7)}
  scores, _ = swe_judge.parse_judge_reply("prefix " + json.dumps({"scores": r_keys}) + " end")
  assert scores == {k: 0.5 for k in WEIGHTS}
  for bad in ("no json at all", json.dumps({"scores": {"fix_quality": 1.0}}),
              json.dumps({"scores": {**names, "rigor": 3}}),
              json.dumps({"scores": {**names, "rigor": "high"}}), json.dumps({"verdict": 1})):
    with pytest.raises(llm.GraderError):
      swe_judge.parse_judge_reply(bad)


def test_llm_judge_scores_and_falls_back_on_failure():
  given = {"fix_quality": 0.26, "reproduction": 1.0, "coverage": 0.44, "rigor": 0.5,
           "discriminativeness": 0.95, "regression_guard": 0.0, "verification_integrity": 0.7}

  def reply(index, body):
    if index == 1:
      return "I would rather not grade this."          # unusable: the fallback applies
    return json.dumps({"reasoning": "steps 1-3 reproduce and fix", "scores": given})

  with ScriptedLLM(reply) as server:
    endpoint = ml_collections.ConfigDict(dict(kind="llm", url=server.url, model="judge",
                                              api_key_env="", timeout_s=10.0, retries=0,
                                              temperature=0.6, max_tokens=1024,
                                              observation_chars=40, prompt="swe_judge.txt",
                                              max_workers=1))
    judge = swe_judge.make_judge(endpoint)
    first = judge.judge(_trajectory(T.careful(), True, T.PATCH + CONFTEST), _Instance())
    second = judge.judge(_trajectory(T.careful(), True, T.PATCH), _Instance())
    body = server.requests[0].body
  prompt = body["messages"][0]["content"]
  # The judge sees the submission's test-infrastructure edits and its verdict names them.
  edits = prompt.split("<test_infrastructure_edits>")[1].split("</test_infrastructure_edits>")[0]
  assert edits.strip().startswith("restored conftest.py from the base (conftest")
  assert first.reasoning.startswith("test-infrastructure edits: restored conftest.py")
  assert first.reasoning.endswith("steps 1-3 reproduce and fix")
  assert body["temperature"] == 0.6 and body["max_tokens"] == 1024
  assert "Fix the bug in mod.add." in prompt and "test_add_numbers" in prompt
  assert "characters elided" in prompt             # observations compacted to 40 characters
  assert first.scores == given and not first.failed
  assert second.failed and "GraderError" in second.failure
  ok = _reward(first, resolved=False)
  assert ok.reward == pytest.approx(-1.0 + 0.5 * reference_j(given))
  fallback = _reward(second, resolved=True)
  assert fallback.reward == 1.0 and fallback.judge_failed and "GraderError" in fallback.failure
  # An unreachable endpoint is a failed judgement too, never an exception.
  endpoint.url = "http://127.0.0.1:9/v1"
  down = swe_judge.make_judge(endpoint).judge(_trajectory(T.careful(), True), _Instance())
  assert down.failed and down.scores is None


def test_evidence_annotator_credits_the_action_behind_the_evidence():
  annotator = swe_annotate.EvidenceAnnotator()
  good = annotator.annotate(_trajectory(T.careful(), True))
  values = rl.interpolate_values(good.num_steps, good.steps, good.values)
  credits = rl.step_credits(values)
  # The reproduction (step 1) and the fixing edit (step 2) carry the rising credit.
  assert credits[1] > 0.05 and credits[2] > 0.05 and credits[0] == pytest.approx(0.0)
  assert values[-1] == pytest.approx(0.95)
  bad = annotator.annotate(_trajectory(T.careless(), False))
  mask, segments = rl.trained_steps(bad.num_steps, False, annotated_steps=bad.steps,
                                    annotated_values=bad.values)
  # Only the reproduction's rise segment [0, 1] is trained in the unresolved run.
  assert segments == [(0, 1)] and mask.tolist() == [True, True, False, False]
  assert bad.values[-1] == pytest.approx(0.05)


def test_llm_annotator_parses_and_falls_back():
  def reply(index, body):
    if index == 0:
      return json.dumps({"reasoning": "r", "annotations": [{"step": 0, "value": 0.2},
                                                           {"step": 2, "value": 0.9}]})
    return json.dumps({"annotations": [{"step": 99, "value": 0.5}]})   # step out of range

  with ScriptedLLM(reply) as server:
    endpoint = ml_collections.ConfigDict(dict(kind="llm", url=server.url, model="teacher",
                                              api_key_env="", timeout_s=10.0, retries=0,
                                              temperature=0.2, max_tokens=512,
                                              observation_chars=1200,
                                              prompt="swe_annotator.txt"))
    annotator = swe_annotate.make_annotator(endpoint)
    ok = annotator.annotate(_trajectory(T.careless(), False), _Instance())
    fallback = annotator.annotate(_trajectory(T.careless(), False), _Instance())
    prompt = server.requests[0].body["messages"][0]["content"]
  assert "NOT RESOLVED" in prompt and "4 steps (0 to 3)" in prompt
  assert (ok.source, ok.steps, ok.values) == ("llm", [0, 2], [0.2, 0.9])
  assert fallback.source == "evidence_fallback" and "outside" in fallback.failure
  assert fallback.steps == swe_annotate.EvidenceAnnotator().annotate(
      _trajectory(T.careless(), False)).steps


def test_extract_json_object_handles_nesting_and_strings():
  text = 'noise {"a": "x}y", "b": {"c": [1, 2]}} tail {"d": 1}'
  assert llm.extract_json_object(text) == {"a": "x}y", "b": {"c": [1, 2]}}
  with pytest.raises(llm.GraderError):
    llm.extract_json_object("{not json}")
