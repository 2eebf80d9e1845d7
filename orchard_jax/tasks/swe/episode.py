"""One SWE episode: the bash agent on an instance in a fresh sandbox, its model reached over
HTTP (normally the recording proxy's per-session URL), and the grading of its submission in
another fresh sandbox by SWE-bench's rules.

  run_episode(instance, client, base_url, ...) -> data.Trajectory   (not yet graded)
  grade(instance, patch, client, log_dir=...)  -> evaluation.EvalResult
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional

from orchard_jax.tasks.errors import EvaluationError
from orchard_jax.tasks.swe import evaluation, testbed
from orchard_jax.tasks.swe.instance import SWEInstance


class EpisodeError(EvaluationError):
  """An episode that could not finish for a reason outside the agent (its sandbox went away,
  the model endpoint stayed unreachable or overloaded). `partial` is the trajectory so far
  (messages up to the failure), for the record; the caller counts the episode as aborted."""

  def __init__(self, message: str, partial=None):
    super().__init__(message)
    self.partial = partial


def transient_model_error(result) -> bool:
  """True when an agent run that ended with "ModelError" failed on the endpoint's
  availability (no answer, 429, 5xx after the client's retries), not on the request: a 4xx
  other than 429 (e.g. a prompt over the context length) is the agent's own outcome."""
  if result.exit_status != "ModelError":
    return False
  text = result.messages[-1].get("extra", {}).get("exception_str", "") if result.messages else ""
  status = re.search(r" answered (\d{3})", text)
  return status is None or not (400 <= int(status.group(1)) < 500 and status.group(1) != "429")


def sandbox_factory(client, **create_kwargs):
  """`instance -> context manager yielding a fresh Sandbox` started from its test_spec image,
  on `client` (an Orchard Env SandboxClient)."""
  def factory(instance: SWEInstance):
    if instance.test_spec is None:
      raise EvaluationError(f"instance {instance.instance_id!r} has no test_spec: no image to "
                            "start")
    return testbed.open_sandbox(client, instance.test_spec.image, **create_kwargs)
  return factory


def run_episode(instance: SWEInstance, client, base_url: str, *, model: str = "default",
                config=None, session_id: Optional[str] = None, attempt: int = 0,
                sampling: Optional[Mapping] = None):
  """The bash agent on `instance` in a fresh sandbox.

  Args:
    instance: an instance with a test_spec.
    client: an Orchard Env SandboxClient.
    base_url: the model's OpenAI-compatible base URL, normally the recording proxy's
      `http://HOST:PORT/sessions/{session_id}/v1`.
    model: the `model` field of requests.
    config: harness.AgentConfig (its workdir is replaced by the instance's).
    session_id: the proxy session, stored on the trajectory so its model calls can be joined.
    attempt: attempt number of this instance.
    sampling: extra ChatModel keywords (temperature, max_tokens, top_p, seed).
  Returns:
    A `data.Trajectory` with the harness messages, exit status and submission (no outcome).
  Raises:
    EvaluationError: the workspace setup failed.
    EpisodeError: the run failed outside the agent (`transient_model_error`, or the sandbox
      failed under it); `partial` holds the messages so far.
  """
  from orchard_jax.harness import AgentConfig, BashAgent, ChatModel
  workdir = instance.test_spec.workdir
  config = dataclasses.replace(config or AgentConfig(), workdir=workdir)
  agent = None
  try:
    with sandbox_factory(client)(instance) as sandbox:
      ready = sandbox.run(testbed.setup_script(instance, workdir=workdir), timeout_s=300)
      if ready.exit_code != 0:
        raise EvaluationError(f"{instance.instance_id}: workspace setup failed: "
                              f"{ready.output[-500:]}")
      with ChatModel(base_url, model, **dict(sampling or {})) as chat:
        agent = BashAgent(chat, sandbox, config)
        result = agent.run(instance.problem_statement)
  except EvaluationError:
    raise
  except Exception as e:  # noqa: BLE001 - keep what the agent did, for the record
    if agent is None:
      raise
    from orchard_jax.data import Trajectory
    partial = Trajectory(trajectory_id=session_id or instance.instance_id,
                         task_id=instance.instance_id, attempt=attempt, session_id=session_id,
                         messages=list(agent.messages))
    raise EpisodeError(f"{type(e).__name__}: {e}", partial) from e
  trajectory = result.to_trajectory(task_id=instance.instance_id, attempt=attempt,
                                    session_id=session_id)
  if transient_model_error(result):
    raise EpisodeError(result.messages[-1].get("extra", {}).get("exception_str", "")
                       or "the model endpoint failed", trajectory)
  trajectory.metadata.setdefault("harness", "orchard_jax.harness.bash_agent")
  return trajectory


def grade(instance: SWEInstance, patch: str, client, *,
          log_dir: Optional[str] = None) -> evaluation.EvalResult:
  """Evaluates `patch` on `instance` in a fresh sandbox (see tasks.swe.evaluation)."""
  with sandbox_factory(client)(instance) as sandbox:
    return evaluation.evaluate_in_sandbox(sandbox, instance, patch, log_dir=log_dir)
