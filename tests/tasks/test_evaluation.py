"""Evaluation in fresh Orchard Env sandboxes on real instances (parse): gold, empty, broken,
CRLF and test-file-clobbering patches, timeouts, partial resolution, predictions files."""
import dataclasses
import json

import hypothesis
import pytest
from hypothesis import strategies as st

from orchard_jax.tasks.swe import evaluation, grading
from orchard_jax.tasks.swe.testbed import open_sandbox


def _evaluate(env_client, instance, patch, tmp_path=None):
  with open_sandbox(env_client, instance.test_spec.image) as sandbox:
    return evaluation.evaluate_in_sandbox(sandbox, instance, patch,
                                          log_dir=str(tmp_path) if tmp_path else None)


def test_gold_resolves_and_empty_does_not(env_client, parse_tasks, tmp_path):
  instances = parse_tasks.instances
  factory = lambda i: open_sandbox(env_client, i.test_spec.image)
  for name in ("gold", "empty"):
    predictions = evaluation.load_predictions(name, instances)
    summary = evaluation.evaluate_predictions(instances, predictions, sandbox_factory=factory,
                                              output_dir=str(tmp_path / name), progress=False)
    expected = grading.RESOLVED if name == "gold" else grading.UNRESOLVED
    assert [r.outcome for r in summary.results] == [expected] * len(instances)
    written = json.loads((tmp_path / name / "summary.json").read_text())
    assert written["counts"][expected] == len(instances)
    assert written["resolved_rate"] == (1.0 if name == "gold" else 0.0)
    first = instances[0].instance_id
    report = json.loads((tmp_path / name / first / "report.json").read_text())
    assert report["outcome"] == expected
    assert "PASSED" in (tmp_path / name / first / "test_output.txt").read_text()
  empty = json.loads((tmp_path / "empty" / "summary.json").read_text())
  assert sorted(empty["empty_patch_instances"]) == sorted(i.instance_id for i in instances)


def test_patch_edge_cases_in_a_sandbox(env_client, parse_tasks, tmp_path):
  instance = parse_tasks.instances[0]
  # A malformed patch is its own outcome, and no test runs.
  broken = _evaluate(env_client, instance, "diff --git a/x b/x\n@@ nonsense @@\n+junk\n",
                     tmp_path / "broken")
  assert broken.outcome == grading.PATCH_FAILED and broken.tests is None
  assert not (tmp_path / "broken" / "test_output.txt").exists()
  # The gold patch with CRLF line endings (a JSON round trip on Windows) still resolves.
  crlf = _evaluate(env_client, instance, instance.patch.replace("\n", "\r\n"))
  assert crlf.outcome == grading.RESOLVED
  # A model that also rewrote a hidden test file: the test patch restores it first.
  hidden = instance.test_patch.split("+++ b/")[1].split("\n")[0]
  clobber = (f"diff --git a/{hidden} b/{hidden}\nnew file mode 100644\n--- /dev/null\n"
             f"+++ b/{hidden}\n@@ -0,0 +1 @@\n+def test_nothing(): pass\n")
  both = _evaluate(env_client, instance, instance.patch + clobber)
  assert both.outcome == grading.RESOLVED


def test_timeout_and_partial(env_client, parse_tasks):
  instance = parse_tasks.instances[0]
  slow = instance.replace(test_spec=dataclasses.replace(
      instance.test_spec, timeout_s=2, test_cmd="sleep 30; " + instance.test_spec.test_cmd))
  result = _evaluate(env_client, slow, instance.patch)
  assert result.outcome == grading.TIMED_OUT
  # With no fix, an instance whose FAIL_TO_PASS also lists a test that passes anyway is partial.
  mixed = instance.replace(FAIL_TO_PASS=instance.FAIL_TO_PASS + instance.PASS_TO_PASS[:1],
                           PASS_TO_PASS=instance.PASS_TO_PASS[1:])
  assert _evaluate(env_client, mixed, "").outcome == grading.PARTIAL


def test_predictions_file_in_swe_bench_format(parse_tasks, tmp_path):
  instances = parse_tasks.instances
  path = tmp_path / "preds.jsonl"
  path.write_text("".join(json.dumps({"instance_id": i.instance_id, "model_name_or_path": "m",
                                      "model_patch": i.patch if k == 0 else None}) + "\n"
                          for k, i in enumerate(instances[:2])))
  predictions = evaluation.load_predictions(str(path), instances)
  assert predictions == {instances[0].instance_id: instances[0].patch,
                         instances[1].instance_id: ""}
  with pytest.raises(evaluation.EvaluationError, match="does not exist"):
    evaluation.load_predictions(str(tmp_path / "missing.jsonl"), instances)
  (tmp_path / "other.jsonl").write_text(json.dumps({"instance_id": "x", "model_patch": ""}) + "\n")
  with pytest.raises(evaluation.EvaluationError, match="names an instance"):
    evaluation.load_predictions(str(tmp_path / "other.jsonl"), instances)


def test_broken_predictions_file_names_the_line(tmp_path):
  # A JSONL file: a good record, a blank line, a broken line; the error names line 3.
  path = tmp_path / "preds.jsonl"
  path.write_text(json.dumps({"instance_id": "a", "model_patch": ""}) + "\n\nnot json\n")
  with pytest.raises(evaluation.EvaluationError, match=r"line 3 is not a JSON object.*not json"):
    evaluation.load_predictions(str(path), [])
  (tmp_path / "preds.json").write_text('{"instance_id": "a"}\n{"instance_id": "b"}\n')
  with pytest.raises(evaluation.EvaluationError, match=r"not valid JSON.*\.jsonl"):
    evaluation.load_predictions(str(tmp_path / "preds.json"), [])


@hypothesis.settings(max_examples=150, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(content=st.one_of(
    st.binary(max_size=200),
    # text with lone surrogates too: JSON's "\\ud800" escape reads back as one
    st.recursive(st.none() | st.booleans() | st.integers()
                 | st.text(st.characters(exclude_categories=()), max_size=8),
                 lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.sampled_from(["instance_id", "model_patch", "x"]), inner,
                                   max_size=3), max_leaves=8).map(
        lambda v: json.dumps(v).encode())),
    name=st.sampled_from(["preds.jsonl", "preds.json"]))
def test_any_predictions_file_reads_as_predictions_or_one_evaluation_error(tmp_path, content,
                                                                          name):
  # The format check needs no task set (swe.evaluate runs it before loading or building one):
  # whatever the file holds, the answer is {instance_id: patch} or EvaluationError, no other
  # exception.
  path = tmp_path / name
  path.write_bytes(content)
  try:
    predictions = evaluation.read_predictions_file(str(path))
  except evaluation.EvaluationError as e:
    assert str(path) in str(e) and "\n" not in str(e).strip()
  else:
    assert predictions and all(isinstance(k, str) and isinstance(v, str)
                               for k, v in predictions.items())
    for text in [*predictions, *predictions.values()]:
      text.encode("utf-8")                     # text a sandbox, a log and a report can hold


def test_a_prediction_without_model_patch_is_refused_not_graded_as_empty(tmp_path):
  # Walkthrough: {"instance_id", "patch"} (another schema's key) was graded as an empty patch,
  # 'unresolved', exit status 0. null stays SWE-bench's "no patch".
  path = tmp_path / "preds.jsonl"
  path.write_text(json.dumps({"instance_id": "a", "model_patch": None}) + "\n"
                  + json.dumps({"instance_id": "b", "patch": "diff"}) + "\n")
  with pytest.raises(evaluation.EvaluationError,
                     match=r"record 1 \('b'\) has no model_patch \(keys: \['instance_id', "
                           r"'patch'\]\)"):
    evaluation.load_predictions(str(path), [])


@pytest.mark.parametrize("content, expected", [
    ('[{"instance_id": "a", "model_patch": "\\ud800"}]',
     r"record 0 \('a'\) model_patch holds a lone surrogate '\\ud800' at character 0"),
    ('[{"instance_id": "a\\udc80", "model_patch": ""}]',
     r"record 0 instance_id holds a lone surrogate '\\udc80' at character 1"),
    ("[]", "holds no predictions"),
    ("", "not valid JSON"),
])
def test_a_predictions_file_that_holds_no_gradable_text_is_one_error(tmp_path, content,
                                                                     expected):
  # Walkthrough: a lone surrogate in a patch was a traceback from inside the sandbox's upload
  # (status 1), and an empty file graded "0 instances" with status 0.
  path = tmp_path / "preds.json"
  path.write_text(content)
  with pytest.raises(evaluation.EvaluationError, match=expected):
    evaluation.read_predictions_file(str(path))
  jsonl = tmp_path / "preds.jsonl"
  jsonl.write_text("\n\n")
  with pytest.raises(evaluation.EvaluationError, match="holds no predictions"):
    evaluation.read_predictions_file(str(jsonl))
