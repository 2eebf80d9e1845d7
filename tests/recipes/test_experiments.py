"""The experiment files: every preset loads, names a registered job, and a config swe.rl cannot
run is refused before the task set or SFT (not minutes into the run)."""
import os

import pytest

from experiments import (common, swe_bar, swe_eval, swe_opd, swe_rpr, swe_sft, swe_tasks,
                         swe_value)
from orchard_jax.recipes import JOBS, swe

EXPERIMENTS = {swe_tasks: "swe.build_tasks", swe_sft: "swe.sft", swe_bar: "swe.rl",
               swe_rpr: "swe.rl", swe_opd: "swe.rl", swe_value: "swe.value",
               swe_eval: "swe.evaluate"}


@pytest.mark.parametrize("preset", common.SWE_PRESETS)
@pytest.mark.parametrize("experiment", list(EXPERIMENTS), ids=lambda m: m.__name__)
def test_every_preset_names_its_registered_job(experiment, preset):
  config = experiment.get_config(preset)
  assert config.job == EXPERIMENTS[experiment] and config.job in JOBS
  if experiment is not swe_tasks:
    assert config.preset == preset and set(config) == set(common.swe_base(preset)) | (
        {"predictions", "output_dir", "run_id", "checkpoint"} if experiment is swe_eval
        else set())


@pytest.mark.parametrize("change, message", [
    ({}, "no teacher"),                                   # swe_opd's tiny default alone
    ({"rl.reward": "process"}, "rl.reward is 'process'"),
    ({"opd.mode": "distill"}, "opd.mode is 'distill'"),
])
def test_swe_rl_refuses_a_config_it_cannot_run_before_doing_anything(tmp_path, change, message):
  config = swe_opd.get_config()
  config.workdir = str(tmp_path / "run")
  config.opd.teacher_urls = ""
  for field, value in change.items():
    block, name = field.split(".")
    config[block][name] = value
  if change:
    config.opd.teacher_init = "runs/some_run"       # only the changed field is wrong
  with pytest.raises(ValueError, match=message):
    swe.train_rl(config)
  assert not os.path.exists(config.workdir)


def test_a_multi_host_run_without_remote_engines_is_refused(tmp_path, monkeypatch):
  """Simulated: jax.process_count is monkeypatched to 2 (this test is one process). Rollouts run
  on process 0 only, which cannot drive an embedded engine whose model spans every host."""
  import jax
  monkeypatch.setattr(jax, "process_count", lambda *args, **kwargs: 2)
  config = swe_rpr.get_config()
  config.workdir = str(tmp_path / "run")
  with pytest.raises(ValueError, match="needs remote engines"):
    swe.train_rl(config)
  assert not os.path.exists(config.workdir)


def _set(config, field, value):
  *blocks, name = field.split(".")
  for block in blocks:
    config = config[block]
  config[name] = value


@pytest.mark.parametrize("experiment, change, message", [
    (swe_rpr, {"rl.iterations": -1}, "rl.iterations is -1"),
    (swe_rpr, {"rl.prompts_per_iteration": 0}, "rl.prompts_per_iteration is 0"),
    (swe_rpr, {"rl.bar.group_size": 0}, "rl.bar: BAR needs group_size >= 1"),
    (swe_rpr, {"rl.bar.positive_fraction": (0.8, 0.2)}, "rl.bar: positive_fraction"),
    (swe_rpr, {"policy.init": "runs/no_such_run"}, "policy.init: 'runs/no_such_run' does not"),
    (swe_rpr, {"sft.source": "runs/no_such_run/store"},
     "sft.source: 'runs/no_such_run/store' does not exist"),
    (swe_opd, {"opd.teacher_init": "runs/no_such_run"},
     "opd.teacher_init: 'runs/no_such_run' does not exist"),
    (swe_sft, {"sft.source": "runs/no_such_run/store"},
     "sft.source: 'runs/no_such_run/store' does not exist"),
    (swe_sft, {"policy.init": "runs/no_such_run"}, "policy.init: 'runs/no_such_run' does not"),
    (swe_rpr, {"engine.data_parallel": 3},
     "engine: data_parallel must be >= 1 and divide max_batch_size 8, got 3"),
])
def test_a_missing_input_or_an_impossible_number_is_refused_before_any_work(
    tmp_path, monkeypatch, experiment, change, message):
  """Each was found by a new-user walkthrough: SFT ran for minutes (rl.iterations=-1 and a
  missing opd.teacher_init only failed, if at all, after it), or a missing sft.source was a
  FileNotFoundError traceback after tasks.json had been written into the run folder."""
  from orchard_jax.recipes import ConfigError
  monkeypatch.chdir(tmp_path)                      # "runs/no_such_run" is relative
  config = experiment.get_config()
  config.workdir = str(tmp_path / "run")
  for field, value in change.items():
    _set(config, field, value)
  job = swe.sft if experiment is swe_sft else swe.train_rl
  with pytest.raises(ConfigError, match=message):
    job(config)
  assert not os.path.exists(config.workdir)


def test_a_sft_source_is_not_needed_when_policy_init_skips_sft(tmp_path):
  """swe.rl with policy.init set runs no SFT, so a stale sft.source is not refused: with both
  wrong, the error names policy.init, the one the run would read."""
  from orchard_jax.recipes import ConfigError
  config = swe_rpr.get_config()
  config.workdir = str(tmp_path / "run")
  config.sft.source = str(tmp_path / "no_such_store")
  config.policy.init = str(tmp_path / "no_such_run")
  with pytest.raises(ConfigError, match="policy.init"):
    swe.train_rl(config)


def test_batch_sizes_must_split_over_microbatches_and_data_parallel_devices():
  """The packer and the trainer need the same rows on every device and microbatch; a batch that
  does not split is one line before any training (here: the tests' 8 host devices)."""
  import jax
  from orchard_jax.recipes import ConfigError
  from orchard_jax.recipes.agentic import checks
  config = common.rl_base("tiny")
  devices = jax.device_count()
  config.rl.update(dict(batch_size=2 * devices, microbatches=2))
  checks.check_batch_sizes(config, ("rl",))
  config.rl.update(dict(batch_size=2 * devices + 1, microbatches=1))
  with pytest.raises(ConfigError, match=f"rl.batch_size is {2 * devices + 1} .* multiple of "
                                        f"{devices}"):
    checks.check_batch_sizes(config, ("rl",))
  config.rl.update(dict(batch_size=devices, microbatches=2))
  with pytest.raises(ConfigError, match=f"multiple of {2 * devices}"):
    checks.check_batch_sizes(config, ("rl",))


def test_cli_harness_overrides_size_the_tiny_run_and_keep_fields_set_on_the_command_line():
  """swe_rpr's tiny preset sizes a codex / claude_code run through agent.cli_overrides: fields
  still at the experiment's values take the CLI run's, one set on the command line is kept,
  and an entry naming no field is refused."""
  from orchard_jax.recipes import ConfigError
  from orchard_jax.recipes.agentic import checks
  from orchard_jax.recipes.swe.harness import apply_cli_overrides

  assert swe_rpr.get_config("qwen3_5_35b_a3b").agent.cli_overrides == ()
  config = swe_rpr.get_config()
  entries = {path: (before, after) for path, before, after in config.agent.cli_overrides}
  assert entries["rl.iterations"] == (6, 1) and entries["eval.baseline"] == (True, False)
  config.rl.iterations = 2                              # as --config.rl.iterations=2 would
  apply_cli_overrides(config, "codex")
  assert config.rl.iterations == 2
  assert (config.eval.baseline, config.rl.final_eval, config.rl.bar.max_rollouts,
          config.tasks.train_tasks) == (False, False, 4, 1)
  default = swe_rpr.get_config()
  for path, _, after in default.agent.cli_overrides:
    if path != "rl.iterations":
      assert _get(config, path) == after
  checks.bar_config(config)                             # a valid BAR setting
  for block in ("rl", "sft"):   # rows split evenly into microbatches on one device (run.py's CPU)
    assert config[block].batch_size % config[block].microbatches == 0
  config.agent.cli_overrides = (("rl.no_such_field", 1, 2),)
  with pytest.raises(ConfigError, match="rl.no_such_field"):
    apply_cli_overrides(config, "codex")


def _get(config, field):
  node = config
  for part in field.split("."):
    node = node[part]
  return node
