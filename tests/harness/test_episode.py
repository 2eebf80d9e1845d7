"""One full episode as the RL recipe runs it: a model (scripted, over real HTTP) drives the bash
agent on a real instance in a fresh sandbox, and the submission is graded in another."""
from orchard_jax.harness.prompts import SUBMIT_COMMAND
from orchard_jax.recipes.swe import run_episode
from orchard_jax.tasks.swe.builder import BuildSettings, build_task_set
from tests.harness import scripted

ScriptedServer = scripted.ScriptedServer
act = scripted.act


def test_scripted_model_fixes_a_real_instance(env_client, tmp_path):
  settings = BuildSettings(packages=("parse",), instances_per_package=3,
                           max_candidates_per_package=15, seconds_per_package=90, seed=1)
  instance = build_task_set(settings, progress=False).instances[0]
  replies = [act("Look at the layout.", "ls"),
             act("Apply my fix.", f"git apply <<'EOF'\n{instance.patch}EOF"),
             act("Submit.", SUBMIT_COMMAND)]
  with ScriptedServer(replies) as url:
    trajectory = run_episode(instance, env_client, url, session_id="s1", log_dir=str(tmp_path))
  assert trajectory.exit_status == "Submitted"
  assert trajectory.outcome["resolved"] is True and trajectory.outcome["status"] == "resolved"
  assert trajectory.session_id == "s1" and trajectory.task_id == instance.instance_id
  assert (tmp_path / "report.json").exists()
  with ScriptedServer([act("Give up.", SUBMIT_COMMAND)]) as url:
    trajectory = run_episode(instance, env_client, url)
  assert trajectory.outcome["status"] == "unresolved" and trajectory.submission == ""
