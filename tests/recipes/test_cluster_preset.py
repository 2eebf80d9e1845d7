"""The experiments' `cluster` preset reads every fleet address from the ORCHARD_* environment
the Kubernetes training Job sets (launch/k8s/training.py), under exactly the names the Job
uses. The Job is rendered from the fleet's own cluster config; no cluster is needed, and the
pod's environment is reproduced here from the rendered manifest (a secret's value, which only
Kubernetes can resolve, is replaced by a placeholder)."""
import os

import pytest

from experiments import swe_bar, swe_distill, swe_eval, swe_opd, swe_rpr, swe_sft, swe_value
from launch.k8s import config as fleet_config
from launch.k8s import training

JOB = "rpr-a"
SECRET = "placeholder-api-key-from-the-secret"


class _RecordingEnviron(dict):
  """os.environ as the Job's pod sees it, remembering every variable a config asks for."""

  def __init__(self, values):
    super().__init__(values)
    self.asked = set()

  def get(self, key, default=None):
    self.asked.add(key)
    return super().get(key, default)

  def __getitem__(self, key):
    self.asked.add(key)
    return super().__getitem__(key)

  def __contains__(self, key):
    self.asked.add(key)
    return super().__contains__(key)


@pytest.fixture
def pod_environ(monkeypatch):
  """The training container's environment from the rendered cluster Job (teacher enabled)."""
  fleet = fleet_config.get_config("cluster")
  fleet.sglang.servers.teacher.enabled = True
  _, job = training.training_job(fleet, name=JOB)
  env = {}
  for item in job["spec"]["template"]["spec"]["containers"][0]["env"]:
    if "value" in item:
      env[item["name"]] = item["value"]
    elif "secretKeyRef" in item["valueFrom"]:
      env[item["name"]] = SECRET
    else:
      env[item["name"]] = "0"          # the completion index of pod 0
  recording = _RecordingEnviron(env)
  monkeypatch.setattr(os, "environ", recording)
  return fleet, recording


@pytest.mark.parametrize("experiment", [swe_sft, swe_bar, swe_rpr, swe_opd, swe_value, swe_eval])
def test_swe_cluster_preset_reads_the_jobs_addresses(pod_environ, experiment):
  fleet, environ = pod_environ
  config = experiment.get_config("cluster")
  asked = {name for name in environ.asked if name.startswith("ORCHARD_")}
  missing = sorted(asked - set(environ))
  assert not missing, f"the config reads {missing}, which the training Job does not set"
  assert {"ORCHARD_ENV_URL", "ORCHARD_ENV_API_KEY", "ORCHARD_CHECKPOINT_DIR",
          "ORCHARD_SGLANG_POLICY_URLS", "ORCHARD_SGLANG_TEACHER_URLS"} <= asked
  assert config.env.url == environ["ORCHARD_ENV_URL"] and config.env.url.startswith("http")
  assert config.env.api_key == SECRET
  # The rollout client routes sessions over every policy replica, and the teacher's.
  assert config.engine.urls == environ["ORCHARD_SGLANG_POLICY_URLS"]
  assert len(config.engine.urls.split(",")) == fleet.sglang.servers.policy.replicas
  assert config.opd.teacher_urls == environ["ORCHARD_SGLANG_TEACHER_URLS"]
  # The run folder and the weights SGLang reloads live on the shared checkpoints volume.
  checkpoints = fleet.volumes.checkpoints.mount_path
  assert config.workdir == f"{checkpoints}/{JOB}"
  assert config.engine.weights_dir == f"{checkpoints}/{JOB}/weights"
  # The trainer starts from the weights the policy servers serve (the models volume).
  assert config.policy.init == fleet.sglang.servers.policy.model_path
  assert config.policy.init.startswith(fleet.volumes.models.mount_path + "/")


def test_swe_distill_cluster_preset_reads_the_jobs_addresses(pod_environ):
  fleet, environ = pod_environ
  config = swe_distill.get_config("cluster")
  asked = {name for name in environ.asked if name.startswith("ORCHARD_")}
  assert asked and asked <= set(environ)
  assert config.env.url == environ["ORCHARD_ENV_URL"] and config.env.api_key == SECRET
  assert config.teacher.url == environ["ORCHARD_SGLANG_TEACHER_URLS"]
  assert config.workdir.startswith(f"{fleet.volumes.checkpoints.mount_path}/{JOB}")


def test_without_the_jobs_environment_the_cluster_preset_points_nowhere(monkeypatch):
  """Outside a Job nothing is invented: empty addresses (the recipe then runs embedded parts
  or fails with its own clear error), never a guessed host."""
  monkeypatch.setattr(os, "environ", _RecordingEnviron({}))
  config = swe_rpr.get_config("cluster")
  assert (config.env.url, config.engine.urls, config.opd.teacher_urls, config.workdir) == (
      "", "", "", "")
