"""recipes/agentic/run_config.py: a run folder's saved config is plain YAML that round-trips,
and a run resumes a folder only when the saved run has the same identity fields (no training)."""
import glob
import json
import logging
import os

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from experiments import swe_rpr
from launch import overrides
from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic import run_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CANDIDATE_PRESETS = ("", "tiny", "qwen3_5_35b_a3b", "cluster", "qwen3_vl_4b", "default",
                      "validate")


def _experiment_configs():
  """(spec, config) for every experiments/*.py file and each preset it accepts."""
  found = []
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py"))):
    if os.path.basename(path) == "common.py":
      continue
    for preset in _CANDIDATE_PRESETS:
      spec = os.path.relpath(path, ROOT) + (f":{preset}" if preset else "")
      try:
        found.append((spec, overrides.load_experiment(spec)))
      except overrides.OverrideError:           # a preset this file does not have
        pass
  return found


EXPERIMENT_CONFIGS = _experiment_configs()


def _set(config, field, value):
  *blocks, name = field.split(".")
  for block in blocks:
    config = config[block]
  config[name] = value


def test_every_experiment_file_is_covered():
  files = {spec.partition(":")[0] for spec, _ in EXPERIMENT_CONFIGS}
  expected = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "experiments",
                                                                       "*.py"))}
  assert files == expected - {os.path.join("experiments", "common.py")}


@pytest.mark.parametrize("spec, config", EXPERIMENT_CONFIGS, ids=[s for s, _ in EXPERIMENT_CONFIGS])
def test_saved_config_is_plain_yaml_that_round_trips(spec, config):
  """What --print_config printed carried `!!python/tuple` tags that a safe YAML reader (and any
  other language's) refuses; the saved form is plain YAML and reads back to the same config."""
  text = run_config.to_yaml(config)
  assert "!!" not in text
  # Independent reference: JSON turns tuples into lists and blocks into objects, as YAML should.
  assert yaml.safe_load(text) == json.loads(json.dumps(config.to_dict()))
  assert run_config.from_yaml(text) == config


# ----------------------------------------------------------------------------- identity


def test_a_fresh_or_empty_folder_starts(tmp_path):
  config = swe_rpr.get_config()
  run_config.check_resume(config, str(tmp_path / "new"))
  (tmp_path / "empty" / "store").mkdir(parents=True)        # folders, no file
  run_config.check_resume(config, str(tmp_path / "empty"))


def test_a_differing_identity_field_stops_the_run_naming_field_old_and_new(tmp_path):
  """The fault: a Claude Code run in the folder of a finished Codex run resumed its checkpoint
  and "finished" in 0.2 min having run nothing."""
  folder = str(tmp_path / "run")
  codex = swe_rpr.get_config()
  codex.agent.harness = "codex"
  run_config.save_config(codex, folder)
  claude = swe_rpr.get_config()
  claude.agent.harness, claude.seed = "claude_code", 3
  with pytest.raises(run_config.RunFolderMismatch) as error:
    run_config.check_resume(claude, folder)
  message = str(error.value)
  assert "\n" not in message and f"run folder {folder} " in message
  assert "agent.harness 'codex' -> 'claude_code'" in message and "seed 0 -> 3" in message
  assert "--config.workdir=DIR" in message and "--config.resume=force" in message


@pytest.mark.parametrize("field, value", [
    ("rl.iterations", 12), ("sft.epochs", 300), ("eval.k", 4), ("eval.max_instances", 0),
    ("rl.lr", 1e-5), ("progress", False), ("engine.urls", "http://h:30000"),
    ("workdir", "elsewhere"), ("mesh.data", 1), ("agent.step_limit", 20)])
def test_a_safe_field_resumes(tmp_path, field, value):
  folder = str(tmp_path / "run")
  run_config.save_config(swe_rpr.get_config(), folder)
  config = swe_rpr.get_config()
  _set(config, field, value)
  run_config.check_resume(config, folder)


def test_resume_force_continues_and_logs_what_differs(tmp_path, caplog):
  folder = str(tmp_path / "run")
  run_config.save_config(swe_rpr.get_config(), folder)
  config = swe_rpr.get_config()
  config.policy.tokenizer, config.resume = "other_tokenizer", "force"
  with caplog.at_level(logging.WARNING):
    run_config.check_resume(config, folder)
  assert "policy.tokenizer 'tiny' -> 'other_tokenizer'" in caplog.text
  config.resume = "yes"
  with pytest.raises(ConfigError, match=r"resume is 'yes'; expected one of \('auto', 'force'\)"):
    run_config.check_resume(config, folder)


def test_a_folder_from_before_saved_configs_resumes_with_a_warning_then_is_checked(
    tmp_path, caplog):
  """A run folder written before this change (checkpoints, no config.yaml) cannot be checked:
  it resumes with a warning, and once the run saves its config the next start is checked."""
  folder = tmp_path / "old_run"
  (folder / "rl" / "checkpoints" / "3").mkdir(parents=True)
  (folder / "rl" / "checkpoints" / "3" / "meta.json").write_text("{}")
  config = swe_rpr.get_config()
  with caplog.at_level(logging.WARNING):
    run_config.check_resume(config, str(folder))
  assert "saved no config.yaml" in caplog.text and str(folder) in caplog.text
  run_config.save_config(config, str(folder))
  config.policy.preset = "small"
  with pytest.raises(run_config.RunFolderMismatch, match="policy.preset 'tiny' -> 'small'"):
    run_config.check_resume(config, str(folder))


def test_a_field_only_one_config_has_is_not_compared(tmp_path):
  """A code change that adds or removes a field must not lock every existing run folder."""
  folder = str(tmp_path / "run")
  saved = swe_rpr.get_config()
  saved.unlock()
  del saved["tasks"]["per_package"]                 # an identity field the old code lacked
  run_config.save_config(saved, folder)
  run_config.check_resume(swe_rpr.get_config(), folder)


def test_every_identity_field_exists_in_some_experiment():
  """A misspelt entry would silently never be compared."""
  fields = set()
  for _, config in EXPERIMENT_CONFIGS:
    fields |= {f for f, _ in run_config._leaves(run_config.to_plain(config))}
  assert run_config.IDENTITY_FIELDS - fields == set()


_LEAVES = dict(run_config._leaves(run_config.to_plain(swe_rpr.get_config())))
del _LEAVES["resume"]                               # its own test: it chooses the check


def _other_value(value):
  """A value of the same type that differs from `value`."""
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 1
  if isinstance(value, str):
    return value + "_x"
  if isinstance(value, list):
    return value + ["x"]
  return "x"                                        # None


@settings(max_examples=100, deadline=None)
@given(st.sets(st.sampled_from(sorted(_LEAVES)), min_size=1, max_size=6))
def test_the_run_stops_exactly_when_an_identity_field_changed(tmp_path_factory, changed):
  """Over generated changes to swe_rpr's fields, written to disk and read back: the run stops
  if and only if an identity field changed, and the message names exactly those fields."""
  folder = str(tmp_path_factory.mktemp("run"))
  run_config.save_config(swe_rpr.get_config(), folder)
  new = run_config.to_plain(swe_rpr.get_config())
  for field in changed:
    *blocks, name = field.split(".")
    node = new
    for block in blocks:
      node = node[block]
    node[name] = _other_value(node[name])
  config = run_config.from_yaml(yaml.safe_dump(new))
  expected = changed & run_config.IDENTITY_FIELDS
  if not expected:
    run_config.check_resume(config, folder)
    return
  with pytest.raises(run_config.RunFolderMismatch) as error:
    run_config.check_resume(config, folder)
  listed = str(error.value).split("holds another run (", 1)[1].rsplit("); choose", 1)[0]
  assert {item.split(" ", 1)[0] for item in listed.split("; ")} == expected


# ----------------------------------------------------------------------------- the jobs


def test_swe_rl_in_another_runs_folder_stops_before_any_work(tmp_path):
  """The job itself: the saved Codex run is left as it was and nothing else is written."""
  from orchard_jax.recipes import swe
  folder = tmp_path / "run"
  codex = swe_rpr.get_config()
  codex.agent.harness, codex.workdir = "codex", str(folder)
  run_config.save_config(codex, str(folder))
  before = (folder / "config.yaml").read_text()
  config = swe_rpr.get_config()
  config.workdir = str(folder)
  with pytest.raises(run_config.RunFolderMismatch, match="agent.harness 'codex' -> 'bash'"):
    swe.train_rl(config)
  assert os.listdir(folder) == ["config.yaml"]
  assert (folder / "config.yaml").read_text() == before


def test_a_distillation_with_another_teacher_stops_before_loading_tasks(tmp_path):
  """Collection skips the attempts its store already holds for the experiment: another
  teacher's would count as done."""
  from experiments import swe_distill as experiment
  from orchard_jax.recipes.swe import distill
  folder = tmp_path / "distill"
  saved = experiment.get_config()
  saved.teacher.checkpoint = "runs/swe_sft_tiny"
  run_config.save_config(saved, str(folder))
  config = experiment.get_config()
  config.workdir = str(folder)
  config.tasks.dataset = str(tmp_path / "never_read.jsonl")     # loading it would fail
  with pytest.raises(run_config.RunFolderMismatch,
                     match="teacher.checkpoint 'runs/swe_sft_tiny' -> ''"):
    distill.collect(config)
  assert os.listdir(folder) == ["config.yaml"]


def test_an_unknown_resume_mode_is_refused_before_launch(tmp_path):
  """A sweep point or a Job's --set is checked on the laptop (launch/overrides.py)."""
  config = overrides.load_experiment("experiments/swe_rpr.py")
  with pytest.raises(overrides.OverrideError, match=r"resume is 'forse'; expected one of"):
    overrides.check(config, [("resume", "forse")], flag="--set")
  overrides.check(config, [("resume", "force")], flag="--set")


def test_launch_refuses_with_one_line_and_status_2(tmp_path):
  """The entry point a user runs (lm_sft: its check comes before the corpus is read)."""
  import subprocess
  import sys
  folder = tmp_path / "lm"
  saved = overrides.load_experiment("experiments/lm_sft.py")
  run_config.save_config(saved, str(folder))
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "run.py"), "--config",
       "experiments/lm_sft.py", f"--config.workdir={folder}", "--config.data.seed=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and "data.seed 0 -> 1" in lines[0] and "Traceback" not in result.stderr
  assert os.listdir(folder) == ["config.yaml"]
