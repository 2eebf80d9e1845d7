"""Tenants, on both backends (Kubernetes: the fake API server of tests/env/fake_kube.py): a
sandbox belongs to the key that created it; every other tenant gets 404 on every route, as if
it did not exist, and listings leave it out; admin keys see and manage all; quotas are 429s.
"""
import httpx
import pytest

from orchard_jax import env as orchard_env
from tests.env.conftest import make_config

_DIFF = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"


def _routes(sandbox_id, job_id, exposure_id):
  base = f"/v1/sandboxes/{sandbox_id}"
  return [("GET", base, {}), ("POST", base + "/wait?timeout=1", {}),
          ("POST", base + "/heartbeat", {}),
          ("POST", base + "/exec", {"json": {"command": "echo hi"}}),
          ("GET", base + "/jobs", {}), ("GET", base + f"/jobs/{job_id}", {}),
          ("POST", base + f"/jobs/{job_id}/wait?timeout=0", {}),
          ("POST", base + f"/jobs/{job_id}/cancel", {}),
          ("PUT", base + "/files?path=x.txt", {"content": b"forged"}),
          ("GET", base + "/files?path=secret.txt", {}), ("GET", base + "/files/list?path=.", {}),
          ("POST", base + "/patch", {"json": {"patch": _DIFF}}), ("GET", base + "/stats", {}),
          ("POST", base + "/ports", {"json": {"port": 8000}}), ("GET", base + "/ports", {}),
          ("DELETE", base + f"/ports/{exposure_id}", {}), ("DELETE", base, {})]


def test_another_tenant_gets_404_on_every_route(service):
  url, keys = service.url, service.keys
  with orchard_env.SandboxClient(url, keys["alice"]) as alice:
    box = alice.create_sandbox(labels={"case": "tenancy"})
    box.upload("secret.txt", b"alice's")
    job = box.start("sleep 30")
    exposure = box.expose_port(8000)
    for method, path, kwargs in _routes(box.id, job.id, exposure["id"]):
      answer = httpx.request(method, url + path, headers={"X-API-Key": keys["bob"]},
                             timeout=30, **kwargs)
      assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
      assert "alice" not in answer.text and "secret" not in answer.text
    with pytest.raises(orchard_env.SandboxNotFound) as missing:
      orchard_env.SandboxClient(url, keys["bob"]).sandbox(box.id)
    with pytest.raises(orchard_env.SandboxNotFound) as never:
      orchard_env.SandboxClient(url, keys["bob"]).sandbox("sbx-000000000000")
    assert str(missing.value).replace(box.id, "X") == str(never.value).replace(
        "sbx-000000000000", "X")          # indistinguishable from a sandbox that never was
    with orchard_env.SandboxClient(url, keys["bob"]) as bob:
      assert box.id not in [s["id"] for s in bob.list_sandboxes()]
      mine = bob.create_sandbox()
      assert [s["id"] for s in bob.list_sandboxes()] == [mine.id]
    # Nothing of bob's attempts reached the sandbox; alice still has it, untouched.
    assert box.download("secret.txt") == b"alice's" and box.refresh()["state"] == "ready"
    assert box.exec("test -e x.txt").exit_code == 1
    assert job.refresh()["status"] == "running"
    assert box.refresh()["tenant"] == "alice"
    if service.backend_kind == "kubernetes":   # ownership is also the pod's label
      pod = service.manager.backend.cluster.objects["pods"]["orchard-" + box.id]
      assert pod["metadata"]["labels"]["orchard.dev/tenant"] == "alice"
    with orchard_env.SandboxClient(url, keys["admin"]) as admin:
      assert box.id in [s["id"] for s in admin.list_sandboxes()]
      assert admin.sandbox(box.id).exec("cat secret.txt").stdout == "alice's"
      admin.delete_sandbox(box.id)
    with pytest.raises(orchard_env.SandboxNotFound, match="deleted"):
      box.refresh()


def test_the_pty_refuses_another_tenant(service):
  from websockets.exceptions import ConnectionClosed
  from websockets.sync.client import connect
  with orchard_env.SandboxClient(service.url, service.keys["alice"]) as alice:
    box = alice.create_sandbox()
    with connect(box.pty_url(), additional_headers={"X-API-Key": service.keys["bob"]}) as ws:
      with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd.code == 4404


def test_tenant_quotas_are_429_naming_the_quota(tmp_path):
  config = make_config(tenant_max_sandboxes=2, tenant_quotas={"small": {"max_memory": 256 << 20}})
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path / "state"))
  with orchard_env.Orchestrator(backend, config=config,
                                api_keys={"big": "k-big", "small": "k-small"}) as service:
    with orchard_env.SandboxClient(service.url, "k-big") as big:
      big.create_sandbox()
      big.create_sandbox()
      with pytest.raises(orchard_env.QuotaExceeded, match="sandboxes") as full:
        big.create_sandbox()
      assert full.value.status_code == 429 and full.value.details["limit"] == 2
    with orchard_env.SandboxClient(service.url, "k-small") as small:
      with pytest.raises(orchard_env.InvalidRequest, match="memory quota"):
        small.create_sandbox()                      # no memory limit under a memory quota
      small.create_sandbox(memory="128Mi")
      with pytest.raises(orchard_env.QuotaExceeded, match="memory"):
        small.create_sandbox(memory="192Mi")
      small.create_sandbox(memory="128Mi")          # exactly the quota
