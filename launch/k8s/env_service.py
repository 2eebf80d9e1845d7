"""Manifests of Orchard Env on Kubernetes: the orchestrator, its RBAC, its API-key Secret,
Redis (its shared store), and the sandbox namespace with its network policies.

The orchestrator is the REST service of orchard_jax/env run with the Kubernetes backend: it
creates one pod per sandbox in `config.sandbox_namespace` and talks to the agent inside each
pod directly. Several replicas share sandbox and job records through Redis, so any replica can
serve any sandbox (orchard_jax/env/state_redis.py).
"""
import json
import os

from launch.k8s import common

COMPONENT = "orchard-env"
REDIS_COMPONENT = "redis"
SANDBOX_COMPONENT = "sandbox"
API_KEY_FIELD = "api-keys"          # key inside the Secret: one API key per line


def namespaces(config) -> list[dict]:
  """The fleet's namespace and the sandbox namespace (only when config.create_namespaces)."""
  if not config.create_namespaces:
    return []
  system = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": common.metadata(config, config.namespace, "namespace")}
  sandboxes = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": common.metadata(config, config.sandbox_namespace, SANDBOX_COMPONENT)}
  # Sandboxes run arbitrary task images: keep them at the "baseline" Pod Security Standard
  # (no privileged pods, host namespaces or host paths).
  sandboxes["metadata"]["labels"].update({
      "pod-security.kubernetes.io/enforce": "baseline",
      "pod-security.kubernetes.io/warn": "restricted",
  })
  return [system, sandboxes]


def service_account(config) -> dict:
  return {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": common.metadata(config, config.env.name, COMPONENT, config.namespace),
          "automountServiceAccountToken": True}


def sandbox_role(config) -> dict:
  """What the orchestrator may do in the sandbox namespace: manage pods (one per sandbox)
  and network policies (per-sandbox egress exceptions), read events and logs."""
  manage = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
  return {
      "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
      "metadata": common.metadata(config, f"{config.env.name}-sandboxes", COMPONENT,
                                  config.sandbox_namespace),
      "rules": [
          {"apiGroups": [""], "resources": ["pods"], "verbs": manage},
          {"apiGroups": [""], "resources": ["pods/log", "pods/status"], "verbs": ["get"]},
          {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
          {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
           "verbs": manage},
      ],
  }


def sandbox_role_binding(config) -> dict:
  """Binds sandbox_role (in the sandbox namespace) to the orchestrator's ServiceAccount."""
  return {
      "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
      "metadata": common.metadata(config, f"{config.env.name}-sandboxes", COMPONENT,
                                  config.sandbox_namespace),
      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                  "name": f"{config.env.name}-sandboxes"},
      "subjects": [{"kind": "ServiceAccount", "name": config.env.name,
                    "namespace": config.namespace}],
  }


def service_reader_role(config) -> list[dict]:
  """A Role and RoleBinding in the fleet's namespace letting the orchestrator read Services
  there: a sandbox whose egress names one (e.g. the recording proxy,
  `http://<service>.<namespace>.svc:<port>`) gets a NetworkPolicy to that Service's
  ClusterIP and pods."""
  name = f"{config.env.name}-read-services"
  role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
          "metadata": common.metadata(config, name, COMPONENT, config.namespace),
          "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]}
  binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": common.metadata(config, name, COMPONENT, config.namespace),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": config.env.name,
                           "namespace": config.namespace}]}
  return [role, binding]


def api_key_secret(config, api_key: str) -> dict:
  """The Secret holding the API keys the orchestrator accepts (X-API-Key), one per line.

  `fleet.py up` creates it once with a generated key (or config.env.api_key) and never
  overwrites an existing one, so clients keep working across `up` runs.
  """
  return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
          "metadata": common.metadata(config, config.env.api_key_secret, COMPONENT,
                                      config.namespace),
          "stringData": {API_KEY_FIELD: api_key}}


def redis_url(config) -> str:
  """The URL the orchestrator replicas (and tools) reach Redis at, inside the cluster."""
  host = common.service_dns(config.redis.name, config.namespace)
  return f"redis://{host}:{config.redis.port}/0"


def env_url(config) -> str:
  """The in-cluster URL of the orchestrator's Service (what recipes set as the env URL)."""
  return f"http://{common.service_dns(config.env.name, config.namespace)}:{config.env.port}"


def _orchestrator_args(config) -> list[str]:
  """`python -m orchard_jax.env serve` with the Kubernetes backend, as orchard_jax/env's
  command line spells it (orchard_jax/env/__main__.py)."""
  env = config.env
  backend = {
      "agent_image": env.agent_image,
      "default_image": env.default_sandbox_image,
      "creation_qps": float(env.creation_qps),
      "max_concurrent_creates": int(env.max_concurrent_creates),
      # The backend's own deny-egress policy then also admits only the orchestrator's pods.
      "orchestrator_selector": common.selector_labels(config, env.name),
      "seccomp_profile": env.sandbox_seccomp_profile,
  }
  if env.sandbox_node_selector:
    backend["node_selector"] = {str(k): str(v) for k, v in dict(env.sandbox_node_selector).items()}
  if env.sandbox_tolerations:
    backend["tolerations"] = [dict(t) for t in env.sandbox_tolerations]
  service = {"max_sandboxes": int(env.max_sandboxes)}
  args = ["python", "-m", "orchard_jax.env", "serve",
          "--backend", "kubernetes", "--in-cluster",
          "--host", "0.0.0.0",
          "--port", str(env.port),
          "--api-keys-file", "/etc/orchard-env/" + API_KEY_FIELD,
          "--public-url", env_url(config),
          "--namespace", config.sandbox_namespace,
          "--store", redis_url(config) if env.store == "redis" else "memory",
          "--config-json", json.dumps(service, sort_keys=True),
          "--kubernetes-config-json", json.dumps(backend, sort_keys=True)]
  return args + [str(a) for a in env.extra_args]


def orchestrator_deployment(config) -> dict:
  """The orchestrator Deployment: `env.replicas` pods of the REST service.

  Raises:
    common.FleetError: more than one replica with the in-process ("memory") store, which
      would give each replica its own view of the sandboxes.
  """
  env = config.env
  if env.store not in ("memory", "redis"):
    raise common.FleetError(f"env.store is {env.store!r}; expected 'memory' or 'redis'")
  if env.replicas > 1 and env.store != "redis":
    raise common.FleetError(
        f"env.replicas is {env.replicas} with env.store 'memory'; several replicas must share "
        "records: set --config.env.store=redis")
  # Readiness and start-up ask the service (which reads the store); liveness only asks the
  # process, so a Redis outage takes replicas out of the Service without restarting them.
  probe = {"httpGet": {"path": "/health", "port": "http"}}
  alive = {"tcpSocket": {"port": "http"}}
  container = {
      "name": "orchestrator",
      "image": config.image,
      "imagePullPolicy": config.image_pull_policy,
      "command": _orchestrator_args(config),
      "ports": [{"name": "http", "containerPort": env.port, "protocol": "TCP"}],
      "env": [
          # Identifies the replica in locks and logs.
          {"name": "ORCHARD_ENV_REPLICA", "valueFrom": {"fieldRef": {
              "fieldPath": "metadata.name"}}},
          {"name": "PYTHONUNBUFFERED", "value": "1"},
      ],
      "volumeMounts": [{"name": "api-keys", "mountPath": "/etc/orchard-env",
                        "readOnly": True}],
      "resources": common.resources(env.cpu, env.memory, cpu_limit=env.cpu_limit,
                                    memory_limit=env.memory_limit),
      "readinessProbe": dict(probe, periodSeconds=5, failureThreshold=3),
      "livenessProbe": dict(alive, periodSeconds=20, failureThreshold=6),
      "startupProbe": dict(probe, periodSeconds=2, failureThreshold=60),
      "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                          "runAsUser": 1000, "capabilities": {"drop": ["ALL"]}},
  }
  selector = common.selector_labels(config, env.name)
  pod_meta = {"labels": common.labels(config, COMPONENT, env.name)}
  return {
      "apiVersion": "apps/v1", "kind": "Deployment",
      "metadata": common.metadata(config, env.name, COMPONENT, config.namespace),
      "spec": {
          "replicas": env.replicas,
          "selector": {"matchLabels": selector},
          "strategy": {"type": "RollingUpdate",
                       "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
          "template": {
              "metadata": pod_meta,
              "spec": {
                  "serviceAccountName": env.name,
                  "containers": [container],
                  "volumes": [{"name": "api-keys", "secret": {
                      "secretName": env.api_key_secret,
                      "items": [{"key": API_KEY_FIELD, "path": API_KEY_FIELD}]}}],
                  # In-flight execs finish (or are recorded as interrupted) before exit.
                  "terminationGracePeriodSeconds": 60,
                  **common.image_pull(config),
              },
          },
      },
  }


def orchestrator_service(config) -> dict:
  """ClusterIP Service in front of the orchestrator replicas."""
  env = config.env
  return {
      "apiVersion": "v1", "kind": "Service",
      "metadata": common.metadata(config, env.name, COMPONENT, config.namespace),
      "spec": {"type": "ClusterIP",
               "selector": common.selector_labels(config, env.name),
               "ports": [{"name": "http", "port": env.port, "targetPort": "http",
                          "protocol": "TCP"}]},
  }


def orchestrator_disruption_budget(config) -> list[dict]:
  """Keeps at least one replica up through node drains (only with several replicas)."""
  if config.env.replicas < 2:
    return []
  return [{
      "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
      "metadata": common.metadata(config, config.env.name, COMPONENT, config.namespace),
      "spec": {"minAvailable": 1,
               "selector": {"matchLabels": common.selector_labels(config, config.env.name)}},
  }]


def redis(config) -> list[dict]:
  """Redis Deployment, Service and (with persistence) PersistentVolumeClaim.

  Redis runs with an append-only file fsynced every second and `noeviction`, so records are
  never dropped to make room: a full Redis fails writes loudly instead.
  """
  if config.env.store != "redis":
    return []
  r = config.redis
  ns = config.namespace
  objects = []
  if r.persistence_size:
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": common.metadata(config, f"{r.name}-data", REDIS_COMPONENT, ns,
                                         app_name=r.name),
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": r.persistence_size}}}}
    if r.storage_class:
      claim["spec"]["storageClassName"] = r.storage_class
    objects.append(claim)
    data_volume = common.pvc_volume("data", f"{r.name}-data")
  else:
    data_volume = {"name": "data", "emptyDir": {}}
  probe = {"exec": {"command": ["redis-cli", "-p", str(r.port), "ping"]}}
  container = {
      "name": "redis",
      "image": r.image,
      "imagePullPolicy": "IfNotPresent",
      "command": ["redis-server", "--port", str(r.port), "--dir", "/data",
                  "--appendonly", "yes", "--appendfsync", "everysec",
                  "--maxmemory-policy", "noeviction", "--protected-mode", "no"],
      "ports": [{"name": "redis", "containerPort": r.port, "protocol": "TCP"}],
      "volumeMounts": [{"name": "data", "mountPath": "/data"}],
      "resources": common.resources(r.cpu, r.memory, memory_limit=r.memory_limit),
      "readinessProbe": dict(probe, periodSeconds=5),
      "livenessProbe": dict(probe, periodSeconds=20, failureThreshold=6),
  }
  objects.append({
      "apiVersion": "apps/v1", "kind": "Deployment",
      "metadata": common.metadata(config, r.name, REDIS_COMPONENT, ns),
      "spec": {
          "replicas": 1,
          # One writer on the data volume: never run the old and new pod together.
          "strategy": {"type": "Recreate"},
          "selector": {"matchLabels": common.selector_labels(config, r.name)},
          "template": {"metadata": {"labels": common.labels(config, REDIS_COMPONENT, r.name)},
                       "spec": {"containers": [container], "volumes": [data_volume]}},
      },
  })
  objects.append({
      "apiVersion": "v1", "kind": "Service",
      "metadata": common.metadata(config, r.name, REDIS_COMPONENT, ns),
      "spec": {"type": "ClusterIP", "selector": common.selector_labels(config, r.name),
               "ports": [{"name": "redis", "port": r.port, "targetPort": "redis",
                          "protocol": "TCP"}]},
  })
  return objects


def sandbox_network_policies(config) -> list[dict]:
  """The sandbox namespace's baseline: no egress at all, ingress only from the orchestrator.

  A sandbox created with network allowed gets its own egress exception from the Kubernetes
  backend; NetworkPolicies are additive, so the exception opens only that pod.
  """
  ns = config.sandbox_namespace
  deny_egress = {
      "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
      "metadata": common.metadata(config, "deny-egress", SANDBOX_COMPONENT, ns),
      "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []},
  }
  orchestrator_only = {
      "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
      "metadata": common.metadata(config, "ingress-from-orchestrator", SANDBOX_COMPONENT, ns),
      "spec": {
          "podSelector": {},
          "policyTypes": ["Ingress"],
          "ingress": [{"from": [{
              "namespaceSelector": {"matchLabels": {
                  "kubernetes.io/metadata.name": config.namespace}},
              "podSelector": {"matchLabels": common.selector_labels(config, config.env.name)},
          }]}],
      },
  }
  return [deny_egress, orchestrator_only]


SECCOMP_COMPONENT = "seccomp-profile"
_KUBELET_SECCOMP = "/var/lib/kubelet/seccomp"


def seccomp_profile_installer(config) -> list[dict]:
  """With env.sandbox_seccomp_profile = "Localhost:<path>": a ConfigMap holding Orchard Env's
  seccomp profile (orchard_jax.env.seccomp, OCI format) and a DaemonSet that writes it to
  /var/lib/kubelet/seccomp/<path> on every node, where the kubelet looks for Localhost
  profiles. Nothing for "RuntimeDefault" (the container runtime's own default profile).
  It runs in the fleet's namespace: the sandbox namespace's Pod Security level forbids the
  hostPath it needs."""
  profile = config.env.sandbox_seccomp_profile
  if not profile.startswith("Localhost:"):
    return []
  from orchard_jax.env import seccomp
  path = profile[len("Localhost:"):]
  name = f"{config.env.name}-seccomp"
  folder, file_name = os.path.dirname(path), os.path.basename(path)
  target = os.path.join(_KUBELET_SECCOMP, folder) if folder else _KUBELET_SECCOMP
  configmap = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": common.metadata(config, name, SECCOMP_COMPONENT, config.namespace),
               "data": {"profile.json": seccomp.oci_profile_json()}}
  container = {
      "name": "install", "image": config.image, "imagePullPolicy": config.image_pull_policy,
      # Copy, then stay (a DaemonSet's pods run forever); the copy is redone on restart.
      "command": ["sh", "-c", f'mkdir -p "{target}" && cp /profile/profile.json '
                              f'"{target}/{file_name}" && exec sleep infinity'],
      "volumeMounts": [{"name": "profile", "mountPath": "/profile", "readOnly": True},
                       {"name": "kubelet-seccomp", "mountPath": _KUBELET_SECCOMP}],
      "resources": common.resources("10m", "16Mi", cpu_limit="100m", memory_limit="32Mi"),
  }
  spec = {"containers": [container],
          "volumes": [{"name": "profile", "configMap": {"name": name}},
                      {"name": "kubelet-seccomp", "hostPath": {
                          "path": _KUBELET_SECCOMP, "type": "DirectoryOrCreate"}}]}
  if config.env.sandbox_node_selector:
    spec["nodeSelector"] = {str(k): str(v) for k, v in dict(config.env.sandbox_node_selector).items()}
  if config.env.sandbox_tolerations:
    spec["tolerations"] = [dict(t) for t in config.env.sandbox_tolerations]
  selector = common.selector_labels(config, name)
  daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": common.metadata(config, name, SECCOMP_COMPONENT, config.namespace),
               "spec": {"selector": {"matchLabels": selector},
                        "template": {"metadata": {"labels": common.labels(
                            config, SECCOMP_COMPONENT, name)}, "spec": spec}}}
  return [configmap, daemonset]


def render(config, api_key: str) -> list[dict]:
  """Every Orchard Env object, in the order `up` applies them."""
  return [
      service_account(config),
      sandbox_role(config),
      sandbox_role_binding(config),
      *service_reader_role(config),
      *sandbox_network_policies(config),
      *seccomp_profile_installer(config),
      api_key_secret(config, api_key),
      *redis(config),
      orchestrator_deployment(config),
      orchestrator_service(config),
      *orchestrator_disruption_budget(config),
  ]
