"""The SWE domain's harness choice (`agent.harness`): the built-in bash agent, or an external
harness run inside the task's sandbox.

| agent.harness   | runs where                   | wire the proxy serves | recorded                      |
|-----------------|------------------------------|-----------------------|-------------------------------|
| bash            | trainer process, env API      | chat completions      | ModelCall per call            |
| mini_swe_agent  | inside the sandbox            | chat completions      | ModelCall per call + .traj    |
| codex           | inside the sandbox            | Responses             | ModelCall per call + rollout  |
| claude_code     | inside the sandbox            | Messages              | ModelCall per call + transcript|

An external harness gets the repository as its working folder and the proxy's per-session
URL as its model endpoint; its sandbox's egress allow-list holds that endpoint only. Its final
workspace diff (`patches.diff_script` against the base commit, as the built-in agent's
submission is) is graded exactly as the built-in agent's patch, and its own logs and
trajectory files are written beside the rollout's evaluation logs (`<log_dir>/harness/`).

An experiment can size a run for the CLIs (`agent.cli_overrides`, e.g. swe_rpr's tiny preset:
one task, one group, no evaluations); `check_harness_config` applies them to the fields still
at the experiment's values. The CLIs' first prompts are 8-16k tokens (their system prompts and
tool schemas), so `check_harness_config` raises the embedded engine's context and the SFT and RL sequence
lengths to `CLI_CONTEXT_TOKENS` when they are smaller, saying so.

SFT seed data for such a harness is the replay expert's gold plan played through the harness
itself (`harness_expert_trajectory`): the policy learns the harness's format before RL.
"""
from __future__ import annotations

import logging
import os
import urllib.parse
from typing import Any, Callable, Mapping, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError

_log = logging.getLogger(__name__)

HARNESSES = ("bash", "mini_swe_agent", "codex", "claude_code")
CLI_CONTEXT_TOKENS = 24576    # Claude Code's first prompt is ~15.6k tokens, Codex's ~8.4k
EXIT_SUBMITTED, EXIT_HARNESS_FAILED, EXIT_TIME = "Submitted", "HarnessFailed", "TimeExceeded"


def check_harness_config(config: ConfigDict) -> None:
  """Checks agent.harness before any work, installs nothing, and makes room for the CLIs'
  prompts (module docstring).

  Raises:
    ConfigError: an unknown harness, or a CLI that is not installed (naming the command that
      installs it).
  """
  name = str(config.agent.get("harness", "bash"))
  if name not in HARNESSES:
    raise ConfigError(f"agent.harness is {name!r}; expected one of {', '.join(HARNESSES)}")
  if name in ("codex", "claude_code"):
    from orchard_jax.harness import HarnessError, install
    try:
      install.executable(name)
    except HarnessError as e:
      raise ConfigError(f"agent.harness={name}: {e}") from None
    apply_cli_overrides(config, name)
    for block, field in (("engine", "max_seq_len"), ("rl", "seq_len"), ("sft", "max_tokens"),
                         ("sft", "seq_len")):
      if block in config and int(config[block][field]) < CLI_CONTEXT_TOKENS and not (
          block == "engine" and str(config.engine.urls).strip()):
        print(f"agent.harness={name}: {block}.{field} raised from {config[block][field]} to "
              f"{CLI_CONTEXT_TOKENS} (the CLI's first prompt alone is 8-16k tokens)", flush=True)
        config[block][field] = CLI_CONTEXT_TOKENS


def apply_cli_overrides(config: ConfigDict, name: str) -> None:
  """Applies `agent.cli_overrides` ((field, value it was given, value with a CLI harness)
  entries, `experiments.common.cli_harness_overrides`) to the fields that still hold the first
  value, printing each change; a field set otherwise (the command line) is kept.

  Raises:
    ConfigError: an entry naming no field of the config.
  """
  for entry in config.agent.get("cli_overrides", ()) or ():
    path, before, after = entry
    *blocks, field = str(path).split(".")
    node = config
    try:
      for block in blocks:
        node = node[block]
      current = node[field]
    except (KeyError, AttributeError):
      raise ConfigError(f"agent.cli_overrides names {path!r}, which is no field of the "
                        "config") from None
    if current == before and current != after:
      print(f"agent.harness={name}: {path} set from {current} to {after} "
            "(agent.cli_overrides)", flush=True)
      node[field] = after


def proxy_origin(base_url: str) -> str:
  """scheme://host:port of a proxy session URL (what the sandbox's egress allow-list holds)."""
  parts = urllib.parse.urlsplit(base_url)
  return f"{parts.scheme}://{parts.netloc}"


def run_cli_episode(instance, client, base_url: str, *, harness: str, model: str,
                    agent: Any, session_id: Optional[str], attempt: int,
                    sampling: Optional[Mapping] = None, evaluate_patch: bool = True,
                    log_dir: Optional[str] = None,
                    before_run: Optional[Callable[[Any], None]] = None):
  """One rollout of an external harness on `instance`: the harness in a fresh sandbox of the
  instance's image (egress: the proxy only), its workspace diff graded in another.

  Args:
    instance: an SWE instance with a test_spec.
    client: an Orchard Env SandboxClient.
    base_url: the proxy's per-session OpenAI base URL (`http://HOST:PORT/sessions/ID/v1`).
    harness: "codex", "claude_code" or "mini_swe_agent".
    model: the model name the harness sends.
    agent: the harness.AgentConfig (its wall_time_limit_s and step_limit bound the run).
    session_id, attempt: stored on the trajectory.
    sampling: the rollout's sampling settings (max_tokens bounds one call's output).
    evaluate_patch: grade the diff.
    log_dir: the rollout's log folder; the harness's logs go to `<log_dir>/harness/`.
    before_run: called with the `tasks.swe` Sandbox once its workspace is ready, before the
      harness starts (the scripted expert reads the files it will edit there).
  Returns:
    A `data.Trajectory` (exit_status Submitted / HarnessFailed / TimeExceeded; submission is
    the diff; metadata names the harness, its exit code and its log files).
  """
  from orchard_jax import data
  from orchard_jax.harness.cli_harness import HarnessLimits, get_cli_harness, run_cli_harness
  from orchard_jax.tasks.swe import evaluation, patches, testbed
  from orchard_jax.tasks.swe.episode import sandbox_factory

  cli = get_cli_harness(harness)
  workdir = instance.test_spec.workdir
  limits = HarnessLimits(timeout_s=float(agent.wall_time_limit_s), max_turns=int(agent.step_limit),
                         max_output_tokens=int((sampling or {}).get("max_tokens") or 4096))
  factory = sandbox_factory(client, egress=[proxy_origin(base_url)])
  with factory(instance) as sandbox:
    ready = sandbox.run(testbed.setup_script(instance, workdir=workdir), timeout_s=300)
    if ready.exit_code != 0:
      raise evaluation.EvaluationError(
          f"{instance.instance_id}: workspace setup failed: {ready.output[-500:]}")
    if before_run is not None:
      before_run(sandbox)
    box = sandbox.box
    run = run_cli_harness(cli, box, instance.problem_statement,
                          base_url=box.egress_url(base_url), workdir=workdir, model=model,
                          limits=limits,
                          diff_command=patches.diff_script(instance.base_commit, workdir=workdir))
  status = (EXIT_TIME if run.timed_out else EXIT_SUBMITTED if run.exit_code == 0
            else EXIT_HARNESS_FAILED)
  logs = _write_logs(run.logs, log_dir)
  trajectory = data.Trajectory(
      trajectory_id=session_id or f"{instance.instance_id}-{attempt}",
      task_id=instance.instance_id, attempt=attempt, session_id=session_id, messages=[],
      exit_status=status, submission=run.patch,
      metadata={"harness": harness, "wire": cli.wire, "harness_exit_code": run.exit_code,
                "harness_wall_s": run.wall_s, "harness_logs": logs,
                "harness_output_tail": run.output[-2000:]})
  if evaluate_patch:
    with sandbox_factory(client)(instance) as sandbox:
      graded = evaluation.evaluate_in_sandbox(sandbox, instance, run.patch, log_dir=log_dir)
    trajectory.outcome = {"resolved": graded.resolved, "status": graded.outcome,
                          **(graded.tests.to_dict() if graded.tests else {})}
  return trajectory


def harness_expert_trajectory(instance, client, store, *, harness: str, agent: Any,
                              steps: Sequence[str], experiment: Optional[str] = None,
                              seed: int = 0, log_dir: Optional[str] = None,
                              model_name: str = "policy"):
  """The replay expert's gold plan played through an external harness, recorded and graded:
  SFT seed data in the harness's own format (its system prompt, tools and shell tool).

  The harness runs in the instance's sandbox as a rollout does, against a recording proxy
  whose upstream is `harness.scripted_model.ScriptedHarnessModel`: each model call is
  answered with the plan's next step (`tasks.swe.expert.plan_steps`, variant "gold", only the
  steps whose kind is in `steps`; the bash agent's submit step is the harness's final
  answer), run by the harness's own shell tool. The calls are recorded in `store` under the
  trajectory's session (text-only records: SFT tokenises them with the policy's template).

  Args:
    instance: an SWE instance with a test_spec.
    client: an Orchard Env SandboxClient.
    store: the run's `data.TrajectoryStore`.
    harness: "codex" or "claude_code" (a harness with a shell function tool).
    agent: the harness.AgentConfig (its limits bound the run).
    steps: the plan's step kinds to play (`tasks.swe.expert`: explore, reproduce, edit,
      verify, test, cleanup).
    experiment: stored on the trajectory.
    seed: varies the plan's wording.
    log_dir: the harness's logs and the grading's go there.
    model_name: the model name the harness is given: the rollouts' (the policy's served
      model name), since a CLI writes it into its system prompt (Claude Code: "You are powered
      by the model ..."), and a seed whose prompt differs there teaches a policy that
      memorises the seed nothing it recognises in the rollouts' prompts.
  Returns:
    A graded `data.Trajectory` with the recorded conversation as its messages and
    metadata["expert"] = {"variant": "gold", "harness": ..., "step_kinds": [...]}.
  Raises:
    HarnessError: the harness offers no shell tool to script.
  """
  from orchard_jax.harness.cli_harness import get_cli_harness
  from orchard_jax.harness.scripted_model import ScriptedHarnessModel, ScriptStep
  from orchard_jax.rollout import RecordingProxy, new_session_id
  from orchard_jax.tasks.swe import expert

  model = ScriptedHarnessModel(get_cli_harness(harness), final_answer="The fix is in place.",
                               model=model_name)
  kinds: list[str] = []

  def plan(sandbox) -> None:
    planned = expert.plan_steps(instance, "gold", base_text=expert.gold_file_texts(
        sandbox, instance), seed=seed)
    chosen = [s for s in planned if s.kind in tuple(steps) and s.kind != "submit"]
    model.steps = [ScriptStep(s.thought, s.command) for s in chosen]
    kinds[:] = [s.kind for s in chosen]

  session = new_session_id(f"{instance.instance_id}-expert-{harness}")
  with RecordingProxy(model, store=store, served_model_name=model.model,
                      freeze_gc=False) as proxy:
    trajectory = run_cli_episode(instance, client, proxy.session_url(session), harness=harness,
                                 model=model.model, agent=agent, session_id=session, attempt=0,
                                 log_dir=log_dir, before_run=plan)
    proxy.end_session(session)
  calls = [c for c in store.model_calls(session) if c.delivered]
  if calls:
    trajectory.messages = list(calls[-1].messages) + (
        [calls[-1].response] if calls[-1].response else [])
    trajectory.tools = calls[-1].tools
  trajectory.trajectory_id = session
  trajectory.experiment = experiment
  trajectory.metadata["expert"] = {"variant": "gold", "harness": harness, "step_kinds": kinds}
  return trajectory


def _write_logs(logs: Mapping[str, str], log_dir: Optional[str]) -> list[str]:
  """Writes the harness's logs under `<log_dir>/harness/`; returns their paths."""
  if not log_dir:
    return []
  folder = os.path.join(log_dir, "harness")
  paths = []
  for name, text in logs.items():
    path = os.path.join(folder, *[p for p in name.split("/") if p not in ("", ".", "..")])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    paths.append(path)
  return paths


__all__ = ["CLI_CONTEXT_TOKENS", "HARNESSES", "check_harness_config",
           "harness_expert_trajectory", "proxy_origin", "run_cli_episode"]
