"""The Kubernetes backend's own duties: valid manifests, reconcile, pending timeout, throttling.

No Kubernetes cluster can run here: these tests use the fake API server and kubelet of
tests/env/fake_kube.py (written for the tests). Manifests are checked against the Kubernetes
JSON schemas with kubernetes-validate, the same check the fake API server applies to every
object the backend creates.
"""
import time

import kubernetes_validate
import pytest

from orchard_jax import env as orchard_env
from orchard_jax.env import store as env_store
from orchard_jax.env.backends import k8s_manifests as m
from orchard_jax.env.backends.kubernetes import KubernetesBackend, KubernetesConfig
from tests.env import fake_kube
from tests.env.conftest import make_config

K8S_VERSION = fake_kube.K8S_VERSION


def _config(**overrides):
  values = dict(namespace="orchard-test", agent_image="orchard-agent:test", creation_qps=50.0,
                node_pids_limit=fake_kube.NODE_PIDS_LIMIT)
  values.update(overrides)
  return KubernetesConfig(**values)


@pytest.mark.parametrize("config", [
    KubernetesConfig(),
    KubernetesConfig(node_selector={"orchard.dev/pool": "sandboxes"},
                     tolerations=[{"key": "sandboxes", "operator": "Exists", "effect": "NoSchedule"}],
                     run_as_user=1000, service_account="sandbox",
                     orchestrator_selector={"app.kubernetes.io/name": "orchard-env"})])
@pytest.mark.parametrize("limits", [{}, {"cpu": 1.5, "memory": 512 << 20, "disk": 2 << 30}])
def test_every_manifest_validates_against_the_kubernetes_schemas(config, limits):
  pod = m.render_pod("sbx-0123456789ab", image="python:3.11-slim", token="secret", config=config,
                     env={"A": "1"}, labels={"team": "rl", "not a label": "x"}, network=True,
                     **limits)
  for obj in (pod, m.render_deny_egress_policy(config),
              m.render_allow_egress_policy("sbx-0123456789ab", config)):
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
  spec = pod["spec"]
  assert spec["automountServiceAccountToken"] is False
  assert spec["initContainers"][0]["image"] == config.agent_image
  container = spec["containers"][0]
  assert container["command"] == ["/orchard/bin/orchard-agent"]
  if limits:
    assert container["resources"]["limits"] == {"cpu": "1500m", "memory": str(512 << 20),
                                                "ephemeral-storage": str(2 << 30)}
    assert spec["volumes"][1]["emptyDir"]["sizeLimit"] == str(2 << 30)
  assert spec.get("nodeSelector", {}) == config.node_selector
  assert pod["metadata"]["labels"]["orchard.dev/team"] == "rl"


def test_invalid_manifest_is_rejected_by_the_schema_check():
  pod = m.render_pod("sbx-0123456789ab", image="x", token="t", config=KubernetesConfig())
  pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "seven"
  with pytest.raises(kubernetes_validate.ValidationError):
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


@pytest.mark.parametrize("profile", ["RuntimeDefault", "Localhost:orchard-env/sandbox.json"])
def test_pods_drop_capabilities_and_carry_a_seccomp_profile(profile):
  pod = m.render_pod("sbx-0123456789ab", image="python:3.11-slim", token="t",
                     config=KubernetesConfig(seccomp_profile=profile), tenant="alice",
                     egress=[{"host": "proxy.orchard.svc", "port": 8000,
                              "addresses": ["10.0.0.7"]},
                             {"host": "10.0.0.8", "port": 80, "addresses": ["10.0.0.8"]}],
                     disk=64 << 20, memory=256 << 20)
  kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
  kind, _, path = profile.partition(":")
  assert pod["spec"]["securityContext"]["seccompProfile"] == (
      {"type": kind, "localhostProfile": path} if path else {"type": kind})
  container = pod["spec"]["containers"][0]["securityContext"]
  assert container == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
  assert pod["metadata"]["labels"]["orchard.dev/tenant"] == "alice"
  # A host name is pinned to the address the orchestrator resolved; an address needs no alias.
  assert pod["spec"]["hostAliases"] == [{"ip": "10.0.0.7", "hostnames": ["proxy.orchard.svc"]}]
  # With a disk size the workspace and /tmp are tmpfs (ENOSPC when full) of that size.
  volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
  for name in (m.WORKSPACE_VOLUME, m.TMP_VOLUME):
    assert volumes[name]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(64 << 20)}
  with pytest.raises(ValueError, match="RuntimeDefault"):
    m.seccomp_profile(KubernetesConfig(seccomp_profile="Unconfined"))


def test_egress_policies_open_the_internet_or_exactly_the_endpoints():
  config = KubernetesConfig()
  endpoints = [{"host": "proxy.orchard.svc", "port": 8000, "addresses": ["10.0.0.7"]},
               {"host": "::1", "port": 8123, "addresses": ["::1"]}]
  only = m.render_allow_egress_policy("sbx-0123456789ab", config, network=False,
                                      egress=endpoints)
  internet = m.render_allow_egress_policy("sbx-0123456789ab", config, network=True)
  for policy in (only, internet):
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["spec"]["podSelector"] == {"matchLabels": {m.LABEL_SANDBOX: "sbx-0123456789ab"}}
  assert only["spec"]["egress"] == [
      {"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}], "ports": [{"protocol": "TCP", "port": 8000}]},
      {"to": [{"ipBlock": {"cidr": "::1/128"}}], "ports": [{"protocol": "TCP", "port": 8123}]}]
  rules = internet["spec"]["egress"]
  assert rules[0]["to"][0]["ipBlock"] == {"cidr": "0.0.0.0/0", "except": list(m.PRIVATE_RANGES)}
  assert {"protocol": "UDP", "port": 53} in rules[1]["ports"]   # cluster DNS, nothing else
  assert "10.0.0.0/8" in m.PRIVATE_RANGES and "169.254.0.0/16" in m.PRIVATE_RANGES


def test_the_oci_seccomp_profile_is_the_profile_compiled_for_bubblewrap():
  from orchard_jax.env import seccomp
  profile = seccomp.oci_profile()
  names = {n for rule in profile["syscalls"] for n in rule["names"]}
  assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
  assert {"unshare", "setns", "mount", "bpf", "keyctl", "ptrace", "clone3"} <= names
  clone = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
  # runc's MASKED_EQ: value is the mask, valueTwo the value it must equal.
  assert {"index": 0, "value": 0x10000000, "valueTwo": 0x10000000,
          "op": "SCMP_CMP_MASKED_EQ"} in [a for r in clone for a in r["args"]]
  assert len(seccomp.compile_bpf()) % 8 == 0 and len(seccomp.compile_bpf()) > 8 * len(names)


def test_deny_egress_policy_and_per_sandbox_exception(tmp_path):
  with fake_kube.FakeCluster(str(tmp_path)) as cluster:
    backend = KubernetesBackend(_config(), api_client=cluster.api_client())
    with orchard_env.Orchestrator(backend, config=make_config()) as service, \
         orchard_env.SandboxClient(service.url, service.api_key) as client:
      assert m.DENY_EGRESS_POLICY in cluster.objects["networkpolicies"]
      with client.create_sandbox(network=True) as box:
        assert m.pod_name(box.id) + "-egress" in cluster.objects["networkpolicies"]
      assert m.pod_name(box.id) + "-egress" not in cluster.objects["networkpolicies"]
      assert m.pod_name(box.id) not in cluster.objects["pods"]


def test_reconcile_deletes_orphans_drops_ghosts_and_skips_when_listing_fails(tmp_path):
  with fake_kube.FakeCluster(str(tmp_path)) as cluster:
    api = cluster.api_client()
    from kubernetes import client as k8s
    core = k8s.CoreV1Api(api)
    orphan = m.render_pod("sbx-00000orphan", image="python:3.11-slim", token="t",
                          config=_config())
    core.create_namespaced_pod("orchard-test", orphan)
    store = env_store.MemoryStore()
    ghost = {"id": "sbx-00000000ghost", "state": "ready", "created_at": time.time(),
             "expires_at": time.time() + 600, "timeout": 600, "ref": {"pod": "x"}}

    # 1. The listing fails: nothing is touched.
    cluster.fail_list = True
    backend = KubernetesBackend(_config(), api_client=api)
    with orchard_env.Orchestrator(backend, store=store, config=make_config()) as service:
      service_call = service.call
      ghost["tenant"] = service.tenants.lookup(service.api_key).tenant   # the client's own
      service_call(store.put(env_store.SANDBOX, ghost["id"], ghost))
      report = service_call(service.manager.reconcile())
      assert report["skipped"] is True
      assert orphan["metadata"]["name"] in cluster.objects["pods"]
      assert service_call(store.get(env_store.SANDBOX, ghost["id"]))["state"] == "ready"
      cluster.fail_list = False
      # 2. The listing works: the orphan pod goes, the ghost record is dropped with a reason.
      report = service_call(service.manager.reconcile())
      assert report["orphans_deleted"] == [orphan["metadata"]["labels"][m.LABEL_SANDBOX]]
      assert report["records_dropped"] == [ghost["id"]]
      assert orphan["metadata"]["name"] not in cluster.objects["pods"]
      with orchard_env.SandboxClient(service.url, service.api_key) as client:
        with pytest.raises(orchard_env.SandboxNotFound, match="lost"):
          client.sandbox(ghost["id"])


def test_pending_timeout_deletes_a_pod_that_never_becomes_ready(tmp_path):
  with fake_kube.FakeCluster(str(tmp_path)) as cluster:
    backend = KubernetesBackend(_config(), api_client=cluster.api_client())
    with orchard_env.Orchestrator(backend, config=make_config(pending_timeout=1.0)) as service, \
         orchard_env.SandboxClient(service.url, service.api_key) as client:
      started = time.monotonic()
      with pytest.raises(orchard_env.SandboxFailed, match="pending_timeout"):
        client.create_sandbox(image=fake_kube.NEVER_READY_IMAGE)
      assert time.monotonic() - started < 10
      assert not any(name.startswith("orchard-sbx") for name in cluster.objects["pods"])


def test_creation_is_throttled(tmp_path):
  with fake_kube.FakeCluster(str(tmp_path)) as cluster:
    backend = KubernetesBackend(_config(creation_qps=4.0), api_client=cluster.api_client())
    # When each creation may go (the fake's arrival times can bunch up on a loaded machine:
    # the calls run in a thread pool after the throttle lets them go).
    granted, throttle = [], backend._throttle

    async def recorded():
      await throttle()
      granted.append(time.monotonic())
    backend._throttle = recorded
    with orchard_env.Orchestrator(backend, config=make_config()) as service, \
         orchard_env.SandboxClient(service.url, service.api_key) as client:
      boxes = [client.create_sandbox(image=fake_kube.NEVER_READY_IMAGE, wait=False)
               for _ in range(5)]
      deadline = time.monotonic() + 10
      while len(cluster.objects["pods"]) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
      assert len(cluster.added_times) == 5
      # five creations at 4 per second take at least one second
      assert len(granted) == 5 and granted[-1] - granted[0] >= 0.99
      for box in boxes:
        box.delete()


def test_pids_limit_must_be_enforceable(tmp_path):
  backend = KubernetesBackend(_config(node_pids_limit=None))
  with pytest.raises(orchard_env.LimitNotEnforceable, match="podPidsLimit"):
    backend.validate(orchard_env.SandboxSpec(image="python:3.11-slim", pids=100))
  with pytest.raises(orchard_env.ImageError, match="container images"):
    backend.validate(orchard_env.SandboxSpec(image="/some/image/dir"))


def test_egress_to_a_cluster_service_by_its_name(tmp_path):
  """egress=["http://<service>.<namespace>.svc:<port>"]: the backend reads the Service; the
  pod's policy allows its ClusterIP and its pods (selector, target port), its /etc/hosts pins
  the name, and the URL inside is the URL given. In the fake cluster the Service's ClusterIP
  is this machine's 127.0.0.1, where a server stands in for the proxy."""
  import http.server
  import threading
  from kubernetes import client as k8s

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
      self.send_response(200)
      self.end_headers()
      self.wfile.write(b"proxy")

    def log_message(self, *args):
      pass
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  port = server.server_address[1]
  try:
    with fake_kube.FakeCluster(str(tmp_path)) as cluster:
      k8s.CoreV1Api(cluster.api_client()).create_namespaced_service("orchard", {
          "apiVersion": "v1", "kind": "Service", "metadata": {"name": "proxy"},
          "spec": {"clusterIP": "127.0.0.1", "selector": {"app": "proxy"},
                   "ports": [{"port": port, "targetPort": "http", "protocol": "TCP"}]}})
      backend = KubernetesBackend(_config(), api_client=cluster.api_client())
      with orchard_env.Orchestrator(backend, config=make_config()) as service, \
           orchard_env.SandboxClient(service.url, service.api_key) as client:
        url = f"http://proxy.orchard.svc:{port}"
        with client.create_sandbox(egress=[url]) as box:
          assert box.egress_url(url + "/v1") == url + "/v1"
          fetch = ("python3 -c \"import sys, urllib.request; "
                   "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\" ")
          assert box.exec(fetch + url + "/").stdout == "proxy\n"
          policy = cluster.objects["networkpolicies"][m.egress_policy_name(box.id)]
          assert policy["spec"]["egress"] == [
              {"to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}],
               "ports": [{"protocol": "TCP", "port": port}]},
              {"to": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "orchard"}},
                       "podSelector": {"matchLabels": {"app": "proxy"}}}],
               "ports": [{"protocol": "TCP", "port": "http"}]}]
        with pytest.raises(orchard_env.SandboxFailed, match="no port 1"):
          client.create_sandbox(egress=["http://proxy.orchard.svc:1"])
  finally:
    server.shutdown()
    server.server_close()
