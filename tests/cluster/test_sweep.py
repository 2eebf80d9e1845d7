"""launch/sweep.py: the grid, its checks against the experiment config, local runs, and
`--render` of one Kubernetes training Job per point (validated against the schemas)."""
import os
import subprocess
import sys
import textwrap

import kubernetes_validate
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = os.path.join(ROOT, "launch", "sweep.py")

EXPERIMENT = textwrap.dedent("""
    import ml_collections
    def get_config(preset="tiny"):
      config = ml_collections.ConfigDict()
      config.job = "no.such_job"
      config.preset = preset
      config.rl = ml_collections.ConfigDict(dict(lr=1e-6, rpr_alpha=0.5, steps=3, kl=False))
      return config
    """)


@pytest.fixture
def experiment():
  """An experiment file inside the repository (the training image only has those)."""
  path = os.path.join(ROOT, "experiments", f"_sweep_test_{os.getpid()}.py")
  with open(path, "w") as f:
    f.write(EXPERIMENT)
  yield os.path.relpath(path, ROOT)
  os.remove(path)


def _sweep(*args):
  return subprocess.run([sys.executable, SWEEP, *args], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)


def test_render_prints_one_valid_training_job_per_grid_point(experiment):
  result = _sweep("--config", experiment + ":cluster", "--sweep", "rl.rpr_alpha=0.25,0.5",
                  "--sweep", "rl.lr=1e-6,3e-6", "--config.rl.steps=7", "--render",
                  "--name", "rpr-grid", "--fleet.training.num_hosts=2")
  assert result.returncode == 0, result.stderr
  objects = list(yaml.safe_load_all(result.stdout))
  for obj in objects:
    kubernetes_validate.validate(obj, kubernetes_validate.utils.latest_version(), strict=True)
  jobs = [o for o in objects if o["kind"] == "Job"]
  assert [j["metadata"]["name"] for j in jobs] == [f"rpr-grid-{i}" for i in range(4)]
  assert len([o for o in objects if o["kind"] == "Service"]) == 4
  commands = [j["spec"]["template"]["spec"]["containers"][0]["command"] for j in jobs]
  # The first --sweep varies slowest; fixed overrides come first in every point.
  expected = [("0.25", "1e-6"), ("0.25", "3e-6"), ("0.5", "1e-6"), ("0.5", "3e-6")]
  for command, (alpha, lr) in zip(commands, expected):
    assert command[:4] == ["python", "launch/run.py", "--config", experiment + ":cluster"]
    assert command[4:] == ["--config.rl.steps=7", f"--config.rl.rpr_alpha={alpha}",
                           f"--config.rl.lr={lr}"]
  for index, job in enumerate(jobs):
    assert job["spec"]["completions"] == 2
    assert job["metadata"]["labels"]["orchard.dev/sweep"] == "rpr-grid"
    assert job["metadata"]["labels"]["orchard.dev/sweep-point"] == str(index)


@pytest.mark.parametrize("sweep, message", [
    ("rl.nope=1,2", "no such field"),
    ("rl.steps=1,two", "rl.steps=two"),
    ("rl.kl=yes", "true or false"),
    ("rl.lr", "FIELD=V1,V2"),
    ("rl.lr=1e-6,1e-6", "repeats a value"),
])
def test_a_bad_sweep_is_refused_before_anything_runs(experiment, sweep, message):
  result = _sweep("--config", experiment, "--sweep", sweep, "--render")
  assert result.returncode == 2
  assert message in result.stderr
  assert result.stdout == ""


def test_local_runs_go_one_after_another_and_failures_are_reported(experiment):
  # The experiment names a job no recipe provides, so launch/run.py fails on every point;
  # the sweep runs them all anyway and says which failed.
  result = _sweep("--config", experiment, "--sweep", "rl.steps=1,2")
  assert result.returncode == 1
  assert "[sweep] point 1/2: --config.rl.steps=1" in result.stdout
  assert "[sweep] point 2/2: --config.rl.steps=2" in result.stdout
  assert "[sweep] 0/2 points succeeded" in result.stdout
  assert result.stderr.count("config.job is 'no.such_job'") == 2


def test_render_refuses_an_experiment_file_the_image_does_not_have(tmp_path):
  outside = tmp_path / "exp.py"
  outside.write_text(EXPERIMENT)
  result = _sweep("--config", str(outside), "--sweep", "rl.steps=1,2", "--render")
  assert result.returncode == 2
  assert "outside the repository" in result.stderr


def test_local_points_run_with_their_overrides_in_separate_run_folders(tmp_path):
  """The success path of a local sweep on the cheapest real job (swe_distill.import: a
  mini-swe-agent folder into the trajectory store, no model): every point runs launch/run.py
  with its own value, in its own run folder next to the base one."""
  from orchard_jax import data
  folder = tmp_path / "miniswe"
  data.export_miniswe([data.Trajectory(
      trajectory_id="t0", task_id="pkg__pkg-1", attempt=0, exit_status="Submitted",
      messages=[{"role": "user", "content": "fix it"},
                {"role": "assistant", "content": "done"}],
      outcome={"resolved": True})], folder)
  base = tmp_path / "runs" / "imported"
  result = _sweep("--config", "experiments/swe_distill.py", "--config.job=swe_distill.import",
                  f"--config.import_from={folder}", f"--config.workdir={base}",
                  "--sweep", "import_experiment=first,second")
  assert result.returncode == 0, result.stdout + result.stderr
  assert "[sweep] 2/2 points succeeded" in result.stdout
  for index, name in enumerate(("first", "second")):
    workdir = f"{base}-import_experiment={name}"
    assert (f"[sweep] point {index + 1}/2: --config.import_experiment={name} -> {workdir}"
            in result.stdout)
    with data.TrajectoryStore(os.path.join(workdir, "store")) as store:
      assert [(t.trajectory_id, t.experiment) for t in store.trajectories()] == [("t0", name)]
  assert not base.exists()     # the base folder itself is never written by a point



def test_render_refuses_a_preset_whose_run_folder_would_be_lost_with_the_pod():
  """Found by a new-user walkthrough: README's sweep example with --render added rendered Jobs
  of the tiny preset, whose run folder (runs/swe_rpr_tiny) ignores $ORCHARD_CHECKPOINT_DIR and
  would live inside each pod; and a fixed --config.workdir gave every point's Job one folder."""
  result = _sweep("--config", "experiments/swe_rpr.py", "--sweep", "rl.lr=1e-6,3e-6", "--render")
  assert result.returncode == 2 and result.stdout == ""
  assert "does not follow $ORCHARD_CHECKPOINT_DIR" in result.stderr
  result = _sweep("--config", "experiments/swe_rpr.py:cluster", "--config.workdir=/checkpoints/x",
                  "--sweep", "rl.lr=1e-6,3e-6", "--render")
  assert result.returncode == 2 and result.stdout == ""
  assert "a fixed --config.workdir would give every point's Job the same run folder" \
      in result.stderr
  result = _sweep("--config", "experiments/swe_rpr.py:cluster", "--sweep", "rl.lr=1e-6,3e-6",
                  "--render")
  assert result.returncode == 0, result.stderr
  env = [{e["name"]: e.get("value") for e in o["spec"]["template"]["spec"]["containers"][0]["env"]}
         for o in yaml.safe_load_all(result.stdout) if o["kind"] == "Job"]
  assert [e["ORCHARD_CHECKPOINT_DIR"] for e in env] == ["/checkpoints/swe-rpr-0",
                                                        "/checkpoints/swe-rpr-1"]
