"""SWE-bench instance schema and I/O: JSONL, JSON-encoded test lists (docs/cases.md 6), datasets."""
import datetime
import json

import pytest

from orchard_jax.tasks.swe.instance import (InstanceError, SWEInstance, TestSpec, load_instances,
                                            save_instances)


def _record(**overrides):
  record = {
      "instance_id": "octo__demo-1", "repo": "octo/demo", "base_commit": "a" * 40,
      "patch": "diff --git a/x.py b/x.py\n", "test_patch": "", "problem_statement": "It breaks.",
      "hints_text": "", "created_at": "2024-05-01T00:00:00", "version": "1.0",
      "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": ["tests/test_x.py::test_b"],
      "environment_setup_commit": "b" * 40}
  record.update(overrides)
  return record


def test_json_encoded_test_lists_are_normalised_to_lists(tmp_path):
  # As published Hugging Face copies of SWE-bench store them (docs/cases.md 6).
  record = _record(FAIL_TO_PASS='["tests/test_x.py::test_a", "tests/test_x.py::test_c"]',
                   PASS_TO_PASS="[]")
  path = tmp_path / "instances.jsonl"
  path.write_text(json.dumps(record) + "\n")
  [instance] = load_instances(path)
  assert instance.FAIL_TO_PASS == ("tests/test_x.py::test_a", "tests/test_x.py::test_c")
  assert instance.PASS_TO_PASS == ()
  assert instance.to_dict()["FAIL_TO_PASS"] == ["tests/test_x.py::test_a",
                                                "tests/test_x.py::test_c"]


def test_jsonl_round_trip_keeps_unknown_fields_and_test_spec(tmp_path):
  spec = {"image": "/images/demo", "test_files": ["tests"], "env": {"TZ": "UTC"},
          "timeout_s": 30}
  record = _record(image_name="swesmith.x86_64.demo", test_spec=spec)
  path = tmp_path / "in.jsonl"
  path.write_text(json.dumps(record) + "\n")
  [instance] = load_instances(path)
  assert instance.extra == {"image_name": "swesmith.x86_64.demo"}
  assert instance.test_spec.test_files == ("tests",) and instance.test_spec.env == {"TZ": "UTC"}
  out = tmp_path / "out.jsonl"
  save_instances([instance], out)
  again = json.loads(out.read_text())
  expected = dict(record, test_spec=dict(spec, timeout_s=30.0, workdir="/testbed",
                                         test_cmd=TestSpec("x").test_cmd, log_parser="pytest",
                                         package=""))
  assert again == expected


@pytest.mark.parametrize("field", ["instance_id", "repo", "base_commit", "problem_statement"])
def test_missing_required_field_is_named(tmp_path, field):
  record = _record()
  del record[field]
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(_record(instance_id="ok-1")) + "\n" + json.dumps(record) + "\n")
  with pytest.raises(InstanceError, match=rf"bad.jsonl:2.*{field}"):
    load_instances(path)


def test_bad_values_say_what_was_expected(tmp_path):
  with pytest.raises(InstanceError, match="FAIL_TO_PASS must be a list of test names"):
    SWEInstance.from_dict(_record(FAIL_TO_PASS=[1, 2]))
  with pytest.raises(InstanceError, match="not valid JSON"):
    SWEInstance.from_dict(_record(PASS_TO_PASS="[unclosed"))
  with pytest.raises(InstanceError, match="'patch' must be a string"):
    SWEInstance.from_dict(_record(patch=3))
  with pytest.raises(InstanceError, match="unknown keys"):
    SWEInstance.from_dict(_record(test_spec={"image": "/x", "bogus": 1}))
  path = tmp_path / "dup.jsonl"
  path.write_text(json.dumps(_record()) + "\n" + json.dumps(_record()) + "\n")
  with pytest.raises(InstanceError, match="already appeared"):
    load_instances(path)


def test_datasets_folder_and_parquet_round_trip(tmp_path):
  a = SWEInstance.from_dict(_record(test_spec={"image": "/images/demo", "env": {"A": "1"}}))
  b = SWEInstance.from_dict(_record(instance_id="octo__demo-2", test_spec={"image": "/images/d2"}))
  for target in (tmp_path / "ds", tmp_path / "set.parquet"):
    save_instances([a, b], target)
    assert load_instances(target) == [a, b]


def test_datasets_rows_with_json_strings_and_timestamps(tmp_path):
  import datasets
  rows = [_record(FAIL_TO_PASS='["t::a"]', PASS_TO_PASS='["t::b"]',
                  created_at=datetime.datetime(2023, 1, 2, 3, 4, 5))]
  datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
  [instance] = load_instances(tmp_path / "hf")
  assert instance.FAIL_TO_PASS == ("t::a",) and instance.PASS_TO_PASS == ("t::b",)
  assert instance.created_at.startswith("2023-01-02T03:04:05")
