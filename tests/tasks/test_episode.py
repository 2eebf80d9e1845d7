"""One full SWE episode as the loop runs it: a model (scripted, over real HTTP) drives the bash
agent on a real instance in a fresh sandbox, and the submission is graded in another."""
from orchard_jax.harness.prompts import SUBMIT_COMMAND
from orchard_jax.tasks.swe import episode
from tests.harness import scripted

ScriptedServer = scripted.ScriptedServer
act = scripted.act


def test_scripted_model_fixes_a_real_instance(env_client, parse_tasks, tmp_path):
  instance = parse_tasks.instances[0]
  replies = [act("Look at the layout.", "ls"),
             act("Apply my fix.", f"git apply <<'EOF'\n{instance.patch}EOF"),
             act("Submit.", SUBMIT_COMMAND)]
  with ScriptedServer(replies) as url:
    trajectory = episode.run_episode(instance, env_client, url, session_id="s1")
  assert trajectory.exit_status == "Submitted" and trajectory.outcome == {}
  assert trajectory.session_id == "s1" and trajectory.task_id == instance.instance_id
  graded = episode.grade(instance, trajectory.submission, env_client, log_dir=str(tmp_path))
  assert graded.resolved and graded.outcome == "resolved"
  assert (tmp_path / "report.json").exists()
  with ScriptedServer([act("Give up.", SUBMIT_COMMAND)]) as url:
    trajectory = episode.run_episode(instance, env_client, url)
  assert trajectory.submission == ""
  assert episode.grade(instance, trajectory.submission, env_client).outcome == "unresolved"
