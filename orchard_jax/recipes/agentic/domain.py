"""The seam between the agentic loop and a task domain: the `Domain` protocol and its data types.

The loop (this package) owns rollout groups, BAR, records, packing, updates, weight sync,
checkpoints and evaluation. A domain owns what its tasks are and how they are judged: it loads
tasks, chooses a training subset, opens the environment its episodes act in, runs one episode
(a harness in a sandbox, its model calls through the proxy's per-session URL), grades it,
judges it with its own rubric set, seeds trajectories for SFT, and names which exit statuses
mean aborted or truncated. The loop never imports a domain: a job function builds one from
the config and hands it in (`agentic.train_rl(config, SWEDomain(config))`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ContextManager, Mapping, Optional, Protocol, Sequence, runtime_checkable

from orchard_jax import data, rl


@dataclasses.dataclass
class Outcome:
  """A domain's grade of one episode.

  Attributes:
    resolved: the task's success test passed (pass@k and the group filter count this).
    status: the grader's word for it ("resolved", "unresolved", "error", "grader_error", ...);
      a status in the domain's `aborted_statuses` makes the rollout aborted (never trained on
      as a failure: a grader that could not grade says nothing about the policy).
    reward: the domain's outcome reward in place of R_bin (e.g. a graded score), or None for
      R_bin = +1 resolved / -1 otherwise.
    details: more fields for the stored trajectory's outcome (test counts, reasons, ...).
  """
  resolved: bool
  status: str = ""
  reward: Optional[float] = None
  details: dict = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict:
    """The stored `trajectory.outcome`: {"resolved", "status", **details} (+ "reward")."""
    out = {"resolved": bool(self.resolved), "status": self.status, **self.details}
    if self.reward is not None:
      out["reward"] = float(self.reward)
    return out


@dataclasses.dataclass
class Judgement:
  """A judge's verdict on one trajectory (rubric-based process reward, docs/algorithms.md 5).

  Attributes:
    scores: {rubric name: raw score in [0, 1]} on the domain's rubric set, or None when the
      judge failed (the reward falls back to the outcome reward).
    reasoning: the judge's explanation.
    failure: why the judgement failed ("" when it did not).
    judge: which judge ("evidence", "llm", ...).
    seconds: wall time of the judgement.
  """
  scores: Optional[dict[str, float]]
  reasoning: str = ""
  failure: str = ""
  judge: str = ""
  seconds: float = 0.0

  @property
  def failed(self) -> bool:
    return self.scores is None or bool(self.failure)


@runtime_checkable
class Judge(Protocol):
  """Grades a whole trajectory on the domain's rubric set. Never raises for a bad reply: a
  failure is a Judgement with scores None and the reason in `failure`."""

  def judge(self, trajectory: data.Trajectory, task: Any) -> Judgement: ...


@dataclasses.dataclass
class Annotation:
  """Sparse V(s_t) annotations of one trajectory for credit-assignment SFT
  (docs/algorithms.md section 1).

  Attributes:
    steps: strictly increasing action indices in [0, num_steps).
    values: V at those steps, in [0, 1].
    num_steps: the trajectory's number of actions T (its assistant messages).
    source: the annotator ("evidence", "llm", "evidence_fallback", ...).
    reasoning: the annotator's explanation.
    failure: why a first-choice annotation was replaced ("" otherwise).
    seconds: wall time.
  """
  steps: list[int]
  values: list[float]
  num_steps: int
  source: str
  reasoning: str = ""
  failure: str = ""
  seconds: float = 0.0


@runtime_checkable
class Annotator(Protocol):
  """Gives sparse V annotations of a trajectory (credit-assignment SFT)."""

  def annotate(self, trajectory: data.Trajectory, task: Any) -> Annotation: ...


@runtime_checkable
class Domain(Protocol):
  """What the agentic loop needs to know about a task domain (module docstring). A domain is
  built from the run's config (its own blocks: tasks, env, agent, judge, annotator) and keeps
  what it needs of it; building one does no work.

  Attributes:
    name: the domain's name ("swe", "claw", "gui").
    rubrics: the rubric set its judge scores (`rl.RubricSet`), or None when it has no judge.
    aborted_statuses: exit statuses of a trajectory, or outcome statuses, that mean the
      rollout was aborted (infrastructure failure, time budget, model-call failure, grader
      error): BAR backfill, the group filter drops the group, never trained on as a failure.
      The loop adds its own `ABORTED` ("aborted") for a run that raised.
    truncated_statuses: exit statuses meaning the agent ran out of steps: R_bin = -1 and never
      resolved, whatever was submitted.
    submitted_statuses: exit statuses of an episode that ended by the agent's own decision;
      BAR ranks these before others within a class.
  """
  name: str
  rubrics: Optional[rl.RubricSet]
  aborted_statuses: frozenset[str]
  truncated_statuses: frozenset[str]
  submitted_statuses: frozenset[str]

  def check_config(self, job: str) -> None:
    """Refuses the domain's own bad settings for `job` ("sft", "rl", "evaluate") as one-line
    ConfigErrors before any work."""

  def load_tasks(self) -> Sequence[Any]:
    """Every task of the configured set, in a stable order."""

  def task_id(self, task) -> str:
    """A task's stable id (splits, seeds, records and reports key on it)."""

  def environment(self) -> ContextManager[Any]:
    """A context manager yielding what episodes act in (e.g. an Orchard Env SandboxClient)."""

  def training_subset(self, run, env) -> list[Any]:
    """The tasks SFT and RL train on, chosen from `run.train_all` (may run the environment,
    e.g. to keep only tasks the seed trajectories solve). With env None (a checkpoint
    evaluation without the run's tasks.json), choose without running anything."""

  def run_episode(self, task, env, base_url: str, *, model: str, session_id: str, attempt: int,
                  sampling: Mapping[str, Any], log_dir: Optional[str]) -> data.Trajectory:
    """One episode: the harness on `task` in a fresh sandbox, its model at `base_url` (the
    proxy's per-session URL; the proxy records every call under `session_id`). Returns the
    trajectory (messages, exit status, submission), not yet graded. Raising aborts the
    rollout."""

  def grade(self, task, trajectory: data.Trajectory, env, *, log_dir: Optional[str]) -> Outcome:
    """Grades a finished episode. Raising aborts the rollout."""

  def make_judge(self) -> Optional[Judge]:
    """The judge of rubric-based process reward (config.judge), or None."""

  def make_annotator(self) -> Annotator:
    """The credit annotator of SFT (config.annotator)."""

  def seed_trajectories(self, run, tasks: Sequence[Any], env) -> list[data.Trajectory]:
    """Graded trajectories that warm-start SFT when `sft.source` is "expert" (e.g. a replay
    expert), cached in `run.store`."""

  # Optional: `begin_iteration(iteration, total)` is called before each RL iteration's
  # rollouts when a domain defines it (e.g. a step-budget curriculum: GUI's 15 then 30).


# The exit status the loop gives a rollout whose run raised or ran past its time budget.
ABORTED = "aborted"


@dataclasses.dataclass(frozen=True)
class StatusRules:
  """A domain's status names as the loop applies them (see `Domain`)."""
  aborted: frozenset[str]
  truncated: frozenset[str]
  submitted: frozenset[str]

  @classmethod
  def of(cls, domain: Domain) -> "StatusRules":
    return cls(frozenset(domain.aborted_statuses) | {ABORTED},
               frozenset(domain.truncated_statuses), frozenset(domain.submitted_statuses))

  def is_aborted(self, trajectory: data.Trajectory) -> bool:
    status = (trajectory.outcome or {}).get("status")
    return trajectory.exit_status in self.aborted or (status is not None
                                                      and status in self.aborted)

  def is_truncated(self, trajectory: data.Trajectory) -> bool:
    return trajectory.exit_status in self.truncated

  def rank(self, trajectory: data.Trajectory) -> int:
    """BAR's status rank: 0 for a submitted episode, 1 otherwise."""
    return 0 if trajectory.exit_status in self.submitted else 1
