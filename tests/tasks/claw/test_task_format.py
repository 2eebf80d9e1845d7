"""Task files are checked when loaded: each kind of mistake is one TaskFormatError naming the
file and the field. Also the where-clause operators, and train/eval overlap detection."""
import copy
import json

import pytest

from orchard_jax.tasks.claw import predicates
from orchard_jax.tasks.claw.errors import TaskFormatError
from orchard_jax.tasks.claw.task import eval_tasks, load_tasks, overlap, task_from_dict

BASE = {
    "id": "notes_demo", "services": ["notes"], "instruction": "Add a note titled A.",
    "fixtures": {"notes": {"notes": [{"id": "n1", "title": "Old", "body": ""}]}},
    "grader": {"completion": [{"kind": "record", "service": "notes", "table": "notes",
                               "where": {"title": "A"}}]},
    "solutions": {"reference": [{"call": "notes_create", "args": {"title": "A", "body": ""}},
                                {"answer": "Done."}],
                  "wrong": [{"answer": "No."}]},
}


def variant(path, value):
  raw = copy.deepcopy(BASE)
  node = raw
  for key in path[:-1]:
    node = node[key]
  if value is KeyError:
    del node[path[-1]]
  else:
    node[path[-1]] = value
  return raw


@pytest.mark.parametrize("path,value,message", [
    (("colour",), "red", r"unknown field\(s\) \['colour'\]"),
    (("id",), "Bad Id!", "id: expected"),
    (("services",), ["notes", "fax"], "services: expected a list of distinct services"),
    (("tools",), ["notes_shred"], "matches no tool"),
    (("instruction",), "  ", "instruction: expected non-empty text"),
    (("fixtures",), {"mail": {}}, "fixtures: expected a mapping keyed by the task's services"),
    (("fixtures", "notes"), {"notes": [{"body": "no title"}]}, "fixtures/faults of notes"),
    (("faults",), {"notes": {"error_rate": 1.5}}, r"faults\.error_rate"),
    (("faults",), {"notes": {"operations": ["mail_send"]}}, "unknown operation"),
    (("grader", "completion"), [], "non-empty list of checks"),
    (("grader", "completion", 0, "kind"), "vibes", "kind one of"),
    (("grader", "completion", 0, "table"), "pages", "notes has tables"),
    (("grader", "completion", 0, "service"), "mail", "expected one of the task's services"),
    (("grader", "completion", 0, "where"), {"title": {"$like": "A"}}, "unknown operator"),
    (("grader", "completion", 0, "where"), {"title": {"$matches": "("}}, "not a regular expr"),
    (("grader", "completion", 0, "count"), {"least": 1}, "count: expected"),
    (("grader", "completion", 0, "weight"), 0, "weight: expected a positive number"),
    (("solutions", "reference", 0, "call"), "notes_shred", "not among the task's tools"),
    (("solutions", "reference", 0, "args"), {"title": 5, "body": ""},
     r"solutions\.reference\[0\]\.args\.title: expected a string"),
    (("solutions", "reference"), [{"answer": "x"}, {"call": "notes_list"}], "answer must be the last"),
    (("solutions", "wrong"), KeyError, r"solutions\.wrong: expected a non-empty list"),
    (("max_steps",), 0, "max_steps"),
])
def test_each_mistake_is_named(path, value, message):
  with pytest.raises(TaskFormatError, match=message) as info:
    task_from_dict(variant(path, value), "demo.yaml")
  assert str(info.value).startswith("demo.yaml: ")


def test_training_tasks_need_no_wrong_solution_and_files_load(tmp_path):
  train = variant(("solutions", "wrong"), KeyError)
  train["split"] = "train"
  assert task_from_dict(train).wrong == ()
  (tmp_path / "a.json").write_text(json.dumps(BASE))
  (tmp_path / "b.yaml").write_text("id: [unclosed\n")
  with pytest.raises(TaskFormatError, match="b.yaml: not valid YAML"):
    load_tasks(str(tmp_path))
  (tmp_path / "b.yaml").write_text(json.dumps({**BASE}))
  with pytest.raises(TaskFormatError, match="appears twice"):
    load_tasks(str(tmp_path))
  lines = tmp_path / "set.jsonl"
  lines.write_text(json.dumps(BASE) + "\n" + json.dumps({**BASE, "id": "other"}) + "\n")
  assert [t.id for t in load_tasks(str(lines))] == ["notes_demo", "other"]


def test_overlap_detection():
  evaluation = eval_tasks()
  same_text = copy.deepcopy(evaluation[0].to_dict())
  same_text.update(id="renamed", split="train")
  assert overlap([task_from_dict(same_text)], evaluation) == ["renamed"]
  fresh = variant(("instruction",), "Something else entirely.")
  assert overlap([task_from_dict(fresh)], evaluation) == []


@pytest.mark.parametrize("value,condition,expected", [
    ("Invoice INV-1", {"$icontains": "inv-1"}, True),
    (["a@x.io", "b@x.io"], {"$contains": "b@x.io"}, True),
    (["A@x.io"], {"$contains": "a@x.io"}, False),
    (["Procurement"], {"$icontains": "procure"}, True),
    ("2026-03-02T10:00:00+01:00", {"$gte": "2026-03-02T09:00:00Z", "$lt": "2026-03-02T09:30:00Z"}, True),
    ("2026-03-02T10:00:00+01:00", {"$gt": "2026-03-02T09:00:00Z"}, False),
    ([1, 2, 3], {"$len": 3}, True),
    ([{"email": "a", "response": "accepted"}, {"email": "b", "response": "declined"}],
     {"$any": {"email": "b", "response": "declined"}}, True),
    ([{"email": "a"}, {"email": "b"}], {"$all": {"email": {"$in": ["a", "b"]}}}, True),
    (["B", "a"], {"$set_eq": ["a", "b"]}, True),
    (["a", "a"], {"$set_eq": ["a"]}, False),
    (None, {"$empty": True}, True),
    ("x", {"$not": {"$eq": "x"}}, False),
    ("Call with insurer at 16:00", {"$matches": r"\b16[:.]00\b"}, True),
    (True, 1, False),
])
def test_operators(value, condition, expected):
  predicates.check_condition(condition, "test")
  assert predicates.satisfies(value, condition) is expected


def test_missing_fields_and_dotted_names():
  record = {"a": {"b": 1}, "n": None}
  assert predicates.matches(record, {"a.b": 1})
  assert not predicates.matches(record, {"a.c": 1})
  assert predicates.matches(record, {"a.c": {"$exists": False}, "n": {"$exists": False}})
  assert predicates.matches(record, {"zz": {"$ne": 1}})
