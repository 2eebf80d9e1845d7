"""The assistant services in-process (the same code that runs in sandboxes): what each operation
does to the state, that a refused call changes nothing (property-based, every tool), fault
injection, reset atomicity, and the audit log."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax.tasks.claw.services import SERVICES
from orchard_jax.tasks.claw.tools import TOOLS

USER = {"name": "Alex Kim", "email": "alex@example.com", "timezone": "Europe/Berlin"}
NOW = "2026-03-02T09:00:00+01:00"
FIXTURES = {
    "mail": {"messages": [
        {"id": "m1", "from": "Dana Lee <dana@acme.com>", "to": ["alex@example.com", "li@x.io"],
         "cc": ["bo@x.io"], "subject": "Invoice", "body": "Please pay INV-1",
         "date": "2026-03-01T08:00:00Z",
         "attachments": [{"id": "a1", "filename": "inv.csv", "content": "total,42"}]},
        {"id": "m2", "folder": "sent", "from": "alex@example.com", "to": ["dana@acme.com"],
         "subject": "Re: Invoice", "body": "Paid.", "date": "2026-03-01T09:00:00Z"},
        {"id": "d1", "folder": "drafts", "to": [], "subject": "draft", "body": "..."}]},
    "calendar": {"events": [
        {"id": "e1", "title": "Standup", "start": "2026-03-02T09:30", "end": "2026-03-02T09:45",
         "recurrence": "FREQ=DAILY;COUNT=5"},
        {"id": "e2", "title": "Review", "organizer": "sam@x.io", "start": "2026-03-03T10:00",
         "end": "2026-03-03T11:00", "attendees": ["alex@example.com", "li@x.io"]}],
        "busy": [{"email": "li@x.io", "start": "2026-03-03T12:00:00Z", "end": "2026-03-03T13:00:00Z"}]},
    "contacts": {"contacts": [
        {"id": "c1", "name": "Dana Lee", "emails": ["dana@acme.com"], "tags": ["client"]},
        {"id": "c2", "name": "Li Wu", "emails": ["li@x.io"], "phones": ["+1 555 0100"]}]},
    "todos": {"todos": [{"id": "t1", "title": "Pay invoice", "due": "2026-03-03"},
                        {"id": "t2", "title": "Old", "status": "done"}]},
    "notes": {"notes": [{"id": "n1", "title": "Atlas", "body": "line 1", "tags": ["work"]}]},
    "files": {"files": {"/docs/a.txt": "alpha", "/docs/sub/b.txt": "beta", "/empty/": None}},
}


def service(name, faults=None, seed=0):
  s = SERVICES[name]()
  s.reset({"fixtures": FIXTURES[name], "faults": faults or {}, "now": NOW, "user": USER,
           "seed": seed})
  return s


def call(s, tool, args):
  status, body, _ = s.call(TOOLS[tool].path, json.dumps(args).encode())
  return status, body


# ----------------------------------------------------------------------------- property tests
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 200) | st.text(max_size=10) |
    st.sampled_from(["m1", "a1", "d1", "e1", "e2", "c1", "t1", "n1", "/docs/a.txt", "/docs",
                     "dana@acme.com", "2026-03-03T10:00", "inbox", "archive", "accepted"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3), max_leaves=8)


@st.composite
def tool_calls(draw):
  name = draw(st.sampled_from(sorted(TOOLS)))
  props = TOOLS[name].parameters["properties"]
  keys = draw(st.lists(st.sampled_from(sorted(props) + ["bogus"]), unique=True,
                       max_size=len(props) + 1))
  return name, {k: draw(json_values) for k in keys}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_calls())
def test_a_refused_call_changes_nothing_and_is_audited(case):
  name, args = case
  s = service(TOOLS[name].service)
  before = s.snapshot()
  status, body = call(s, name, args)
  assert status in (200, 400, 404, 409), (name, args, status, body)
  assert s.audit[-1]["operation"] == name and s.audit[-1]["status"] == status
  assert s.audit[-1]["arguments"] == args
  if status != 200:
    assert set(body["error"]) == {"type", "message"} and "\n" not in body["error"]["message"]
    assert s.snapshot() == before
  elif not TOOLS[name].mutates:
    assert s.snapshot() == before


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_any_body_bytes_get_a_json_answer(raw):
  s = service("mail")
  status, body, _ = s.call("/messages/send", raw)
  assert status in (200, 400) and isinstance(body, dict)


# ----------------------------------------------------------------------------- faults and reset
def test_fail_first_then_success_and_faulted_calls_change_nothing():
  s = service("mail", faults={"fail_first": 2, "statuses": [429, 500],
                              "operations": ["mail_send"]})
  args = {"to": ["bo@x.io"], "subject": "s", "body": "b"}
  statuses = [call(s, "mail_send", args)[0] for _ in range(3)]
  assert statuses == [429, 500, 200]
  assert [e["fault"] for e in s.audit] == [True, True, False]
  assert len([m for m in s.snapshot()["messages"] if m["folder"] == "sent"]) == 2  # m2 + one
  assert call(s, "mail_search", {"query": "invoice"})[0] == 200     # other operations unaffected


def test_random_faults_follow_the_seed():
  def run(seed):
    s = service("todos", faults={"error_rate": 0.5, "statuses": [500, 503]}, seed=seed)
    return [call(s, "todos_list", {})[0] for _ in range(30)]
  assert run(7) == run(7)
  assert run(7) != run(8)
  assert set(run(7)) == {200, 500, 503}


def test_a_bad_reset_keeps_the_old_state():
  s = service("contacts")
  before = s.snapshot()
  from orchard_jax.tasks.claw.services.core import BadArguments
  with pytest.raises(BadArguments, match="fixtures of contacts"):
    s.reset({"fixtures": {"contacts": [{"id": "x", "name": "N", "birthday": "soon"}]}})
  with pytest.raises(BadArguments, match="faults"):
    s.reset({"faults": {"error_rate": 2}})
  with pytest.raises(BadArguments, match="unknown field"):
    s.reset({"fixture": {}})
  assert s.snapshot() == before


# ----------------------------------------------------------------------------- semantics
def test_mail_reply_all_forward_and_drafts():
  s = service("mail")
  status, body = call(s, "mail_reply", {"message_id": "m1", "body": "ok", "reply_all": True})
  assert status == 200
  reply = body["message"]
  assert reply["to"] == ["dana@acme.com", "li@x.io"] and reply["cc"] == ["bo@x.io"]
  assert reply["subject"] == "Re: Invoice" and reply["in_reply_to"] == "m1"
  status, body = call(s, "mail_forward", {"message_id": "m1", "to": ["fin@x.io"]})
  assert body["message"]["subject"] == "Fwd: Invoice"
  assert [a["filename"] for a in body["message"]["attachments"]] == ["inv.csv"]
  assert "Please pay INV-1" in body["message"]["body"]
  assert call(s, "mail_send_draft", {"draft_id": "d1"})[0] == 409          # no recipient yet
  assert call(s, "mail_update_draft", {"draft_id": "d1", "to": ["x@y.io"]})[0] == 200
  assert call(s, "mail_send_draft", {"draft_id": "d1"})[1]["message"]["folder"] == "sent"
  assert call(s, "mail_update_draft", {"draft_id": "d1", "body": "x"})[0] == 409  # sent now
  status, body = call(s, "mail_get_attachment", {"message_id": "m1", "attachment_id": "zz"})
  assert status == 404 and "a1" in body["error"]["message"]


def test_mail_search_filters():
  s = service("mail")
  found = lambda **a: [m["id"] for m in call(s, "mail_search", a)[1]["messages"]]  # noqa: E731
  assert found(query="invoice") == ["m2", "m1"]
  assert found(query="invoice", folder="inbox") == ["m1"]
  assert found(has_attachment=True) == ["m1"]
  assert found(after="2026-03-01T08:30:00Z") == ["d1", "m2"]          # d1 is dated "now"
  assert found(**{"from": "dana"}) == ["m1"]
  call(s, "mail_move", {"message_id": "m1", "folder": "trash"})
  assert found(query="invoice") == ["m2"]                              # trash is not searched


def test_calendar_recurrence_invitations_and_free_busy():
  s = service("calendar")
  status, body = call(s, "calendar_list_events", {"start": "2026-03-02", "end": "2026-03-09"})
  titles = [(e["title"], e["start"]) for e in body["events"]]
  assert titles[:3] == [("Standup", "2026-03-02T09:30:00+01:00"),
                        ("Standup", "2026-03-03T09:30:00+01:00"),
                        ("Review", "2026-03-03T10:00:00+01:00")]
  assert sum(1 for t, _ in titles if t == "Standup") == 5
  assert [e["event_id"] for e in call(s, "calendar_list_invitations", {})[1]["invitations"]] == \
      ["e2"]
  assert call(s, "calendar_update_event", {"event_id": "e2", "title": "x"})[0] == 409
  assert call(s, "calendar_respond", {"event_id": "e2", "response": "declined"})[0] == 200
  busy = call(s, "calendar_free_busy", {"emails": ["alex@example.com", "li@x.io"],
                                        "start": "2026-03-03T00:00", "end": "2026-03-04T00:00"})
  busy = busy[1]["busy"]
  assert busy["alex@example.com"] == [{"start": "2026-03-03T09:30:00+01:00",
                                       "end": "2026-03-03T09:45:00+01:00"}]   # declined: free
  assert busy["li@x.io"] == [{"start": "2026-03-03T10:00:00+01:00",
                              "end": "2026-03-03T11:00:00+01:00"},
                             {"start": "2026-03-03T13:00:00+01:00",
                              "end": "2026-03-03T14:00:00+01:00"}]
  status, body = call(s, "calendar_delete_event", {"event_id": "e1",
                                                   "occurrence_start": "2026-03-04T09:00"})
  assert status == 404                                                  # no such occurrence
  assert call(s, "calendar_delete_event", {"event_id": "e1",
                                           "occurrence_start": "2026-03-04T09:30"})[0] == 200
  body = call(s, "calendar_list_events", {"start": "2026-03-02", "end": "2026-03-09",
                                          "query": "standup"})[1]
  assert len(body["events"]) == 4
  bad = call(s, "calendar_create_event", {"title": "x", "start": "2026-03-02T10:00",
                                          "end": "2026-03-02T09:00"})
  assert bad[0] == 400 and "after the start" in bad[1]["error"]["message"]


def test_contacts_todos_notes():
  c = service("contacts")
  assert call(c, "contacts_create", {"name": "D2", "emails": ["DANA@acme.com"]})[0] == 409
  assert [x["id"] for x in call(c, "contacts_search", {"query": "client"})[1]["contacts"]] == ["c1"]
  t = service("todos")
  assert call(t, "todos_complete", {"todo_id": "t2"})[0] == 409
  done = call(t, "todos_complete", {"todo_id": "t1"})[1]["todo"]
  assert done["status"] == "done" and done["completed"]
  assert call(t, "todos_update", {"todo_id": "t1", "due": ""})[1]["todo"]["due"] is None
  n = service("notes")
  assert call(n, "notes_update", {"note_id": "n1", "append": "line 2"})[1]["note"]["body"] == \
      "line 1\nline 2"
  assert call(n, "notes_update", {"note_id": "n1", "append": "x", "body": "y"})[0] == 400


def test_files_tree():
  f = service("files")
  assert call(f, "files_read", {"path": "/docs/../etc/passwd"})[0] == 400
  assert call(f, "files_read", {"path": "docs/a.txt"})[0] == 400
  assert call(f, "files_write", {"path": "/docs/a.txt", "content": "x"})[0] == 409
  assert call(f, "files_write", {"path": "/docs/a.txt", "content": "!", "mode": "append"}
              )[1]["written"]["size"] == 6
  assert call(f, "files_move", {"source": "/docs", "destination": "/archive/docs"})[0] == 200
  paths = sorted(e["id"] for e in f.snapshot()["files"])
  assert paths == ["/archive", "/archive/docs", "/archive/docs/a.txt", "/archive/docs/sub",
                   "/archive/docs/sub/b.txt", "/empty"]
  assert call(f, "files_move", {"source": "/archive", "destination": "/archive/docs/x"})[0] == 409
  assert call(f, "files_delete", {"path": "/archive"})[0] == 409          # not empty
  assert call(f, "files_delete", {"path": "/archive", "recursive": True})[1]["entries"] == 5
  hits = call(f, "files_search", {"query": "ALPHA"})[1]
  assert hits["total"] == 0
