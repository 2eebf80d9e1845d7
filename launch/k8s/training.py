"""Manifests of a multi-host training run: an Indexed Job plus its headless Service.

Every pod of the Job runs `python launch/run.py --config EXPERIMENT ...` and joins one JAX
program through `jax.distributed.initialize` (orchard_jax/parallel/distributed.py reads the
environment set here):

  JAX_COORDINATOR_ADDRESS  pod 0's stable DNS name and port: `<job>-0.<job>.<ns>.svc...:PORT`
                           (an Indexed Job names its pods' hosts `<job>-<index>`, and the
                           headless Service of the same name as the pods' subdomain gives
                           them DNS records)
  JAX_NUM_PROCESSES        the number of hosts (the Job's completions and parallelism)
  JAX_PROCESS_ID           the pod's completion index (from its
                           batch.kubernetes.io/job-completion-index annotation)

The pods also get the in-cluster addresses of the fleet's services, so the experiment's
cluster preset needs no hard-coded address:

  ORCHARD_ENV_URL               Orchard Env's Service, e.g. http://orchard-env.orchard.svc...:8080
  ORCHARD_ENV_API_KEY           its API key (from the Secret `fleet.py up` created)
  ORCHARD_SGLANG_<NAME>_URL     SGLang server NAME's load-balanced Service
  ORCHARD_SGLANG_<NAME>_URLS    comma-separated stable URLs of each of its replicas (for the
                                rollout client's per-session routing and weight updates)
"""
import re
from typing import Optional, Sequence

from launch.k8s import common
from launch.k8s import env_service
from launch.k8s import sglang

COMPONENT = "training"
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
# An Indexed Job's pod hostname is "<job>-<index>", which must stay a 63-character DNS label.
_MAX_JOB_NAME = 56


def check_job_name(name: str) -> str:
  """Returns `name` if it can name an Indexed Job and its headless Service.

  Raises:
    common.FleetError: not a DNS label (lower-case letters, digits, '-', starting with a
      letter) or too long for the pods' hostnames.
  """
  if not _DNS_LABEL.match(name) or len(name) > _MAX_JOB_NAME:
    raise common.FleetError(
        f"training job name {name!r} must be a DNS label of at most {_MAX_JOB_NAME} "
        "characters: lower-case letters, digits and '-', starting with a letter")
  return name


def coordinator_address(config, name: str) -> str:
  """host:port of process 0 of job `name` (pod `<name>-0` in the headless Service `name`)."""
  host = f"{name}-0.{common.service_dns(name, config.namespace)}"
  return f"{host}:{config.training.coordinator_port}"


def _service_env(config) -> list[dict]:
  """URLs of the fleet's services, and the env API key, as container environment."""
  env = [{"name": "ORCHARD_ENV_URL", "value": env_service.env_url(config)},
         {"name": "ORCHARD_ENV_API_KEY", "valueFrom": {"secretKeyRef": {
             "name": config.env.api_key_secret, "key": env_service.API_KEY_FIELD}}}]
  for server in sorted(config.sglang.servers):
    if not config.sglang.servers[server].enabled:
      continue
    key = server.upper()
    env += [{"name": f"ORCHARD_SGLANG_{key}_URL", "value": sglang.server_url(config, server)},
            {"name": f"ORCHARD_SGLANG_{key}_URLS",
             "value": ",".join(sglang.replica_urls(config, server))}]
  return env


def training_job(config, *, name: Optional[str] = None, overrides: Sequence[str] = (),
                 labels: Optional[dict] = None) -> list[dict]:
  """The headless Service and the Indexed Job of one training run.

  Args:
    config: the fleet config.
    name: the Job's name (default config.training.name); a sweep passes one per point.
    overrides: extra `--config.FIELD=VALUE` arguments after config.training.overrides.
    labels: extra labels on the Job and its pods (a sweep marks its points with them).
  Returns:
    [Service, Job].
  Raises:
    common.FleetError: a bad job name or host count.
  """
  t = config.training
  name = check_job_name(name or t.name)
  if t.num_hosts < 1:
    raise common.FleetError(f"training.num_hosts is {t.num_hosts}; expected >= 1")
  ns = config.namespace
  vols = config.volumes
  extra_labels = dict(labels or {})
  args = ["python", "launch/run.py", "--config", t.experiment,
          *[str(o) for o in t.overrides], *[str(o) for o in overrides]]
  env = [
      {"name": "JAX_COORDINATOR_ADDRESS", "value": coordinator_address(config, name)},
      {"name": "JAX_NUM_PROCESSES", "value": str(t.num_hosts)},
      {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {
          "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
      # Caches (task images, tokenizers) and stores live on the shared checkpoints volume.
      {"name": "XDG_CACHE_HOME", "value": f"{vols.checkpoints.mount_path}/cache"},
      {"name": "ORCHARD_CHECKPOINT_DIR", "value": f"{vols.checkpoints.mount_path}/{name}"},
      {"name": "PYTHONUNBUFFERED", "value": "1"},
      *_service_env(config),
      *common.env_list(t.extra_env),
  ]
  container = {
      "name": "trainer",
      "image": config.image,
      "imagePullPolicy": config.image_pull_policy,
      "command": args,
      "env": env,
      "ports": [{"name": "coordinator", "containerPort": t.coordinator_port,
                 "protocol": "TCP"}],
      "resources": common.resources(t.cpu, t.memory, accelerators=(
          t.accelerator_resource, t.accelerators_per_host)),
      "volumeMounts": [
          {"name": "models", "mountPath": vols.models.mount_path, "readOnly": True},
          {"name": "checkpoints", "mountPath": vols.checkpoints.mount_path},
          {"name": "dshm", "mountPath": "/dev/shm"},
      ],
  }
  job_labels = dict(common.labels(config, COMPONENT, name), **extra_labels)
  service = {
      "apiVersion": "v1", "kind": "Service",
      "metadata": common.metadata(config, name, COMPONENT, ns),
      "spec": {
          "clusterIP": "None",
          # Pods need each other's DNS records before any of them is Ready.
          "publishNotReadyAddresses": True,
          "selector": {"batch.kubernetes.io/job-name": name},
          "ports": [{"name": "coordinator", "port": t.coordinator_port,
                     "targetPort": t.coordinator_port, "protocol": "TCP"}],
      },
  }
  service["metadata"]["labels"].update(extra_labels)
  job = {
      "apiVersion": "batch/v1", "kind": "Job",
      "metadata": dict(common.metadata(config, name, COMPONENT, ns), labels=job_labels),
      "spec": {
          "completionMode": "Indexed",
          "completions": t.num_hosts,
          "parallelism": t.num_hosts,
          "backoffLimit": t.backoff_limit,
          "ttlSecondsAfterFinished": t.ttl_seconds_after_finished,
          "template": {
              "metadata": {"labels": dict(job_labels)},
              "spec": {
                  "subdomain": name,
                  "restartPolicy": "Never",
                  "containers": [container],
                  "volumes": [
                      common.pvc_volume("models", vols.models.claim, read_only=True),
                      common.pvc_volume("checkpoints", vols.checkpoints.claim),
                      common.shm_volume(t.shm_size),
                  ],
                  **common.pod_scheduling(t.node_selector, t.tolerations),
                  **common.image_pull(config),
              },
          },
      },
  }
  common.check_manifests([service, job])
  return [service, job]
