"""launch/sweep.py on swe_eval: each point's evaluation lands in the point's own run folder."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_local_sweep_of_swe_eval_writes_each_point_to_its_run_folder(tmp_path):
  # One instance without a test_spec: it grades as "error" without a sandbox image, which is
  # enough to see where each point writes its results.
  dataset = tmp_path / "instances.jsonl"
  dataset.write_text(json.dumps({"instance_id": "pkg__pkg-1", "repo": "pkg", "base_commit": "c",
                                 "patch": "", "test_patch": "", "problem_statement": "p",
                                 "FAIL_TO_PASS": [], "PASS_TO_PASS": []}) + "\n")
  base = tmp_path / "runs" / "ev"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "sweep.py"), "--config",
       os.path.join(ROOT, "experiments", "swe_eval.py"), "--sweep", "predictions=gold,empty",
       f"--config.tasks.dataset={dataset}", "--config.progress=false",
       f"--config.workdir={base}", f"--config.output_dir={tmp_path}/shared"],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert "[sweep] 2/2 points succeeded" in result.stdout
  for name in ("gold", "empty"):
    folder = tmp_path / "runs" / f"ev-predictions={name}" / name
    with open(folder / "summary.json") as f:
      assert json.load(f)["total_instances"] == 1
    with open(folder / "results.jsonl") as f:
      assert [json.loads(line)["instance_id"] for line in f] == ["pkg__pkg-1"]
  assert not (tmp_path / "shared").exists()     # no point wrote to the shared output_dir
  assert not base.exists()
