"""Manifests of the SGLang inference servers: per entry of `config.sglang.servers` (policy,
teacher, ...) a StatefulSet of `replicas` servers, a load-balanced Service and a headless
Service.

Each pod runs `python -m sglang.launch_server` on `tp * dp` GPUs with the model read from the
models volume and the checkpoints volume mounted at the same path as in the trainer, so the
recipe can reload new policy weights with SGLang's `/update_weights_from_disk`.

Why a StatefulSet rather than a Deployment: the rollout client (orchard_jax/rollout/client.py)
routes each session to one server to reuse its prefix cache, and weight updates must reach
every server, so clients need one stable address per replica. A StatefulSet governed by the
headless Service `<name>-pods` gives replica i the DNS name
`<name>-i.<name>-pods.<namespace>.svc.cluster.local`, which survives pod restarts;
`replica_urls()` lists them. The plain Service load-balances for clients that need no
affinity.
"""
from launch.k8s import common

COMPONENT = "sglang"


def server_name(name: str) -> str:
  """The StatefulSet/Service name of SGLang server `name` (e.g. "sglang-policy")."""
  return f"sglang-{name.replace('_', '-')}"


def server_url(config, name: str) -> str:
  """The in-cluster base URL of SGLang server `name` (its load-balanced Service)."""
  server = config.sglang.servers[name]
  host = common.service_dns(server_name(name), config.namespace)
  return f"http://{host}:{server.port}"


def replica_urls(config, name: str) -> list[str]:
  """The stable base URL of every replica of SGLang server `name`, replica 0 first."""
  server = config.sglang.servers[name]
  full = server_name(name)
  pods = common.service_dns(f"{full}-pods", config.namespace)
  return [f"http://{full}-{i}.{pods}:{server.port}" for i in range(server.replicas)]


def launch_command(server) -> list[str]:
  """SGLang's own launch command line for one server entry.

  Flags are SGLang's (`python -m sglang.launch_server --help`): --model-path, --tp, --dp,
  --ep, --port, --host, --served-model-name, --mem-fraction-static, --context-length,
  --tool-call-parser, --reasoning-parser, --enable-metrics.
  """
  args = ["python3", "-m", "sglang.launch_server",
          "--model-path", server.model_path,
          "--served-model-name", server.served_model_name,
          "--host", "0.0.0.0",
          "--port", str(server.port),
          "--tp", str(server.tp),
          "--mem-fraction-static", str(server.mem_fraction_static),
          "--context-length", str(server.context_length),
          "--enable-metrics"]
  if server.dp > 1:
    args += ["--dp", str(server.dp)]
  if server.ep > 1:
    args += ["--ep", str(server.ep)]
  if server.tool_call_parser:
    args += ["--tool-call-parser", server.tool_call_parser]
  if server.reasoning_parser:
    args += ["--reasoning-parser", server.reasoning_parser]
  return args + [str(a) for a in server.extra_args]


def _validate(name: str, server) -> None:
  if server.tp < 1 or server.dp < 1:
    raise common.FleetError(
        f"sglang.servers.{name}: tp and dp must be >= 1; saw tp={server.tp} dp={server.dp}")
  if server.ep > 1 and (server.tp * server.dp) % server.ep:
    raise common.FleetError(
        f"sglang.servers.{name}: ep={server.ep} must divide the GPU count tp*dp="
        f"{server.tp * server.dp}")
  if not str(server.model_path).startswith("/"):
    raise common.FleetError(
        f"sglang.servers.{name}.model_path is {server.model_path!r}; expected an absolute "
        "path on the models volume, e.g. /models/qwen3_5_35b_a3b")


def server_manifests(config, name: str) -> list[dict]:
  """StatefulSet + Service + headless Service of SGLang server `name`.

  Raises:
    common.FleetError: inconsistent parallelism or a model path outside the volume.
  """
  server = config.sglang.servers[name]
  _validate(name, server)
  sg = config.sglang
  vols = config.volumes
  full = server_name(name)
  ns = config.namespace
  gpus = server.tp * server.dp
  health = {"httpGet": {"path": "/health", "port": "http"}}
  container = {
      "name": "sglang",
      "image": sg.image,
      "imagePullPolicy": "IfNotPresent",
      "command": launch_command(server),
      "env": [{"name": "HF_HUB_OFFLINE", "value": "1"},   # weights come from the volume
              {"name": "PYTHONUNBUFFERED", "value": "1"}],
      "ports": [{"name": "http", "containerPort": server.port, "protocol": "TCP"}],
      "resources": common.resources(server.cpu, server.memory,
                                    accelerators=(sg.gpu_resource, gpus)),
      "volumeMounts": [
          {"name": "models", "mountPath": vols.models.mount_path, "readOnly": True},
          {"name": "checkpoints", "mountPath": vols.checkpoints.mount_path, "readOnly": True},
          {"name": "dshm", "mountPath": "/dev/shm"},
      ],
      # Loading a large model takes minutes: the startup probe allows startup_seconds, then
      # liveness takes over; readiness keeps traffic away while the server is busy loading.
      "startupProbe": dict(health, periodSeconds=10,
                           failureThreshold=max(1, server.startup_seconds // 10)),
      "readinessProbe": dict(health, periodSeconds=10, timeoutSeconds=5, failureThreshold=3),
      "livenessProbe": dict(health, periodSeconds=30, timeoutSeconds=10, failureThreshold=5),
  }
  selector = common.selector_labels(config, full)
  stateful_set = {
      "apiVersion": "apps/v1", "kind": "StatefulSet",
      "metadata": common.metadata(config, full, COMPONENT, ns),
      "spec": {
          "replicas": server.replicas,
          "serviceName": f"{full}-pods",
          # Servers are independent: start and replace them all at once, not in order.
          "podManagementPolicy": "Parallel",
          "updateStrategy": {"type": "RollingUpdate"},
          "selector": {"matchLabels": selector},
          "template": {
              "metadata": {"labels": common.labels(config, COMPONENT, full)},
              "spec": {
                  "containers": [container],
                  "volumes": [
                      common.pvc_volume("models", vols.models.claim, read_only=True),
                      common.pvc_volume("checkpoints", vols.checkpoints.claim,
                                        read_only=True),
                      common.shm_volume(server.shm_size),
                  ],
                  **common.pod_scheduling(sg.node_selector, sg.tolerations),
              },
          },
      },
  }
  port = {"name": "http", "port": server.port, "targetPort": "http", "protocol": "TCP"}
  service = {
      "apiVersion": "v1", "kind": "Service",
      "metadata": common.metadata(config, full, COMPONENT, ns),
      "spec": {"type": "ClusterIP", "selector": selector, "ports": [port]},
  }
  headless = {
      "apiVersion": "v1", "kind": "Service",
      "metadata": common.metadata(config, f"{full}-pods", COMPONENT, ns, app_name=full),
      # Replica DNS names exist while a server is still loading its weights.
      "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
               "ports": [port]},
  }
  return [stateful_set, service, headless]


def render(config) -> list[dict]:
  """Manifests of every enabled SGLang server, in a stable order."""
  objects = []
  for name in sorted(config.sglang.servers):
    if config.sglang.servers[name].enabled:
      objects += server_manifests(config, name)
  return objects
