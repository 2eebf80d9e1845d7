"""launch/run.py: config loading, overrides, and dispatch errors, run as a user runs it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, cwd=ROOT):
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "run.py"), *args],
                        cwd=cwd, capture_output=True, text=True, timeout=300)


def _write_config(tmp_path, job):
  path = tmp_path / "exp.py"
  path.write_text(textwrap.dedent(f"""
      import ml_collections
      def get_config(preset="tiny"):
        config = ml_collections.ConfigDict()
        config.job = {job!r}
        config.preset = preset
        config.rl = ml_collections.ConfigDict(dict(lr=1e-6))
        return config
      """))
  return str(path)


def test_unknown_field_override_is_a_clear_error(tmp_path):
  result = _run(["--config", _write_config(tmp_path, "nope"), "--config.rl.not_a_field=3"])
  assert result.returncode == 2
  assert ("unknown config field 'not_a_field' in --config.rl.not_a_field" in result.stderr)
  assert "Traceback" not in result.stderr


def test_misspelt_field_suggests_the_right_one(tmp_path):
  result = _run(["--config", _write_config(tmp_path, "nope"), "--config.rl.lrr=3e-6"])
  assert result.returncode == 2
  assert "unknown config field 'lrr'" in result.stderr and '"lr"' in result.stderr


def test_badly_typed_override_names_the_flag_and_value(tmp_path):
  result = _run(["--config", _write_config(tmp_path, "nope"), "--config.rl.lr=abc"])
  assert result.returncode == 2
  assert "--config.rl.lr=abc" in result.stderr and "Traceback" not in result.stderr


def test_unknown_job_names_the_known_jobs(tmp_path):
  result = _run(["--config", _write_config(tmp_path, "no.such_job") + ":small",
                 "--config.rl.lr=3e-6"])
  assert result.returncode != 0
  assert "config.job is 'no.such_job'; expected one of" in result.stderr
  assert result.returncode == 2 and "Traceback" not in result.stderr


def test_missing_config_flag_is_a_usage_error():
  """One line and status 2, like every other refusal (absl printed its usage text and every
  flag, the error last, with status 1)."""
  result = _run([])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: --config is required, e.g. --config experiments/swe_rpr.py (see --help)"]


def test_unknown_preset_is_one_line_naming_the_presets():
  result = _run(["--config", "experiments/lm_sft.py:bogus"])
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "preset 'bogus' is not one of the model presets" in result.stderr
  result = _run(["--config", "experiments/swe_rpr.py:bogus"])
  assert result.returncode == 2 and "preset 'bogus' is not one of" in result.stderr


def test_missing_config_file_is_one_line_pointing_at_the_repository_root(tmp_path):
  # A user running from another directory: the relative experiment path does not resolve.
  result = _run(["--config", "experiments/swe_eval.py"], cwd=str(tmp_path))
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "--config experiments/swe_eval.py: no such file" in result.stderr
  assert os.path.join(ROOT, "experiments", "swe_eval.py") in result.stderr
  result = _run(["--config=experiments/swe_evl.py:tiny"])        # a typo in the file name
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "no such file" in result.stderr


def test_sweep_and_fleet_report_config_mistakes_in_one_line(tmp_path):
  def launcher(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  result = launcher("sweep.py", "--config", "experiments/swe_rpr.py:cluster", "--config.rl.lrr=1",
                    "--sweep", "rl.lr=1e-6,3e-6", "--render")
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "unknown config field 'lrr' in --config.rl.lrr" in result.stderr
  result = launcher("fleet.py", "up", "--dry-run", "--config", "launch/k8s/config.py",
                    "--config.imgae=x")
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "unknown config field 'imgae'" in result.stderr and '"image"' in result.stderr
  result = launcher("fleet.py", "up", "--dry-run", "--config", "launch/k8s/confg.py")
  assert result.returncode == 2 and "no such file" in result.stderr


def test_a_config_without_a_job_field_is_one_line(tmp_path):
  path = tmp_path / "nojob.py"
  path.write_text("import ml_collections\n"
                  "def get_config():\n"
                  "  return ml_collections.ConfigDict(dict(lr=1.0))\n")
  result = _run(["--config", str(path)])
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "the config has no 'job' field" in result.stderr


def test_checking_the_job_name_imports_no_recipe_module():
  # run.py checks config.job before the compilation cache and distributed init: the check
  # must not import the recipe (a heavy module, and one that may touch devices).
  code = textwrap.dedent("""
      import sys, ml_collections
      from orchard_jax import recipes
      config = ml_collections.ConfigDict(dict(job="swe.evaluate"))
      assert recipes.check_job(config) == "swe.evaluate"
      loaded = sorted(m for m in sys.modules if m.startswith("orchard_jax.recipes."))
      print(loaded)
      try:
        recipes.check_job(ml_collections.ConfigDict(dict(job="swe.evalute")))
      except recipes.UnknownJobError as e:
        print(e)
      """)
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  loaded, message = result.stdout.splitlines()
  assert loaded == "[]"
  assert message.startswith("config.job is 'swe.evalute'; expected one of: ")
  assert "swe.evaluate" in message


def _one_line_error(result, *fragments):
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(error) == 1, result.stderr[-2000:]
  for fragment in fragments:
    assert fragment in error[0]


def test_a_missing_checkpoint_is_one_line_before_any_work(tmp_path):
  workdir = tmp_path / "run"
  result = _run(["--config", "experiments/swe_eval.py", f"--config.checkpoint={tmp_path}/nope",
                 f"--config.workdir={workdir}"])
  _one_line_error(result, "config.checkpoint", f"'{tmp_path}/nope' does not exist")
  assert not workdir.exists()          # refused before the run folder and the task set


def test_a_missing_or_malformed_predictions_file_is_one_line(tmp_path):
  result = _run(["--config", "experiments/swe_eval.py",
                 f"--config.predictions={tmp_path}/preds.jsonl"])
  _one_line_error(result, "config.predictions", "does not exist")
  # A file that exists but is not JSONL: refused before the dataset is loaded, and before its
  # instance without a test_spec would be built (cloned by tasks.url_template).
  dataset = tmp_path / "instances.jsonl"
  dataset.write_text(json.dumps({"instance_id": "pkg__pkg-1", "repo": "pkg", "base_commit": "c",
                                 "patch": "", "test_patch": "", "problem_statement": "p",
                                 "FAIL_TO_PASS": [], "PASS_TO_PASS": []}) + "\n")
  predictions = tmp_path / "preds.jsonl"
  predictions.write_text("{not json\n")
  result = _run(["--config", "experiments/swe_eval.py", f"--config.predictions={predictions}",
                 f"--config.tasks.dataset={dataset}", f"--config.tasks.build_dir={tmp_path}/b",
                 f"--config.output_dir={tmp_path}/out"])
  _one_line_error(result, "config.predictions", "line 1 is not a JSON object")
  assert not (tmp_path / "b").exists()    # nothing was built for a malformed file


def test_a_missing_tokenizer_is_one_line_naming_the_field(tmp_path):
  result = _run(["--config", "experiments/lm_sft.py", f"--config.data.tokenizer={tmp_path}/tok",
                 f"--config.workdir={tmp_path}/run"])
  _one_line_error(result, "data.tokenizer", "no such folder")


def test_a_misspelt_override_of_a_default_fleet_config_is_one_line():
  # Without --fleet (sweep.py) or --config (fleet.py) the default file is loaded while the
  # flag is defined, so the override is resolved before the flags parser runs.
  def launcher(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  result = launcher("sweep.py", "--config", "experiments/swe_rpr.py", "--sweep",
                    "rl.lr=1e-6,3e-6", "--fleet.imgae=x", "--render")
  _one_line_error(result, "unknown config field 'imgae' in --fleet.imgae", '"image"')
  result = launcher("fleet.py", "status", "--dry-run", "--config.env.replicsa=3")
  _one_line_error(result, "unknown config field 'replicsa' in --config.env.replicsa",
                  '"replicas"')
  # A correct override of the default still applies.
  result = launcher("sweep.py", "--config", "experiments/swe_rpr.py:cluster", "--sweep",
                    "rl.lr=1e-6,3e-6", "--fleet.image=registry.example/orchard:v7", "--render")
  assert result.returncode == 0, result.stderr
  assert "image: registry.example/orchard:v7" in result.stdout


def _without_fleet_environment(**extra):
  env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
  return dict(env, **extra)


def test_the_cluster_preset_outside_a_job_names_the_missing_variables(tmp_path):
  def run(env):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "run.py"), "--config",
                           "experiments/swe_rpr.py:cluster"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  result = run(_without_fleet_environment())
  _one_line_error(result, "ORCHARD_CHECKPOINT_DIR (config.workdir)",
                  "ORCHARD_ENV_URL (config.env.url)",
                  "ORCHARD_SGLANG_POLICY_URLS (config.engine.urls)")
  assert "ORCHARD_SGLANG_TEACHER" not in result.stderr        # swe_rpr has no OPD teacher
  # With the Job's variables set, the run gets past the check (to the models volume, which
  # this machine does not have).
  result = run(_without_fleet_environment(
      ORCHARD_CHECKPOINT_DIR=str(tmp_path / "ckpt"), ORCHARD_ENV_URL="http://127.0.0.1:9",
      ORCHARD_SGLANG_POLICY_URLS="http://127.0.0.1:9"))
  _one_line_error(result, "policy.init: '/models/qwen3_5_35b_a3b' does not exist")


@pytest.mark.parametrize("experiment, job, variables", [
    ("swe_sft", "sft", ["ORCHARD_CHECKPOINT_DIR", "ORCHARD_ENV_URL"]),
    ("swe_value", "value", ["ORCHARD_CHECKPOINT_DIR"]),
    ("swe_eval", "evaluate", ["ORCHARD_ENV_URL"]),
])
def test_each_swe_job_checks_the_fleet_addresses_it_uses(monkeypatch, experiment, job,
                                                          variables):
  import importlib
  from orchard_jax import recipes
  from orchard_jax.recipes import swe
  monkeypatch.setattr(os, "environ", _without_fleet_environment())
  config = importlib.import_module(f"experiments.{experiment}").get_config("cluster")
  with pytest.raises(recipes.ConfigError, match="not set here") as error:
    getattr(swe, job)(config)
  from orchard_jax.recipes.agentic.checks import CLUSTER_VARIABLES
  named = [v for v in CLUSTER_VARIABLES.values() if v in str(error.value)]
  assert named == variables


def test_a_setting_the_recipe_refuses_before_work_is_one_line(tmp_path):
  result = _run(["--config", "experiments/swe_rpr.py", "--config.rl.reward=rpx",
                 f"--config.workdir={tmp_path}/run"])
  _one_line_error(result, "rl.reward is 'rpx'; expected 'binary' or 'rpr'")


def test_a_run_that_fails_before_any_output_leaves_no_run_folder(tmp_path):
  new = tmp_path / "runs" / "sft"
  result = _run(["--config", "experiments/swe_sft.py", f"--config.workdir={new}",
                 f"--config.tasks.dataset={tmp_path}/instances.jsonl"])    # no such file
  _one_line_error(result, "tasks.dataset", "instances.jsonl")
  assert not new.exists()
  mine = tmp_path / "mine"                    # a folder the user made: kept, even when empty
  mine.mkdir()
  result = _run(["--config", "experiments/swe_sft.py", f"--config.workdir={mine}",
                 f"--config.tasks.dataset={tmp_path}/instances.jsonl"])
  assert result.returncode != 0 and mine.is_dir()


@pytest.mark.parametrize("experiment, job, field, value", [
    ("swe_rpr", "train_rl", "sft.mode", "credits"),
    ("swe_rpr", "train_rl", "judge.kind", "gpt"),
    ("swe_rpr", "train_rl", "annotator.kind", "human"),
    ("swe_sft", "sft", "sft.mode", "credits"),
    ("swe_sft", "sft", "annotator.kind", "human"),
])
def test_sft_and_grader_settings_are_refused_before_any_work(tmp_path, experiment, job, field,
                                                             value):
  # Without the early check these surfaced only after the task set, the expert's trajectories
  # and (for rl) SFT: minutes into the run.
  import importlib
  from orchard_jax import recipes
  from orchard_jax.recipes import swe
  config = importlib.import_module(f"experiments.{experiment}").get_config()
  config.workdir = str(tmp_path / "run")
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(recipes.ConfigError, match=f"{field} is '{value}'; expected one of"):
    getattr(swe, job)(config)
  assert not (tmp_path / "run").exists()


def test_a_missing_value_checkpoint_is_refused_before_any_work(tmp_path):
  # swe_eval with a policy checkpoint and eval.value_checkpoint: the value model used to be
  # looked for only after the task set was built and every instance evaluated k times.
  import importlib
  from orchard_jax import recipes
  from orchard_jax.recipes import swe
  policy = tmp_path / "hf_policy"              # passes the cheap Hugging Face folder check
  policy.mkdir()
  (policy / "config.json").write_text("{}")
  (policy / "model.safetensors").write_bytes(b"")
  config = importlib.import_module("experiments.swe_eval").get_config()
  config.checkpoint = str(policy)
  config.workdir = str(tmp_path / "run")
  config.eval.value_checkpoint = str(tmp_path / "no_value_run")
  with pytest.raises(recipes.ConfigError, match="eval.value_checkpoint: no value-model"):
    swe.evaluate(config)
  assert not (tmp_path / "run").exists()


def test_ctrl_c_in_a_job_is_one_line_and_status_130(tmp_path):
  """A Ctrl-C during the main job's SFT printed a 40-line KeyboardInterrupt traceback from deep
  inside jax (walkthrough). The job is replaced by one raising KeyboardInterrupt, as SIGINT does
  wherever the job is; launch/run.py's own main and flags parser run as a user runs them."""
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {ROOT!r})
      sys.argv = ["launch/run.py", "--config", {_write_config(tmp_path, "lm.sft")!r}]
      from absl import app
      from launch import overrides, run
      from orchard_jax import recipes
      def interrupted(config):
        raise KeyboardInterrupt
      recipes.run_job = interrupted
      app.run(overrides.usage_errors_as_one_line(run.main),
              flags_parser=overrides.flags_parser("config"))
      """)
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 130, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith("interrupted (Ctrl-C): files written")


@pytest.mark.parametrize("text, expected", [
    ("harness's model calls into training data\n", "not a Python config file"),   # a README
    ("import ml_collections\nCONFIG = 1\n", "the file defines no get_config()"),
    ("def get_config(preset='tiny'):\n  return {}['rl']\n", "loading it raised KeyError: 'rl'"),
    ("import no_such_module_xyz\ndef get_config():\n  pass\n",
     "loading it raised ModuleNotFoundError: No module named 'no_such_module_xyz'"),
])
def test_a_config_file_that_does_not_load_is_one_line(tmp_path, text, expected):
  """A file that exists but is not an experiment (not Python, no get_config, get_config raised)
  is one `error:` line naming the flag and the file; ml_collections let these out as tracebacks
  (and a missing get_config was reported as an unknown field 'config_config')."""
  path = tmp_path / "exp.py"
  path.write_text(text)
  for launcher in (["run.py"], ["sweep.py", "--render"]):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "launch", launcher[0]),
                             "--config", str(path), *launcher[1:]],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: --config {path}: "), lines
    assert expected in lines[0] and "Traceback" not in result.stderr
  if "raised KeyError" in expected:                   # where: the file and line that raised
    assert f"{path}:2" in lines[0]


@pytest.mark.parametrize("override, expected", [
    ("--config.sampling.temperature=nan", "sampling.temperature is nan; expected a number"),
    ("--config.rl.lr=nan", "rl.lr is nan; expected a number"),
    ("--config.sampling.temperature=-0.5", "sampling.temperature is -0.5; expected a finite"),
    ("--config.sampling.temperature=inf", "sampling.temperature is inf; expected a finite"),
    ("--config.sampling.top_p=1.5", "sampling.top_p is 1.5; expected a number in (0, 1]"),
    ("--config.sampling.top_p=0", "sampling.top_p is 0.0; expected a number in (0, 1]"),
    ("--config.sampling.max_tokens=-1", "sampling.max_tokens is -1; expected a count >= 0"),
])
def test_a_value_no_job_can_use_is_one_line_before_any_work(tmp_path, override, expected):
  """These parse as floats and ints; the engine refused the sampling ones request by request,
  after the task set and SFT (minutes in), and a NaN learning rate trained NaNs."""
  workdir = tmp_path / "run"
  result = _run(["--config", "experiments/swe_rpr.py", override, f"--config.workdir={workdir}"])
  _one_line_error(result, expected)
  assert not workdir.exists()


def test_every_experiment_default_passes_the_value_checks():
  import glob
  import importlib
  from orchard_jax import recipes
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py"))):
    name = os.path.basename(path)[:-3]
    module = importlib.import_module(f"experiments.{name}")
    if hasattr(module, "get_config"):
      recipes.check_values(module.get_config())


def test_a_bad_sweep_axis_is_an_error_line_like_every_launcher_s():
  """sweep.py wrote its own refusals as "sweep: ..." beside run.py's and fleet.py's
  "error: ..." lines."""
  result = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "sweep.py"), "--config",
                           "experiments/swe_rpr.py:cluster", "--sweep", "rl.lr", "--render"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: --sweep takes FIELD=V1,V2,...; saw 'rl.lr'"]


def test_print_config_lists_the_fields_with_overrides_and_runs_nothing(tmp_path):
  """A new user's question "which fields can I override?" had no answer but reading
  experiments/common.py; --print_config prints the resolved config and exits 0."""
  import yaml
  workdir = tmp_path / "run"
  result = _run(["--config", "experiments/swe_rpr.py", "--config.rl.lr=3e-6",
                 f"--config.workdir={workdir}", "--print_config"])
  assert result.returncode == 0, result.stderr[-2000:]
  assert "!!python" not in result.stdout           # plain YAML: tuples are lists
  printed = yaml.safe_load(result.stdout)
  assert printed["job"] == "swe.rl" and printed["rl"]["lr"] == 3e-6
  assert printed["eval"]["splits"] == ["train", "heldout"]
  assert printed["workdir"] == str(workdir) and not workdir.exists()
  result = _run(["--config", "experiments/swe_rpr.py", "--config.sampling.top_p=3",
                 "--print_config"])
  _one_line_error(result, "sampling.top_p is 3.0")


def test_sweep_points_and_fleet_sets_get_the_same_value_checks(tmp_path):
  """A sweep point or a training Job's --set that run.py would refuse fails on the laptop,
  not in each point's run or pod."""
  def launcher(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  result = launcher("sweep.py", "--config", "experiments/swe_rpr.py:cluster", "--sweep",
                    "sampling.top_p=0.5,2", "--render")
  _one_line_error(result, "--sweep sampling.top_p=2: sampling.top_p is 2.0; expected a number")
  result = launcher("fleet.py", "train", "--dry-run", "--config", "launch/k8s/config.py",
                    "--job-name", "x", "--set", "rl.lr=nan")
  _one_line_error(result, "rl.lr is nan; expected a number")
