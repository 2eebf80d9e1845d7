"""Pieces every manifest shares: labels, metadata, resources, volumes, YAML output.

Manifests are plain dicts shaped like the Kubernetes API objects (what `kubectl apply -f`
reads and what the `kubernetes` client accepts as a body), built by functions from the fleet
config (launch/k8s/config.py), so every value comes from config.
"""
from typing import Any, Iterable, Optional

import yaml

PART_OF = "orchard-jax"
MANAGED_BY = "orchard-fleet"


class FleetError(Exception):
  """Base class of the fleet's errors (bad config, API failures during up/down/status)."""


def labels(config, component: str, name: Optional[str] = None) -> dict[str, str]:
  """The recommended app.kubernetes.io labels of one object of the fleet.

  `app.kubernetes.io/instance` (the fleet's name) plus `managed-by` is what `fleet.py down`
  and `status` select on.
  """
  return {
      "app.kubernetes.io/name": name or component,
      "app.kubernetes.io/component": component,
      "app.kubernetes.io/part-of": PART_OF,
      "app.kubernetes.io/instance": config.name,
      "app.kubernetes.io/managed-by": MANAGED_BY,
  }


def selector_labels(config, name: str) -> dict[str, str]:
  """The labels a Service or Deployment selects its pods by (a stable subset of labels())."""
  return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": config.name}


def fleet_selector(config) -> str:
  """Label selector string matching every object of this fleet."""
  return (f"app.kubernetes.io/instance={config.name},"
          f"app.kubernetes.io/managed-by={MANAGED_BY}")


def metadata(config, name: str, component: str, namespace: Optional[str] = None,
             *, app_name: Optional[str] = None, annotations: Optional[dict] = None) -> dict:
  """`metadata` of an object: name, namespace (omitted for cluster-scoped kinds), labels."""
  meta: dict[str, Any] = {"name": name, "labels": labels(config, component, app_name or name)}
  if namespace is not None:
    meta["namespace"] = namespace
  if annotations:
    meta["annotations"] = dict(annotations)
  return meta


def resources(cpu: str, memory: str, *, cpu_limit: Optional[str] = None,
              memory_limit: Optional[str] = None,
              accelerators: Optional[tuple[str, int]] = None) -> dict:
  """A container's `resources`: requests, limits, and accelerators (requested == limited).

  Args:
    cpu, memory: requests as Kubernetes quantities ("500m", "4Gi").
    cpu_limit, memory_limit: limits; memory defaults to the request (a pod over its memory
      request is the first evicted), cpu stays unlimited unless given.
    accelerators: (resource name, count), e.g. ("nvidia.com/gpu", 8); extended resources
      must have equal request and limit.
  """
  requests = {"cpu": str(cpu), "memory": str(memory)}
  limits = {"memory": str(memory_limit or memory)}
  if cpu_limit:
    limits["cpu"] = str(cpu_limit)
  if accelerators and accelerators[1] > 0:
    requests[accelerators[0]] = str(accelerators[1])
    limits[accelerators[0]] = str(accelerators[1])
  return {"requests": requests, "limits": limits}


def pvc_volume(name: str, claim: str, *, read_only: bool = False) -> dict:
  """A pod volume backed by a PersistentVolumeClaim."""
  return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}


def shm_volume(size: str) -> dict:
  """A memory-backed /dev/shm (the container default of 64 MiB starves NCCL and SGLang)."""
  return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def pod_scheduling(node_selector, tolerations) -> dict:
  """nodeSelector and tolerations for a pod spec, omitted when empty."""
  spec: dict[str, Any] = {}
  if node_selector:
    spec["nodeSelector"] = {str(k): str(v) for k, v in dict(node_selector).items()}
  if tolerations:
    spec["tolerations"] = [dict(t) for t in tolerations]
  return spec


def image_pull(config) -> dict:
  """imagePullSecrets for a pod spec, omitted when there are none."""
  secrets = list(config.image_pull_secrets)
  return {"imagePullSecrets": [{"name": s} for s in secrets]} if secrets else {}


def env_list(values: dict) -> list[dict]:
  """[{"name": k, "value": str(v)}] for a container's `env`, in a stable order."""
  return [{"name": str(k), "value": str(v)} for k, v in sorted(dict(values).items())]


def service_dns(name: str, namespace: str) -> str:
  """The in-cluster DNS name of a Service."""
  return f"{name}.{namespace}.svc.cluster.local"


class _NoAliasDumper(yaml.SafeDumper):
  """Writes a dict used twice (e.g. labels) out in full instead of as a YAML alias."""

  def ignore_aliases(self, data):
    return True


def to_yaml(manifests: Iterable[dict]) -> str:
  """A multi-document YAML stream, as `kubectl apply -f -` reads it."""
  return yaml.dump_all(list(manifests), Dumper=_NoAliasDumper, sort_keys=False,
                       default_flow_style=False)
