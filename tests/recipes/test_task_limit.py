"""tasks.limit: the first N instances of the task set; a negative N is refused, not sliced."""
import json

import ml_collections
import pytest

from orchard_jax.recipes import swe


def _tasks(tmp_path, limit):
  path = tmp_path / "instances.jsonl"
  path.write_text("".join(json.dumps({"instance_id": f"i{k}", "repo": "r", "base_commit": "c",
                                      "patch": "", "test_patch": "", "problem_statement": "p",
                                      "FAIL_TO_PASS": [], "PASS_TO_PASS": []}) + "\n"
                          for k in range(3)))
  return ml_collections.ConfigDict({"dataset": str(path), "limit": limit})


def test_limit_takes_the_first_instances(tmp_path):
  assert [i.instance_id for i in swe.load_task_set(_tasks(tmp_path, 2))] == ["i0", "i1"]
  assert len(swe.load_task_set(_tasks(tmp_path, 0))) == 3


def test_negative_limit_is_refused(tmp_path):
  # -1 reads as "no limit" to many users; instances[:-1] would silently drop the last one.
  with pytest.raises(ValueError, match="tasks.limit is -1; expected 0"):
    swe.load_task_set(_tasks(tmp_path, -1))


def test_an_unknown_package_is_refused_before_any_is_built(tmp_path):
  # Walkthrough: --config.tasks.packages=nosuchpkg was a BuildError traceback, raised only once
  # the packages listed before it had been built (minutes each on a fresh cache).
  from experiments import common
  from orchard_jax.recipes import ConfigError
  tasks = common.swe_tasks()
  tasks.packages = ("toolz", "nosuchpkg")
  tasks.output_dir = str(tmp_path / "tasksets")
  with pytest.raises(ConfigError, match=r"tasks.packages: unknown package\(s\) \['nosuchpkg'\]"):
    swe.load_task_set(tasks)
  assert not (tmp_path / "tasksets").exists()
