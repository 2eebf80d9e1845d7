"""The Claw domain on the agentic seam: its tasks and split, training-subset choice, an episode
through the ReAct harness whose model is a real HTTP endpoint (a scripted OpenAI-compatible
server playing a task's reference or wrong solution as tool calls: no model can run here),
grading read back by the loop's `grade`, seed trajectories for SFT, and the claw_eval summary."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments import common
from orchard_jax import data
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic.domain import Domain, StatusRules
from orchard_jax.recipes.claw import ClawDomain, OutcomeAnnotator, play_scripted
from orchard_jax.tasks import claw as claw_tasks
from tests.openai_stub import ChatStub


def config(**overrides):
  c = common.claw_base("tiny")
  c.tasks.synth_count = 40
  for key, value in overrides.items():
    node, *path = key.split(".")
    target = c[node]
    for p in path[:-1]:
      target = target[p]
    target[path[-1]] = value
  return c


@pytest.fixture(scope="module")
def domain():
  return ClawDomain(config())


@pytest.fixture(scope="module")
def tasks(domain):
  return domain.load_tasks()


def test_tasks_split_and_subset(domain, tasks):
  assert isinstance(domain, Domain)
  train, heldout = domain.split_tasks(tasks)
  assert len(train) == 40 and all(t.split == "train" for t in train)
  assert {t.id for t in heldout} == {t.id for t in claw_tasks.eval_tasks()}

  class Run:
    train_all = train
  chosen = domain.training_subset(Run, None)
  assert len(chosen) == 2 and all(len(t.reference) == 2 for t in chosen)
  spread = ClawDomain(config(**{"tasks.selection": "spread", "tasks.train_tasks": 0}))
  assert len({t.template for t in spread.training_subset(Run, None)[:19]}) == 19
  with pytest.raises(ConfigError, match="agent.harness"):
    ClawDomain(config(**{"agent.harness": "gemini"})).check_config("rl")
  with pytest.raises(ConfigError, match="tasks.train_file"):
    ClawDomain(config(**{"tasks.train_file": "/nope"})).check_config("rl")


def scripted_endpoint(steps):
  """An OpenAI-compatible endpoint that answers with `steps` (tool calls, then the answer),
  one per request, and records what it was sent."""
  def answer(request):
    step = steps[min(request.index, len(steps) - 1)]
    if step.answer is not None:
      return step.answer
    return {"tool_calls": [{"id": f"call_{request.index}", "type": "function", "function": {
        "name": step.tool, "arguments": json.dumps(step.arguments)}}]}
  return ChatStub(answer)


@pytest.mark.parametrize("which,resolved", [("reference", True), ("wrong", False)])
def test_an_episode_through_the_harness_is_graded(domain, env_client, which, resolved):
  task = next(t for t in claw_tasks.eval_tasks() if t.id == "contacts_update_phone")
  with scripted_endpoint(getattr(task, which)) as stub:
    trajectory = domain.run_episode(task, env_client, stub.root + "/v1", model="policy",
                                    session_id="s1", attempt=0,
                                    sampling={"temperature": 0.5, "seed": 7}, log_dir=None)
    body = stub.requests[0].body
  assert {t["function"]["name"] for t in body["tools"]} == {t.name for t in task.tools}
  assert body["temperature"] == 0.5 and body["seed"] == 7
  assert body["messages"][0]["content"] == claw_tasks.system_prompt(task)
  assert trajectory.exit_status == "Submitted" and trajectory.session_id == "s1"
  assert trajectory.tools and trajectory.metadata["harness"] == "react"
  outcome = domain.grade(task, trajectory, env_client, log_dir=None)
  assert outcome.resolved is resolved
  assert outcome.status == ("passed" if resolved else "failed")
  assert (outcome.details["task_score"] >= 0.75) is resolved
  rules = StatusRules.of(domain)
  trajectory.outcome = outcome.to_dict()
  assert not rules.is_aborted(trajectory) and not rules.is_truncated(trajectory)


def test_a_dying_service_and_a_grader_error_abort_the_rollout(domain, env_client):
  rules = StatusRules.of(domain)
  task = claw_tasks.task_from_dict({**next(t for t in claw_tasks.eval_tasks()
                                           if t.id == "todos_mark_done").to_dict(),
                                    "faults": {"todos": {"crash_after": 1}}})
  with scripted_endpoint(task.reference) as stub:
    trajectory = domain.run_episode(task, env_client, stub.root + "/v1", model="policy",
                                    session_id="s2", attempt=0, sampling={}, log_dir=None)
  assert trajectory.exit_status == "aborted" and rules.is_aborted(trajectory)
  assert "todos service stopped answering" in trajectory.metadata["claw"]["error"]
  broken = data.Trajectory(trajectory_id="x", task_id=task.id, exit_status="Submitted",
                           outcome={"status": "grader_error", "resolved": False})
  assert rules.is_aborted(broken)


def test_seed_trajectories_are_the_reference_solutions(domain, tasks, env_client, tmp_path):
  train = [t for t in tasks if t.split == "train"][:2]

  class Run:
    store = data.TrajectoryStore(str(tmp_path / "store"))
  try:
    seeds = domain.seed_trajectories(Run, train, env_client)
    assert [t.task_id for t in seeds] == [t.id for t in train]
    assert all(t.resolved for t in seeds) and all(t.tools for t in seeds)
    again = domain.seed_trajectories(Run, train, None)          # read back, not replayed
    assert [t.trajectory_id for t in again] == [t.trajectory_id for t in seeds]
    annotation = OutcomeAnnotator().annotate(seeds[0], train[0])
    assert annotation.values[-1] == 1.0 and annotation.num_steps == 2
    sequences = data.sft_sequences_from_messages(seeds[0].messages, data.load_tokenizer("tiny"),
                                                 tools=seeds[0].tools)
    assert sequences and sequences[0].num_loss_tokens > 0
  finally:
    Run.store.close()


def test_local_play_agrees_with_sandbox_play(env_client):
  task = next(t for t in claw_tasks.eval_tasks() if t.id == "multi_reschedule_notify_retry")
  local = play_scripted(task)
  sandboxed = play_scripted(task, env_client)
  assert local.outcome.passed and sandboxed.outcome.passed
  assert local.outcome.robustness_detail == sandboxed.outcome.robustness_detail


def test_claw_summary_and_external_answers():
  from orchard_jax.recipes.claw import ExternalRun, claw_summary, final_answer
  report = {"heldout": {"per_instance": {"a": [True, False, True], "b": [True, True, True],
                                         "c": [False, False, False]}}}
  services = {"a": ("mail",), "b": ("mail", "files"), "c": ("files",)}
  scores = {("a", 0): 1.0, ("a", 1): 0.4, ("a", 2): 0.8, ("b", 0): 1.0, ("b", 1): 1.0,
            ("b", 2): 0.9}
  summary = claw_summary(report, services, scores, 3)
  assert summary["all"].pass_at_k == pytest.approx(2 / 3)
  assert summary["all"].pass_hat_k == pytest.approx(1 / 3)
  assert summary["mail"].pass_at_k == 1.0 and summary["mail"].pass_hat_k == 0.5
  assert summary["files"].pass_hat_k == 0.5 and summary["files"].tasks == 2
  codex = "\n".join(json.dumps(e) for e in [
      {"type": "thread.started"}, {"type": "item.completed", "item": {
          "type": "command_execution", "command": "claw tools"}},
      {"type": "item.completed", "item": {"type": "agent_message", "text": "Moved it. "}}])
  assert final_answer(codex) == "Moved it."
  claude = json.dumps({"type": "result", "subtype": "success", "result": "Done: 3 notes."})
  assert final_answer("noise\n" + claude) == "Done: 3 notes."
  assert final_answer("plain text only") == ""

  class Run:
    timed_out, exit_code, output = False, 1, codex
  run = ExternalRun("codex", Run)
  assert run.exit_status == "HarnessFailed" and run.answer == "Moved it."



def _store_rollouts(store, rollouts, experiment="claw_eval-eval"):
  """rollouts: [(startup_s, episode_s, [(seconds, new prompt tokens, output tokens), ...])]:
  each call's prompt is the previous call's prompt and output plus its new tokens."""
  for r, (startup, episode, calls) in enumerate(rollouts):
    session, clock, prompt = f"{experiment}-{r}", 1000.0 * r, []
    for i, (seconds, new_tokens, output_len) in enumerate(calls):
      prompt = prompt + [7] * new_tokens
      store.append_model_call(data.ModelCall(
          session_id=session, call_index=i, prompt_ids=list(prompt),
          output_ids=[5] * output_len, output_logprobs=[-1.0] * output_len,
          started_at=clock, finished_at=clock + seconds))
      prompt = prompt + [5] * output_len
      clock += seconds + 1.0
    store.append_trajectory(data.Trajectory(
        trajectory_id=session, task_id=f"task{r}", session_id=session, experiment=experiment,
        metadata={"startup_s": startup, "episode_s": episode}))


def test_rollout_times_split_each_rollout_into_services_model_and_the_rest(tmp_path):
  from orchard_jax.recipes.claw import format_rollout_times, rollout_times
  with data.TrajectoryStore(tmp_path / "store") as store:
    # rollout 0: up 0.5 s, calls of 10 s and 4 s in a 16 s episode (other 1.5 s); first prompt
    # 100 tokens, the second call adds 20 beyond prompt + output; rollout 1: one 30 s call.
    _store_rollouts(store, [(0.5, 16.0, [(10.0, 100, 8), (4.0, 20, 6)]),
                            (1.5, 32.0, [(30.0, 300, 64)])])
    _store_rollouts(store, [(9.0, 99.0, [(1.0, 5, 5)])], experiment="other")
    times = rollout_times(store, "claw_eval-eval")
    assert rollout_times(store, "nothing") == {"rollouts": 0}
  assert times["rollouts"] == 2 and times["calls"] == 3 and times["calls_per_rollout"] == 1.5
  assert times["first_prompt_tokens"] == 400 and times["later_prompt_tokens"] == 20
  assert times["output_tokens"] == 78
  assert times["model_s"]["sum"] == pytest.approx(44.0)
  assert times["other_s"]["sum"] == pytest.approx(1.5 + 0.5)
  assert times["startup_s"]["max"] == 1.5 and times["episode_s"]["p50"] == pytest.approx(24.0)
  assert times["model_share"] == pytest.approx(44.0 / 48.0)
  text = format_rollout_times(times)
  assert "2 rollouts" in text and "services up p50 1.00 s" in text and "92% of episode" in text


@pytest.mark.parametrize("preset", common.PRESETS)
def test_claw_experiments_name_their_jobs(preset):
  from experiments import claw_eval, claw_rl, claw_sft, claw_tasks
  from orchard_jax.recipes import JOBS
  for module, job in ((claw_tasks, "claw.tasks"), (claw_sft, "claw.sft"), (claw_rl, "claw.rl"),
                      (claw_eval, "claw.evaluate")):
    c = module.get_config(preset)
    assert c.job == job and job in JOBS and c.preset == preset
  rl = claw_rl.get_config(preset)
  if preset != "tiny":           # the published setting (docs/algorithms.md section 8)
    assert (rl.rl.prompts_per_iteration, rl.rl.bar.group_size) == (8, 8)
    assert rl.agent.wall_time_limit_s == 600.0 and rl.sandbox.cpu == 2.0
  assert rl.rl.reward == "binary" and rl.agent.harness == "react"


def test_claw_rl_refuses_a_bad_harness_before_any_work(tmp_path):
  from experiments import claw_rl
  from orchard_jax.recipes import claw
  c = claw_rl.get_config("tiny")
  c.workdir = str(tmp_path / "run")
  c.agent.harness = "gemini"
  with pytest.raises(ConfigError, match="agent.harness is 'gemini'"):
    claw.train_rl(c)
  import os
  assert not os.path.exists(c.workdir)


EXIT_STATUSES = ("Submitted", "LimitsExceeded", "TimeExceeded", "ModelError", "HarnessFailed",
                 "aborted")
OUTCOME_STATUSES = (None, "passed", "failed", "aborted", "grader_error")


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 30), st.integers(1, 4), st.integers(1, 10))
def test_evaluation_runs_a_tasks_trials_in_turn_within_blocks(tasks, k, parallel):
  """claw_eval's k trials of a task share their first prompt: the loop starts trial a + 1 one
  block (at most `parallel` requests) after trial a, so the engine's prefix cache still holds
  it, instead of starting all k side by side."""
  from orchard_jax.recipes.agentic.evaluation import trial_order
  order = trial_order(tasks, k, parallel)
  assert sorted(order) == [(i, a) for i in range(tasks) for a in range(k)]
  where = {pair: n for n, pair in enumerate(order)}
  for i in range(tasks):
    block = min(parallel, tasks - i // parallel * parallel)   # the size of i's block
    for a in range(1, k):
      assert where[(i, a)] - where[(i, a - 1)] == block
  assert trial_order(3, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]

class _FinishedRuns:
  """Stands in for RolloutRunner in the loop's `evaluate_policy`: hands back rollouts already
  run (no engine or sandbox can run inside a property test), each flagged aborted by the loop's
  own StatusRules for the Claw domain, as RolloutRunner.run flags them."""

  def __init__(self, domain, rows, parallel=2):
    self.domain, self.rows, self.parallel = domain, rows, parallel

  def run_with_progress(self, requests, description, progress_factory, **kwargs):
    from orchard_jax.recipes.agentic.rollouts import Rollout
    rules = StatusRules.of(self.domain)
    out = []
    for request in requests:
      exit_status, status = self.rows[(request.task.id, request.attempt)]
      outcome = {} if status is None else {"status": status, "resolved": status == "passed"}
      trajectory = data.Trajectory(trajectory_id=f"{request.task.id}-{request.attempt}",
                                   task_id=request.task.id, attempt=request.attempt,
                                   exit_status=exit_status, outcome=outcome)
      out.append(Rollout(request, trajectory.trajectory_id, trajectory,
                         aborted=rules.is_aborted(trajectory), seconds=0.0,
                         truncated=rules.is_truncated(trajectory)))
    return out


@pytest.fixture(scope="module")
def eval_tasks():
  return claw_tasks.eval_tasks()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_claw_table_counts_aborted_rollouts_as_the_loop_does(domain, eval_tasks, data_):
  """The claw_eval table's aborted column agrees with the loop's `aborted N` for any mix of
  exit and outcome statuses (the lead saw `aborted 6` from the loop beside `aborted 0` in the
  table when every codex rollout hit its 10-minute budget: TimeExceeded)."""
  from orchard_jax.recipes.agentic.evaluation import evaluate_policy
  from orchard_jax.recipes.claw import claw_summary
  tasks = eval_tasks[:data_.draw(st.integers(1, 4), label="tasks")]
  k = 3
  rows = {(t.id, a): (data_.draw(st.sampled_from(EXIT_STATUSES)),
                      data_.draw(st.sampled_from(OUTCOME_STATUSES)))
          for t in tasks for a in range(k)}
  report = evaluate_policy(_FinishedRuns(domain, rows), {"heldout": tasks}, k=k, seed=0)
  summary = claw_summary(report, {t.id: t.services for t in tasks}, {}, k)
  assert summary["all"].aborted == report["heldout"]["aborted"]
  assert summary["all"].trials == report["heldout"]["attempts"] == len(rows)
  assert summary["all"].grader_errors == sum(s == "grader_error" for _, s in rows.values())
  for service in {s for t in tasks for s in t.services}:
    mine = [key for key in rows if service in next(t for t in tasks if t.id == key[0]).services]
    assert summary[service].aborted == sum(report["heldout"]["per_instance_aborted"][i][a]
                                           for i, a in mine)
