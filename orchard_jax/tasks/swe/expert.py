"""A replay expert: real, executed agent trajectories built from an instance's gold patch.

Machines without a teacher model still need seed data for credit-assignment SFT (docs/algorithms.md
section 1): resolved trajectories for the "every action" loss and unresolved ones whose rise
segments carry credit. The expert plays a competent engineer with privileged knowledge of the
fix: it explores the repository, reproduces the bug with a focused test (sliced from the hidden
FAIL_TO_PASS tests), edits the source, re-runs the reproduction and the existing tests, cleans
up and submits. Every step runs for real through the same `BashAgent` loop and sandbox a model
would use (the expert is a scripted "model"), so observations, exit codes and the submitted
patch are genuine, and the submission is then graded in a fresh sandbox.

Variants (`VARIANTS`):
  gold       explore -> reproduce -> fix -> verify -> run tests -> clean up -> submit (resolved)
  detour     a wrong edit first (a different SWE-smith mutation of the buggy function), the
             reproduction still fails, revert, then the gold path (resolved)
  wrong_fix  the wrong edit is submitted (unresolved)
  partial    only the first hunk of a multi-hunk gold patch (unresolved or partial)
  give_up    explores and reproduces, then submits no change (unresolved)

Evidence for the offline annotator is stored in `Trajectory.metadata["expert"]`: the kind of
each step, which steps ran the reproduction and whether it passed, and `fail_to_pass_steps`,
the edit steps after which the reproduction went from failing to passing.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import random
import re
import shlex
import textwrap
import uuid
from typing import Callable, ContextManager, Sequence

from orchard_jax.harness import prompts
from orchard_jax.harness.bash_agent import AgentConfig, AgentResult, BashAgent, EXIT_SUBMITTED
from orchard_jax.harness.errors import HarnessError
from orchard_jax.tasks.swe.testbed import setup_script

VARIANTS = ("gold", "detour", "wrong_fix", "partial", "give_up")
REPRO_NAME = "test_issue_repro.py"
_MAX_REPRO_TESTS = 3


@dataclasses.dataclass
class _Step:
  kind: str
  thought: str
  command: str


@dataclasses.dataclass
class _ScriptedReply:
  content: str
  finish_reason: str = "stop"


class _ScriptedModel:
  """Answers each model call with the next planned step, formatted as the protocol asks."""

  def __init__(self, steps: Sequence[_Step]):
    self.steps = list(steps)
    self.index = 0

  def complete(self, messages):
    if self.index >= len(self.steps):
      raise HarnessError("the expert's plan ran out of steps before it submitted")
    step = self.steps[self.index]
    self.index += 1
    return _ScriptedReply(f"THOUGHT: {step.thought}\n\n```bash\n{step.command}\n```")


# ----------------------------------------------------------------------------- patch anatomy


@dataclasses.dataclass
class _Hunk:
  file: str
  old_start: int
  old_lines: list[str]   # context + removed, in order
  new_lines: list[str]   # context + added, in order
  removed: list[str]
  added: list[str]
  section: str           # the text after the second @@ (enclosing def/class)


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)\Z")


def _hunks(patch: str) -> list[_Hunk]:
  hunks, file, current = [], None, None
  for line in patch.splitlines():
    if line.startswith("+++ "):
      file = line[4:].strip()
      file = file[2:] if file.startswith("b/") else file
      continue
    if line.startswith("--- ") or line.startswith("diff --git") or line.startswith("index "):
      continue
    match = _HUNK.match(line)
    if match:
      current = _Hunk(file, int(match.group(1)), [], [], [], [], match.group(2).strip())
      hunks.append(current)
      continue
    if current is None or line.startswith("\\"):
      continue
    body = line[1:]
    if line.startswith("-"):
      current.old_lines.append(body)
      current.removed.append(body)
    elif line.startswith("+"):
      current.new_lines.append(body)
      current.added.append(body)
    else:
      current.old_lines.append(body)
      current.new_lines.append(body)
  return hunks


def _new_files(test_patch: str) -> dict[str, str]:
  """{path: content} of the files a test patch creates (the hidden test files)."""
  files, path, lines, creating = {}, None, [], False
  def flush():
    if path and creating:
      files[path] = "\n".join(lines) + "\n"
  for line in test_patch.splitlines():
    if line.startswith("diff --git"):
      flush()
      path, lines, creating = None, [], False
    elif line.startswith("--- "):
      creating = line[4:].strip() == "/dev/null"
    elif line.startswith("+++ "):
      target = line[4:].strip()
      path = target[2:] if target.startswith("b/") else target
    elif line.startswith("+") and creating and path:
      lines.append(line[1:])
  flush()
  return files


def slice_tests(source: str, tests: Sequence[str]) -> str:
  """A focused test module: `source`'s module-level set-up plus only the named tests.

  Args:
    source: a test file's text.
    tests: names inside it: "test_x" or "TestClass::test_y" (parametrisation suffix removed).

  Returns:
    The module text: imports, helpers and fixtures are kept, other tests are dropped, a kept
    class keeps its non-test members.
  """
  lines = source.splitlines()
  tree = ast.parse(source)
  wanted_funcs = {t for t in tests if "::" not in t}
  wanted_methods: dict[str, set] = {}
  for t in tests:
    if "::" in t:
      cls, meth = t.split("::", 1)
      wanted_methods.setdefault(cls, set()).add(meth.split("::")[-1])

  def span(node):
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start, node.end_lineno

  def is_test(name):
    return name.startswith("test") or name.startswith("Test")

  out = []  # (text, is_import)
  for node in tree.body:
    start, end = span(node)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      out.append(("\n".join(lines[start - 1:end]), True))
      continue
    name = getattr(node, "name", None)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_test(name):
      if name in wanted_funcs:
        out.append(("\n".join(lines[start - 1:end]), False))
      continue
    if isinstance(node, ast.ClassDef) and is_test(name):
      if name not in wanted_methods:
        continue
      body_start = min(span(n)[0] for n in node.body)
      parts = ["\n".join(lines[start - 1:body_start - 1])]
      for member in node.body:
        member_name = getattr(member, "name", None)
        if (isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_test(member_name)
            and member_name not in wanted_methods[name]):
          continue
        s, e = span(member)
        parts.append("\n".join(lines[s - 1:e]))
      out.append(("\n".join(parts), False))
      continue
    if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
      continue
    out.append(("\n".join(lines[start - 1:end]), False))
  text = ""
  for i, (chunk, is_import) in enumerate(out):
    if i:
      text += "\n" if is_import and out[i - 1][1] else "\n\n\n"
    text += chunk
  return text + "\n"


# ----------------------------------------------------------------------------- the plan


def _edit_command(file: str, old: str, new: str) -> str:
  script = (f"from pathlib import Path\n"
            f"path = Path({file!r})\n"
            f"text = path.read_text()\n"
            f"old = {old!r}\n"
            f"new = {new!r}\n"
            f"assert text.count(old) == 1, 'expected the snippet exactly once'\n"
            f"path.write_text(text.replace(old, new))\n"
            f"print('edited', path)")
  return f"python - <<'EOF'\n{script}\nEOF"


def _unique_edit(text: str, hunk: _Hunk) -> tuple[str, str]:
  """(old, new) snippets for a hunk that occur exactly once in `text`."""
  old = "\n".join(hunk.old_lines)
  new = "\n".join(hunk.new_lines)
  if text.count(old) == 1 or not old:
    return old, new
  raise HarnessError(f"the gold hunk for {hunk.file} is not unique in the file")


def _wrong_edit(file_text: str, file: str, hunk: _Hunk, seed: int) -> tuple[str, str] | None:
  """A plausible wrong edit near the bug: another SWE-smith mutation of the same function."""
  try:
    from swesmith.bug_gen.adapters.python import get_entities_from_file_py
    from swesmith.bug_gen.procedural.python import MODIFIERS_PYTHON
  except ImportError:
    return None
  import tempfile
  with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(file_text)
  entities = []
  try:
    get_entities_from_file_py(entities, f.name)
  finally:
    os.unlink(f.name)
  line = hunk.old_start + 3
  around = [e for e in entities if e.line_start <= line <= e.line_end
            and "def " in e.src_code.splitlines()[0]]
  around.sort(key=lambda e: e.line_end - e.line_start)
  rng = random.Random(seed)
  for entity in around[:1]:
    modifiers = [type(m)(likelihood=1.0, seed=seed) for m in MODIFIERS_PYTHON]
    rng.shuffle(modifiers)
    for modifier in modifiers:
      if not modifier.can_change(entity):
        continue
      try:
        rewrite = modifier.modify(entity)
      except Exception:  # noqa: BLE001
        continue
      if rewrite is None:
        continue
      indent = " " * (entity.indent_level * entity.indent_size)
      old = "\n".join(file_text.splitlines()[entity.line_start - 1:entity.line_end])
      new = "\n".join(indent + l if l.strip() else l for l in rewrite.rewrite.splitlines())
      if new.strip() != old.strip() and file_text.count(old) == 1:
        try:
          compile(file_text.replace(old, new), file, "exec")
        except SyntaxError:
          continue
        return old, new
  return None


def _symbol(hunk: _Hunk, instance) -> str:
  bug = (instance.extra or {}).get("bug") or {}
  if bug.get("entity"):
    return bug["entity"]
  match = re.search(r"(?:def|class)\s+(\w+)", hunk.section)
  return match.group(1) if match else os.path.splitext(os.path.basename(hunk.file))[0]


def plan_steps(instance, variant: str, *, base_text: dict[str, str], seed: int = 0
               ) -> list[_Step]:
  """The expert's steps for one variant (see the module docstring).

  Args:
    instance: an SWEInstance with patch, test_patch and FAIL_TO_PASS.
    variant: one of VARIANTS.
    base_text: {path: text at base_commit} of the files the gold patch edits.
    seed: varies the wording.

  Raises:
    HarnessError: the variant does not apply (e.g. "partial" for a one-hunk patch, no wrong
      edit found for "detour" / "wrong_fix").
  """
  if variant not in VARIANTS:
    raise HarnessError(f"unknown expert variant {variant!r}; expected one of {VARIANTS}")
  rng = random.Random(seed)
  hunks = _hunks(instance.patch)
  if not hunks:
    raise HarnessError(f"{instance.instance_id}: the gold patch has no hunks")
  if variant == "partial" and len(hunks) < 2:
    raise HarnessError(f"{instance.instance_id}: 'partial' needs a gold patch with 2+ hunks")
  first = hunks[0]
  symbol = _symbol(first, instance)
  package_dir = os.path.dirname(first.file) or "."
  hidden = _new_files(instance.test_patch)
  test_cmd = (instance.test_spec.test_cmd if instance.test_spec else "python -m pytest -rA")
  quick = test_cmd.replace("-rA", "-q").replace("--tb=short", "--tb=short")
  steps = [
      _Step("explore", rng.choice([
          "I'll start by getting an overview of the repository layout.",
          "First, let me see how the repository is organised.",
      ]), "ls -la && find . -name '*.py' -not -path './.git/*' | grep -v -i test | head -40"),
      _Step("explore", f"The issue points at behaviour implemented around `{symbol}`. Let me find "
            f"where it is defined.", f"grep -rn \"def {symbol}\\|class {symbol}\" "
            f"{shlex.quote(package_dir)} | head -20"),
      _Step("explore", f"Let me read the code in {first.file} around that definition.",
            f"nl -ba {shlex.quote(first.file)} | sed -n '{max(1, first.old_start - 25)},"
            f"{first.old_start + len(first.old_lines) + 20}p'"),
  ]
  repro_path = None
  fail_to_pass = list(instance.FAIL_TO_PASS)
  by_file: dict[str, list[str]] = {}
  for test in fail_to_pass:
    path, _, rest = test.partition("::")
    if path in hidden and rest:
      by_file.setdefault(path, []).append(re.sub(r"\[.*\]$", "", rest))
  if by_file:
    path, names = next(iter(by_file.items()))
    names = list(dict.fromkeys(names))[:_MAX_REPRO_TESTS]
    repro = slice_tests(hidden[path], names)
    repro_path = os.path.join(os.path.dirname(path), REPRO_NAME) if os.path.dirname(path) else REPRO_NAME
    folder = os.path.dirname(repro_path)
    mkdir = f"mkdir -p {shlex.quote(folder)} && " if folder else ""
    steps.append(_Step("reproduce", "Before changing anything I'll reproduce the problem with a "
                       "focused test that exercises the behaviour described in the issue.",
                       f"{mkdir}cat > {shlex.quote(repro_path)} <<'EOF'\n{repro.rstrip()}\nEOF\n"
                       f"{quick} {shlex.quote(repro_path)}"))
  def verify(kind="verify"):
    if repro_path is None:
      return []
    return [_Step(kind, "Let me run the reproduction again to see whether the behaviour changed.",
                  f"{quick} {shlex.quote(repro_path)}")]

  def gold_edits(selected):
    out = []
    for hunk in selected:
      old, new = _unique_edit(base_text[hunk.file], hunk)
      removed = next((l.strip() for l in hunk.removed if l.strip()), "")
      added = next((l.strip() for l in hunk.added if l.strip()), "")
      if removed and added:
        thought = (f"Found it: in {hunk.file} the line `{removed}` is wrong; it should be "
                   f"`{added}`. I'll make that change.")
      elif added:
        thought = f"The code in {hunk.file} is missing `{added}`; I'll add it back."
      else:
        thought = f"The line `{removed}` in {hunk.file} should not be there; I'll remove it."
      out.append(_Step("edit", thought, _edit_command(hunk.file, old, new)))
    return out

  wrong = None
  if variant in ("detour", "wrong_fix"):
    wrong = _wrong_edit(base_text[first.file], first.file, first, seed)
    if wrong is None:
      raise HarnessError(f"{instance.instance_id}: no plausible wrong edit for {variant!r}")

  visible_tests = [t for t in (instance.test_spec.test_files if instance.test_spec else ())]
  run_tests = _Step("test", "Now the existing test suite, to make sure nothing else broke.",
                    f"{quick} {' '.join(shlex.quote(t) for t in visible_tests)} 2>&1 | tail -n 15")
  cleanup = _Step("cleanup", "The reproduction test was only for me; I'll remove it and check "
                  "that only the source change remains.",
                  (f"rm -f {shlex.quote(repro_path)} && " if repro_path else "") + "git status --short")
  submit = _Step("submit", "The change is complete. Submitting the patch.", prompts.SUBMIT_COMMAND)
  wrong_step = (None if wrong is None else _Step(
      "wrong_edit", f"My guess is that the logic of `{symbol}` mishandles this case; I'll adjust it.",
      _edit_command(first.file, wrong[0], wrong[1])))

  if variant == "gold":
    steps += gold_edits(hunks) + verify() + [run_tests, cleanup, submit]
  elif variant == "detour":
    steps += [wrong_step] + verify() + [_Step(
        "revert", "That did not fix it, so my guess was wrong. I'll revert the change and look "
        "more closely.", f"git checkout -- {shlex.quote(first.file)} && git status --short")]
    steps += gold_edits(hunks) + verify() + [run_tests, cleanup, submit]
  elif variant == "wrong_fix":
    steps += [wrong_step] + verify() + [cleanup, submit]
  elif variant == "partial":
    steps += gold_edits(hunks[:1]) + verify() + [cleanup, submit]
  elif variant == "give_up":
    steps += [_Step("cleanup", "I could not pin down the cause. I'll remove my scratch files and "
                    "stop here.", (f"rm -f {shlex.quote(repro_path)} && " if repro_path else "")
                    + "git status --short"), submit]
  return steps


# ----------------------------------------------------------------------------- running


@dataclasses.dataclass
class ExpertRun:
  """One executed expert trajectory and its grading."""
  variant: str
  result: AgentResult
  step_kinds: list[str]
  evidence: list[dict]
  fail_to_pass_steps: list[int]
  evaluation: object | None = None

  @property
  def resolved(self) -> bool | None:
    return None if self.evaluation is None else bool(self.evaluation.resolved)

  def to_trajectory(self, instance_id: str, *, attempt: int = 0, experiment: str | None = None):
    """A `data.Trajectory` (mini-swe-agent format when written) with the expert's evidence."""
    outcome = {}
    if self.evaluation is not None:
      outcome = {"resolved": self.evaluation.resolved, "status": self.evaluation.outcome,
                 **(self.evaluation.tests.to_dict() if self.evaluation.tests else {})}
    trajectory = self.result.to_trajectory(
        task_id=instance_id, trajectory_id=f"{instance_id}-expert-{self.variant}-"
        f"{uuid.uuid4().hex[:6]}", attempt=attempt,
        metadata={"expert": {"variant": self.variant, "step_kinds": self.step_kinds,
                             "evidence": self.evidence,
                             "fail_to_pass_steps": self.fail_to_pass_steps}})
    trajectory.outcome = outcome
    trajectory.experiment = experiment
    return trajectory


def _evidence(result: AgentResult, kinds: list[str]) -> tuple[list[dict], list[int]]:
  evidence, flips = [], []
  step = -1
  last_edit, last_state = None, None
  messages = result.messages
  for i, message in enumerate(messages):
    if message["role"] != "assistant":
      continue
    step += 1
    kind = kinds[step] if step < len(kinds) else "unknown"
    if kind in ("edit", "wrong_edit", "revert"):
      last_edit = step
    observation = messages[i + 1] if i + 1 < len(messages) else {}
    code = observation.get("extra", {}).get("returncode")
    if kind in ("reproduce", "verify") and code is not None:
      passed = code == 0
      evidence.append({"step": step, "kind": kind, "reproduction_passed": passed})
      if passed and last_state is False and last_edit is not None:
        flips.append(last_edit)
      last_state = passed
  return evidence, flips


def gold_file_texts(sandbox, instance) -> dict[str, str]:
  """{path: text} of the files the gold patch edits, read in `sandbox` (a `tasks.swe` Sandbox
  whose workspace is at the instance's base commit): what `plan_steps` needs."""
  texts: dict[str, str] = {}
  for hunk in _hunks(instance.patch):
    if hunk.file not in texts:
      texts[hunk.file] = sandbox.run(f"cat {shlex.quote(hunk.file)}", timeout_s=30).output
  return texts


def run_expert(instance, variant: str, *, sandbox_factory: Callable[..., ContextManager],
               evaluate: Callable | None = None, config: AgentConfig = AgentConfig(),
               seed: int = 0) -> ExpertRun:
  """Plans and executes one expert variant in a fresh sandbox, then grades its submission.

  Args:
    instance: an SWEInstance with a test_spec (its image and test command).
    variant: one of VARIANTS.
    sandbox_factory: `instance -> context manager yielding a Sandbox` (fresh per call).
    evaluate: `(instance, patch) -> EvalResult` (e.g. evaluation in another fresh sandbox), or
      None to skip grading.
    config: the agent config (the same limits a model run would have).
    seed: varies wording and the wrong edit.

  Raises:
    HarnessError: the variant does not apply to this instance (including a "wrong" edit that
      turned out to fix the reproduction), or the workspace setup failed.
  """
  workdir = instance.test_spec.workdir if instance.test_spec else config.workdir
  with sandbox_factory(instance) as sandbox:
    ready = sandbox.run(setup_script(instance, workdir=workdir), timeout_s=300)
    if ready.exit_code != 0:
      raise HarnessError(f"{instance.instance_id}: workspace setup failed: {ready.output[-500:]}")
    steps = plan_steps(instance, variant, base_text=gold_file_texts(sandbox, instance), seed=seed)
    agent = BashAgent(_ScriptedModel(steps), sandbox, dataclasses.replace(config, workdir=workdir))
    result = agent.run(instance.problem_statement)
  kinds = [s.kind for s in steps]
  evidence, flips = _evidence(result, kinds)
  if variant in ("detour", "wrong_fix"):
    after_wrong = [e for e in evidence if e["kind"] == "verify"][:1]
    if after_wrong and after_wrong[0]["reproduction_passed"]:
      # The "wrong" edit happened to fix the reproduction: the story would be false.
      raise HarnessError(f"{instance.instance_id}: the wrong edit of {variant!r} made the "
                         f"reproduction pass; variant not applicable")
  evaluation = None
  if evaluate is not None and result.exit_status == EXIT_SUBMITTED:
    evaluation = evaluate(instance, result.submission)
  return ExpertRun(variant, result, kinds, evidence, flips, evaluation)


def expert_trajectories(instances: Sequence, client, *,
                        variants: Sequence[str] = ("gold", "detour", "wrong_fix", "give_up"),
                        agent_config: AgentConfig | None = None, output_dir: str | None = None,
                        seed: int = 0, experiment: str | None = None) -> list:
  """Executes the expert's variants on each instance and grades every submission in a fresh
  sandbox of `client` (an Orchard Env SandboxClient).

  A variant that does not apply to an instance (e.g. "partial" on a one-hunk patch) is skipped.
  Returns `data.Trajectory` objects (outcome filled, expert evidence in metadata); with
  `output_dir`, each is also written as a mini-swe-agent `*.traj.json` file there.
  """
  import logging

  from orchard_jax.data.miniswe import write_miniswe_trajectory
  from orchard_jax.tasks.swe import episode

  factory = episode.sandbox_factory(client)
  config = agent_config or AgentConfig()
  trajectories = []
  for instance in instances:
    for attempt, variant in enumerate(variants):
      try:
        run = run_expert(instance, variant, sandbox_factory=factory,
                         evaluate=lambda inst, patch: episode.grade(inst, patch, client),
                         config=config, seed=seed + attempt)
      except HarnessError as e:
        logging.getLogger(__name__).info("expert variant %s skipped on %s: %s", variant,
                                         instance.instance_id, e)
        continue
      trajectory = run.to_trajectory(instance.instance_id, attempt=attempt, experiment=experiment)
      trajectories.append(trajectory)
      if output_dir:
        write_miniswe_trajectory(trajectory, os.path.join(
            output_dir, variant, instance.instance_id, f"{instance.instance_id}.traj.json"))
  return trajectories
