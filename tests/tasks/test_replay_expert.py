"""The replay expert on a real instance (parse): every variant runs for real in a sandbox, the
good ones replay to resolved, the failed ones do not, and the evidence marks the step that made
the reproduction pass."""
import re

import pytest

from orchard_jax.tasks.swe.expert import plan_steps, run_expert, slice_tests
from orchard_jax.tasks.swe import evaluation
from orchard_jax.tasks.swe.testbed import open_sandbox
from tests.parse_tasks import parse_task_set


@pytest.fixture(scope="module")
def instance():
  return parse_task_set().instances[0]


@pytest.mark.slow
def test_variants_replay_to_their_expected_outcome(env_client, instance, tmp_path):
  factory = lambda i: open_sandbox(env_client, i.test_spec.image)

  def grade(inst, patch):
    with factory(inst) as sandbox:
      return evaluation.evaluate_in_sandbox(sandbox, inst, patch)

  expected = {"gold": True, "detour": True, "wrong_fix": False, "give_up": False}
  for variant, resolved in expected.items():
    run = run_expert(instance, variant, sandbox_factory=factory, evaluate=grade, seed=3)
    assert run.result.exit_status == "Submitted"
    assert run.resolved is resolved, (variant, run.evaluation)
    assistant = [m for m in run.result.messages if m["role"] == "assistant"]
    for message in assistant:  # a competent agent's shape: THOUGHT, then one bash block
      assert message["content"].startswith("THOUGHT: ")
      assert len(re.findall(r"```bash\n", message["content"])) == 1
    reproduce = [e for e in run.evidence if e["kind"] == "reproduce"]
    assert reproduce and reproduce[0]["reproduction_passed"] is False
    if resolved:
      [flip] = run.fail_to_pass_steps
      assert run.step_kinds[flip] == "edit"
      assert any(e["kind"] == "verify" and e["reproduction_passed"] and e["step"] > flip
                 for e in run.evidence)
      assert "test_issue_repro" not in run.result.submission  # scratch files cleaned up
    else:
      assert run.fail_to_pass_steps == []
    if variant == "detour":
      assert "wrong_edit" in run.step_kinds and "revert" in run.step_kinds
    trajectory = run.to_trajectory(instance.instance_id)
    assert trajectory.outcome["resolved"] is resolved
    assert trajectory.metadata["expert"]["variant"] == variant


def test_plans_per_variant(instance):
  import subprocess
  from orchard_jax.harness.errors import HarnessError
  from orchard_jax.tasks.swe.expert import _hunks
  # The instance image's workspace seed: a repository holding base_commit alone.
  from orchard_jax.env.images import default_cache_dir, resolve_image
  image = resolve_image(instance.test_spec.image, allowed_roots=[default_cache_dir()])
  repo = image.workspace_seed
  files = sorted({h.file for h in _hunks(instance.patch)})
  base_text = {f: subprocess.run(["git", "show", f"{instance.base_commit}:{f}"], cwd=repo,
                                 capture_output=True, text=True, check=True).stdout
               for f in files}
  hunks = _hunks(instance.patch)
  gold = plan_steps(instance, "gold", base_text=base_text)
  assert [s.kind for s in gold].count("edit") == len(hunks)
  assert [s.kind for s in gold][-1] == "submit"
  if len(hunks) >= 2:
    partial = plan_steps(instance, "partial", base_text=base_text)
    assert [s.kind for s in partial].count("edit") == 1
  one_hunk = instance.replace(patch=instance.patch.split("\n@@", 2)[0] + "\n@@"
                              + instance.patch.split("\n@@", 2)[1])
  with pytest.raises(HarnessError, match="2\\+ hunks"):
    plan_steps(one_hunk, "partial", base_text=base_text)
  with pytest.raises(HarnessError, match="unknown expert variant"):
    plan_steps(instance, "magic", base_text=base_text)


def test_slice_keeps_setup_and_only_the_named_tests():
  source = ("import os\nimport sys\n\nLIMIT = 3\n\ndef helper():\n    return LIMIT\n\n"
            "def test_a():\n    assert helper() == 3\n\ndef test_b():\n    assert False\n\n"
            "class TestC:\n    x = 1\n    def setup_method(self):\n        pass\n"
            "    def test_keep(self):\n        pass\n    def test_drop(self):\n        pass\n\n"
            "if __name__ == '__main__':\n    test_a()\n")
  text = slice_tests(source, ["test_a", "TestC::test_keep"])
  assert text == ("import os\nimport sys\n\n\nLIMIT = 3\n\n\ndef helper():\n    return LIMIT\n\n\n"
                  "def test_a():\n    assert helper() == 3\n\n\nclass TestC:\n    x = 1\n"
                  "    def setup_method(self):\n        pass\n    def test_keep(self):\n"
                  "        pass\n")
