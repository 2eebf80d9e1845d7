"""`fleet.py down --dry-run` and `status --dry-run`: what the command would do, not `up`'s
manifests. The real `down` runs against the fake Kubernetes API server (no real one can run on
this machine; tests/cluster/fake_kube.py) to check the dry run names what it deletes and keeps.
"""
import os
import subprocess
import sys

import pytest

from launch import fleet
from launch import k8s
from launch.k8s import client as kube
from launch.k8s import config as fleet_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _client(api) -> kube.KubeClient:
  import kubernetes.client
  configuration = kubernetes.client.Configuration()
  configuration.host = api.url
  return kube.KubeClient(kubernetes.client.ApiClient(configuration))


def _cli(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "fleet.py"), *args],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("delete_volumes", [False, True])
def test_down_dry_run_names_what_down_deletes_and_keeps(fake_kube, delete_volumes):
  config = fleet_config.get_config("cluster")
  plan = fleet.down_targets(config, delete_volumes=delete_volumes)
  with _client(fake_kube) as client:
    fleet.up(client, config)
    rendered = {kube.describe(o) for o in k8s.render_fleet(config)}
    deleted = fleet.down(client, config, delete_volumes=delete_volumes)
  left = {kube.describe(dict(o, kind=kind))
          for (kind, _, _), o in fake_kube.objects.items()}
  planned_deletes = [line.removeprefix("delete ").split(" (only if")[0] for line in plan
                     if line.startswith("delete ") and not line.startswith("delete every")]
  planned_keeps = {line.removeprefix("keep   ").split(" (")[0] for line in plan
                   if line.startswith("keep ")}
  assert planned_deletes == deleted            # the same objects, in the same order
  assert planned_keeps == left and planned_keeps | set(deleted) == rendered
  assert bool(planned_keeps) != delete_volumes


def test_dry_runs_of_down_and_status_print_no_manifests():
  result = _cli("down", "--dry-run")
  assert result.returncode == 0, result.stderr
  assert "apiVersion" not in result.stdout
  assert "would delete Deployment orchard/orchard-env" in result.stdout
  assert "would keep   PersistentVolumeClaim orchard/orchard-checkpoints" in result.stdout
  assert "would delete every Job in orchard labelled app.kubernetes.io/instance=orchard" \
      in result.stdout
  result = _cli("status", "--dry-run")
  assert result.returncode == 0, result.stderr
  assert "apiVersion" not in result.stdout
  assert "would read Deployment orchard/orchard-env" in result.stdout
  assert "would list Pods in orchard-sandboxes" in result.stdout
  result = _cli("up", "--dry-run")                                    # up still prints YAML
  assert result.returncode == 0 and "apiVersion" in result.stdout


@pytest.mark.parametrize("experiment, message", [
    ("experiments/swe_rpx.py:cluster", "experiment file 'experiments/swe_rpx.py' not found"),
    ("experiments/swe_rpr.py:clustr", "preset 'clustr' is not one of"),
    ("experiments/swe_rpr.py", "does not follow $ORCHARD_CHECKPOINT_DIR"),   # the tiny preset
])
def test_train_refuses_an_experiment_its_job_could_not_run(experiment, message):
  """Found by a new-user walkthrough: without --set the experiment was never loaded, so a
  misspelt file or preset rendered (and `train` would submit) a Job that fails in its pods, and
  the tiny preset's run folder would be inside the pod, lost with it; with --set a misspelt
  preset was a traceback."""
  for extra in ([], ["--set", "rl.lr=1e-6"]):
    result = _cli("train", "--dry-run", "--job-name", "rpr-1",
                  f"--config.training.experiment={experiment}", *extra)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: training.experiment: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_train_runs_the_experiment_by_its_path_inside_the_image():
  result = _cli("train", "--dry-run", "--job-name", "rpr-1",
                f"--config.training.experiment={ROOT}/experiments/swe_rpr.py:cluster")
  assert result.returncode == 0, result.stderr
  import yaml
  job = next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "Job")
  command = job["spec"]["template"]["spec"]["containers"][0]["command"]
  assert command == ["python", "launch/run.py", "--config", "experiments/swe_rpr.py:cluster"]


def test_an_unknown_command_is_one_line():
  result = _cli("upp", "--dry-run")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: expected a command, one of ('up', 'down', 'status', 'train', 'weights'); saw "
      "['upp'] (see --help)"]
