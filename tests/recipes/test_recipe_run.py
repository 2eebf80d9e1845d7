"""The main job's wiring on a miniature configuration: two real tasks (on the parse package's
image, with a coin-flip hidden test), a 2-layer MoE policy, credit-assignment SFT from a
mini-swe-agent folder, two RL iterations of BAR rollouts through the recording proxy into the
embedded engine, real sandboxes and grading, an LLM judge (a scripted endpoint) that fails on
some calls, one rollout aborted by an injected sandbox failure, packed updates, weight sync,
orbax checkpoints, the evaluations of the SFT start and of the final policy under the same
protocol, and swe_eval on the resulting checkpoint."""
import dataclasses
import json
import math
import os
import threading

import pytest

from experiments import swe_eval as swe_eval_experiment
from experiments import swe_rpr, swe_value
from orchard_jax import data
from orchard_jax.recipes import swe
from orchard_jax.recipes.swe.domain import SWEDomain
from tests.recipes import conftest
from tests.recipes.scripted_llm import ScriptedLLM

WEIGHTS = {"fix_quality": 0.15, "reproduction": 0.18, "coverage": 0.12, "rigor": 0.15,
           "discriminativeness": 0.14, "regression_guard": 0.12, "verification_integrity": 0.14}
GIVEN = {"fix_quality": 0.1, "reproduction": 0.0, "coverage": 0.26, "rigor": 0.0,
         "discriminativeness": 0.0, "regression_guard": 0.0, "verification_integrity": 0.54}
J_GIVEN = sum(WEIGHTS[k] * math.floor(v * 10 + 0.5 + 1e-9) / 10 for k, v in GIVEN.items())


def _judge_reply(index, body):
  if index % 3 == 1:
    return "The trajectory is too short to grade."       # no JSON: the judge call fails
  return json.dumps({"reasoning": "no process to speak of", "scores": GIVEN})


@pytest.fixture(scope="module")
def mini_run(coin_dataset, parse_instances, tmp_path_factory):
  """Runs swe.rl once on the miniature config; yields (result, config, captured stdout)."""
  import io
  import contextlib
  from orchard_jax.tasks.swe.instance import load_instances
  tmp_path = tmp_path_factory.mktemp("mini_run")
  instances = load_instances(coin_dataset)
  aborted = {"session": None}
  lock = threading.Lock()
  original = SWEDomain.run_episode

  def flaky_episode(self, instance, client, base_url, **kwargs):
    """Fault injection: the first rollout of iteration 0 with attempt 1 loses its sandbox."""
    with lock:
      hit = (aborted["session"] is None and kwargs["session_id"].startswith("swe_rpr-0-")
             and kwargs["attempt"] == 1)
      if hit:
        aborted["session"] = kwargs["session_id"]
    if hit:
      raise RuntimeError("injected failure: the sandbox backend went away")
    return original(self, instance, client, base_url, **kwargs)

  mp = pytest.MonkeyPatch()
  mp.setattr(SWEDomain, "run_episode", flaky_episode)
  out = io.StringIO()
  try:
    with ScriptedLLM(_judge_reply) as judge:
      config = conftest.mini_config(swe_rpr, tmp_path, coin_dataset, judge_url=judge.url,
                                    sft_source=conftest.sft_folder(tmp_path, instances))
      with contextlib.redirect_stdout(out):
        result = swe.train_rl(config)
  finally:
    mp.undo()
  yield result, config, out.getvalue(), aborted["session"]


@pytest.mark.slow
def test_iterations_are_logged_and_trained(mini_run):
  result, config, stdout, _ = mini_run
  assert "SFT data:" in stdout and "SFT done:" in stdout
  assert "[it 1/2]" in stdout and "[it 2/2]" in stdout and "eval[train]" in stdout
  assert "eval_start[train]" in stdout and "pass@1[train] SFT start" in stdout
  history = result["iterations"]
  assert len(history) == 2
  for stats in history:
    for key in ("reward/mean", "resolved/first", "bar/rollouts", "groups/dropped",
                "train/tokens", "time/rollout_s", "time/judge_s", "time/train_s"):
      assert key in stats
    # BAR: every prompt gets its first stride; a prompt stops at N_max = 6.
    assert 4 <= stats["bar/rollouts"] <= 12
    assert stats["bar/target"] + stats["bar/widened"] + stats["bar/ranked"] == 2
    # Kept groups train; dropped ones do not (the batch keeps its shape either way).
    if stats["groups/trained"]:
      assert stats["train/tokens"] > 0 and stats["train/updates"] >= 1
    else:
      assert stats["train/tokens"] == 0
  # With a fair coin and up to 6 rollouts per prompt, a group without both outcomes is rare
  # (1/32 per prompt); across 4 prompts at least one group trains.
  assert sum(s["groups/trained"] for s in history) >= 1


@pytest.mark.slow
def test_rollouts_are_stored_with_rewards_and_judge_fallback(mini_run):
  result, config, _, aborted_session = mini_run
  with data.TrajectoryStore(os.path.join(config.workdir, "store")) as store:
    rollouts = store.trajectories(experiment="swe_rpr")
    assert len(rollouts) == sum(s["bar/rollouts"] for s in result["iterations"])
    judged = failed = 0
    for t in rollouts:
      binary = t.rewards["binary"]
      truncated = t.exit_status == "LimitsExceeded"
      assert binary == (1.0 if t.resolved and not truncated else -1.0)
      if t.metadata.get("aborted"):
        assert t.rewards["total"] == -1.0 and "judge" not in t.metadata
        continue
      verdict = t.metadata["judge"]
      if verdict["failed"]:
        failed += 1
        assert t.rewards["total"] == binary and "GraderError" in verdict["failure"]
      else:
        judged += 1
        assert t.rewards["total"] == pytest.approx(binary + 0.5 * J_GIVEN)
      # Every non-aborted rollout's model calls were recorded by the proxy with log-probs.
      calls = store.model_calls(t.session_id)
      assert calls and all(len(c.output_logprobs) == len(c.output_ids) for c in calls)
    assert judged and failed
    # The aborted rollout: stored with its error, R_bin -1, never reached the model.
    [aborted] = [t for t in rollouts if t.trajectory_id == aborted_session]
    assert aborted.exit_status == "aborted" and aborted.metadata["aborted"]
    assert "injected failure" in aborted.metadata["error"]
    assert store.model_calls(aborted_session) == []
  assert result["iterations"][0]["rollouts/aborted"] == 1


@pytest.mark.slow
def test_weights_sync_and_checkpoints(mini_run):
  result, config, _, _ = mini_run
  from orchard_jax.recipes.agentic import policy
  from orchard_jax.train import Checkpointer
  folder = policy.find_checkpoint_dir(config.workdir)
  assert folder == os.path.join(config.workdir, "rl", "checkpoints")
  updates = [s["train/updates"] for s in result["iterations"]]
  with Checkpointer(folder, async_save=False) as checkpoints:
    assert checkpoints.latest_step() == sum(updates)
  with data.TrajectoryStore(os.path.join(config.workdir, "store")) as store:
    versions = {}
    for t in store.trajectories(experiment="swe_rpr"):
      for call in store.model_calls(t.session_id):
        versions.setdefault(t.iteration, set()).add(call.policy_version)
  # Iteration 0 sampled from the SFT weights (version 0); iteration 1 from the weights after
  # iteration 0's updates, synced into the engine.
  assert versions[0] == {0}
  assert versions[1] == {updates[0]}
  assert os.path.exists(os.path.join(config.workdir, "sft", "checkpoints"))
  assert json.load(open(os.path.join(config.workdir, "tasks.json")))["train"] == [
      "coin__parse-0", "coin__parse-1"]


@pytest.fixture(scope="module")
def value_run(mini_run, coin_dataset, tmp_path_factory):
  """swe.value on the miniature run's trajectory store, backbone from its policy checkpoint."""
  _, run_config, _, _ = mini_run
  config = conftest.mini_config(swe_value, tmp_path_factory.mktemp("value"), coin_dataset)
  config.value.update(dict(stores=(os.path.join(run_config.workdir, "store"),),
                           init_from_policy=run_config.workdir, heldout_fraction=0.0,
                           epochs=1, batch_size=8, microbatches=1, seq_len=1536, ks=(1, 2)))
  return swe.value(config), config


@pytest.mark.slow
def test_value_model_trains_on_the_store(mini_run, value_run):
  result, run_config, _, _ = mini_run
  report, config = value_run
  with data.TrajectoryStore(os.path.join(run_config.workdir, "store")) as store:
    usable = [t for t in store.trajectories() if t.resolved is not None
              and not t.metadata.get("aborted") and t.exit_status != "aborted"]
  assert report["data"]["kept"] == len(usable) == report["data"]["train"]
  assert report["data"]["resolved"] == sum(bool(t.resolved) for t in usable)
  fit = report["train_fit"]
  assert 0.0 <= fit["ece"] <= 1.0 and fit["num_tasks_at_2"] == 2
  # best-of-k picks one of k candidates: it lies between the worst and best of them on average.
  assert 0.0 <= fit["best_of_2"] <= fit["pass_at_2"] + 1e-9
  assert os.path.exists(os.path.join(config.workdir, "value", "report.json"))


@pytest.mark.slow
def test_checkpoint_evaluation_reproduces_the_final_evaluation(mini_run, value_run,
                                                               coin_dataset, tmp_path):
  """swe_eval --config.checkpoint=<run> samples the same tokens as the run's final evaluation
  (same weights, same seeds, one request at a time); outcomes differ only by the coin. With a
  value model it also reports best-of-k."""
  result, run_config, _, _ = mini_run
  _, value_config = value_run
  report = result["eval"]["train"]
  assert report["instances"] == 2 and report["attempts"] == 4 and report["k"] == 2
  assert 0.0 <= report["pass@1"] <= report["pass@2"] <= 1.0
  config = conftest.mini_config(swe_eval_experiment, tmp_path, coin_dataset)
  config.checkpoint = run_config.workdir
  config.eval.value_checkpoint = value_config.workdir
  config.value.init_from_policy = run_config.workdir
  again = swe.evaluate(config)
  assert set(again) == {"train"} and again["train"]["attempts"] == 4
  assert 0.0 <= again["train"]["best_of_2"] <= 1.0 and "value/auc" in again["train"]

  def first_outputs(workdir, experiment):
    with data.TrajectoryStore(os.path.join(workdir, "store")) as store:
      return {(t.task_id, t.metadata["seed"]): store.model_calls(t.session_id)[0].output_ids
              for t in store.trajectories(experiment=experiment)}

  before = first_outputs(run_config.workdir, "swe_rpr-eval")
  after = first_outputs(config.workdir, "swe_eval-eval")
  assert len(before) == 4 and before == after


@pytest.mark.slow
def test_opd_teacher_scores_the_sampled_tokens(mini_run):
  """On-policy distillation's teacher (a second, embedded engine serving the run's checkpoint)
  scores the tokens the student sampled, each at the temperature it was sampled at; with the
  same weights its log-probs equal the trainer's forward pass at those temperatures, and an OPD
  policy-loss step trains on them."""
  import jax
  import numpy as np
  from orchard_jax import parallel, train
  from orchard_jax.recipes.agentic import grpo, policy, teachers
  _, run_config, _, _ = mini_run
  config = run_config.copy_and_resolve_references()
  config.opd.update(dict(mode="loss", teacher_init=run_config.workdir))
  tokenizer = policy.load_tokenizer(config.policy)
  mesh = parallel.make_mesh(config.mesh)
  with data.TrajectoryStore(os.path.join(run_config.workdir, "store")) as store:
    t = next(t for t in store.trajectories(experiment="swe_rpr")
             if store.model_calls(t.session_id))
    sequences = data.sequences_from_model_calls(store.model_calls(t.session_id), mode="rl")
  with teachers.opd_teacher(config, tokenizer, mesh) as teacher:
    scored = grpo.add_teacher_logprobs([s.with_advantage(1.0) for s in sequences], teacher)
  model = policy.build_policy(config.policy, mesh, vocab_size=tokenizer.vocab_size,
                              init=run_config.workdir)
  for s in scored:
    n = len(s)
    logp, _, _ = train.token_logprobs(model, s.input_ids[None], np.arange(n)[None],
                                      np.ones((1, n), np.int32), with_entropy=False,
                                      temperatures=s.temperatures[None])
    mask = s.teacher_mask > 0
    assert mask.sum() == s.num_loss_tokens and not mask[0]
    # The run samples at config.rollout's temperature (0.8 on the tiny preset), not 1.
    np.testing.assert_allclose(s.temperatures[mask], config.sampling.temperature)
    np.testing.assert_allclose(s.teacher_logprobs[mask], np.asarray(logp)[0][mask], atol=1e-4)
  batches, _ = grpo.pack_updates(scored, config, data_parallel_size=train.data_parallel_size(
      mesh), seed=0)
  assert {"teacher_logprobs", "teacher_mask"} <= set(batches[0])
  trainer_config = dataclasses.replace(grpo.trainer_config(config, str(os.path.join(
      run_config.workdir, "opd_check")), model.config), total_steps=1)
  with train.Trainer(model, grpo.policy_loss(config), trainer_config, mesh=mesh) as trainer:
    metrics = trainer.train_step(batches[0])
  assert np.isfinite(metrics["loss"]) and jax.device_count() >= 1


@pytest.mark.slow
def test_replay_expert_data_is_cached_in_the_store(parse_instances, env_client, tmp_path,
                                                   monkeypatch):
  """The SFT stage's replay-expert trajectories are executed and graded once, then read back
  from the run's store."""
  from orchard_jax.harness import AgentConfig
  from orchard_jax.recipes.swe.domain import cached_expert_trajectories
  from orchard_jax.tasks.swe import expert
  instance = parse_instances[0]
  with data.TrajectoryStore(str(tmp_path / "store")) as store:
    first = cached_expert_trajectories([instance], env_client, store, variants=("gold",),
                                       agent_config=AgentConfig(output_limit_chars=300),
                                       experiment="x-expert")
    assert [t.metadata["expert"]["variant"] for t in first] == ["gold"]
    assert first[0].resolved is True and first[0].exit_status == "Submitted"
    calls = []
    monkeypatch.setattr(expert, "expert_trajectories", lambda *a, **k: calls.append(a) or [])
    again = cached_expert_trajectories([instance], env_client, store, variants=("gold",),
                                       agent_config=AgentConfig(), experiment="x-expert")
    assert calls == [] and [t.trajectory_id for t in again] == [first[0].trajectory_id]
