"""The validation pass: is each instance a usable task in its built environment?

SWE-bench validates a task by running its tests with and without the gold patch. Here each
instance is evaluated four times, each in a fresh sandbox with the same evaluator that grades
rollouts (`evaluation.py`): twice with the gold patch and twice with none. From the per-test
statuses of the four runs (SWE-bench's log parser on each test log):
  FAIL_TO_PASS  kept as given when every given test passes in both gold runs and fails in both
                empty runs; when the instance gives none, derived as the tests that do exactly
                that (SWE-bench's definition);
  PASS_TO_PASS  the given tests (or, when none are given, every test) that pass in all four
                runs: a test that fails once is flaky or broken in this environment, and is
                taken out, as the built-in builder does with its two baseline runs.
An instance is usable when it has a FAIL_TO_PASS test left and, graded by SWE-bench's rules on
the recorded runs with the new lists, gold resolves in both runs and empty resolves in neither.
Every other instance is reported with why.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
from typing import Callable, ContextManager, Sequence

from orchard_jax.tasks.swe import evaluation, grading, log_parsers
from orchard_jax.tasks.swe.instance import SWEInstance, save_instances
from orchard_jax.tasks.swe.testbed import Sandbox

RUNS = (("gold", 0), ("gold", 1), ("empty", 0), ("empty", 1))


@dataclasses.dataclass
class ValidationReport:
  """The verdict on one instance.

  Attributes:
    instance_id: the instance.
    usable: gold resolves twice and empty never, with the lists below.
    reason: why not usable ("" when usable).
    fail_to_pass, pass_to_pass: the validated lists.
    dropped_pass_to_pass: given PASS_TO_PASS tests taken out as flaky or failing.
    outcomes: {run name: evaluation outcome} of the four runs.
  """
  instance_id: str
  usable: bool
  reason: str = ""
  fail_to_pass: list[str] = dataclasses.field(default_factory=list)
  pass_to_pass: list[str] = dataclasses.field(default_factory=list)
  dropped_pass_to_pass: list[str] = dataclasses.field(default_factory=list)
  outcomes: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Validation:
  """All verdicts, and the usable instances with their validated lists."""
  reports: list[ValidationReport]
  instances: list[SWEInstance]
  path: str = ""

  def summary(self) -> str:
    usable = sum(r.usable for r in self.reports)
    lines = [f"validation: {usable} of {len(self.reports)} instances usable (gold resolved "
             f"twice, empty never)" + (f"; usable instances in {self.path}" if self.path else "")]
    dropped = sum(len(r.dropped_pass_to_pass) for r in self.reports)
    if dropped:
      lines.append(f"  {dropped} PASS_TO_PASS test(s) taken out as flaky or failing")
    lines += [f"  unusable {r.instance_id}: {r.reason}" for r in self.reports if not r.usable]
    return "\n".join(lines)


def judge(instance: SWEInstance, statuses: dict[str, dict[str, str]],
          outcomes: dict[str, str]) -> ValidationReport:
  """The verdict from the four runs' per-test statuses ({"gold0": {test: status}, ...})."""
  report = ValidationReport(instance.instance_id, False, outcomes=dict(outcomes))
  errors = [name for name, outcome in outcomes.items()
            if outcome in (grading.ERROR, grading.TIMED_OUT, grading.PATCH_FAILED)]
  if errors:
    report.reason = f"run(s) {errors} ended {[outcomes[e] for e in errors]}"
    return report
  gold = [statuses["gold0"], statuses["gold1"]]
  empty = [statuses["empty0"], statuses["empty1"]]
  passes = lambda runs, t: all(log_parsers.passed(r, t) for r in runs)
  fails = lambda runs, t: not any(log_parsers.passed(r, t) for r in runs)
  if instance.FAIL_TO_PASS:
    bad = [t for t in instance.FAIL_TO_PASS if not (passes(gold, t) and fails(empty, t))]
    if bad:
      report.reason = (f"FAIL_TO_PASS test(s) that do not fail without the fix and pass with it "
                       f"in both runs: {bad[:3]}")
      return report
    f2p = list(instance.FAIL_TO_PASS)
  else:
    names = sorted(set().union(*statuses.values()))
    f2p = [t for t in names if passes(gold, t) and fails(empty, t)]
  candidates = list(instance.PASS_TO_PASS) if instance.PASS_TO_PASS else sorted(
      set().union(*statuses.values()) - set(f2p))
  p2p = [t for t in candidates if passes(gold + empty, t)]
  report.dropped_pass_to_pass = [t for t in instance.PASS_TO_PASS if t not in p2p]
  report.fail_to_pass, report.pass_to_pass = f2p, p2p
  if not f2p:
    report.reason = "no test fails without the fix and passes with it in both runs"
    return report
  for name, status in statuses.items():
    resolved = grading.resolution(grading.tests_report(status, f2p, p2p)) == grading.RESOLVED
    if resolved != name.startswith("gold"):
      report.reason = f"run {name} is {'resolved' if resolved else 'not resolved'}"
      return report
  report.usable = True
  return report


def _statuses(log_dir: str, instance: SWEInstance) -> dict[str, str]:
  """Per-test statuses of one run: `test_statuses.json`, which the evaluation writes from the
  trusted runner's signed report; the test log parsed with the instance's log parser only for
  runs that left no such file (a test command that is not a plain pytest run)."""
  path = os.path.join(log_dir, "test_statuses.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  path = os.path.join(log_dir, "test_output.txt")
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8", errors="replace") as f:
    return log_parsers.parse_test_log(f.read(), instance.test_spec.log_parser)


def validate(instances: Sequence[SWEInstance],
             sandbox_factory: Callable[[SWEInstance], ContextManager[Sandbox]], *,
             output_dir: str, max_workers: int = 2, progress: bool = True) -> Validation:
  """Runs the four evaluations of each instance and judges it (the module docstring).

  Args:
    instances: built instances (with a test_spec).
    sandbox_factory: `instance -> context manager yielding a fresh Sandbox`.
    output_dir: gets `<instance_id>/<run>/` logs, `validation.jsonl` and the usable instances
      as `instances.jsonl`.
    max_workers: sandboxes at once.
    progress: show a progress bar.
  """
  from tqdm.auto import tqdm
  jobs = [(i, kind, n) for i in instances for kind, n in RUNS]
  done: dict[str, dict] = {}
  with concurrent.futures.ThreadPoolExecutor(max(1, max_workers)) as pool, \
      tqdm(total=len(jobs), desc="validate", unit="run", disable=not progress) as bar:
    def run(job):
      instance, kind, n = job
      name = f"{kind}{n}"
      log_dir = os.path.join(output_dir, instance.instance_id, name)
      patch = instance.patch if kind == "gold" else ""
      try:
        with sandbox_factory(instance) as sandbox:
          result = evaluation.evaluate_in_sandbox(sandbox, instance, patch, log_dir=log_dir)
      except Exception as e:  # noqa: BLE001 - a sandbox failure is this run's outcome
        result = evaluation.EvalResult(instance.instance_id, grading.ERROR, error=str(e))
      return instance.instance_id, name, result.outcome, _statuses(log_dir, instance)
    for instance_id, name, outcome, status in pool.map(run, jobs):
      entry = done.setdefault(instance_id, {"outcomes": {}, "statuses": {}})
      entry["outcomes"][name], entry["statuses"][name] = outcome, status
      bar.update(1)
  reports, usable = [], []
  for instance in instances:
    entry = done[instance.instance_id]
    report = judge(instance, entry["statuses"], entry["outcomes"])
    reports.append(report)
    if report.usable:
      usable.append(instance.replace(FAIL_TO_PASS=tuple(report.fail_to_pass),
                                     PASS_TO_PASS=tuple(report.pass_to_pass)))
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "validation.jsonl"), "w") as f:
    for report in reports:
      f.write(json.dumps(dataclasses.asdict(report)) + "\n")
  path = save_instances(usable, os.path.join(output_dir, "instances.jsonl"))
  return Validation(reports, usable, path)
