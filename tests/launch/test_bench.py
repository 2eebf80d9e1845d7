"""launch/bench.py's output: --json writes every row with its ratio, into a folder it creates."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launch.benchmarks import common  # noqa: E402


def test_json_rows_land_in_a_folder_that_did_not_exist(tmp_path):
  # A user passing --json results/run1/bench.json after a long benchmark: the folder is made
  # rather than the measured rows lost to FileNotFoundError.
  rows = [common.Row("decode batch 8", "tokens/s", 300.0, 200.0, "transformers"),
          common.Row("exec p50", "ms", 4.0, 2.0, "bwrap", higher_is_better=False)]
  path = tmp_path / "results" / "run1" / "bench.json"
  common.write_json(str(path), rows)
  written = json.loads(path.read_text())
  assert [r["case"] for r in written] == ["decode batch 8", "exec p50"]
  assert [r["ratio"] for r in written] == [300.0 / 200.0, 2.0 / 4.0]


def test_a_misspelt_suite_is_one_line_and_status_2():
  """Was absl's usage text and flag list with the error last, status 1 (walkthrough)."""
  import subprocess
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, os.path.join(root, "launch", "bench.py"), "--suite",
                           "proxyy"], capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"error: --suite is 'proxyy'; expected one of {list(common.SUITES)} (see --help)"]


def test_a_missing_suite_says_it_is_required():
  """Was "--suite is None; expected one of ..." (walkthrough)."""
  import subprocess
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, os.path.join(root, "launch", "bench.py")],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"error: --suite is required: one of {list(common.SUITES)}, e.g. --suite model "
      "(see --help)"]


def test_cases_select_the_model_bench_presets(monkeypatch):
  import pytest

  from launch.benchmarks import model
  monkeypatch.setenv("ORCHARD_BENCH_CASES", "small, small_qwen3_5")
  assert [c[0] for c in model.selected_cases()] == ["small", "small_qwen3_5"]
  monkeypatch.setenv("ORCHARD_BENCH_CASES", "")
  assert model.selected_cases() == model.CASES
  monkeypatch.setenv("ORCHARD_BENCH_CASES", "smal")
  with pytest.raises(ValueError, match="smal"):
    model.selected_cases()


def test_profile_and_cases_are_refused_for_suites_that_ignore_them():
  import subprocess
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, os.path.join(root, "launch", "bench.py"), "--suite",
                           "proxy", "--cases", "small"], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2
  assert "--profile and --cases apply to --suite model" in result.stderr


def test_env_bench_phases_wait_for_network_namespace_teardown(monkeypatch):
  """launch/benchmarks/env.py's _settle: a phase starts after 5 looks in a row (50 ms apart)
  saw no kernel worker tearing down network namespaces, or after its limit."""
  from launch.benchmarks import env as env_bench
  assert env_bench._netns_teardown_running() in (True, False)   # reads this machine's /proc
  looks = iter([True, True, False, True] + [False] * 100)
  seen = []
  monkeypatch.setattr(env_bench, "_netns_teardown_running", lambda: seen.append(1) or next(looks))
  monkeypatch.setattr(env_bench.time, "sleep", lambda s: None)
  env_bench._settle("a phase")
  assert len(seen) == 4 + 5   # three busy looks, the last one after a quiet look, then 5 quiet
  clock = iter(range(1000))
  monkeypatch.setattr(env_bench.time, "monotonic", lambda: next(clock) * 0.05)
  monkeypatch.setattr(env_bench, "_netns_teardown_running", lambda: True)
  assert 1.0 <= env_bench._settle("a phase", limit=1.0) < 1.2   # never quiet: stops at the limit
