"""recipes/agentic/run_folder.py: a failed run removes the run folder only when it created it and the
folder holds no file; user data is never touched."""
import os

import pytest

from orchard_jax.recipes.agentic import run_folder


class _Failed(Exception):
  pass


def _fail_inside(path, body=lambda path: None, error=_Failed):
  with pytest.raises(error):
    with run_folder.run_folder(str(path)):
      body(path)
      raise error()


def test_a_folder_the_failed_run_created_and_left_empty_is_removed(tmp_path):
  _fail_inside(tmp_path / "runs" / "a")
  assert not (tmp_path / "runs" / "a").exists()
  # Empty folders the run made inside (an unused store) do not count as output.
  _fail_inside(tmp_path / "b", lambda p: os.makedirs(p / "store" / "trajectories"))
  assert not (tmp_path / "b").exists()
  _fail_inside(tmp_path / "c", error=KeyboardInterrupt)          # Ctrl-C before any output
  assert not (tmp_path / "c").exists()


def test_a_folder_holding_a_file_or_a_link_is_kept(tmp_path):
  def write(path):
    os.makedirs(path / "store" / "model_calls")
    (path / "store" / "model_calls" / "part-0.jsonl").write_text("{}\n")
  _fail_inside(tmp_path / "a", write)
  assert (tmp_path / "a" / "store" / "model_calls" / "part-0.jsonl").read_text() == "{}\n"
  (tmp_path / "elsewhere").mkdir()
  _fail_inside(tmp_path / "b", lambda p: os.symlink(tmp_path / "elsewhere", p / "link"))
  assert os.path.islink(tmp_path / "b" / "link")


def test_a_folder_that_existed_before_the_run_is_kept_even_when_empty(tmp_path):
  (tmp_path / "mine").mkdir()
  _fail_inside(tmp_path / "mine")
  assert (tmp_path / "mine").is_dir()


def test_a_run_that_succeeds_keeps_its_folder(tmp_path):
  with run_folder.run_folder(str(tmp_path / "ok")):
    pass
  assert (tmp_path / "ok").is_dir()


def test_remove_if_empty_refuses_anything_with_content(tmp_path):
  (tmp_path / "a" / "b").mkdir(parents=True)
  (tmp_path / "a" / "b" / "f").write_text("x")
  assert not run_folder.remove_if_empty(str(tmp_path / "a"))
  assert (tmp_path / "a" / "b" / "f").exists()
  assert not run_folder.remove_if_empty(str(tmp_path / "missing"))


def test_the_runs_own_saved_config_does_not_keep_its_folder(tmp_path):
  """A training run saves config.yaml first; failing before any output it leaves no folder,
  but a config.yaml among other files, or one deeper down, is kept."""
  (tmp_path / "a" / "store").mkdir(parents=True)
  (tmp_path / "a" / "config.yaml").write_text("job: x\n")
  assert run_folder.remove_if_empty(str(tmp_path / "a"), ignore=("config.yaml",))
  assert not (tmp_path / "a").exists()
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "config.yaml").write_text("job: x\n")
  (tmp_path / "b" / "tasks.json").write_text("{}")
  assert not run_folder.remove_if_empty(str(tmp_path / "b"), ignore=("config.yaml",))
  assert (tmp_path / "b" / "config.yaml").exists()
  (tmp_path / "c" / "sft").mkdir(parents=True)
  (tmp_path / "c" / "sft" / "config.yaml").write_text("job: x\n")
  assert not run_folder.remove_if_empty(str(tmp_path / "c"), ignore=("config.yaml",))


def test_each_external_harness_runs_in_its_own_default_folder():
  """A run resumes from its folder, so `swe_rpr --config.agent.harness=codex` and then
  `claude_code` must not share one: the second would resume the first's finished run."""
  import os
  import sys
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from experiments import claw_rl, swe_rpr
  from orchard_jax.recipes.agentic.run import run_dir

  folders = {}
  for harness in ("bash", "mini_swe_agent", "codex", "claude_code"):
    config = swe_rpr.get_config()
    config.agent.harness = harness
    folders[harness] = run_dir(config)
  assert folders["bash"] == os.path.join("runs", "swe_rpr_tiny")     # the README's folder
  assert len(set(folders.values())) == 4
  assert folders["claude_code"] == os.path.join("runs", "swe_rpr_tiny_claude_code")
  claw = claw_rl.get_config()
  assert run_dir(claw) == os.path.join("runs", f"{claw.name}_tiny")   # its built-in harness
  claw.agent.harness = "codex"
  assert run_dir(claw) == os.path.join("runs", f"{claw.name}_tiny_codex")
  config = swe_rpr.get_config()
  config.agent.harness, config.workdir = "codex", "elsewhere"
  assert run_dir(config) == "elsewhere"                              # an explicit folder wins
