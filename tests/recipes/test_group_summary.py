"""The loop's per-group evaluation summary (recipes/agentic/evaluation.summarize_groups), used by
claw.evaluate per service and gui.evaluate per family and site: worked examples a reader can
check by hand, and for any report the figures written again here by their definitions
(pass@k: any of a task's first k trials passed; pass^k: all k did)."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_jax.recipes.agentic import evaluation


def test_pass_at_k_pass_hat_k_success_and_scores_by_hand():
  trials = {"t1": [{"passed": True, "score": 1.0}, {"passed": False, "score": 0.2},
                   {"passed": True, "score": 0.9}],
            "t2": [{"passed": True, "score": 0.8}] * 3,
            "t3": [{"passed": False, "score": 0.0, "status": "grader_error"}] * 3,
            "t4": [{"passed": True, "score": 1.0}]}          # one trial of three
  groups = {"t1": ["mail"], "t2": ["mail", "calendar"], "t3": ["calendar"], "t4": ["files"]}
  out = evaluation.summarize_groups(trials, groups, 3)
  assert out["all"].pass_at_k == pytest.approx(3 / 4)        # t1, t2, t4
  assert out["all"].pass_hat_k == pytest.approx(1 / 4)       # t2 only; t4 lacks trials
  assert out["all"].success == pytest.approx(6 / 10) and out["all"].trials == 10
  assert out["mail"].pass_at_k == 1.0 and out["mail"].pass_hat_k == pytest.approx(0.5)
  assert out["calendar"].pass_at_k == pytest.approx(0.5) and out["calendar"].grader_errors == 3
  assert out["all"].aborted == 0                             # no flags: status "aborted" only
  assert out["all"].mean_score == pytest.approx((1 + .2 + .9 + .8 * 3 + 0 + 1) / 10)
  table = evaluation.format_group_table(out, 3, title="service")
  assert table.splitlines()[-1].startswith("all") and "pass^3" in table and "score" in table
  unscored = evaluation.summarize_groups({"a": [{"passed": True}]}, {}, 1)
  assert unscored["all"].mean_score is None
  assert "score" not in evaluation.format_group_table(unscored, 1)


def test_report_trials_keeps_the_loops_aborted_flags_statuses_and_scores():
  report = {"train": {"per_instance": {"a": [True, False]},
                      "per_instance_aborted": {"a": [False, True]},
                      "per_instance_status": {"a": ["passed", "TimeExceeded"]}},
            "heldout": {"per_instance": {"b": [False]}}}
  trials = evaluation.report_trials(report, {("a", 0): 0.9})
  assert trials == {"a": [{"passed": True, "status": "passed", "aborted": False, "score": 0.9},
                          {"passed": False, "status": "TimeExceeded", "aborted": True,
                           "score": 0.0}],
                    "b": [{"passed": False, "status": None, "score": 0.0}]}
  summary = evaluation.summarize_groups(trials, {}, 2)["all"]
  assert summary.aborted == 1 and summary.tasks == 2 and summary.trials == 3


_trial = st.fixed_dictionaries({"passed": st.booleans(),
                                "status": st.sampled_from([None, "passed", "grader_error",
                                                           "aborted"])},
                               optional={"aborted": st.booleans()})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), st.lists(_trial, max_size=5), min_size=1),
       st.dictionaries(st.sampled_from("abcdef"), st.lists(st.sampled_from("xyz"), max_size=2,
                                                           unique=True)),
       st.integers(1, 4))
def test_every_group_agrees_with_the_definitions(trials, groups, k):
  out = evaluation.summarize_groups(trials, groups, k)
  members = {"all": sorted(trials)}
  for task_id in trials:
    for g in groups.get(task_id, ()):
      members.setdefault(g, []).append(task_id)
  assert set(out) == set(members)
  for g, ids in members.items():
    first_k = [trials[i][:k] for i in ids]
    flat = [t for ts in first_k for t in ts]
    s = out[g]
    assert s.tasks == len(ids) and s.trials == len(flat)
    assert s.pass_at_k == pytest.approx(
        sum(any(t["passed"] for t in ts) for ts in first_k) / len(ids))
    assert s.pass_hat_k == pytest.approx(
        sum(len(ts) == k and all(t["passed"] for t in ts) for ts in first_k) / len(ids))
    assert s.success == pytest.approx(sum(t["passed"] for t in flat) / len(flat) if flat else 0)
    assert s.grader_errors == sum(t["status"] == "grader_error" for t in flat)
    assert s.aborted == sum(t["aborted"] if "aborted" in t else t["status"] == "aborted"
                            for t in flat)


def test_the_evaluate_job_prints_and_writes_each_grouping(tmp_path, monkeypatch, capsys):
  """jobs.evaluate_groups after the loop's evaluation. The checkpoint's evaluation itself (a
  served policy running episodes: tests/recipes/test_toy_domain.py) is replaced by its report
  here, and the trial scores come from real trajectories in a real store."""
  from experiments import common
  from orchard_jax import data
  from orchard_jax.recipes.agentic import jobs
  report = {"heldout": {"per_instance": {"a": [True, False], "b": [False, False]},
                        "per_instance_aborted": {"a": [False, False], "b": [False, True]},
                        "per_instance_status": {"a": ["passed", "failed"],
                                                "b": ["failed", "aborted"]}}}
  monkeypatch.setattr(jobs, "evaluate_checkpoint", lambda config, domain: report)
  config = common.claw_base("tiny")
  config.name, config.store.path = "demo", str(tmp_path / "store")
  config.eval.k, config.eval.output_dir = 2, str(tmp_path / "out")
  with data.TrajectoryStore(config.store.path) as store:
    for task_id, attempt, score in [("a", 0, 0.9), ("a", 1, 0.5), ("b", 0, 0.1)]:
      store.append_trajectory(data.Trajectory(
          trajectory_id=f"{task_id}{attempt}", task_id=task_id, attempt=attempt,
          experiment="demo-eval", messages=[], metadata={"score": score}))
  out = jobs.evaluate_groups(config, None, {"service": {"a": ["mail"], "b": ["mail", "files"]},
                                            "kind": {"a": ["x"]}},
                             name="demo", trial_score=lambda t: t.metadata["score"],
                             header="checkpoint C:", extra={"harness": "builtin"})
  printed = capsys.readouterr().out
  assert printed.startswith("checkpoint C:\nservice") and "\nkind " in printed
  with open(tmp_path / "out" / "eval" / "demo_summary.json") as f:
    written = json.load(f)
  assert written["harness"] == "builtin" and written["k"] == 2
  assert written["summary"] == out["demo"]
  mail = written["summary"]["service"]["mail"]
  assert mail["pass_at_k"] == 0.5 and mail["aborted"] == 1 and mail["trials"] == 4
  assert mail["mean_score"] == pytest.approx((0.9 + 0.5 + 0.1 + 0.0) / 4)
  assert written["summary"]["kind"]["x"]["success"] == 0.5
