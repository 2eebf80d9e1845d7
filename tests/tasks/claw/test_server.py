"""A service's HTTP front over real sockets: routes, control token, malformed and hostile
requests (the server answers or closes, and keeps serving), persistent connections. Clients are
the standard library's http.client, httpx and raw sockets."""
import http.client
import json
import socket
import threading

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax.tasks.claw.services import SERVICES
from orchard_jax.tasks.claw.services.server import make_server

TOKEN = "t" * 32


@pytest.fixture(scope="module")
def server():
  service = SERVICES["notes"]()
  srv = make_server(service, TOKEN)
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  host, port = srv.server_address
  yield f"http://{host}:{port}", (host, port), service
  srv.shutdown()
  srv.server_close()


def raw(address, data: bytes, timeout=5.0) -> bytes:
  with socket.create_connection(address, timeout=timeout) as sock:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    chunks = []
    while True:
      try:
        chunk = sock.recv(65536)
      except socket.timeout:
        break
      if not chunk:
        break
      chunks.append(chunk)
  return b"".join(chunks)


def test_routes_and_control_token(server):
  url, _, _ = server
  with httpx.Client(base_url=url) as c:
    assert c.get("/health").json()["service"] == "notes"
    assert {t["name"] for t in c.get("/tools").json()["tools"]} >= {"notes_create", "notes_get"}
    for method, path in (("GET", "/audit"), ("GET", "/state"), ("POST", "/reset")):
      r = c.request(method, path)
      assert r.status_code == 403 and "X-Claw-Control" in r.json()["error"]["message"]
      r = c.request(method, path, headers={"X-Claw-Control": "wrong"})
      assert r.status_code == 403
    h = {"X-Claw-Control": TOKEN}
    assert c.post("/reset", headers=h, json={"fixtures": {"notes": [
        {"id": "n1", "title": "A", "body": "x"}]}}).json()["counts"] == {"notes": 1}
    r = c.post("/notes/get", json={"note_id": "n1"})
    assert r.status_code == 200 and r.json()["note"]["title"] == "A"
    assert c.post("/notes/get", content=b"{bad").status_code == 400
    assert c.post("/notes/nope", json={}).status_code == 404
    assert c.get("/notes/get").status_code == 405
    assert c.put("/notes/get", json={}).status_code == 405
    assert c.post("/reset", headers=h, content=b"[1").json()["error"]["type"] == "invalid_json"
    audit = c.get("/audit", headers=h).json()["entries"]
    assert [(e["path"], e["status"]) for e in audit] == [("/notes/get", 200), ("/notes/get", 400),
                                                         ("/notes/nope", 404)]
    assert c.get("/state", headers=h).json()["tables"]["notes"][0]["id"] == "n1"


def test_chunked_bodies(server):
  _, address, _ = server
  body = b'{"title": "C", "body": "chunked"}'
  request = (b"POST /notes/create HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
             b"Connection: close\r\n\r\n" + b"%x\r\n" % 10 + body[:10] + b"\r\n" +
             b"%x;ext=1\r\n" % (len(body) - 10) + body[10:] + b"\r\n0\r\nX-Trailer: y\r\n\r\n")
  answer = raw(address, request)
  assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
  assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["note"]["body"] == "chunked"
  with httpx.Client() as c:     # httpx streams an iterator body with chunked encoding
    r = c.post(f"http://{address[0]}:{address[1]}/notes/create",
               content=iter([b'{"title": "D", ', b'"body": "x"}']))
    assert r.status_code == 200 and r.json()["note"]["title"] == "D"


def test_persistent_connection(server):
  _, (host, port), _ = server
  conn = http.client.HTTPConnection(host, port, timeout=5)
  for _ in range(3):
    conn.request("POST", "/notes/list", body=b"{}", headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["total"] >= 0
  conn.close()


@pytest.mark.parametrize("request_bytes,status", [
    (b"POST /notes/list HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    (b"POST /notes/list HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /notes/list HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"fffffff\r\n", 413),
    (b"POST /notes/list HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
    (b"POST /notes/list HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 413),
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 150 + b"\r\n", 431),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", 400),
])
def test_malformed_requests_get_a_status_and_a_closed_connection(server, request_bytes, status):
  _, address, _ = server
  answer = raw(address, request_bytes)
  assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:100]
  assert b"Connection: close" in answer


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300) | st.builds(
    lambda m, p, b: f"{m} {p} HTTP/1.1\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b,
    st.sampled_from(["GET", "POST", "DELETE", "OPTIONS"]),
    st.sampled_from(["/health", "/reset", "/notes/create", "/x?y=1", "//", "/audit"]),
    st.binary(max_size=100)))
def test_hostile_bytes_never_stop_the_server(server, data):
  url, address, _ = server
  answer = raw(address, data, timeout=2.0)
  if answer:
    assert answer.startswith(b"HTTP/1.1 "), answer[:60]
  assert httpx.get(url + "/health", timeout=5).status_code == 200
