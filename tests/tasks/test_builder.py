"""The task builder on a real package (parse, from its sdist on the package index; the
environment is cached under the user's cache folder). Each built instance is checked by running
its tests again with plain git and pytest, independently of the builder's own bookkeeping."""
import json
import os
import shutil
import subprocess

import pytest

from orchard_jax.tasks.swe import builder
from orchard_jax.tasks.swe.builder import BuildSettings, build_task_set
from orchard_jax.tasks.swe.environment import build_environment
from orchard_jax.tasks.swe.log_parsers import parse_test_log
from orchard_jax.tasks.swe.packages import PROFILES
from orchard_jax.tasks.swe.testbed import setup_script
from tests.parse_tasks import SETTINGS



@pytest.fixture(scope="module")
def task_set(parse_tasks):
  # Built once into the user's cache folder (keyed by the settings), reused by later runs.
  return parse_tasks


def _git(repo, *args):
  return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                        text=True).stdout


def test_build_report_counts_every_candidate(task_set):
  [stats] = task_set.stats
  assert stats.kept == len(task_set.instances) == 3
  assert stats.tried == stats.kept + sum(stats.dropped.values())
  assert stats.baseline_tests > 50
  summary = task_set.summary()
  assert "tried" in summary and "kept" in summary and "parse-1.22.4" in summary
  report = json.loads(open(os.path.join(os.path.dirname(task_set.path),
                                        "build_report.json")).read())
  assert report["packages"][0]["kept"] == 3
  again = build_task_set(SETTINGS, progress=False)   # the settings of tests/parse_tasks.py
  assert again.from_cache and [i.instance_id for i in again.instances] == [
      i.instance_id for i in task_set.instances]


def test_instances_fail_at_base_and_pass_with_gold_patch(task_set, tmp_path):
  env = build_environment(PROFILES["parse"])
  for instance in task_set.instances:
    assert instance.FAIL_TO_PASS and instance.PASS_TO_PASS
    assert not set(instance.FAIL_TO_PASS) & set(instance.PASS_TO_PASS)
    # base_commit is a root commit: its history shows nothing of the fix.
    assert _git(env.repo, "rev-list", "--count", instance.base_commit).strip() == "1"
    # The statement is evidence from the tests, not the fix.
    for line in instance.patch.splitlines():
      if line.startswith(("+ ", "- ")) and len(line.strip()) > 12:
        assert line[1:].strip() not in instance.problem_statement
    work = tmp_path / instance.instance_id
    shutil.copytree(env.repo, work, symlinks=True)
    setup = subprocess.run(["bash", "-c", setup_script(instance, workdir=str(work))],
                           capture_output=True, text=True)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert _git(work, "log", "--all", "--format=%H").split() == [instance.base_commit]
    hidden = {t.split("::")[0] for t in instance.FAIL_TO_PASS}
    assert all(not (work / f).exists() for f in hidden)
    subprocess.run(["git", "apply"], input=instance.test_patch, text=True, cwd=work, check=True)
    tests = list(instance.FAIL_TO_PASS) + list(instance.PASS_TO_PASS)
    log, _, _ = env.run_tests(str(work), tests, timeout_s=120)
    status = parse_test_log(log)
    assert all(status.get(t) not in ("PASSED", "XFAIL") for t in instance.FAIL_TO_PASS)
    assert all(status.get(t) == "PASSED" for t in instance.PASS_TO_PASS)
    subprocess.run(["git", "apply"], input=instance.patch, text=True, cwd=work, check=True)
    # Gold patch + test patch reproduce the unmodified sdist exactly.
    _git(work, "add", "-A")
    assert _git(work, "write-tree") == _git(env.repo, "rev-parse", env.clean_commit + "^{tree}")
    log, _, _ = env.run_tests(str(work), tests, timeout_s=120)
    status = parse_test_log(log)
    assert all(status.get(t) == "PASSED" for t in tests)


def test_unknown_package_is_an_error(tmp_path):
  with pytest.raises(builder.BuildError, match="unknown package 'nope'"):
    build_task_set(BuildSettings(packages=("nope",)), output_dir=str(tmp_path), progress=False)


def test_instance_images_show_only_themselves(task_set, env_client):
  # Each instance's sandbox is the Debian root filesystem, the venv and its own seed: no host
  # folder (the trainer's interpreter, /work), no other instance's commit, no clean sdist.
  from orchard_jax.tasks.swe.testbed import open_sandbox
  assert "leak scan: dropped" in task_set.summary()
  env = build_environment(PROFILES["parse"])
  for instance in task_set.instances:
    with open(os.path.join(instance.test_spec.image, "image.json")) as f:
      manifest = json.load(f)
    assert manifest["base"] == "rootfs" and manifest["workspace_seed"] == "seed"
    with open_sandbox(env_client, instance.test_spec.image) as box:
      assert box.run(setup_script(instance), timeout_s=120).exit_code == 0
      out = box.run(f"git cat-file -e {env.clean_commit} && echo CLEAN-VISIBLE; "
                    "ls -d /root/.pyenv/versions /work 2>&1 | grep -c 'cannot access'; "
                    "git log --all --format=%H; python -c 'import sys; print(sys.prefix)'",
                    timeout_s=60).output.split()
      assert "CLEAN-VISIBLE" not in out
      assert out[:3] == ["2", instance.base_commit, "/venv"]
