"""Bring your own SWE-bench data, end to end, from local mirrors the test makes.

The upstream-like repository is written here (a small package with a real git history: a bug,
then a commit that fixes it and adds its test), cloned bare into a mirrors folder as a user's
mirror would be. Instances are collected from the fixing commits at their real commits, built
(one environment on the root filesystem's default Python, one needing Python 3.9), validated in
real sandboxes (gold twice, empty twice) and graded. The full upstream dataset is a documented
command (README "Bring your own dataset"); CI has no network to the repositories' hosts.
"""
import json
import os
import subprocess

import pytest
from ml_collections import ConfigDict

from orchard_jax.recipes import swe
from orchard_jax.tasks.swe import (collect, evaluation, leak_scan, repo_env, testbed,
                                   validation)

pytestmark = pytest.mark.slow

_SETUP = """[project]
name = "{name}"
version = "0.1"
requires-python = ">=3.7"
classifiers = [{classifiers}]
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[tool.setuptools]
packages = ["{name}"]
"""
_BUGGY = "def clamp(x, lo, hi):\n    return max(lo, x)\n\n\ndef double(x):\n    return 2 * x\n"
_FIXED = "def clamp(x, lo, hi):\n    return min(hi, max(lo, x))\n\n\ndef double(x):\n    return 2 * x\n"
_TESTS = """import socket
from {name} import clamp, double


def test_double():
    assert double(2) == 4


def test_needs_network():     # fails in a sandbox: no network
    socket.create_connection(("192.0.2.1", 9), timeout=0.5)
"""
_NEW_TEST = "\n\ndef test_clamp_high():\n    assert clamp(9, 0, 5) == 5\n"


def _commit(repo, message, files, date):
  for path, text in files.items():
    os.makedirs(os.path.dirname(os.path.join(repo, path)) or repo, exist_ok=True)
    with open(os.path.join(repo, path), "w") as f:
      f.write(text)
  env = dict(os.environ, GIT_AUTHOR_NAME="dev", GIT_AUTHOR_EMAIL="dev@example.org",
             GIT_COMMITTER_NAME="dev", GIT_COMMITTER_EMAIL="dev@example.org",
             GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
  subprocess.run(["git", "-C", repo, "add", "-A"], check=True)
  subprocess.run(["git", "-C", repo, "commit", "-qm", message], check=True, env=env)
  return subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()


def _upstream(tmp, name, classifiers, date):
  repo = os.path.join(tmp, "work", name)
  subprocess.run(["git", "init", "-q", "-b", "main", repo], check=True)
  setup = {"pyproject.toml": _SETUP.format(name=name, classifiers=classifiers)}
  _commit(repo, "initial", {**setup, f"{name}/__init__.py": _BUGGY,
                            "tests/test_core.py": _TESTS.format(name=name)}, date)
  subprocess.run(["git", "-C", repo, "tag", "v0.1"], check=True)
  fix = _commit(repo, "Fix clamp ignoring the upper bound", {
      f"{name}/__init__.py": _FIXED,
      "tests/test_core.py": _TESTS.format(name=name) + _NEW_TEST}, date)
  _commit(repo, "later work", {"README": "later\n"}, date)
  mirror = os.path.join(tmp, "mirrors", "upstream", name + ".git")
  subprocess.run(["git", "clone", "-q", "--bare", repo, mirror], check=True)
  return fix


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  tmp = str(tmp_path_factory.mktemp("byod"))
  fixes = [{"repo": "upstream/clampy", "commit": _upstream(tmp, "clampy", "", "2024-05-01T00:00:00")},
           {"repo": "upstream/oldclamp", "commit": _upstream(
               tmp, "oldclamp", '"Programming Language :: Python :: 3.9"', "2021-06-01T00:00:00")}]
  source = repo_env.RepoSource(mirrors=os.path.join(tmp, "mirrors"), url_template="")
  instances, problems = collect.collect(fixes, source)
  assert problems == []
  build = repo_env.build_dataset(instances, repo_env.DatasetSettings(source=source),
                                 output_dir=os.path.join(tmp, "build"), progress=False)
  return tmp, fixes, instances, build


def test_collected_instances_are_at_their_real_upstream_commits(dataset):
  _, fixes, instances, _ = dataset
  for fix, instance in zip(fixes, instances):
    bare = os.path.join(dataset[0], "mirrors", fix["repo"] + ".git")
    parent = subprocess.run(["git", "-C", bare, "rev-parse", fix["commit"] + "^"],
                            capture_output=True, text=True).stdout.strip()
    assert instance.base_commit == parent and instance.version == "0.1"
    assert instance.patch.count("diff --git") == 1 and "min(hi" in instance.patch
    assert "tests/test_core.py" in instance.test_patch and "min(hi" not in instance.test_patch


def test_build_picks_interpreters_and_reports_each_instance(dataset):
  _, _, _, build = dataset
  assert build.counts == {"built": 2, "error": 0, "leak": 0}, build.summary()
  pythons = {r.instance_id.split("__")[1].split("-")[0]: r.python for r in build.reports}
  assert pythons == {"clampy": "3.11", "oldclamp": "3.9"}
  for instance in build.instances:
    assert instance.test_spec.test_files == ("tests/test_core.py",)
    with open(os.path.join(instance.test_spec.image, "image.json")) as f:
      manifest = json.load(f)
    assert manifest["base"] == "rootfs" and "/venv" in manifest["binds"].values()


def test_workspace_is_the_real_commit_with_history_hidden_and_no_host(dataset):
  _, fixes, _, build = dataset
  with swe.sandbox_client(ConfigDict(dict(url="", api_key=""))) as client:
    for fix, instance in zip(fixes, build.instances):
      with swe.sandbox_factory(client)(instance) as box:
        ready = box.run(testbed.setup_script(instance), timeout_s=120)
        assert ready.exit_code == 0, ready.output
        shown = box.run("git rev-parse HEAD; git log --all --oneline | wc -l; "
                        f"git cat-file -e {fix['commit']} && echo FIX-VISIBLE; "
                        "ls /root/.pyenv/versions 2>&1; ls /work 2>&1 | head -1; "
                        "git status --porcelain | wc -l; python -V",
                        timeout_s=60).output.split("\n")
        assert shown[0] == instance.base_commit and shown[1] == "1"
        assert "FIX-VISIBLE" not in shown
        assert any("No such file" in line for line in shown[3:5])   # no host /work
        assert shown[-3] == "0"                                     # a clean work tree
        wanted = "3.9" if "oldclamp" in instance.instance_id else "3.11"
        assert shown[-2].startswith(f"Python {wanted}")


def test_validation_keeps_usable_instances_and_drops_failing_pass_to_pass(dataset):
  tmp, _, _, build = dataset
  with swe.sandbox_client(ConfigDict(dict(url="", api_key=""))) as client:
    result = validation.validate(build.instances, swe.sandbox_factory(client),
                                 output_dir=os.path.join(tmp, "validate"), progress=False)
    assert all(r.usable for r in result.reports), result.summary()
    for instance in result.instances:
      assert instance.FAIL_TO_PASS == ("tests/test_core.py::test_clamp_high",)
      assert instance.PASS_TO_PASS == ("tests/test_core.py::test_double",)
    for name, rate in (("gold", 1.0), ("empty", 0.0)):
      predictions = evaluation.load_predictions(name, result.instances)
      summary = evaluation.evaluate_predictions(
          result.instances, predictions, sandbox_factory=swe.sandbox_factory(client),
          output_dir=os.path.join(tmp, "eval", name), progress=False)
      assert summary.resolved_rate == rate and not summary.failure


def test_leak_scan_finds_the_fix_in_every_form(dataset, tmp_path):
  _, fixes, instances, _ = dataset
  instance = instances[0]
  bare = os.path.join(dataset[0], "mirrors", fixes[0]["repo"] + ".git")
  fixed = leak_scan.fixed_sources(instance.patch, repo=bare, base_commit=instance.base_commit)
  assert [f.path for f in fixed] == ["clampy/__init__.py"] and fixed[0].blob
  tree = tmp_path / "image"
  (tree / "usr/lib/python3/dist-packages/clampy").mkdir(parents=True)
  (tree / "usr/lib/python3/dist-packages/clampy/__init__.py").write_text(_FIXED)
  (tree / "opt/other/clampy").mkdir(parents=True)
  (tree / "opt/other/clampy/__init__.py").write_text(_BUGGY)       # the bug: no leak
  import zipfile
  with zipfile.ZipFile(tree / "opt/clampy-0.2-py3-none-any.whl", "w") as wheel:
    wheel.writestr("clampy/__init__.py", _FIXED.replace("\n", "  \n"))   # whitespace differs
  subprocess.run(["git", "clone", "-q", "--bare", bare, str(tree / "srv/copy.git")], check=True)
  leaks = leak_scan.scan_trees([(str(tree), "/")], {instance.instance_id: fixed})
  assert sorted((l.path, l.form) for l in leaks) == [
      ("/opt/clampy-0.2-py3-none-any.whl!clampy/__init__.py", "archive"),
      ("/srv/copy.git", "git"), ("/usr/lib/python3/dist-packages/clampy/__init__.py", "text")]


def test_a_non_editable_install_of_a_later_commit_is_dropped_as_a_leak(dataset, tmp_path):
  # SWE-bench's environment_setup_commit is often later than the base: a plain `pip install .`
  # there copies the fixed source into the venv, which every sandbox can read.
  tmp, fixes, instances, _ = dataset
  leaky = instances[0].replace(environment_setup_commit=fixes[0]["commit"], version="leaky")
  specs = tmp_path / "specs.json"
  specs.write_text(json.dumps({"upstream/clampy": {"leaky": {
      "install": "python -m pip install .", "pip_packages": ["pytest"]}}}))
  source = repo_env.RepoSource(mirrors=os.path.join(tmp, "mirrors"), url_template="")
  build = repo_env.build_dataset([leaky], repo_env.DatasetSettings(source=source,
                                                                   specs=str(specs)),
                                 progress=False)
  assert build.counts == {"built": 0, "error": 0, "leak": 1}
  assert "site-packages/clampy/__init__.py (text copy" in build.reports[0].reason


def test_a_missing_interpreter_is_one_line_naming_it(dataset, tmp_path):
  tmp, _, instances, _ = dataset
  specs = tmp_path / "specs.json"
  specs.write_text(json.dumps({"upstream/clampy": {"*": {"python": "3.4"}}}))
  source = repo_env.RepoSource(mirrors=os.path.join(tmp, "mirrors"), url_template="")
  build = repo_env.build_dataset(instances[:1], repo_env.DatasetSettings(
      source=source, specs=str(specs)), progress=False)
  (report,) = build.reports
  assert report.status == "error" and "\n" not in report.reason
  assert "Python 3.4 is not installed here" in report.reason and "pyenv install 3.4" in report.reason


def test_evaluation_refuses_instances_without_test_spec_before_any_sandbox(dataset):
  _, _, instances, _ = dataset
  opened = []
  with pytest.raises(evaluation.EvaluationError, match="2 instance\\(s\\) have no test_spec"):
    evaluation.evaluate_predictions(instances, {i.instance_id: "" for i in instances},
                                    sandbox_factory=lambda i: opened.append(i), output_dir="/tmp/x",
                                    progress=False)
  assert opened == []


def test_rl_trains_on_a_dataset_of_upstream_fixes(dataset, tmp_path):
  # The RL recipe (BAR, tiny preset, one iteration) on the collected instances as a plain
  # SWE-bench file: no test_spec, so the job builds their images from the mirrors first.
  import contextlib
  import io
  from experiments import swe_bar
  from orchard_jax.tasks.swe.instance import save_instances
  from tests.recipes import conftest
  tmp, _, instances, _ = dataset
  path = save_instances(instances, str(tmp_path / "upstream.jsonl"))
  config = conftest.mini_config(swe_bar, tmp_path, path,
                                sft_source=conftest.sft_folder(tmp_path, instances))
  config.tasks.mirrors = os.path.join(tmp, "mirrors")
  config.tasks.build_dir = str(tmp_path / "build")
  config.rl.iterations = 1
  config.eval.update(dict(k=1, max_instances=1))
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    result = swe.train_rl(config)
  stdout = out.getvalue()
  assert "dataset build: 2 instances: built 2" in stdout
  assert "[it 1/1]" in stdout and "eval[train]" in stdout
  (stats,) = result["iterations"]
  assert stats["bar/rollouts"] >= 4
  trained = json.load(open(os.path.join(config.workdir, "tasks.json")))["train"]
  assert sorted(trained) == sorted(i.instance_id for i in instances)


def test_run_exits_nonzero_naming_the_instances_in_error(dataset, tmp_path):
  # One instance whose workspace cannot be set up (its seed is no repository): the sandbox
  # starts, the evaluation ends in `error`, and launch/run.py says how many and exits 1.
  import sys
  from orchard_jax.env.images import write_image_manifest
  from orchard_jax.tasks.swe import rootfs
  from orchard_jax.tasks.swe.instance import save_instances
  _, _, _, build = dataset
  good = build.instances[0]
  broken_dir = os.path.join(os.path.dirname(good.test_spec.image), "test-broken-seed")
  os.makedirs(os.path.join(broken_dir, "seed"), exist_ok=True)
  write_image_manifest(broken_dir, base="rootfs", rootfs=rootfs.build_rootfs().path,
                       workdir="/testbed", workspace_seed="seed")
  import dataclasses
  broken = good.replace(instance_id="upstream__broken-1", test_spec=dataclasses.replace(
      good.test_spec, image=broken_dir))
  path = save_instances([good, broken], str(tmp_path / "two.jsonl"))
  proc = subprocess.run([sys.executable, "launch/run.py", "--config", "experiments/swe_eval.py",
                         f"--config.tasks.dataset={path}", "--config.predictions=gold",
                         f"--config.output_dir={tmp_path / 'eval'}", "--config.progress=False"],
                        capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                            os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "error: 1 of 2 instance(s) ended in error" in proc.stderr
  assert "upstream__broken-1" in proc.stderr
  missing = good.replace(test_spec=dataclasses.replace(good.test_spec, image=broken_dir + "-no"))
  path = save_instances([missing], str(tmp_path / "missing.jsonl"))
  proc = subprocess.run([sys.executable, "launch/run.py", "--config", "experiments/swe_eval.py",
                         f"--config.tasks.dataset={path}", "--config.predictions=gold",
                         f"--config.output_dir={tmp_path / 'eval2'}"],
                        capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                            os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode == 2 and "do not exist" in proc.stderr.strip().splitlines()[-1]
  assert not (tmp_path / "eval2").exists()


def test_cluster_images_follow_swe_bench_naming(dataset):
  from orchard_jax.tasks.swe import dataset as byod
  _, _, instances, _ = dataset
  mapped = byod.with_cluster_images(instances, "swebench")
  assert mapped[0].test_spec.image == (
      f"swebench/sweb.eval.x86_64.upstream_1776_clampy-{instances[0].instance_id[-10:]}:latest")
  assert mapped[0].test_spec.test_files == ("tests/test_core.py",)
  assert "/opt/miniconda3/envs/testbed/bin" in mapped[0].test_spec.env["PATH"]
  ours = byod.with_cluster_images(instances, "registry.local:5000/orchard")
  assert ours[1].test_spec.image.startswith("registry.local:5000/orchard/sweb.eval.x86_64.")
  assert byod.container_image("django__django-11099") == (
      "swebench/sweb.eval.x86_64.django_1776_django-11099:latest")


def test_instance_images_push_to_a_registry_under_swe_bench_names(dataset, tmp_path):
  # The cluster path with images of our own: export one instance's image as OCI layers, push
  # it with skopeo to a registry on loopback (Debian's docker-registry), and read it back.
  import shutil
  import socket
  import tarfile
  import time
  from orchard_jax.tasks.swe import oci
  for tool in ("skopeo", "docker-registry"):
    assert shutil.which(tool), f"{tool} is installed by launch/install.sh"
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  (tmp_path / "registry.yml").write_text(
      f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'store'}\n"
      f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
  registry = subprocess.Popen(["docker-registry", "serve", str(tmp_path / "registry.yml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    for _ in range(100):
      with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
          break
      time.sleep(0.1)
    _, _, _, build = dataset
    instance = build.instances[1]                      # Python 3.9: four layers
    (pushed,) = oci.push_instances([instance], f"127.0.0.1:{port}/orchard",
                                   layout=str(tmp_path / "layout"), tls_verify=False)
    assert pushed.test_spec.image == (f"127.0.0.1:{port}/orchard/sweb.eval.x86_64."
                                      f"{instance.instance_id.replace('__', '_1776_')}:latest")
    info = json.loads(subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{pushed.test_spec.image}"],
        capture_output=True, text=True, check=True).stdout)
    assert len(info["Layers"]) == 4 and "VIRTUAL_ENV=/venv" in info["Env"]
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{pushed.test_spec.image}", f"dir:{tmp_path / 'back'}"], check=True)
    seed_layer = tmp_path / "back" / info["Layers"][-1].split(":")[1]
    with tarfile.open(seed_layer) as layer:
      shallow = layer.extractfile("testbed/.git/shallow").read().decode().strip()
    assert shallow == instance.base_commit
  finally:
    registry.terminate()
    registry.wait(timeout=10)


def test_files_the_install_generates_reach_the_workspace_untracked(dataset, tmp_path):
  # setuptools-scm / hatch-vcs write a version module into the source tree at install time;
  # the package cannot be imported without it, and it must never show up in a patch.
  tmp, _, instances, _ = dataset
  specs = tmp_path / "specs.json"
  specs.write_text(json.dumps({"upstream/clampy": {"*": {
      "pre_install": ["printf 'VERSION = 7\\n' > clampy/_version.py"],
      "install": "python -m pip install -e .", "pip_packages": ["pytest"]}}}))
  source = repo_env.RepoSource(mirrors=os.path.join(tmp, "mirrors"), url_template="")
  build = repo_env.build_dataset(instances[:1], repo_env.DatasetSettings(
      source=source, specs=str(specs)), progress=False)
  (instance,) = build.instances
  with swe.sandbox_client(ConfigDict(dict(url="", api_key=""))) as client:
    with swe.sandbox_factory(client)(instance) as box:
      assert box.run(testbed.setup_script(instance), timeout_s=120).exit_code == 0
      out = box.run("python -c 'import clampy._version as v; print(v.VERSION)'; "
                    "git status --porcelain | wc -l", timeout_s=60).output.split()
  assert out == ["7", "0"]
