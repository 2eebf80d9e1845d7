"""Pieces every manifest shares: labels, metadata, resources, volumes, YAML output.

Manifests are plain dicts shaped like the Kubernetes API objects (what `kubectl apply -f`
reads and what the `kubernetes` client accepts as a body), built by functions from the fleet
config (launch/k8s/config.py), so every value comes from config.
"""
import re
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


# A container image reference, after the grammar of distribution's reference package:
# [registry[:port]/]path[/path...][:tag][@digest].
_DOMAIN = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*(?::[0-9]+)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"^(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def check_manifests(objects: Iterable[dict]) -> None:
  """Refuses rendered objects the API server would reject, before anything is applied: a
  container image that is not an image reference (an empty or mistyped --config.image), a
  negative replica count, a port outside 1-65535. A fleet config override is not checked
  field by field; what it renders is.

  Raises:
    FleetError: names the object, the path inside it and the value.
  """
  for obj in objects:
    where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}"
    for path, value in _walk(obj, ""):
      key = path.rsplit(".", 1)[-1].split("[")[0]
      if key == "image" and ".containers[" in path or key == "image" and ".initContainers[" in path:
        if not isinstance(value, str) or not _IMAGE.match(value):
          raise FleetError(f"{where}: {path.lstrip('.')} is {value!r}; expected a container "
                           "image reference such as registry.example/orchard-jax:0.1")
      elif key == "replicas" and isinstance(value, int) and value < 0:
        raise FleetError(f"{where}: {path.lstrip('.')} is {value}; expected a count >= 0")
      elif key in ("containerPort", "port", "targetPort") and isinstance(value, int) and not (
          isinstance(value, bool) or 1 <= value <= 65535):
        raise FleetError(f"{where}: {path.lstrip('.')} is {value}; expected a port 1-65535")


def _walk(value, path: str):
  """(path, leaf) pairs of a manifest: "spec.template.spec.containers[0].image"."""
  if isinstance(value, dict):
    for key, item in value.items():
      yield from _walk(item, f"{path}.{key}")
  elif isinstance(value, list):
    for i, item in enumerate(value):
      yield from _walk(item, f"{path}[{i}]")
  else:
    yield path, value
