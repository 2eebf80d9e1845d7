"""The few Kubernetes API operations the fleet needs, on the official `kubernetes` client.

Objects are applied with server-side apply (`kubectl apply --server-side`: one PATCH with
content type application/apply-patch+yaml that creates or updates the object and records
this tool as the field manager), read, listed by label and deleted, for the kinds the fleet
renders. Everything goes through the client's typed APIs (CoreV1Api, AppsV1Api, ...); replies
are read as plain dicts.
"""
import dataclasses
import json
from typing import Optional

from launch.k8s.common import FleetError

FIELD_MANAGER = "orchard-fleet"
_APPLY = "application/apply-patch+yaml"


@dataclasses.dataclass(frozen=True)
class _Kind:
  api: str            # class name in kubernetes.client
  suffix: str         # method suffix: create_<suffix>, read_<suffix>, ...
  namespaced: bool


# kind -> how the typed client reaches it. One line per kind the fleet renders or reads.
_KINDS = {
    "Namespace": _Kind("CoreV1Api", "namespace", False),
    "ServiceAccount": _Kind("CoreV1Api", "service_account", True),
    "Secret": _Kind("CoreV1Api", "secret", True),
    "Service": _Kind("CoreV1Api", "service", True),
    "ConfigMap": _Kind("CoreV1Api", "config_map", True),
    "PersistentVolumeClaim": _Kind("CoreV1Api", "persistent_volume_claim", True),
    "Pod": _Kind("CoreV1Api", "pod", True),
    "Deployment": _Kind("AppsV1Api", "deployment", True),
    "StatefulSet": _Kind("AppsV1Api", "stateful_set", True),
    "Job": _Kind("BatchV1Api", "job", True),
    "Role": _Kind("RbacAuthorizationV1Api", "role", True),
    "RoleBinding": _Kind("RbacAuthorizationV1Api", "role_binding", True),
    "NetworkPolicy": _Kind("NetworkingV1Api", "network_policy", True),
    "PodDisruptionBudget": _Kind("PolicyV1Api", "pod_disruption_budget", True),
}


def describe(obj: dict) -> str:
  """"Kind namespace/name" of a manifest, for messages."""
  meta = obj.get("metadata", {})
  where = f"{meta['namespace']}/" if meta.get("namespace") else ""
  return f"{obj.get('kind')} {where}{meta.get('name')}"


class KubeClient:
  """Apply, read, list and delete fleet objects through one `kubernetes.client.ApiClient`.

  Args:
    api_client: a configured kubernetes.client.ApiClient (from a kubeconfig, in-cluster
      config, or a test's Configuration pointing at a fake API server).
  """

  def __init__(self, api_client):
    import kubernetes.client
    self._module = kubernetes.client
    self._api_client = api_client
    self._apis: dict[str, object] = {}

  @classmethod
  def from_kubeconfig(cls, kubeconfig: Optional[str] = None,
                      context: Optional[str] = None) -> "KubeClient":
    """A client for the cluster of `kubeconfig` (default ~/.kube/config), or the in-cluster
    service account when running inside a pod and no kubeconfig is given.

    Raises:
      FleetError: no usable configuration was found.
    """
    from kubernetes import client, config
    configuration = client.Configuration()
    try:
      if kubeconfig is None and _in_cluster():
        config.load_incluster_config(client_configuration=configuration)
      else:
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=configuration)
    except (config.ConfigException, FileNotFoundError) as e:
      raise FleetError(f"no Kubernetes configuration: {e}; pass --kubeconfig or set "
                       "KUBECONFIG (kubectl's configuration works as it is)") from e
    return cls(client.ApiClient(configuration))

  def close(self) -> None:
    self._api_client.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # --- operations -----------------------------------------------------------------------

  def apply(self, obj: dict) -> dict:
    """Creates or updates `obj` with server-side apply; returns the object as stored."""
    kind, api = self._lookup(obj["kind"])
    meta = obj["metadata"]
    method = getattr(api, f"patch_{self._scope(kind)}")
    args = self._args(kind, meta["name"], meta.get("namespace"))
    return self._call(method, describe(obj), *args, body=obj, field_manager=FIELD_MANAGER,
                      force=True, _content_type=_APPLY)

  def create(self, obj: dict) -> dict:
    """Creates `obj`.

    Raises:
      AlreadyExists: an object of that kind and name exists.
      FleetError: any other API failure.
    """
    kind, api = self._lookup(obj["kind"])
    method = getattr(api, f"create_{self._scope(kind)}")
    namespace = obj["metadata"].get("namespace")
    args = (namespace,) if kind.namespaced else ()
    return self._call(method, describe(obj), *args, body=obj)

  def read(self, kind_name: str, name: str, namespace: Optional[str] = None) -> Optional[dict]:
    """The object, or None when it does not exist."""
    kind, api = self._lookup(kind_name)
    method = getattr(api, f"read_{self._scope(kind)}")
    try:
      return self._call(method, f"{kind_name} {name}", *self._args(kind, name, namespace))
    except NotFound:
      return None

  def list(self, kind_name: str, namespace: str, label_selector: str = "") -> list[dict]:
    """Objects of a namespaced kind in `namespace` matching `label_selector`."""
    kind, api = self._lookup(kind_name)
    method = getattr(api, f"list_namespaced_{kind.suffix}")
    reply = self._call(method, f"{kind_name} list in {namespace}", namespace,
                       label_selector=label_selector)
    return reply.get("items") or []

  def delete(self, kind_name: str, name: str, namespace: Optional[str] = None) -> bool:
    """Deletes one object (its pods too, for Jobs); False when it did not exist."""
    kind, api = self._lookup(kind_name)
    method = getattr(api, f"delete_{self._scope(kind)}")
    try:
      self._call(method, f"{kind_name} {name}", *self._args(kind, name, namespace),
                 propagation_policy="Background")
    except NotFound:
      return False
    return True

  # --- plumbing ---------------------------------------------------------------------------

  def _lookup(self, kind_name: str):
    if kind_name not in _KINDS:
      raise FleetError(f"kind {kind_name!r} is not one the fleet manages; expected one of "
                       f"{sorted(_KINDS)}")
    kind = _KINDS[kind_name]
    if kind.api not in self._apis:
      self._apis[kind.api] = getattr(self._module, kind.api)(self._api_client)
    return kind, self._apis[kind.api]

  @staticmethod
  def _scope(kind: _Kind) -> str:
    return f"namespaced_{kind.suffix}" if kind.namespaced else kind.suffix

  @staticmethod
  def _args(kind: _Kind, name: str, namespace: Optional[str]) -> tuple:
    if kind.namespaced:
      if not namespace:
        raise FleetError(f"{kind.suffix} {name!r} needs a namespace")
      return (name, namespace)
    return (name,)

  def _call(self, method, what: str, *args, **kwargs) -> dict:
    import urllib3
    from kubernetes.client.exceptions import ApiException
    try:
      response = method(*args, _preload_content=False, **kwargs)
    except ApiException as e:
      raise _api_error(e, what) from None
    except urllib3.exceptions.HTTPError as e:
      raise FleetError(f"{what}: cannot reach the Kubernetes API server at "
                       f"{self._api_client.configuration.host}: {e}") from None
    data = response.data
    return json.loads(data) if data else {}


class NotFound(FleetError):
  """The API server answered 404 for an object."""


class AlreadyExists(FleetError):
  """The API server answered 409 to a create."""


def _api_error(e, what: str) -> FleetError:
  message = e.reason or ""
  try:
    message = json.loads(e.body).get("message", message)
  except (TypeError, ValueError, AttributeError):
    pass
  text = f"{what}: HTTP {e.status} {message}"
  if e.status == 404:
    return NotFound(text)
  if e.status == 409:
    return AlreadyExists(text)
  if e.status in (401, 403):
    return FleetError(f"{text} (check the kubeconfig's credentials and RBAC)")
  return FleetError(text)


def _in_cluster() -> bool:
  import os
  return "KUBERNETES_SERVICE_HOST" in os.environ and not os.environ.get("KUBECONFIG")
