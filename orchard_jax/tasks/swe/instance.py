"""The SWE-bench task instance: schema, validation, and JSONL / Hugging Face `datasets` I/O.

An instance is one repository state with a bug (or missing feature), the gold `patch` that
fixes it, the `test_patch` that adds the hidden tests, and the tests that decide the outcome:
FAIL_TO_PASS (fail before the fix, pass after) and PASS_TO_PASS (pass before and after). The
fields are SWE-bench's (princeton-nlp/SWE-bench, `swebench.harness.constants`), so SWE-bench
Verified, SWE-Gym and SWE-smith files load as they are; fields this schema does not know are kept
in `extra` and written back unchanged.

orchard_jax adds one optional extension field, `test_spec` (see `TestSpec`): where and how the
instance is evaluated (the image, the test command, which test files to run, the log parser).
The task builder fills it for the instances it makes; other data sets can be given one by the
user.
"""
from __future__ import annotations

import dataclasses
import datetime as _datetime
import json
import os
import shlex
from typing import Any, Iterable, Mapping, Sequence

from orchard_jax.tasks.errors import InstanceError

# The SWE-bench fields, in SWE-bench's order.
SWE_BENCH_FIELDS = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
    "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS",
    "environment_setup_commit")
_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
_TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


@dataclasses.dataclass(frozen=True)
class TestSpec:
  """How and where one instance is evaluated (orchard_jax's extension of the SWE-bench schema).

  Attributes:
    image: the sandbox image: an image directory's absolute path (local backend, docs/contracts.md
      "Env images"), "host", or a container image reference (Kubernetes backend).
    workdir: where the repository lives inside the sandbox (SWE-bench's "/testbed").
    test_cmd: the command that runs tests, without test arguments; the evaluator appends
      shell-quoted test files or pytest node ids (e.g. `tests/test_a.py::test_b`). It must
      print a log that `log_parser` understands (for pytest: run with `-rA`).
    test_files: the test files (SWE-bench's "test directives") the evaluator runs; every
      FAIL_TO_PASS and PASS_TO_PASS test lives in one of them.
    log_parser: name of the parser in `orchard_jax.tasks.swe.log_parsers.LOG_PARSERS`.
    timeout_s: wall-clock limit of one test run, in seconds.
    env: extra environment variables for the test run.
    package: the package environment the instance was built from ("toolz-1.2.0"), if any.
  """
  __test__ = False  # not a pytest test class
  image: str
  workdir: str = "/testbed"
  test_cmd: str = "python -m pytest -rA -p no:cacheprovider"
  test_files: tuple[str, ...] = ()
  log_parser: str = "pytest"
  timeout_s: float = 300.0
  env: Mapping[str, str] = dataclasses.field(default_factory=dict)
  package: str = ""

  def command(self, tests: Sequence[str] | None = None) -> str:
    """The shell command that runs `tests` (node ids or files); all of `test_files` if None."""
    targets = list(self.test_files if tests is None else tests)
    return " ".join([self.test_cmd] + [shlex.quote(t) for t in targets])

  def to_dict(self) -> dict:
    out = dataclasses.asdict(self)
    out["test_files"] = list(self.test_files)
    out["env"] = dict(self.env)
    return out

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "TestSpec":
    """Builds a TestSpec from a dict (a JSON object); unknown keys are an error.

    Raises:
      InstanceError: a key is unknown, `image` is missing, or a value has the wrong type.
    """
    if isinstance(data, str):
      data = _json_field("test_spec", data)
    if not isinstance(data, Mapping):
      raise InstanceError(f"test_spec must be an object, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
      raise InstanceError(f"test_spec has unknown keys {unknown}; expected a subset of {sorted(known)}")
    if not isinstance(data.get("image"), str) or not data["image"]:
      raise InstanceError(f"test_spec.image must be a non-empty string, got {data.get('image')!r}")
    values = dict(data)
    values["test_files"] = tuple(_string_list("test_spec.test_files", values.get("test_files", ())))
    values["env"] = {str(k): str(v) for k, v in (values.get("env") or {}).items()}
    if "timeout_s" in values:
      values["timeout_s"] = float(values["timeout_s"])
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class SWEInstance:
  """One SWE-bench task instance (docs/algorithms.md section 7 lists the fields).

  Use `SWEInstance.from_dict` to build one from a record with validation; FAIL_TO_PASS and
  PASS_TO_PASS may be lists or JSON-encoded strings of lists (as some Hugging Face copies of
  SWE-bench store them, docs/cases.md 6) and are normalised to tuples of test names.
  """
  instance_id: str
  repo: str
  base_commit: str
  problem_statement: str
  patch: str = ""
  test_patch: str = ""
  hints_text: str = ""
  created_at: str = ""
  version: str = ""
  FAIL_TO_PASS: tuple[str, ...] = ()
  PASS_TO_PASS: tuple[str, ...] = ()
  environment_setup_commit: str = ""
  test_spec: TestSpec | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_dict(cls, record: Mapping[str, Any]) -> "SWEInstance":
    """Validates a record (a JSONL line, a `datasets` row) and returns the instance.

    Raises:
      InstanceError: a required field is missing or empty, or a field has the wrong type; the
        message names the instance and the field, what was expected and what was seen.
    """
    if not isinstance(record, Mapping):
      raise InstanceError(f"an instance must be a JSON object, got {type(record).__name__}")
    where = f"instance {record.get('instance_id')!r}" if record.get("instance_id") else "instance"
    missing = [k for k in _REQUIRED if not record.get(k)]
    if missing:
      raise InstanceError(f"{where} is missing required field(s) {missing}; it has {sorted(record)}")
    values: dict[str, Any] = {}
    for name in SWE_BENCH_FIELDS:
      if name not in record or record[name] is None:
        continue
      value = record[name]
      if name in _TEST_LISTS:
        values[name] = tuple(_string_list(f"{where}: {name}", value))
      elif name == "created_at":
        values[name] = _timestamp(value)
      elif name == "version":
        values[name] = str(value)
      elif isinstance(value, str):
        values[name] = value
      else:
        raise InstanceError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    if record.get("test_spec") is not None:
      try:
        values["test_spec"] = TestSpec.from_dict(record["test_spec"])
      except InstanceError as e:
        raise InstanceError(f"{where}: {e}") from None
    values["extra"] = {k: v for k, v in record.items()
                       if k not in SWE_BENCH_FIELDS and k != "test_spec"}
    return cls(**values)

  def to_dict(self) -> dict:
    """The record as SWE-bench writes it (lists as JSON lists), plus `test_spec` and `extra`."""
    out: dict[str, Any] = {name: getattr(self, name) for name in SWE_BENCH_FIELDS}
    for name in _TEST_LISTS:
      out[name] = list(out[name])
    if self.test_spec is not None:
      out["test_spec"] = self.test_spec.to_dict()
    for key, value in self.extra.items():
      out.setdefault(key, value)
    return out

  def replace(self, **changes) -> "SWEInstance":
    return dataclasses.replace(self, **changes)


def _json_field(name: str, value: str):
  try:
    return json.loads(value)
  except json.JSONDecodeError as e:
    raise InstanceError(f"{name} is a string that is not valid JSON ({e}): {value[:120]!r}") from None


def _string_list(name: str, value) -> list[str]:
  if isinstance(value, str):
    value = _json_field(name, value) if value.strip() else []
  if hasattr(value, "tolist"):  # numpy / pyarrow arrays from datasets
    value = value.tolist()
  if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
    raise InstanceError(f"{name} must be a list of test names (strings), got {value!r:.200}")
  return list(value)


def _timestamp(value) -> str:
  if isinstance(value, (_datetime.datetime, _datetime.date)):
    return value.isoformat()
  if isinstance(value, (int, float)):  # epoch milliseconds, as some parquet copies store it
    seconds = value / 1000 if value > 1e11 else value
    return _datetime.datetime.fromtimestamp(seconds, _datetime.timezone.utc).isoformat()
  return str(value)


# ----------------------------------------------------------------------------- I/O


def load_instances(source: str | os.PathLike, *, split: str = "test") -> list[SWEInstance]:
  """Loads instances from a JSONL/JSON file, a parquet file, a `datasets` folder or a hub name.

  Args:
    source: `*.jsonl` (one instance per line), `*.json` (a list of instances), `*.parquet`, a
      folder written by `datasets.Dataset.save_to_disk` (or a DatasetDict folder, then `split`
      picks the split), or a Hugging Face dataset name such as "princeton-nlp/SWE-bench_Verified"
      (needs the hub or its local cache).
    split: the split to read from a DatasetDict or a hub dataset.

  Returns:
    The validated instances, in file order.

  Raises:
    InstanceError: a record does not match the schema (names the line or row), or two records
      share an instance_id.
    FileNotFoundError: `source` looks like a path and does not exist.
  """
  path = os.fspath(source)
  if path.endswith(".jsonl"):
    records = list(_read_jsonl(path))
  elif path.endswith(".json"):
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if not isinstance(data, list):
      raise InstanceError(f"{path}: expected a JSON list of instances, got {type(data).__name__}")
    records = [(f"{path}[{i}]", r) for i, r in enumerate(data)]
  else:
    records = [(f"{path}[{i}]", r) for i, r in enumerate(_read_dataset(path, split))]
  instances, seen = [], {}
  for where, record in records:
    try:
      instance = SWEInstance.from_dict(record)
    except InstanceError as e:
      raise InstanceError(f"{where}: {e}") from None
    if instance.instance_id in seen:
      raise InstanceError(f"{where}: instance_id {instance.instance_id!r} already appeared at "
                          f"{seen[instance.instance_id]}")
    seen[instance.instance_id] = where
    instances.append(instance)
  return instances


def save_instances(instances: Iterable[SWEInstance], path: str | os.PathLike) -> str:
  """Writes instances as JSONL (`*.jsonl`), parquet (`*.parquet`) or a `datasets` folder.

  The JSONL file is written to a temporary name and renamed, so a reader never sees half a file.

  Returns:
    The path written.
  """
  path = os.fspath(path)
  records = [i.to_dict() for i in instances]
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  if path.endswith(".jsonl"):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
  import datasets  # heavy; only when asked for
  dataset = datasets.Dataset.from_list([_arrow_safe(r) for r in records])
  if path.endswith(".parquet"):
    dataset.to_parquet(path)
  else:
    dataset.save_to_disk(path)
  return path


def _arrow_safe(record: dict) -> dict:
  # test_spec.env is a free-form mapping: keep it JSON-encoded so every row has one arrow type.
  record = dict(record)
  if record.get("test_spec") is not None:
    spec = dict(record["test_spec"])
    spec["env"] = json.dumps(spec.get("env", {}))
    record["test_spec"] = spec
  return record


def _read_jsonl(path: str):
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield f"{path}:{number}", json.loads(line)
      except json.JSONDecodeError as e:
        raise InstanceError(f"{path}:{number}: not a JSON object ({e}): {line[:120]!r}") from None


def _read_dataset(path: str, split: str):
  import datasets
  if path.endswith(".parquet"):
    dataset = datasets.Dataset.from_parquet(path)
  elif os.path.isdir(path):
    dataset = datasets.load_from_disk(path)
    if isinstance(dataset, datasets.DatasetDict):
      if split not in dataset:
        raise InstanceError(f"{path}: no split {split!r}; it has {sorted(dataset)}")
      dataset = dataset[split]
  elif os.path.sep in path and not os.path.exists(path):
    raise FileNotFoundError(f"no such instance file or dataset folder: {path}")
  else:
    dataset = datasets.load_dataset(path, split=split)
  for row in dataset:
    spec = row.get("test_spec")
    if isinstance(spec, dict) and isinstance(spec.get("env"), str):
      spec = dict(spec)
      spec["env"] = json.loads(spec["env"]) if spec["env"] else {}
      row = dict(row, test_spec=spec)
    yield row
