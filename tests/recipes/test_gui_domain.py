"""The GUI domain on the agentic seam: tasks and splits, the training subset, episodes through
the browser harness whose model is a real HTTP endpoint (a scripted OpenAI-compatible server:
no model can run here) with the screenshot as an image part and only the last one in context,
the +1 / 0 / -1 rewards read back by the loop's `grade`, aborted rollouts, the curriculum, the
scripted demonstrations recorded one model call per turn and turned into SFT sequences with
their images by the loop, and the evaluation summary per family and site."""
import json

import numpy as np
import pytest

from experiments import common, gui_eval, gui_rl, gui_sft
from orchard_jax import data, models
from orchard_jax.recipes import JOBS, ConfigError
from orchard_jax.recipes.agentic.domain import Domain, StatusRules
from orchard_jax.recipes.agentic.images import PolicyImages
from orchard_jax.recipes.agentic.sft import trajectory_sequences
from orchard_jax.recipes.agentic import evaluation
from orchard_jax.recipes.gui import GUIDomain, groupings
from orchard_jax.tasks import gui
from tests.openai_stub import ChatStub


def config(**overrides):
  c = common.gui_base("tiny")
  for key, value in overrides.items():
    node, *path = key.split(".")
    target = c[node]
    for p in path[:-1]:
      target = target[p]
    target[path[-1]] = value
  return c


@pytest.fixture(scope="module")
def domain():
  return GUIDomain(config(**{"tasks.sites": "mail/star"}))


def test_tasks_split_subset_and_curriculum(domain):
  assert isinstance(domain, Domain)
  tasks = domain.load_tasks()
  train, evaluation = domain.split_tasks(tasks)
  assert {t.family for t in train} >= {"miniwob/click-test", "miniwob/click-button"}
  assert all(t.seed >= gui.task.EVAL_SEED_BASE for t in evaluation if t.kind == "miniwob")
  assert not {t.id for t in train} & {t.id for t in evaluation}

  class Run:
    train_all = train
  chosen = domain.training_subset(Run, None)
  assert len(chosen) == 2 and len({t.family for t in chosen}) == 2   # spread over families
  curriculum = GUIDomain(config(**{"agent.step_limits": (15, 30),
                                   "agent.curriculum_iterations": (3,)}))
  task = gui.site_tasks(["shop/buy"])[0]
  assert curriculum.step_limit(task) == 15
  curriculum.begin_iteration(3, 10)
  assert curriculum.step_limit(task) == 30
  assert curriculum.step_limit(gui.miniwob_tasks(["click-test"])[0]) == 15   # task ceiling


@pytest.mark.parametrize("change, message", [
    ({"agent.observation": "video"}, "agent.observation is 'video'"),
    ({"agent.tools": "click,teleport"}, "unknown tool(s) ['teleport']"),
    ({"agent.step_limits": (15, 30)}, "agent.curriculum_iterations needs 1"),
    ({"browser.viewport": (10, 10)}, "browser: viewport"),
    ({"browser.screenshot_format": "gif"}, "screenshot_format"),
    ({"policy.preset": "tiny"}, "reads text only"),
    ({"gui_judge.kind": "webjudge"}, "gui_judge.url is empty"),
    ({"tasks.miniwob": "no-such-task"}, "unknown MiniWoB++ task"),
])
def test_bad_settings_are_refused_before_any_work(change, message):
  with pytest.raises(ConfigError) as info:
    GUIDomain(config(**change)).check_config("rl")
  assert message in str(info.value)


def scripted_endpoint(replies):
  """An OpenAI-compatible server answering with the given tool calls (name, arguments text),
  one per request, then done."""
  def answer(request):
    name, arguments = replies[request.index] if request.index < len(replies) else ("done", "{}")
    return {"tool_calls": [{"id": f"call_{request.index}", "type": "function", "function": {
        "name": name, "arguments": arguments}}]}
  return ChatStub(answer)


def test_an_episode_through_the_harness_sees_screenshots_and_is_graded(domain, env_client):
  task = next(t for t in domain.load_tasks() if t.family == "mail/star")
  replies = [("click", '{"x": 1200, "y": 5}'), ("hover", '{"x": 10, "y": 10}')]
  with scripted_endpoint(replies) as stub:
    trajectory = domain.run_episode(task, env_client, stub.root + "/v1", model="policy",
                                    session_id="s1", attempt=0,
                                    sampling={"temperature": 0.5, "seed": 7}, log_dir=None)
    bodies = [r.body for r in stub.requests]
  assert [t["function"]["name"] for t in bodies[0]["tools"]] == ["click", "write", "done"]
  assert bodies[0]["temperature"] == 0.5 and bodies[0]["seed"] == 7
  images = [[p for m in b["messages"] if isinstance(m["content"], list) for p in m["content"]
             if p["type"] == "image_url"] for b in bodies]
  assert [len(i) for i in images] == [1, 1, 1]   # the last screenshot only, every call
  assert images[0][0]["image_url"]["url"].startswith("data:image/png;base64,")
  assert "Error: click: 'x' must be from 0 to 1000" in json.dumps(bodies[1]["messages"])
  outcome = domain.grade(task, trajectory, env_client, log_dir=None)
  assert trajectory.exit_status == "Submitted" and outcome.status == "failure"
  assert outcome.reward == 0.0 and not outcome.resolved
  assert "sha256:" in json.dumps(trajectory.messages) and "base64" not in json.dumps(
      trajectory.messages)   # stored trajectories name screenshots by digest


def test_repeated_format_failures_score_minus_one_and_a_dead_browser_aborts(domain, env_client):
  task = domain.load_tasks()[0]
  rules = StatusRules.of(domain)
  bad = [("click", "not json")] * 3
  with scripted_endpoint(bad) as stub:
    trajectory = domain.run_episode(task, env_client, stub.root + "/v1", model="policy",
                                    session_id="s2", attempt=0, sampling={}, log_dir=None)
  outcome = domain.grade(task, trajectory, env_client, log_dir=None)
  assert trajectory.exit_status == "RepeatedFormatError"
  assert outcome.status == "format_failure" and outcome.reward == -1.0
  assert not rules.is_aborted(trajectory)
  broken = GUIDomain(config(**{"browser.python": "/nonexistent/python3"}))
  with scripted_endpoint([]) as stub:
    trajectory = broken.run_episode(task, env_client, stub.root + "/v1", model="policy",
                                    session_id="s3", attempt=0, sampling={}, log_dir=None)
  trajectory.outcome = broken.grade(task, trajectory, env_client, log_dir=None).to_dict()
  assert trajectory.exit_status == "aborted" and rules.is_aborted(trajectory)
  assert "browser sandbox" in trajectory.metadata["gui"]["reason"]


def test_scripted_demonstrations_train_one_sample_per_turn_with_their_images(env_client,
                                                                            tmp_path):
  domain = GUIDomain(config(**{"tasks.miniwob": "click-checkboxes",
                               "agent.tools": "click,write,press_keys"}))
  tasks = domain.load_tasks()[:1]
  store = data.TrajectoryStore(str(tmp_path / "store"))

  class Run:
    pass
  Run.store = store
  [trajectory] = domain.seed_trajectories(Run, tasks, env_client)
  assert trajectory.resolved and trajectory.experiment == "gui-expert"
  assert domain.seed_trajectories(Run, tasks, env_client)[0].trajectory_id == \
      trajectory.trajectory_id   # stored once, read back
  calls = store.model_calls(trajectory.session_id)
  turns = sum(1 for m in trajectory.messages if m["role"] == "assistant")
  assert len(calls) == turns >= 2 and all(c.text_only and len(c.images) == 1 for c in calls)
  assert all(store.has_image(c.images[0]) for c in calls)
  tokenizer = data.load_tokenizer("tiny_vl")
  images = PolicyImages(models.get_preset("tiny_vl"), store, images_per_row=2)
  sequences = trajectory_sequences(trajectory, tokenizer, store, images.image_tokens)
  assert len(sequences) == turns        # one training sample per turn
  image_id = tokenizer.image_token_id
  for sequence, call in zip(sequences, calls):
    assert sequence.images == tuple(call.images)
    assert int(np.sum(np.asarray(sequence.input_ids) == image_id)) == \
        images.image_tokens(call.images[0])
    loss_positions = np.flatnonzero(np.asarray(sequence.loss_weights) > 0)
    assert loss_positions.min() > np.flatnonzero(np.asarray(sequence.input_ids) == image_id).max()
  packed = data.pack_sequences(sequences, batch_size=2, seq_len=2048, **images.pack_kwargs())
  batches = images.add(packed)
  assert batches[0]["positions"].shape == (2, 2048, 3)
  assert batches[0]["pixel_values"].shape[:2] == (2, 2)


def test_success_is_reported_per_family_and_per_site():
  tasks = {t.id: t for t in gui.site_tasks(["shop/cheapest", "mail/star"]) +
           gui.miniwob_tasks(["click-test"], split="eval")}
  ids = sorted(tasks)
  report = {"heldout": {"per_instance": {ids[0]: [True, False], ids[1]: [True, True],
                                         ids[-1]: [False, False]}}}
  trials = evaluation.report_trials(report)
  kinds = groupings(list(tasks.values()))
  assert set(kinds) == {"family", "site"}
  summary = evaluation.summarize_groups(trials, kinds["family"], 2)
  families = {tasks[i].family for i in (ids[0], ids[1], ids[-1])}
  assert set(summary) == families | {"all"}
  for name in families:
    verdicts = [v for i, vs in report["heldout"]["per_instance"].items()
                if tasks[i].family == name for v in vs]
    assert summary[name].success == sum(verdicts) / len(verdicts)
    assert summary[name].trials == len(verdicts)
  sites = evaluation.summarize_groups(trials, kinds["site"], 2)
  assert set(sites) == {tasks[i].site for i in (ids[0], ids[1], ids[-1])} | {"all"}
  text = evaluation.format_group_table(summary, 2, title="family")
  assert text.splitlines()[0].startswith("family") and "pass@2" in text


@pytest.mark.parametrize("preset", common.GUI_PRESETS)
@pytest.mark.parametrize("experiment, job", [(gui_rl, "gui.rl"), (gui_sft, "gui.sft"),
                                             (gui_eval, "gui.evaluate")])
def test_gui_experiments_name_their_jobs(experiment, job, preset):
  c = experiment.get_config(preset)
  assert c.job == job and job in JOBS and c.preset == preset
  if preset != "tiny":   # the published setting
    assert c.policy.preset == "qwen3_vl_4b" and tuple(c.browser.viewport) == (1280, 1000)
    assert c.agent.screenshots_in_context == 1 and c.agent.tools == "all"
    assert tuple(c.agent.step_limits) == (15, 30) and c.rl.bar.group_size == 5
    assert (c.rl.eps_low, c.rl.eps_high, c.rl.kl_coef, c.rl.entropy_coef) == (0.2, 0.28, 0, 0)
    assert (c.sft.epochs, c.sft.lr, c.sft.batch_size) == (3, 1e-5, 128)
    assert tuple(c.sft.frozen) == ("visual",)
