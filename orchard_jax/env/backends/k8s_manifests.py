"""The Kubernetes objects the Kubernetes backend creates, as plain dicts (validated in the tests
against the Kubernetes JSON schemas).

- one Pod per sandbox: an init container copies the agent bundle from the agent image into an
  emptyDir; the sandbox container (the requested image) runs the agent as its entrypoint, with
  requests/limits, an emptyDir workspace (sizeLimit = disk), a readiness probe on the agent,
  no service-account token, and the node selector and tolerations from the config;
- one namespace-wide NetworkPolicy that denies all egress of sandbox pods;
- for a sandbox created with network=True or an egress allow-list, a NetworkPolicy of that
  one pod (policies are additive, so it opens that pod alone): network=True allows the
  internet (every address but the cluster's private, link-local and shared ranges, so no
  cluster service, node port or cloud metadata endpoint) and DNS; each egress endpoint allows
  its addresses (/32 or /128) on its TCP port, host names pinned in the pod's /etc/hosts
  (hostAliases) to the addresses the orchestrator resolved, so the URL inside is the URL given.
"""
import dataclasses
import re
from typing import Optional

MANAGED_BY = "orchard-env"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_SANDBOX = "orchard.dev/sandbox-id"
LABEL_TENANT = "orchard.dev/tenant"
ANNOTATION_LABELS = "orchard.dev/labels"
DENY_EGRESS_POLICY = "orchard-sandboxes-deny-egress"
AGENT_VOLUME = "orchard-agent"
AGENT_MOUNT = "/orchard"
AGENT_BUNDLE = "/opt/orchard-agent"
WORKSPACE_VOLUME = "workspace"
TMP_VOLUME = "tmp"
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                  "169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8")
PRIVATE_RANGES_V6 = ("fc00::/7", "fe80::/10", "::1/128")


@dataclasses.dataclass
class KubernetesConfig:
  """Settings of the Kubernetes backend.

  Attributes:
    namespace: where sandbox pods live (must exist).
    agent_image: the image whose /opt/orchard-agent holds the agent bundle.
    default_image: the container image used for image "host".
    agent_port: the agent's TCP port in each pod.
    workdir: the workspace mount when the request gives none.
    node_selector, tolerations: scheduling of sandbox pods.
    cpu_request, memory_request: requests when a sandbox gives no limit (limits = the sandbox's
      cpu/memory when given; requests then equal the limits).
    image_pull_policy: for the sandbox and agent images.
    run_as_user: uid of the sandbox container (None: the image's default).
    creation_qps: pod creations per second at most; max_concurrent_creates: in flight at once.
    service_account: service account of sandbox pods (its token is never mounted).
    orchestrator_selector: if set, pod labels of the orchestrator; ingress to sandbox pods is
      then only allowed from such pods.
    agent_request_timeout: seconds for one request to an agent (long polls add their wait).
    node_pids_limit: the kubelet's podPidsLimit on the sandbox nodes, if set there; a request's
      pids limit is accepted only when at least this (Kubernetes has no per-pod pids field).
    seccomp_profile: the sandbox pod's seccomp profile: "RuntimeDefault" (the container
      runtime's default, Docker's list: no namespaces, mounts, bpf, keyctl, ptrace of others
      for a container without CAP_SYS_ADMIN) or "Localhost:<path>", a profile the nodes hold
      under /var/lib/kubelet/seccomp (orchard_jax.env.seccomp.oci_profile_json() writes ours;
      launch/k8s/env_service.py installs it with a DaemonSet).
    internet_except: CIDRs a network=True sandbox may not reach (default: private, shared,
      link-local and loopback ranges: the cluster's pods, services and nodes, and cloud
      metadata endpoints).
    dns_selector: pod labels (in namespace kube-system) of the cluster DNS, which network=True
      sandboxes may query on port 53.
  """
  namespace: str = "orchard-sandboxes"
  agent_image: str = "orchard-agent:latest"
  default_image: str = "python:3.11-slim"
  agent_port: int = 7777
  workdir: str = "/workspace"
  node_selector: dict = dataclasses.field(default_factory=dict)
  tolerations: list = dataclasses.field(default_factory=list)
  cpu_request: str = "100m"
  memory_request: str = "128Mi"
  image_pull_policy: str = "IfNotPresent"
  run_as_user: Optional[int] = None
  creation_qps: float = 20.0
  max_concurrent_creates: int = 64
  service_account: Optional[str] = None
  orchestrator_selector: Optional[dict] = None
  agent_request_timeout: float = 30.0
  node_pids_limit: Optional[int] = None
  seccomp_profile: str = "RuntimeDefault"
  internet_except: list = dataclasses.field(default_factory=lambda: list(PRIVATE_RANGES))
  dns_selector: dict = dataclasses.field(default_factory=lambda: {"k8s-app": "kube-dns"})


def pod_name(sandbox_id: str) -> str:
  return "orchard-" + sandbox_id


def _cpu_quantity(cores: float) -> str:
  return f"{max(1, int(round(cores * 1000)))}m"


def _label_value(value: str) -> Optional[str]:
  value = str(value)
  return value if re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value) and len(value) <= 63 else None


def render_pod(sandbox_id: str, *, image: str, token: str, config: KubernetesConfig,
               cpu: Optional[float] = None, memory: Optional[int] = None,
               disk: Optional[int] = None, env: Optional[dict] = None,
               labels: Optional[dict] = None, workdir: Optional[str] = None,
               network: bool = False, egress: Optional[list] = None,
               tenant: Optional[str] = None) -> dict:
  """The Pod manifest of one sandbox (see the module docstring).

  Args:
    egress: resolved endpoints, dicts {"host", "port", "addresses": [ip, ...]}; the names
      among them become hostAliases.
  """
  import json
  workdir = workdir or config.workdir
  limits, requests = {}, {"cpu": config.cpu_request, "memory": config.memory_request}
  if cpu is not None:
    limits["cpu"] = requests["cpu"] = _cpu_quantity(cpu)
  if memory is not None:
    limits["memory"] = requests["memory"] = str(memory)
  if disk is not None:   # the workspace and /tmp are in memory; this bounds the image's layer
    limits["ephemeral-storage"] = requests["ephemeral-storage"] = str(disk)
  pod_labels = {LABEL_MANAGED: MANAGED_BY, LABEL_NAME: "orchard-sandbox",
                LABEL_SANDBOX: sandbox_id, "orchard.dev/network": "allowed" if network else "blocked"}
  if tenant is not None:   # the owner, also in the service's store (tenant names are label values)
    pod_labels[LABEL_TENANT] = tenant
  container_env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                   {"name": "ORCHARD_AGENT_TOKEN", "value": token},
                   {"name": "ORCHARD_WORKDIR", "value": workdir}]
  container_env += [{"name": k, "value": v} for k, v in sorted((env or {}).items())]
  # With a disk size, the workspace and /tmp are memory-backed emptyDirs of that size: tmpfs,
  # so filling one is ENOSPC inside the pod (a disk-backed emptyDir over its sizeLimit gets
  # the pod evicted instead), and their pages count toward the memory limit, as on the local
  # backend (the service checks that 2 x disk fits in memory).
  workspace = {"name": WORKSPACE_VOLUME, "emptyDir": {}}
  tmp = {"name": TMP_VOLUME, "emptyDir": {}}
  if disk is not None:
    for volume in (workspace, tmp):
      volume["emptyDir"] = {"medium": "Memory", "sizeLimit": str(disk)}
  sandbox = {
      "name": "sandbox", "image": image, "imagePullPolicy": config.image_pull_policy,
      "command": [f"{AGENT_MOUNT}/bin/orchard-agent"],
      "args": ["--host", "$(POD_IP)", "--port", str(config.agent_port), "--workdir", workdir],
      "workingDir": workdir, "env": container_env,
      "ports": [{"name": "agent", "containerPort": config.agent_port, "protocol": "TCP"}],
      "readinessProbe": {"httpGet": {"path": "/health", "port": config.agent_port},
                         "periodSeconds": 1, "failureThreshold": 3},
      "resources": {"requests": requests, **({"limits": limits} if limits else {})},
      "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": AGENT_MOUNT, "readOnly": True},
                       {"name": WORKSPACE_VOLUME, "mountPath": workdir},
                       {"name": TMP_VOLUME, "mountPath": "/tmp"}],
  }
  sandbox["securityContext"] = {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}
  if config.run_as_user is not None:
    sandbox["securityContext"]["runAsUser"] = config.run_as_user
  spec = {
      "restartPolicy": "Never",
      "automountServiceAccountToken": False,
      "enableServiceLinks": False,
      "terminationGracePeriodSeconds": 1,
      "initContainers": [{
          "name": "install-agent", "image": config.agent_image,
          "imagePullPolicy": config.image_pull_policy,
          "command": ["cp", "-a", f"{AGENT_BUNDLE}/.", f"{AGENT_MOUNT}/"],
          "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                        "limits": {"cpu": "500m", "memory": "64Mi"}},
          "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": AGENT_MOUNT}],
      }],
      "containers": [sandbox],
      "volumes": [{"name": AGENT_VOLUME, "emptyDir": {}}, workspace, tmp],
      "securityContext": {"seccompProfile": seccomp_profile(config)},
  }
  if config.node_selector:
    spec["nodeSelector"] = dict(config.node_selector)
  if config.tolerations:
    spec["tolerations"] = [dict(t) for t in config.tolerations]
  if config.service_account:
    spec["serviceAccountName"] = config.service_account
  aliases = {}
  for endpoint in egress or ():
    if endpoint["host"] not in endpoint["addresses"]:
      for address in endpoint["addresses"]:
        aliases.setdefault(address, [])
        if endpoint["host"] not in aliases[address]:
          aliases[address].append(endpoint["host"])
  if aliases:
    spec["hostAliases"] = [{"ip": ip, "hostnames": names} for ip, names in sorted(aliases.items())]
  annotations = {ANNOTATION_LABELS: json.dumps(labels or {}, sort_keys=True)}
  for key, value in (labels or {}).items():
    if _label_value(value) is not None and re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}", key):
      pod_labels.setdefault("orchard.dev/" + key if "/" not in key else key, value)
  return {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"name": pod_name(sandbox_id), "namespace": config.namespace,
                       "labels": pod_labels, "annotations": annotations},
          "spec": spec}


def seccomp_profile(config: KubernetesConfig) -> dict:
  """The pod's securityContext.seccompProfile from config.seccomp_profile.

  Raises:
    ValueError: neither "RuntimeDefault" nor "Localhost:<path>".
  """
  value = config.seccomp_profile
  if value == "RuntimeDefault":
    return {"type": "RuntimeDefault"}
  if value.startswith("Localhost:") and value[len("Localhost:"):]:
    return {"type": "Localhost", "localhostProfile": value[len("Localhost:"):]}
  raise ValueError(f"seccomp_profile must be 'RuntimeDefault' or 'Localhost:<path>'; got "
                   f"{value!r}")


def render_deny_egress_policy(config: KubernetesConfig) -> dict:
  """The namespace-wide policy: sandbox pods may not open connections anywhere (and, with
  orchestrator_selector, only the orchestrator may connect to them)."""
  spec = {"podSelector": {"matchLabels": {LABEL_MANAGED: MANAGED_BY}},
          "policyTypes": ["Egress"], "egress": []}
  if config.orchestrator_selector:
    spec["policyTypes"].append("Ingress")
    spec["ingress"] = [{"from": [{"namespaceSelector": {},
                                  "podSelector": {"matchLabels": dict(config.orchestrator_selector)}}]}]
  return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": DENY_EGRESS_POLICY, "namespace": config.namespace,
                       "labels": {LABEL_MANAGED: MANAGED_BY}},
          "spec": spec}


def egress_policy_name(sandbox_id: str) -> str:
  return pod_name(sandbox_id) + "-egress"


def render_allow_egress_policy(sandbox_id: str, config: KubernetesConfig, *,
                               network: bool = True, egress: Optional[list] = None) -> dict:
  """The per-sandbox exception to the deny-egress policy.

  Args:
    network: allow the internet (all but config.internet_except) and cluster DNS.
    egress: resolved endpoints, dicts {"host", "port", "addresses": [ip, ...], and for a
      cluster Service "service": {"namespace", "selector", "target_port"}}: each allows its
      addresses on its TCP port, and a Service's pods on their target port.
  """
  import ipaddress
  rules = []
  if network:
    v4 = [c for c in config.internet_except if ":" not in c]
    v6 = [c for c in config.internet_except if ":" in c] or list(PRIVATE_RANGES_V6)
    rules.append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}},
                         {"ipBlock": {"cidr": "::/0", "except": v6}}]})
    rules.append({"to": [{"namespaceSelector": {"matchLabels": {
                              "kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": dict(config.dns_selector)}}],
                  "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]})
  for endpoint in egress or ():
    blocks = []
    for address in endpoint["addresses"]:
      bits = 128 if ipaddress.ip_address(address).version == 6 else 32
      blocks.append({"ipBlock": {"cidr": f"{address}/{bits}"}})
    if blocks:
      rules.append({"to": blocks, "ports": [{"protocol": "TCP", "port": int(endpoint["port"])}]})
    service = endpoint.get("service")
    if service is not None and service["selector"]:   # its pods, on the port they serve on
      peer = {"namespaceSelector": {"matchLabels": {
                  "kubernetes.io/metadata.name": service["namespace"]}},
              "podSelector": {"matchLabels": dict(service["selector"])}}
      rules.append({"to": [peer], "ports": [{"protocol": "TCP",
                                             "port": service["target_port"]}]})
  return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": egress_policy_name(sandbox_id), "namespace": config.namespace,
                       "labels": {LABEL_MANAGED: MANAGED_BY, LABEL_SANDBOX: sandbox_id}},
          "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: sandbox_id}},
                   "policyTypes": ["Egress"], "egress": rules}}
