"""A rollout's world in real Orchard Env sandboxes (local bubblewrap backend): start-up, one
sandbox per world with nothing shared, bad arguments as readable 4xx results, a service that
dies mid-episode aborting the episode with the reason, injected faults, and a client inside the
sandbox (where an external harness runs) reaching the same services."""
import json

import pytest

from orchard_jax.harness.tool_agent import ToolAgent, ToolAgentConfig
from orchard_jax.tasks.claw import episode as episodes
from orchard_jax.tasks.claw import task as tasks
from orchard_jax.tasks.claw.errors import ServicesError
from orchard_jax.tasks.claw.solutions import ScriptedModel
from orchard_jax.tasks.claw.tools import select_tools
from orchard_jax.tasks.claw.world import ClawWorld

RESETS = {"notes": {"fixtures": {"notes": [{"id": "n1", "title": "A", "body": "alpha"}]}},
          "todos": {"fixtures": {"todos": [{"id": "t1", "title": "Pay rent"}]}}}


def test_calls_state_audit_and_errors(env_client):
  with ClawWorld(env_client, RESETS) as world:
    assert world.startup_s > 0 and set(world.pids) == {"notes", "todos"}
    ok = world.call("notes_get", '{"note_id": "n1"}')
    assert ok.status == 200 and not ok.is_error and json.loads(ok.content)["note"]["body"] == "alpha"
    bad = world.call("notes_create", '{"title": ""}')
    assert bad.is_error and bad.abort is None
    assert bad.content.startswith("Error 400 (invalid_arguments): arguments: missing required")
    broken = world.call("todos_create", '{"title": "x", ')
    assert broken.status == 400 and "not valid JSON" in broken.content
    missing = world.call("todos_complete", {"todo_id": "t9"})
    assert missing.status == 404 and "t9" in missing.content
    assert world.call("mail_send", {}).content.startswith("Error: unknown tool 'mail_send'")
    backend = world.backend(select_tools(["notes"], ["notes_get"]))
    refused = backend.call("notes_delete", '{"note_id": "n1"}')
    assert refused.is_error and "notes_get" in refused.content
    assert world.call("todos_complete", {"todo_id": "t1"}).status == 200
    evidence = world.evidence()
    assert evidence.alive == {"notes": True, "todos": True}
    assert [(e["operation"], e["status"]) for e in evidence.audit] == [
        ("notes_get", 200), ("notes_create", 400), ("todos_create", 400),
        ("todos_complete", 404), ("todos_complete", 200)]
    assert evidence.state["todos"]["todos"][0]["status"] == "done"
    assert evidence.state["notes"]["notes"][0]["body"] == "alpha"      # refused calls: no change


def test_two_worlds_share_nothing(env_client):
  with ClawWorld(env_client, RESETS) as a, ClawWorld(env_client, RESETS) as b:
    assert a.box.id != b.box.id and a.token != b.token
    a.call("notes_update", {"note_id": "n1", "body": "changed in A"})
    assert json.loads(b.call("notes_get", {"note_id": "n1"}).content)["note"]["body"] == "alpha"
    assert len(a.audit("notes")) == 1 and len(b.audit("notes")) == 1
    b.token, token = a.token, b.token           # A's token does not open B's control routes
    with pytest.raises(ServicesError, match="403"):
      b.audit("notes")
    b.token = token


def test_a_service_that_dies_aborts_the_episode_with_the_reason(env_client):
  task = tasks.eval_tasks()[0]
  for t in tasks.eval_tasks():
    if t.id == "notes_append_action":
      task = t

  def agent(world, backend, instruction):
    world.kill("notes")
    model = ScriptedModel(task.reference)
    return ToolAgent(model, backend, ToolAgentConfig()).run(instruction)

  ep = episodes.run_episode(task, env_client, agent)
  assert ep.exit_status == "aborted"
  assert ep.outcome.status == "aborted" and not ep.outcome.passed
  assert "notes service stopped answering mid-episode" in ep.outcome.error
  assert ep.evidence.alive == {"notes": False}
  assert len(ep.run.messages) == 4                   # system, user, the call, its error result


def test_injected_crash_and_latency(env_client):
  resets = {"todos": {"faults": {"crash_after": 2, "latency_ms": [300, 300]}}}
  with ClawWorld(env_client, resets) as world:
    first = world.call("todos_list", {})
    assert first.status == 200 and first.seconds >= 0.3
    assert world.call("todos_list", {}).status == 200
    dead = world.call("todos_list", {})
    assert dead.abort and "todos service stopped answering" in dead.abort
    assert world.call("todos_create", {"title": "x"}).abort == dead.abort
    assert world.evidence().alive == {"todos": False}


def test_a_client_inside_the_sandbox_reaches_the_services(env_client):
  with ClawWorld(env_client, RESETS) as world:
    url = world.internal_urls["notes"]
    script = ("import json, urllib.request as u\n"
              f"r = u.urlopen(u.Request('{url}/notes/search', data=b'{{\"query\": \"A\"}}', "
              "method='POST'))\nprint(json.load(r)['total'])\n"
              "try:\n"
              f"  u.urlopen('{url}/audit')\n"
              "except Exception as e:\n  print(e.code)\n")
    result = world.box.exec(["python3", "-c", script], timeout=30)
    assert result.stdout.split() == ["1", "403"], result.stderr
    assert [e["operation"] for e in world.audit("notes")] == ["notes_search"]


def test_bad_fixtures_fail_the_start_with_the_reason(env_client):
  with pytest.raises(ServicesError, match="todos.*priority"):
    with ClawWorld(env_client, {"todos": {"fixtures": {"todos": [
        {"title": "x", "priority": "urgent"}]}}}):
      pass


def test_egress_lets_an_in_sandbox_harness_reach_its_model_endpoint(env_client):
  """An external harness runs in the world's sandbox and reaches the model (the recording
  proxy) through the sandbox's egress allow-list; the stub here stands in for the proxy."""
  from tests.openai_stub import ChatStub
  with ChatStub(lambda request: "hello from the model") as stub, \
       ClawWorld(env_client, RESETS, egress=[stub.root]) as world:
    url = world.box.egress_url(stub.root + "/v1/chat/completions")
    script = ("import json, urllib.request as u\n"
              f"r = u.urlopen(u.Request('{url}', data=json.dumps({{'messages': []}}).encode(), "
              "headers={'Content-Type': 'application/json'}))\n"
              "print(json.load(r)['choices'][0]['message']['content'])\n")
    result = world.box.exec(["python3", "-c", script], timeout=60)
    assert result.stdout.strip() == "hello from the model", result.stderr
    assert len(stub.requests) == 1
