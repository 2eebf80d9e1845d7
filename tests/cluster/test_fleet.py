"""launch/fleet.py up / status / train / down through the official `kubernetes` client.

No real Kubernetes API server can run on this machine, so these tests drive a fake one
(tests/cluster/fake_kube.py) that speaks the same REST API, refuses objects that fail the
Kubernetes schemas, and records the traffic. The client, the requests and the CLI are real.
"""
import os
import subprocess
import sys

import pytest

from launch import fleet
from launch import k8s
from launch.k8s import client as kube
from launch.k8s import config as fleet_config
from launch.k8s import env_service

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "launch", "k8s", "config.py")


def _client(api) -> kube.KubeClient:
  import kubernetes.client
  configuration = kubernetes.client.Configuration()
  configuration.host = api.url
  return kube.KubeClient(kubernetes.client.ApiClient(configuration))


def _keys(objects):
  return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
          for o in objects}


def _mark_deployments_ready(api, config):
  for obj in k8s.render_fleet(config):
    if obj["kind"] in ("Deployment", "StatefulSet"):
      api.set_status(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"],
                     {"readyReplicas": obj["spec"]["replicas"]})


def test_up_applies_every_object_once_and_is_idempotent(fake_kube, capsys):
  config = fleet_config.get_config("cluster")
  with _client(fake_kube) as client:
    fleet.up(client, config)
    assert set(fake_kube.objects) == _keys(k8s.render_fleet(config))
    writes = [r for r in fake_kube.requests if r[0] in ("POST", "PATCH")]
    # Server-side apply for everything but the Secret, which is created once.
    assert [r[:2] for r in writes if r[0] == "POST"] == [
        ("POST", f"/api/v1/namespaces/{config.namespace}/secrets")]
    assert all(r[2] == "application/apply-patch+yaml" for r in writes if r[0] == "PATCH")
    secret = fake_kube.get("Secret", config.env.api_key_secret, config.namespace)
    key = secret["stringData"][env_service.API_KEY_FIELD]
    assert len(key) >= 32 and key != k8s.DRY_RUN_API_KEY
    uids = {k: o["metadata"]["uid"] for k, o in fake_kube.objects.items()}

    fleet.up(client, config)                       # again: same objects, same key
    assert {k: o["metadata"]["uid"] for k, o in fake_kube.objects.items()} == uids
    again = fake_kube.get("Secret", config.env.api_key_secret, config.namespace)
    assert again["stringData"][env_service.API_KEY_FIELD] == key
  assert "kept    Secret" in capsys.readouterr().out


def test_up_applies_config_changes_in_place(fake_kube):
  config = fleet_config.get_config("cluster")
  with _client(fake_kube) as client:
    fleet.up(client, config)
    config.sglang.servers.policy.replicas = 9
    fleet.up(client, config)
  deployment = fake_kube.get("StatefulSet", "sglang-policy", config.namespace)
  assert deployment["spec"]["replicas"] == 9
  assert deployment["metadata"]["resourceVersion"] == "2"


def test_status_reports_missing_and_unready_objects_until_the_fleet_is_up(fake_kube):
  config = fleet_config.get_config("default")
  with _client(fake_kube) as client:
    rows, healthy = fleet.status(client, config)
    assert not healthy and all(state == "missing" for _, state, _ in rows[:-1])
    fleet.up(client, config)
    rows, healthy = fleet.status(client, config)
    assert not healthy
    assert ("Deployment orchard/orchard-env", "0/1 ready", False) in rows
    _mark_deployments_ready(fake_kube, config)
    fake_kube.put({"apiVersion": "v1", "kind": "Pod", "status": {"phase": "Running"},
                   "metadata": {"name": "sbx-1", "namespace": config.sandbox_namespace}})
    rows, healthy = fleet.status(client, config)
  assert healthy
  assert rows[-1] == (f"sandbox pods in {config.sandbox_namespace}", "1 Running", True)


def test_wait_until_ready_names_the_deployments_still_short(fake_kube):
  config = fleet_config.get_config("default")
  with _client(fake_kube) as client:
    fleet.up(client, config)
    with pytest.raises(k8s.FleetError, match=r"sglang-policy 0/1 ready"):
      fleet.wait_until_ready(client, config, timeout_seconds=0.2, poll_seconds=0.05)
    _mark_deployments_ready(fake_kube, config)
    fleet.wait_until_ready(client, config, timeout_seconds=1, poll_seconds=0.05)


def test_train_submits_an_indexed_job_once_and_down_removes_the_fleet(fake_kube):
  config = fleet_config.get_config("cluster")
  with _client(fake_kube) as client:
    fleet.up(client, config)
    fleet.train(client, config, name="rpr-1", overrides=["--config.rl.lr=3e-6"])
    job = fake_kube.get("Job", "rpr-1", config.namespace)
    assert job["spec"]["completionMode"] == "Indexed"
    assert fake_kube.get("Service", "rpr-1", config.namespace)["spec"]["clusterIP"] == "None"
    with pytest.raises(k8s.FleetError, match="exists; pass another --job-name"):
      fleet.train(client, config, name="rpr-1")

    fleet.weights(client, config, repo_id="Qwen/Qwen3-30B-A3B", folder="qwen3")
    assert fake_kube.get("Job", "weights-qwen3", config.namespace) is not None
    with pytest.raises(k8s.FleetError, match="exists"):
      fleet.weights(client, config, repo_id="Qwen/Qwen3-30B-A3B", folder="qwen3")

    fleet.down(client, config)
    left = set(fake_kube.objects)
    volumes = {k for k in _keys(k8s.render_fleet(config)) if k[0] == "PersistentVolumeClaim"}
    assert left == volumes | {("Namespace", "", config.namespace)}

    fleet.down(client, config, delete_volumes=True)
    assert fake_kube.objects == {}


def test_down_leaves_namespaces_the_fleet_did_not_create(fake_kube):
  config = fleet_config.get_config("default")
  fake_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {
      "name": config.sandbox_namespace, "labels": {"team": "someone-else"}}})
  with _client(fake_kube) as client:
    fleet.down(client, config, delete_volumes=True)
  assert fake_kube.get("Namespace", config.sandbox_namespace) is not None


def test_api_errors_name_the_object_and_the_reason(fake_kube):
  config = fleet_config.get_config("default")
  config.create_namespaces = False           # the namespace does not exist on the server
  with _client(fake_kube) as client, pytest.raises(kube.FleetError) as error:
    fleet.up(client, config)
  assert "orchard" in str(error.value) and "404" in str(error.value)


def _cli(*args, kubeconfig):
  return subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "fleet.py"), *args,
       "--kubeconfig", kubeconfig, "--config", CONFIG + ":cluster"],
      capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_cli_up_train_status_down_against_the_api_server(fake_kube, tmp_path):
  kubeconfig = fake_kube.kubeconfig(tmp_path / "kubeconfig")
  result = _cli("up", kubeconfig=kubeconfig)
  assert result.returncode == 0, result.stderr
  assert "applied Deployment orchard/orchard-env" in result.stdout
  result = _cli("train", "--job-name", "sweep-a", "--set", "rl.rpr_alpha=0.25",
                kubeconfig=kubeconfig)
  assert result.returncode == 0, result.stderr
  command = fake_kube.get("Job", "sweep-a", "orchard")["spec"]["template"]["spec"][
      "containers"][0]["command"]
  assert command[-1] == "--config.rl.rpr_alpha=0.25"
  result = _cli("status", kubeconfig=kubeconfig)
  assert result.returncode == 1 and "NOT healthy" in result.stdout   # nothing is ready yet
  result = _cli("down", "--delete-volumes", kubeconfig=kubeconfig)
  assert result.returncode == 0, result.stderr
  assert fake_kube.objects == {}


def test_cli_reports_an_unreachable_cluster_clearly(tmp_path, fake_kube):
  kubeconfig = fake_kube.kubeconfig(tmp_path / "kubeconfig")
  fake_kube.__exit__(None, None, None)                  # the server goes away
  result = _cli("status", kubeconfig=kubeconfig)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
  assert "fleet status failed" in result.stderr


def test_train_set_is_checked_against_the_experiment_before_anything_is_submitted(
    fake_kube, tmp_path):
  kubeconfig = fake_kube.kubeconfig(tmp_path / "kubeconfig")
  result = _cli("train", "--job-name", "typo", "--set", "rl.rpr_alfa=0.25",
                kubeconfig=kubeconfig)
  assert result.returncode != 0
  assert "--set rl.rpr_alfa: the config has no such field" in result.stderr
  assert "rpr_alpha" in result.stderr                              # ml_collections' suggestion
  result = _cli("train", "--job-name", "typo", "--set", "rl.lr=fast", kubeconfig=kubeconfig)
  assert result.returncode != 0 and "--set rl.lr=fast" in result.stderr
  assert fake_kube.objects == {}                                   # nothing was created
