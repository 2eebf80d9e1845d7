"""Two Orchard Env replicas sharing one Redis serve the same sandboxes.

Each replica is its own service process (`python -m orchard_jax.env serve --backend kubernetes
--store redis://...`), as two pods of the orchestrator Deployment are. They share a real
redis-server started here and one Kubernetes cluster. No real Kubernetes cluster can run on
this machine, so the cluster is the env room's fake API server + kubelet
(tests/env/fake_kube.py): every sandbox pod still runs the real in-sandbox agent (inside
bubblewrap), and the replicas reach it directly, as they would reach pod IPs.
"""
import importlib.util
import json
import os
import shutil
import signal

import pytest

from orchard_jax.env import SandboxClient
from orchard_jax.env.errors import SandboxNotFound
from orchard_jax.env.orchestrator import ServiceProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMESPACE = "orchard-replicas"
KEY = "replica-test-key"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="the fake kubelet runs pods in bubblewrap")


def _load_fake_cluster():
  path = os.path.join(ROOT, "tests", "env", "fake_kube.py")
  spec = importlib.util.spec_from_file_location("_env_fake_kube", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  fake_kube = _load_fake_cluster()
  with fake_kube.FakeCluster(str(tmp_path_factory.mktemp("cluster"))) as fake:
    yield fake


@pytest.fixture(scope="module")
def kubeconfig(cluster, tmp_path_factory):
  import yaml
  path = tmp_path_factory.mktemp("kube") / "config"
  path.write_text(yaml.safe_dump({
      "apiVersion": "v1", "kind": "Config", "current-context": "fake",
      "clusters": [{"name": "fake", "cluster": {"server": cluster.url}}],
      "users": [{"name": "orchestrator", "user": {"token": "t"}}],
      "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "orchestrator"}}]}))
  return str(path)


def _replica(kubeconfig, redis_url) -> ServiceProcess:
  """One orchestrator replica in its own process, as the fleet's Deployment runs it."""
  k8s_config = {"creation_qps": 50.0, "node_pids_limit": 256}
  return ServiceProcess([
      "--backend", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", NAMESPACE,
      "--agent-image", "orchard-agent:test", "--store", redis_url,
      "--kubernetes-config-json", json.dumps(k8s_config),
      "--config-json", json.dumps({"reap_interval": 0.5})], api_keys=[KEY],
      startup_timeout=120)


@pytest.fixture(scope="module")
def replica_b(kubeconfig, redis_server):
  """The replica that stays up for the whole module; each test starts its own replica A."""
  with _replica(kubeconfig, redis_server.url) as b:
    yield b


def test_create_on_one_replica_exec_and_delete_on_the_other(kubeconfig, redis_server,
                                                            replica_b):
  with _replica(kubeconfig, redis_server.url) as a, SandboxClient(a.url, KEY) as on_a, \
       SandboxClient(replica_b.url, KEY) as on_b:
    box_a = on_a.create_sandbox(memory="512Mi")
    box_b = on_b.sandbox(box_a.id)                         # B finds A's record
    assert box_b.state == "ready"
    result = box_b.exec("echo hello from $(hostname) > note.txt && cat note.txt")
    assert result.exit_code == 0 and result.stdout.startswith("hello from")
    assert box_a.download("note.txt").decode() == result.stdout   # same sandbox from A
    assert [s["id"] for s in on_a.list_sandboxes()] == [s["id"] for s in on_b.list_sandboxes()]
    on_b.delete_sandbox(box_a.id)
    with pytest.raises(SandboxNotFound):
      box_a.exec("true")                                   # A sees the deletion
    assert on_a.list_sandboxes() == []


def test_a_replica_killed_mid_exec_loses_no_job_record(kubeconfig, redis_server, replica_b):
  with _replica(kubeconfig, redis_server.url) as a, SandboxClient(replica_b.url, KEY) as on_b:
    with SandboxClient(a.url, KEY) as on_a:
      # Created through the API, not create_sandbox(): this client must not delete it on
      # exit, since the point is what survives replica A.
      box = on_a.sandbox(on_a._json("POST", "/v1/sandboxes",
                                    json={"memory": "512Mi", "wait": True})["id"])
      job = box.start("sleep 2; echo finished; exit 3")
      assert job.status == "running"
      a.process.send_signal(signal.SIGKILL)             # a crash: no shutdown, no clean-up
      a.process.wait()
    listed = on_b._json("GET", f"/v1/sandboxes/{box.id}/jobs")["jobs"]
    assert [j["id"] for j in listed] == [job.id]         # the record outlived replica A
    final = on_b._json("POST", f"/v1/sandboxes/{box.id}/jobs/{job.id}/wait",
                       params={"timeout": 60})
    assert final["status"] == "finished"
    assert final["exit_code"] == 3 and final["stdout"] == "finished\n"
    on_b.delete_sandbox(box.id)


def test_a_replica_that_stops_leaves_the_sandboxes_to_the_others(kubeconfig, redis_server,
                                                                 replica_b):
  with SandboxClient(replica_b.url, KEY) as on_b:
    with _replica(kubeconfig, redis_server.url) as a, SandboxClient(a.url, KEY) as on_a:
      sandbox_id = on_a._json("POST", "/v1/sandboxes", json={"wait": True})["id"]
    # Replica A got SIGTERM (a rolling update): it shut down gracefully, and the sandbox it
    # created is still served by B.
    assert a.process.returncode is not None
    assert on_b.sandbox(sandbox_id).exec("echo still here").stdout == "still here\n"
    on_b.delete_sandbox(sandbox_id)
