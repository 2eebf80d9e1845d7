"""A fake Kubernetes API server for the fleet tests.

No real Kubernetes API server can run on this machine (no container runtime, no etcd), so the
fleet's up/down/status are exercised against this stand-in. It speaks the REST shapes the
official `kubernetes` client uses for the kinds the fleet manages: create (POST, 409 when the
object exists), read and list with label selectors (GET), server-side apply (PATCH with
application/apply-patch+yaml: create or update, fieldManager required), and delete (DELETE,
404 when absent; deleting a namespace deletes what it holds). Like the real server it refuses
(422) any object that does not validate against the Kubernetes JSON schemas, and it records
every request so tests can assert on the traffic.
"""
import copy
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

KUBERNETES_VERSION = "1.33"

_CORE = re.compile(r"^/api/v1/namespaces"
                   r"(?:/(?P<ns>[^/]+)(?:/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?)?)?$")
_GROUP = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/"
                    r"(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$")
_KIND_OF = {"namespaces": "Namespace", "services": "Service", "secrets": "Secret",
            "serviceaccounts": "ServiceAccount", "persistentvolumeclaims": "PersistentVolumeClaim",
            "pods": "Pod", "configmaps": "ConfigMap", "deployments": "Deployment", "jobs": "Job",
            "statefulsets": "StatefulSet",
            "roles": "Role", "rolebindings": "RoleBinding", "networkpolicies": "NetworkPolicy",
            "poddisruptionbudgets": "PodDisruptionBudget"}


class FakeKubeAPI:
  """In-memory API server on 127.0.0.1; a context manager.

  Attributes:
    objects: {(kind, namespace or "", name): object dict} as stored.
    requests: [(method, path, content type)] in arrival order.
    url: the server's base URL.
  """

  def __init__(self):
    self.objects: dict[tuple[str, str, str], dict] = {}
    self.requests: list[tuple[str, str, str]] = []
    self._lock = threading.Lock()
    self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()

  def kubeconfig(self, path) -> str:
    """Writes a kubeconfig pointing at this server to `path`; returns the path."""
    import yaml
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
        "users": [{"name": "tester", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
    }))
    return str(path)

  def get(self, kind: str, name: str, namespace: str = "") -> dict | None:
    with self._lock:
      return copy.deepcopy(self.objects.get((kind, namespace, name)))

  def set_status(self, kind: str, name: str, namespace: str, status: dict) -> None:
    """What a controller would do: writes `status` of a stored object."""
    with self._lock:
      self.objects[(kind, namespace, name)]["status"] = status

  def put(self, obj: dict) -> None:
    """Stores an object directly (e.g. a pod some other actor created)."""
    meta = obj["metadata"]
    with self._lock:
      self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = copy.deepcopy(obj)

  # --- request handling (called from the server threads) ------------------------------------

  def handle(self, method: str, path: str, query: dict, content_type: str, body: bytes):
    self.requests.append((method, path, content_type))
    route = _route(path)
    if route is None:
      return 404, _status(404, "NotFound", f"no route for {path}")
    kind, namespace, name = route
    with self._lock:
      if method == "GET":
        return self._get(kind, namespace, name, query)
      if method == "POST":
        return self._create(kind, namespace, json.loads(body))
      if method == "PATCH":
        return self._apply(kind, namespace, name, query, content_type, json.loads(body))
      if method == "DELETE":
        return self._delete(kind, namespace, name)
    return 405, _status(405, "MethodNotAllowed", method)

  def _get(self, kind, namespace, name, query):
    if name is not None:
      obj = self.objects.get((kind, namespace, name))
      if obj is None:
        return 404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
      return 200, obj
    selector = _parse_selector(query.get("labelSelector", [""])[0])
    items = [o for (k, ns, _), o in sorted(self.objects.items())
             if k == kind and ns == namespace and _matches(o, selector)]
    return 200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items}

  def _invalid(self, obj):
    try:
      kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
      path = ".".join(str(p) for p in e.path)
      return 422, _status(422, "Invalid", f"{obj.get('kind')} is invalid: {path}: {e.message}")
    return None

  def _create(self, kind, namespace, obj):
    if (error := self._invalid(obj)) is not None:
      return error
    name = obj["metadata"]["name"]
    if (kind, namespace, name) in self.objects:
      return 409, _status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists')
    if namespace and ("Namespace", "", namespace) not in self.objects:
      return 404, _status(404, "NotFound", f'namespaces "{namespace}" not found')
    stored = self._store(kind, namespace, obj, None)
    return 201, stored

  def _apply(self, kind, namespace, name, query, content_type, obj):
    if content_type != "application/apply-patch+yaml":
      return 415, _status(415, "UnsupportedMediaType",
                          f"this fake only applies, saw {content_type}")
    if not query.get("fieldManager"):
      return 422, _status(422, "Invalid", "fieldManager is required for apply patch")
    if obj["metadata"]["name"] != name:
      return 400, _status(400, "BadRequest", "the name in the body does not match the URL")
    if (error := self._invalid(obj)) is not None:
      return error
    if namespace and ("Namespace", "", namespace) not in self.objects:
      return 404, _status(404, "NotFound", f'namespaces "{namespace}" not found')
    previous = self.objects.get((kind, namespace, name))
    return (200 if previous else 201), self._store(kind, namespace, obj, previous)

  def _store(self, kind, namespace, obj, previous):
    stored = copy.deepcopy(obj)
    meta = stored["metadata"]
    if previous is None:
      meta.update(uid=str(uuid.uuid4()), resourceVersion="1",
                  creationTimestamp="2026-01-01T00:00:00Z")
      stored.setdefault("status", {"phase": "Active"} if kind == "Namespace" else {})
    else:
      meta.update(uid=previous["metadata"]["uid"],
                  resourceVersion=str(int(previous["metadata"]["resourceVersion"]) + 1),
                  creationTimestamp=previous["metadata"]["creationTimestamp"])
      stored["status"] = previous.get("status", {})
    if kind == "Service" and "clusterIP" not in stored["spec"]:
      stored["spec"]["clusterIP"] = "10.96.0.%d" % (len(self.objects) % 250 + 1)
    self.objects[(kind, namespace, meta["name"])] = stored
    return stored

  def _delete(self, kind, namespace, name):
    if self.objects.pop((kind, namespace, name), None) is None:
      return 404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
    if kind == "Namespace":     # the namespace controller empties it
      for key in [k for k in self.objects if k[1] == name]:
        del self.objects[key]
    return 200, _status(200, "Success", "deleted")


def _route(path: str):
  if m := _GROUP.match(path):
    kind = _KIND_OF.get(m["plural"])
    return None if kind is None else (kind, m["ns"], m["name"])
  if m := _CORE.match(path):
    if m["plural"] is None:        # /api/v1/namespaces[/name]
      return ("Namespace", "", m["ns"])
    kind = _KIND_OF.get(m["plural"])
    return None if kind is None else (kind, m["ns"], m["name"])
  return None


def _parse_selector(text: str) -> dict[str, str]:
  pairs = [p.split("=", 1) for p in text.split(",") if p]
  return {k.strip(): v.strip() for k, v in pairs}


def _matches(obj, selector: dict[str, str]) -> bool:
  have = obj.get("metadata", {}).get("labels") or {}
  return all(have.get(k) == v for k, v in selector.items())


def _status(code: int, reason: str, message: str) -> dict:
  return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 400 else "Success",
          "message": message, "reason": reason, "code": code}


def _handler_for(api: FakeKubeAPI):

  class Handler(BaseHTTPRequestHandler):

    def _serve(self):
      parsed = urlparse(self.path)
      length = int(self.headers.get("Content-Length") or 0)
      body = self.rfile.read(length) if length else b"{}"
      code, reply = api.handle(self.command, parsed.path, parse_qs(parsed.query),
                               self.headers.get("Content-Type", ""), body)
      data = json.dumps(reply).encode()
      self.send_response(code)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _serve

    def log_message(self, *args):
      pass

  return Handler
