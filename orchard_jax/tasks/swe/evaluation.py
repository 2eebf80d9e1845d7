"""SWE-bench-style evaluation of predictions in fresh sandboxes (docs/algorithms.md section 7).

For each instance, in a sandbox of its own started from the instance's image:
  1. put the workspace at `base_commit` (`testbed.setup_script`);
  2. apply the model patch robustly (`patches.apply_script`); if nothing applies the outcome is
     `patch_failed` and no test runs;
  3. screen every path the patch touched (its headers and the workspace's `git status`):
     a patch that adds a site hook, a module shadowing the runner, package metadata, a link or
     a path outside the repository is graded `unresolved` with the reason and no test runs;
     test files, conftest files, runner configuration and the like are put back to their base
     state (`screening`), and so is every file the test patch touches; then the test patch
     (the hidden tests) is applied;
  4. run the instance's test files under a time limit (`timed_out` past it). A pytest command
     runs under the trusted runner (`trusted_runner`): per-test results come from a report the
     supervisor signs, never from the log, and a run the code under test cut short or bent is
     `unresolved` with the reason in `EvalResult.integrity`. Other runners' logs are read with
     SWE-bench's parser. Results are graded by SWE-bench's rules (`grading`, where a skipped
     test is not passing).
Instances run in parallel, one sandbox each. Every instance leaves a folder with the patch,
the apply log, the test log, the test records, `test_statuses.json` (the per-test statuses the
grade was computed from, named as the instance's log parser names them) and `report.json`; the
run leaves
`summary.json` (SWE-bench's report layout: counts per outcome and the instance ids in each).
"""
from __future__ import annotations

import base64
import binascii
import collections
import concurrent.futures
import dataclasses
import json
import os
import shlex
import shutil
import time
from typing import Callable, ContextManager, Mapping, Sequence

from orchard_jax.tasks.errors import EvaluationError
from orchard_jax.tasks.swe import grading, log_parsers, patches, screening, trusted_runner
from orchard_jax.tasks.swe.instance import SWEInstance
from orchard_jax.tasks.swe.testbed import Sandbox, setup_script

SandboxFactory = Callable[[SWEInstance], ContextManager[Sandbox]]
_SCRATCH = "/tmp/orchard_eval"


@dataclasses.dataclass
class EvalResult:
  """The evaluation of one prediction.

  Attributes:
    instance_id: the instance.
    outcome: one of grading.OUTCOMES.
    patch_applied: whether the model patch applied (True for an empty patch).
    empty_patch: the prediction changed nothing.
    apply_method: which apply attempt worked ("git apply --recount", "patch --fuzz=5 -l").
    tests: which FAIL_TO_PASS / PASS_TO_PASS tests passed, or None if no test ran.
    test_exit_code: the test command's exit code (124: killed at the time limit).
    seconds: wall time of the whole evaluation.
    error: what went wrong for outcome "error" (or a note).
    restored_files: test-infrastructure files the patch changed, put back to their base state
      before the tests ran (`screening`).
    integrity: why the patch's run cannot count (a rejected path, tampering seen in the run);
      never empty for an unresolved patch whose tests would otherwise have passed.
    suspicious: added code that reaches into the runner or the interpreter, and tests demoted
      for it (for review; no effect on the outcome by itself).
    report_source: "structured" (the signed report of the trusted runner) or "log".
  """
  instance_id: str
  outcome: str
  patch_applied: bool = False
  empty_patch: bool = False
  apply_method: str = ""
  tests: grading.TestsReport | None = None
  test_exit_code: int | None = None
  seconds: float = 0.0
  error: str = ""
  restored_files: list[str] = dataclasses.field(default_factory=list)
  integrity: list[str] = dataclasses.field(default_factory=list)
  suspicious: list[str] = dataclasses.field(default_factory=list)
  report_source: str = ""

  @property
  def resolved(self) -> bool:
    return self.outcome == grading.RESOLVED

  def to_dict(self) -> dict:
    out = dataclasses.asdict(self)
    out["tests"] = self.tests.to_dict() if self.tests else None
    out["resolved"] = self.resolved
    return out


def evaluate_in_sandbox(sandbox: Sandbox, instance: SWEInstance, model_patch: str, *,
                        log_dir: str | None = None) -> EvalResult:
  """Evaluates one prediction in a fresh sandbox (steps 1-4 of the module docstring).

  Args:
    sandbox: a sandbox started from `instance.test_spec.image`, used for nothing else.
    instance: the instance (needs `test_spec`).
    model_patch: the predicted diff ("" for no change).
    log_dir: if given, the patch, logs and report.json are written there.

  Raises:
    EvaluationError: the instance has no test_spec.
  """
  spec = instance.test_spec
  if spec is None:
    raise EvaluationError(f"instance {instance.instance_id!r} has no test_spec: the evaluator "
                          f"needs its image, test command and test files")
  start = time.monotonic()
  logs: dict[str, str] = {}
  result = EvalResult(instance.instance_id, grading.ERROR)
  try:
    _evaluate(sandbox, instance, model_patch, result, logs)
  finally:
    result.seconds = round(time.monotonic() - start, 3)
    if log_dir:
      _write_logs(log_dir, model_patch, logs, result)
  return result


def _evaluate(sandbox, instance, model_patch, result, logs):
  spec = instance.test_spec
  workdir = shlex.quote(spec.workdir)
  setup = sandbox.run(setup_script(instance, workdir=spec.workdir), timeout_s=300)
  logs["setup.log"] = setup.output
  if setup.exit_code != 0:
    result.error = f"workspace setup failed (exit {setup.exit_code}): {setup.output[-500:]}"
    return
  if instance.test_patch.strip():
    sandbox.write_file(f"{_SCRATCH}/test_patch.diff", instance.test_patch.encode("utf-8"))
    check = sandbox.run(f"cd {workdir} && git apply --check {_SCRATCH}/test_patch.diff",
                        timeout_s=120)
    if check.exit_code != 0:
      result.error = f"the test patch does not apply at base_commit: {check.output[-500:]}"
      return
  cleaned = patches.clean_patch(model_patch)
  result.empty_patch = not cleaned
  layout = screening.TestLayout.of(instance)
  screen = screening.Screen()
  if cleaned:
    screen = _apply_and_screen(sandbox, instance, cleaned, layout, result, logs)
    if screen is None:
      return
  result.patch_applied = True
  result.restored_files = screen.restored_paths
  restore = list(dict.fromkeys(screen.restored_paths + patches.patch_files(instance.test_patch)))
  if restore:
    base = shlex.quote(instance.base_commit)
    script = "\n".join(
        f"rm -rf -- {shlex.quote(f)}; git checkout -q {base} -- {shlex.quote(f)} 2>/dev/null"
        for f in sorted(restore, key=lambda p: (p.count("/"), p)))
    restored = sandbox.run(f"cd {workdir} || exit 2\n{script}\nexit 0", timeout_s=120)
    logs["restore.log"] = restored.output
  if instance.test_patch.strip():
    applied = sandbox.run(f"cd {workdir} && git apply -v {_SCRATCH}/test_patch.diff",
                          timeout_s=120)
    logs["test_patch.log"] = applied.output
    if applied.exit_code != 0:
      # It applies at base_commit (checked above): what the model patch left in its way (a
      # folder where a hidden test goes, attributes) is the patch's own doing.
      result.outcome = grading.UNRESOLVED
      result.integrity = [f"the test patch did not apply over the model patch: "
                          f"{applied.output[-300:]}"]
      result.error = result.integrity[0]
      return
  _run_tests(sandbox, instance, layout, screen, result, logs)


def _apply_and_screen(sandbox, instance, cleaned, layout, result, logs):
  """Applies the model patch and screens what it touched; the Screen, or None when the outcome
  is already decided (the patch did not apply, or it touches a rejected kind)."""
  workdir = instance.test_spec.workdir
  paths = []
  for i, variant in enumerate(patches.patch_variants(cleaned)):
    path = f"{_SCRATCH}/model_patch_{i}.diff"
    sandbox.write_file(path, variant.encode("utf-8"))
    paths.append(path)
  applied = sandbox.run(patches.apply_script(paths, workdir=workdir), timeout_s=120)
  logs["apply_patch.log"] = applied.output
  outcome = patches.parse_apply_output(applied.output, applied.exit_code)
  if not outcome.applied:
    result.outcome = grading.PATCH_FAILED
    result.error = "the model patch did not apply with any method"
    return None
  result.apply_method = outcome.method
  status = sandbox.run(f"cd {shlex.quote(workdir)} && git status --porcelain=v1 -z "
                       "--untracked-files=all --no-renames", timeout_s=60)
  workspace = screening.parse_git_status(status.output) if status.exit_code == 0 else []
  screen = screening.screen_patch(cleaned, layout, workspace)
  _keep_config_edits_pytest_does_not_read(sandbox, instance, screen)
  result.suspicious = [str(f) for f in screening.suspicious_code(cleaned, layout)]
  if screen.rejected:
    result.patch_applied = True
    result.outcome = grading.UNRESOLVED
    result.integrity = [str(f) for f in screen.rejected]
    result.error = ("graded unresolved without running the tests: the patch changes "
                    + "; ".join(result.integrity))
    return None
  return screen


def _keep_config_edits_pytest_does_not_read(sandbox, instance, screen):
  """setup.cfg, tox.ini and pyproject.toml also hold packaging and other tools' settings: an
  edit of one that leaves pytest's settings as they were is the fix's own, not put back."""
  workdir = shlex.quote(instance.test_spec.workdir)
  base = shlex.quote(instance.base_commit)
  for finding in list(screen.restored):
    if finding.kind != "runner_config" or \
        finding.path.rsplit("/", 1)[-1] not in screening.SHARED_CONFIG_FILES:
      continue
    path = shlex.quote(finding.path)
    shown = sandbox.run(
        f"cd {workdir} || exit 2\n"
        f"if git cat-file -e {base}:{path} 2>/dev/null; then git show {base}:{path} | base64 -w0;"
        f" else printf ABSENT; fi; echo\n"
        f"if [ -f {path} ] && [ ! -L {path} ]; then base64 -w0 < {path}; else printf ABSENT; fi;"
        f" echo\n", timeout_s=60)
    lines = shown.output.split("\n")
    if shown.exit_code != 0 or len(lines) < 2:
      continue
    try:
      before, after = [None if text.strip() == "ABSENT" else
                       base64.b64decode(text.strip()).decode("utf-8", "replace")
                       for text in lines[:2]]
    except (ValueError, binascii.Error):
      continue
    if not screening.runner_settings_differ(before, after, finding.path):
      screen.restored.remove(finding)
      screen.fix_files.append(finding.path)


def _run_tests(sandbox, instance, layout, screen, result, logs):
  spec = instance.test_spec
  run_spec = trusted_runner.prepare(spec.test_cmd, spec.test_files, workdir=spec.workdir,
                                    timeout_s=spec.timeout_s, env=spec.env)
  for path, data in run_spec.files.items():
    sandbox.write_file(path, data)
  run = sandbox.run(run_spec.command, timeout_s=spec.timeout_s + 60)
  logs["test_output.txt"] = trusted_runner.strip_report(run.output)
  result.test_exit_code = run.exit_code
  result.report_source = "structured" if run_spec.structured else "log"
  if not run_spec.structured:
    if getattr(run, "failed", False):
      result.error = f"the sandbox failed while the tests ran: {run.output[-300:]}"
      return
    if run.timed_out or run.exit_code in (124, 137):
      result.outcome = grading.TIMED_OUT
      result.error = f"the tests ran past {spec.timeout_s:.0f} s"
      return
    status = log_parsers.parse_test_log(run.output, spec.log_parser)
    if not status:
      result.error = f"the test run named no test (exit {run.exit_code}): {run.output[-500:]}"
      return
  else:
    report = trusted_runner.read_report(run.output, run_spec)
    if report is None:
      if trusted_runner.started(run.output, run_spec):
        # The supervisor ran with the key, then its report never came: only code run by the
        # test command can kill it (the sandbox timing out is handled first).
        if run.timed_out:
          result.outcome = grading.TIMED_OUT
          result.error = f"the tests ran past {spec.timeout_s:.0f} s"
          return
        result.outcome = grading.UNRESOLVED
        result.integrity = ["the test supervisor's signed report never arrived: the code under "
                            "test killed it, or cut its output"]
        result.error = result.integrity[0]
      else:
        result.error = (f"the test supervisor did not start (exit {run.exit_code}): "
                        f"{run.output[-500:]}")
      return
    result.test_exit_code = report.exit_code
    logs["test_records.jsonl"] = "".join(json.dumps(r) + "\n" for r in report.records)
    if report.timed_out:
      result.outcome = grading.TIMED_OUT
      result.error = f"the tests ran past {spec.timeout_s:.0f} s"
      return
    verdict = trusted_runner.judge_records(
        report, is_test_path=lambda path: screening.is_test_code(path, layout),
        changed_files=screen.fix_files)
    status = log_parsers.status_map_from_results(verdict.statuses, spec.log_parser)
    result.integrity += verdict.findings
    result.suspicious += verdict.notes
  logs["test_statuses.json"] = json.dumps(status, indent=0, sort_keys=True)
  result.tests = grading.tests_report(status, instance.FAIL_TO_PASS, instance.PASS_TO_PASS)
  result.outcome = grading.resolution(result.tests)
  if result.integrity:
    result.outcome = grading.UNRESOLVED
    result.error = "graded unresolved: " + "; ".join(result.integrity)


def _write_logs(log_dir, model_patch, logs, result):
  if os.path.isdir(log_dir):
    shutil.rmtree(log_dir)  # no stale log of an earlier run may sit beside this report
  os.makedirs(log_dir, exist_ok=True)
  with open(os.path.join(log_dir, "patch.diff"), "w", encoding="utf-8") as f:
    f.write(model_patch or "")
  for name, text in logs.items():
    with open(os.path.join(log_dir, name), "w", encoding="utf-8") as f:
      f.write(text)
  with open(os.path.join(log_dir, "report.json"), "w") as f:
    json.dump(result.to_dict(), f, indent=1)


# ----------------------------------------------------------------------------- predictions


def load_predictions(source: str, instances: Sequence[SWEInstance]) -> dict[str, str]:
  """Predictions {instance_id: model_patch} from "gold", "empty" or a SWE-bench predictions file.

  A predictions file is JSONL (one `{"instance_id", "model_patch", "model_name_or_path"}` per
  line) or a JSON list / {instance_id: prediction} object, as SWE-bench's harness accepts.
  Instances without a prediction are left out (SWE-bench evaluates only predicted instances).

  Raises:
    EvaluationError: the file is unreadable, a record lacks instance_id / model_patch, or it
      names no known instance.
  """
  if source == "gold":
    return {i.instance_id: i.patch for i in instances}
  if source == "empty":
    return {i.instance_id: "" for i in instances}
  predictions = read_predictions_file(source)
  known = {i.instance_id for i in instances}
  if predictions and not set(predictions) & known:
    raise EvaluationError(f"{source}: none of its {len(predictions)} predictions names an "
                          f"instance of the task set (e.g. {next(iter(predictions))!r})")
  return predictions


def read_predictions_file(source: str) -> dict[str, str]:
  """{instance_id: model_patch} of a SWE-bench predictions file, checked for format alone (no
  task set needed, so a malformed file is refused before any instance is loaded or built).

  Raises:
    EvaluationError: the file does not exist or is unreadable, is not JSONL / JSON, holds no
      prediction, or a record lacks instance_id / model_patch or has one that is not a string
      or not text (a lone surrogate).
  """
  if not os.path.exists(source):
    raise EvaluationError(f"predictions must be 'gold', 'empty' or a predictions file; "
                          f"{source!r} does not exist")
  try:
    with open(source, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:   # a folder, no permission, not UTF-8 text
    raise EvaluationError(f"{source}: cannot be read as a UTF-8 predictions file ({e})") from None
  if source.endswith(".jsonl"):
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise EvaluationError(f"{source}: line {number} is not a JSON object ({e}): "
                              f"{line[:200]!r}") from None
  else:
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise EvaluationError(f"{source}: not valid JSON ({e}); a file of one prediction per "
                            "line should end in .jsonl") from None
    if not isinstance(data, (dict, list)):
      raise EvaluationError(f"{source}: expected a JSON list of predictions or an "
                            f"{{instance_id: prediction}} object; got {type(data).__name__}")
    records = list(data.values()) if isinstance(data, dict) else data
  predictions = {}
  for n, record in enumerate(records):
    if not isinstance(record, dict) or "instance_id" not in record:
      raise EvaluationError(f"{source}: record {n} has no instance_id: {str(record)[:200]}")
    if not isinstance(record["instance_id"], str) or not record["instance_id"]:
      raise EvaluationError(f"{source}: record {n} instance_id must be a non-empty string; got "
                            f"{record['instance_id']!r:.200}")
    _check_utf8(record["instance_id"], f"{source}: record {n} instance_id")
    if "model_patch" not in record:    # null is SWE-bench's "no patch"; a missing key means
      raise EvaluationError(           # a file of another schema, not empty predictions
        f"{source}: record {n} ({record['instance_id']!r}) has no model_patch (keys: "
        f"{sorted(record)}); expected SWE-bench's prediction format {{\"instance_id\", "
        f"\"model_patch\", \"model_name_or_path\"}}")
    patch = record["model_patch"]
    if patch is None:
      patch = ""
    if not isinstance(patch, str):
      raise EvaluationError(f"{source}: record {n} model_patch must be a string")
    _check_utf8(patch, f"{source}: record {n} ({record['instance_id']!r}) model_patch")
    predictions[record["instance_id"]] = patch
  if not predictions:
    raise EvaluationError(f"{source}: holds no predictions; expected SWE-bench's prediction "
                          "format, one {\"instance_id\", \"model_patch\", "
                          "\"model_name_or_path\"} per instance to grade")
  return predictions


def _check_utf8(text: str, what: str) -> None:
  """Raises EvaluationError when `text` holds a lone surrogate (JSON's escape of half a UTF-16
  pair, e.g. "\\ud800"), which no UTF-8 file, sandbox or log can hold."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise EvaluationError(f"{what} holds a lone surrogate {text[e.start]!r} at character "
                          f"{e.start}, which is not text (no UTF-8 can encode it)") from None


@dataclasses.dataclass
class EvalSummary:
  """A run's results: one EvalResult per instance, counts per outcome, and where logs are."""
  results: list[EvalResult]
  output_dir: str

  @property
  def counts(self) -> dict[str, int]:
    counts = collections.Counter(r.outcome for r in self.results)
    return {o: counts.get(o, 0) for o in grading.OUTCOMES}

  @property
  def errors(self) -> list[str]:
    """Instances whose evaluation itself failed (outcome "error"): no verdict on the patch."""
    return sorted(r.instance_id for r in self.results if r.outcome == grading.ERROR)

  @property
  def failure(self) -> str:
    """"" when every instance got a verdict; else one line saying how many did not (a run
    with such instances is not a result, and launch/run.py exits non-zero with this line)."""
    errors = self.errors
    if not errors:
      return ""
    shown = ", ".join(errors[:5]) + (", ..." if len(errors) > 5 else "")
    return (f"{len(errors)} of {len(self.results)} instance(s) ended in error, so the run graded "
            f"no patch for them ({shown}); see report.json in each one's folder under "
            f"{self.output_dir}")

  @property
  def resolved_rate(self) -> float:
    return sum(r.resolved for r in self.results) / max(len(self.results), 1)

  def to_dict(self) -> dict:
    by_outcome = {o: sorted(r.instance_id for r in self.results if r.outcome == o)
                  for o in grading.OUTCOMES}
    return {"total_instances": len(self.results), "resolved_rate": self.resolved_rate,
            "counts": self.counts, "empty_patch_instances": sorted(
                r.instance_id for r in self.results if r.empty_patch),
            "instances_by_outcome": by_outcome}

  def table(self) -> str:
    counts = self.counts
    parts = ", ".join(f"{o} {n}" for o, n in counts.items() if n)
    return (f"{len(self.results)} instances: {parts}; resolved {self.resolved_rate:.1%} "
            f"(logs in {self.output_dir})")


def evaluate_predictions(instances: Sequence[SWEInstance], predictions: Mapping[str, str], *,
                         sandbox_factory: SandboxFactory, output_dir: str, max_workers: int = 2,
                         retries: int = 1, progress: bool = True) -> EvalSummary:
  """Evaluates many predictions in parallel, one fresh sandbox per instance.

  Args:
    instances: the task set; only those with a prediction are evaluated.
    predictions: {instance_id: model patch}.
    sandbox_factory: `instance -> context manager yielding a Sandbox` started from the
      instance's image (e.g. `lambda i: testbed.open_sandbox(client, i.test_spec.image)`).
    output_dir: gets `<instance_id>/` log folders, `results.jsonl` and `summary.json`.
    max_workers: sandboxes evaluated at once.
    retries: fresh attempts for an instance whose outcome is "error" (a sandbox failure).
    progress: show a progress bar.

  Returns:
    The EvalSummary. A sandbox that fails to start gives that instance outcome "error".

  Raises:
    EvaluationError: an instance to evaluate has no test_spec (checked for all of them before
      the first sandbox starts; the message names them).
  """
  from tqdm.auto import tqdm
  chosen = [i for i in instances if i.instance_id in predictions]
  unspecified = [i.instance_id for i in chosen if i.test_spec is None]
  if unspecified:
    raise EvaluationError(
        f"{len(unspecified)} instance(s) have no test_spec, so there is no image or test command "
        f"to evaluate them with (e.g. {unspecified[:3]}); build their environments first "
        f"(README 'Bring your own dataset')")
  os.makedirs(output_dir, exist_ok=True)

  def attempt(instance: SWEInstance) -> EvalResult:
    log_dir = os.path.join(output_dir, instance.instance_id)
    try:
      with sandbox_factory(instance) as sandbox:
        return evaluate_in_sandbox(sandbox, instance, predictions[instance.instance_id],
                                   log_dir=log_dir)
    except Exception as e:  # noqa: BLE001 - one broken sandbox must not stop the run
      result = EvalResult(instance.instance_id, grading.ERROR, error=f"{type(e).__name__}: {e}")
      _write_logs(log_dir, predictions[instance.instance_id], {}, result)
      return result

  def one(instance: SWEInstance) -> EvalResult:
    result = attempt(instance)
    for _ in range(retries):  # "error" is the sandbox's failure, not the prediction's
      if result.outcome != grading.ERROR:
        break
      result = attempt(instance)
    return result

  results: list[EvalResult] = []
  with concurrent.futures.ThreadPoolExecutor(max(1, max_workers)) as pool, \
      tqdm(total=len(chosen), desc="evaluate", unit="inst", disable=not progress) as bar:
    for result in pool.map(one, chosen):
      results.append(result)
      bar.update(1)
      bar.set_postfix(resolved=sum(r.resolved for r in results))
  summary = EvalSummary(results, output_dir)
  with open(os.path.join(output_dir, "results.jsonl"), "w") as f:
    for r in results:
      f.write(json.dumps(r.to_dict()) + "\n")
  with open(os.path.join(output_dir, "summary.json"), "w") as f:
    json.dump(summary.to_dict(), f, indent=1)
  return summary
