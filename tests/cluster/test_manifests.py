"""Every manifest the fleet renders validates against the Kubernetes JSON schemas
(kubernetes-validate, strict: unknown fields are errors), for the default and cluster presets,
and the objects agree with each other (selectors, ports, names, RBAC subjects)."""
import os
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from launch import k8s
from launch.k8s import config as fleet_config
from launch.k8s import env_service
from launch.k8s import sglang
from launch.k8s import training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The oldest Kubernetes minor the manifests support (batch.kubernetes.io/job-name labels and
# Indexed Jobs are GA there) and the newest the validator ships.
VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())


def _all(preset):
  config = fleet_config.get_config(preset)
  weights = k8s.storage.weights_job(config, "Qwen/Qwen3-30B-A3B", "qwen3_30b_a3b")
  return config, k8s.render_fleet(config, api_key="k") + k8s.training_job(config) + [weights]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("preset", fleet_config.PRESETS)
def test_every_manifest_validates_against_the_kubernetes_schemas(preset, version):
  _, objects = _all(preset)
  assert len(objects) >= 15
  for obj in objects:
    # Raises ValidationError (or SchemaNotFoundError for a kind Kubernetes does not have).
    kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_rejects_a_broken_manifest():
  """Negative control: the schema check above is not vacuous."""
  config = fleet_config.get_config("default")
  deployment = env_service.orchestrator_deployment(config)
  deployment["spec"]["replica"] = 2                       # misspelt field
  with pytest.raises(kubernetes_validate.ValidationError):
    kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
  job = k8s.training_job(config)[1]
  job["spec"]["completions"] = "four"                      # wrong type
  with pytest.raises(kubernetes_validate.ValidationError):
    kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("preset", fleet_config.PRESETS)
def test_names_are_unique_and_every_object_carries_the_fleet_labels(preset):
  config, objects = _all(preset)
  keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
  assert len(keys) == len(set(keys))
  for obj in objects:
    got = obj["metadata"]["labels"]
    assert got["app.kubernetes.io/instance"] == config.name
    assert got["app.kubernetes.io/managed-by"] == "orchard-fleet"


def _pods(objects):
  """(namespace, pod template labels, pod spec) of every workload."""
  for obj in objects:
    if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
      template = obj["spec"]["template"]
      yield obj["metadata"]["namespace"], template["metadata"]["labels"], template["spec"], obj


@pytest.mark.parametrize("preset", fleet_config.PRESETS)
def test_every_service_selects_the_pods_it_fronts_on_a_port_they_expose(preset):
  _, objects = _all(preset)
  pods = list(_pods(objects))
  for service in (o for o in objects if o["kind"] == "Service"):
    ns, selector = service["metadata"]["namespace"], service["spec"]["selector"]
    matched = [spec for pod_ns, labels, spec, _ in pods
               if pod_ns == ns and all(labels.get(k) == v for k, v in selector.items())]
    if service["metadata"]["labels"]["app.kubernetes.io/component"] == "training":
      # The Job controller adds batch.kubernetes.io/job-name=<job> to its pods.
      job = next(o for o in objects if o["kind"] == "Job")
      assert selector == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
      matched = [job["spec"]["template"]["spec"]]
    assert matched, f"Service {service['metadata']['name']} selects no pod"
    container_ports = {p["name"]: p["containerPort"] for spec in matched
                       for c in spec["containers"] for p in c.get("ports", [])}
    for port in service["spec"]["ports"]:
      target = port["targetPort"]
      assert target in container_ports or target in container_ports.values(), port


@pytest.mark.parametrize("preset", fleet_config.PRESETS)
def test_workloads_mount_only_volumes_their_pod_declares(preset):
  _, objects = _all(preset)
  claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
  for _, _, spec, obj in _pods(objects):
    declared = {v["name"]: v for v in spec.get("volumes", [])}
    for container in spec["containers"]:
      for mount in container.get("volumeMounts", []):
        assert mount["name"] in declared, (obj["metadata"]["name"], mount)
    for volume in declared.values():
      if "persistentVolumeClaim" in volume:
        assert volume["persistentVolumeClaim"]["claimName"] in claims


def test_training_job_gives_every_pod_what_jax_distributed_initialize_needs():
  config = fleet_config.get_config("cluster")
  service, job = k8s.training_job(config, name="rpr-a", overrides=["--config.rl.lr=3e-6"])
  spec = job["spec"]
  assert spec["completionMode"] == "Indexed"
  assert spec["completions"] == spec["parallelism"] == config.training.num_hosts == 4
  pod = spec["template"]["spec"]
  # An Indexed Job's pod i has hostname "<job>-i"; with subdomain == the headless Service's
  # name its DNS name is "<job>-i.<service>.<namespace>.svc.cluster.local".
  assert service["spec"]["clusterIP"] == "None"
  assert pod["subdomain"] == service["metadata"]["name"] == "rpr-a"
  env = {e["name"]: e for e in pod["containers"][0]["env"]}
  assert env["JAX_COORDINATOR_ADDRESS"]["value"] == (
      f"rpr-a-0.rpr-a.{config.namespace}.svc.cluster.local:{config.training.coordinator_port}")
  assert env["JAX_NUM_PROCESSES"]["value"] == "4"
  assert env["JAX_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
      "metadata.annotations['batch.kubernetes.io/job-completion-index']")
  assert env["ORCHARD_ENV_URL"]["value"] == env_service.env_url(config)
  assert env["ORCHARD_ENV_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == (
      config.env.api_key_secret)
  assert env["ORCHARD_SGLANG_POLICY_URL"]["value"] == sglang.server_url(config, "policy")
  assert env["ORCHARD_SGLANG_POLICY_URLS"]["value"].split(",") == [
      f"http://sglang-policy-{i}.sglang-policy-pods.{config.namespace}.svc.cluster.local:30000"
      for i in range(config.sglang.servers.policy.replicas)]
  assert "ORCHARD_SGLANG_TEACHER_URL" not in env          # teacher is disabled by default
  command = pod["containers"][0]["command"]
  assert command[:4] == ["python", "launch/run.py", "--config", "experiments/swe_rpr.py:cluster"]
  assert command[-1] == "--config.rl.lr=3e-6"
  limits = pod["containers"][0]["resources"]["limits"]
  assert limits["nvidia.com/gpu"] == "8"


def test_training_job_names_must_be_dns_labels():
  config = fleet_config.get_config("default")
  for bad in ("Upper", "has_underscore", "9starts-with-digit", "x" * 60):
    with pytest.raises(k8s.FleetError, match="DNS label"):
      training.training_job(config, name=bad)


def test_sglang_servers_run_sglangs_launch_command_on_tp_times_dp_gpus():
  config = fleet_config.get_config("cluster")
  config.sglang.servers.teacher.enabled = True
  objects = sglang.render(config)
  deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
  assert set(deployments) == {"sglang-policy", "sglang-teacher"}
  for name, server in (("sglang-policy", config.sglang.servers.policy),
                       ("sglang-teacher", config.sglang.servers.teacher)):
    container = deployments[name]["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    flags = dict(zip(command[3::2], command[4::2]))
    assert flags["--model-path"] == server.model_path
    assert flags["--tp"] == str(server.tp)
    assert flags["--port"] == str(server.port)
    assert flags["--host"] == "0.0.0.0"
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == container["resources"]["requests"]["nvidia.com/gpu"] == str(
        server.tp * server.dp)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
      assert container[probe]["httpGet"]["path"] == "/health"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert "/dev/shm" in mounts
    assert deployments[name]["spec"]["replicas"] == server.replicas
    # Replica i is "<name>-i" under the headless Service: a stable address per server.
    headless = next(o for o in objects if o["metadata"]["name"] == f"{name}-pods")
    assert deployments[name]["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"


def test_sglang_rejects_inconsistent_parallelism():
  config = fleet_config.get_config("cluster")
  config.sglang.servers.policy.ep = 3
  with pytest.raises(k8s.FleetError, match="ep=3"):
    sglang.render(config)


def test_sandbox_namespace_denies_egress_and_admits_only_the_orchestrator():
  config = fleet_config.get_config("cluster")
  policies = {p["metadata"]["name"]: p for p in env_service.sandbox_network_policies(config)}
  deny = policies["deny-egress"]
  assert deny["metadata"]["namespace"] == config.sandbox_namespace
  # An empty podSelector selects every pod; Egress with no rules allows no egress at all.
  assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}
  ingress = policies["ingress-from-orchestrator"]["spec"]["ingress"][0]["from"][0]
  orchestrator = env_service.orchestrator_deployment(config)
  pod_labels = orchestrator["spec"]["template"]["metadata"]["labels"]
  assert all(pod_labels[k] == v for k, v in ingress["podSelector"]["matchLabels"].items())
  assert ingress["namespaceSelector"]["matchLabels"] == {
      "kubernetes.io/metadata.name": orchestrator["metadata"]["namespace"]}


def test_orchestrator_may_manage_sandbox_pods_and_policies_and_nothing_cluster_wide():
  config = fleet_config.get_config("cluster")
  role, binding = env_service.sandbox_role(config), env_service.sandbox_role_binding(config)
  account = env_service.service_account(config)
  deployment = env_service.orchestrator_deployment(config)
  assert role["kind"] == "Role" and role["metadata"]["namespace"] == config.sandbox_namespace
  grants = {(g, r): set(rule["verbs"]) for rule in role["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]}
  for resource in (("", "pods"), ("networking.k8s.io", "networkpolicies")):
    assert {"create", "delete", "get", "list", "watch"} <= grants[resource]
  assert binding["roleRef"]["name"] == role["metadata"]["name"]
  assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                  "namespace": account["metadata"]["namespace"]}]
  assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == (
      account["metadata"]["name"])
  # Services of the fleet's namespace may be read (egress to the recording proxy by name).
  reader, reader_binding = env_service.service_reader_role(config)
  assert reader["metadata"]["namespace"] == config.namespace
  assert reader["rules"] == [{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]
  assert reader_binding["subjects"] == binding["subjects"]


def test_presets_differ_in_scale_and_store():
  default, cluster = (fleet_config.get_config(p) for p in fleet_config.PRESETS)
  kinds = lambda c: [o["kind"] for o in env_service.redis(c)]  # noqa: E731
  assert kinds(default) == []                                   # in-process store
  assert sorted(kinds(cluster)) == ["Deployment", "PersistentVolumeClaim", "Service"]
  command = env_service.orchestrator_deployment(cluster)["spec"]["template"]["spec"][
      "containers"][0]["command"]
  assert command[command.index("--store") + 1] == env_service.redis_url(cluster)
  assert env_service.orchestrator_deployment(cluster)["spec"]["replicas"] == 3
  default.env.replicas = 2                                      # memory store, 2 replicas
  with pytest.raises(k8s.FleetError, match="env.store=redis"):
    env_service.orchestrator_deployment(default)
  with pytest.raises(ValueError, match="expected one of"):
    fleet_config.get_config("huge")


def test_dry_run_prints_the_manifests_with_config_overrides():
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "fleet.py"), "up", "--dry-run",
       "--config", os.path.join(ROOT, "launch", "k8s", "config.py") + ":cluster",
       "--config.sglang.servers.policy.replicas=7"],
      capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert result.returncode == 0, result.stderr
  documents = list(yaml.safe_load_all(result.stdout))
  expected = k8s.render_fleet(fleet_config.get_config("cluster"))
  assert [d["kind"] for d in documents] == [o["kind"] for o in expected]
  policy = next(d for d in documents if d["metadata"]["name"] == "sglang-policy"
                and d["kind"] == "StatefulSet")
  assert policy["spec"]["replicas"] == 7
  secret = next(d for d in documents if d["kind"] == "Secret")
  assert secret["stringData"][env_service.API_KEY_FIELD] == k8s.DRY_RUN_API_KEY


def test_weights_job_downloads_into_the_folder_sglang_reads():
  config = fleet_config.get_config("cluster")
  job = k8s.storage.weights_job(config, "Qwen/Qwen3.5-35B-A3B", "qwen3_5_35b_a3b")
  container = job["spec"]["template"]["spec"]["containers"][0]
  destination = container["command"][4]
  assert destination == config.sglang.servers.policy.model_path == "/models/qwen3_5_35b_a3b"
  assert container["command"][3] == "Qwen/Qwen3.5-35B-A3B"
  mount = container["volumeMounts"][0]
  assert mount["mountPath"] == "/models" and not mount.get("readOnly")
  for repo, folder in (("not a repo", "x"), ("Qwen/Qwen3", "../etc"), ("Qwen/Qwen3", "a/b")):
    with pytest.raises(k8s.FleetError, match="expected"):
      k8s.storage.weights_job(config, repo, folder)


@pytest.mark.parametrize("preset", fleet_config.PRESETS)
def test_orchestrator_command_is_one_the_env_service_accepts(preset):
  """The Deployment's command parses with orchard_jax.env's own command line, and its JSON
  settings build the env room's ServiceConfig and KubernetesConfig."""
  import json
  from orchard_jax.env import __main__ as env_cli
  from orchard_jax.env.backends.kubernetes import KubernetesConfig
  from orchard_jax.env.manager import ServiceConfig
  config = fleet_config.get_config(preset)
  container = env_service.orchestrator_deployment(config)["spec"]["template"]["spec"][
      "containers"][0]
  command = container["command"]
  assert command[:4] == ["python", "-m", "orchard_jax.env", "serve"]
  args = env_cli._parser().parse_args(command[3:])
  assert args.backend == "kubernetes" and args.in_cluster
  assert args.namespace == config.sandbox_namespace
  assert args.port == container["ports"][0]["containerPort"]
  assert args.store == (env_service.redis_url(config) if preset == "cluster" else "memory")
  mount = container["volumeMounts"][0]["mountPath"]
  assert args.api_keys_file == f"{mount}/{env_service.API_KEY_FIELD}"
  service = ServiceConfig(**json.loads(args.config_json))
  assert service.max_sandboxes == config.env.max_sandboxes
  backend = KubernetesConfig(**json.loads(args.kubernetes_config_json))
  assert backend.agent_image == config.env.agent_image
  assert backend.creation_qps == config.env.creation_qps
  pod_labels = env_service.orchestrator_deployment(config)["spec"]["template"]["metadata"][
      "labels"]
  assert all(pod_labels[k] == v for k, v in backend.orchestrator_selector.items())


def test_a_localhost_seccomp_profile_is_installed_on_the_nodes_and_used_by_sandboxes():
  """env.sandbox_seccomp_profile = Localhost:...: a ConfigMap with Orchard Env's OCI profile
  and a DaemonSet writing it where the kubelet reads Localhost profiles; the orchestrator's
  Kubernetes backend then puts that profile in every sandbox pod."""
  import json
  from orchard_jax.env import seccomp
  from orchard_jax.env.backends.k8s_manifests import KubernetesConfig, render_pod
  config = fleet_config.get_config("cluster")
  assert env_service.seccomp_profile_installer(config) == []     # RuntimeDefault: nothing
  config.env.sandbox_seccomp_profile = "Localhost:orchard-env/sandbox.json"
  configmap, daemonset = env_service.seccomp_profile_installer(config)
  for obj in (configmap, daemonset):
    kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
  assert json.loads(configmap["data"]["profile.json"]) == seccomp.oci_profile()
  command = daemonset["spec"]["template"]["spec"]["containers"][0]["command"][-1]
  assert '"/var/lib/kubelet/seccomp/orchard-env/sandbox.json"' in command
  container = env_service.orchestrator_deployment(config)["spec"]["template"]["spec"][
      "containers"][0]["command"]
  backend = json.loads(container[container.index("--kubernetes-config-json") + 1])
  pod = render_pod("sbx-0123456789ab", image="x", token="t",
                   config=KubernetesConfig(**backend))
  assert pod["spec"]["securityContext"]["seccompProfile"] == {
      "type": "Localhost", "localhostProfile": "orchard-env/sandbox.json"}


@pytest.mark.parametrize("field, value, expected", [
    ("image", "", "containers[0].image is ''; expected a container image reference"),
    ("image", "my image:1", "containers[0].image is 'my image:1'"),
    ("redis.image", "a//b", "containers[0].image is 'a//b'"),
    ("env.replicas", -2, "spec.replicas is -2; expected a count >= 0"),
    ("env.port", 70000, "containerPort is 70000; expected a port 1-65535"),
])
def test_an_override_the_api_server_would_reject_is_refused_before_applying(field, value,
                                                                             expected):
  """The schemas accept these (a string, an int32), the API server does not: an empty or
  mistyped --config.image, a negative replica count, a port out of range. The fleet refuses
  what it renders, naming the object and the path, before `up` creates anything."""
  config = fleet_config.get_config("cluster")
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(k8s.FleetError, match=expected.replace("[", r"\[").replace("(", r"\(")):
    k8s.render_fleet(config)


def test_training_and_weights_jobs_check_their_images_too():
  config = fleet_config.get_config("default")
  config.image = "Bad Image"
  with pytest.raises(k8s.FleetError, match=r"Job 'orchard-train'.*image is 'Bad Image'"):
    k8s.training_job(config, name="orchard-train")
  config = fleet_config.get_config("default")
  config.weights.image = "x:"
  with pytest.raises(k8s.FleetError, match="image is 'x:'"):
    k8s.storage.weights_job(config, "Qwen/Qwen3-30B-A3B", "q")
