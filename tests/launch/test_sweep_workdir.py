"""launch/sweep.py on swe_eval: each point's evaluation lands in the point's own run folder."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow   # two launcher processes, each grading in a real sandbox
def test_a_local_sweep_of_swe_eval_writes_each_point_to_its_run_folder(tmp_path):
  # One real instance of the shared parse task set (tests/parse_tasks.py), graded in real
  # sandboxes: gold resolves it, the empty patch does not.
  from orchard_jax.tasks.swe.instance import save_instances
  from tests.parse_tasks import parse_task_set
  instance = parse_task_set().instances[0]
  dataset = save_instances([instance], str(tmp_path / "instances.jsonl"))
  base = tmp_path / "runs" / "ev"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "sweep.py"), "--config",
       os.path.join(ROOT, "experiments", "swe_eval.py"), "--sweep", "predictions=gold,empty",
       f"--config.tasks.dataset={dataset}", "--config.progress=false",
       f"--config.workdir={base}", f"--config.output_dir={tmp_path}/shared"],
      cwd=tmp_path, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert "[sweep] 2/2 points succeeded" in result.stdout
  for name, outcome in (("gold", "resolved"), ("empty", "unresolved")):
    folder = tmp_path / "runs" / f"ev-predictions={name}" / name
    with open(folder / "summary.json") as f:
      assert json.load(f)["total_instances"] == 1
    with open(folder / "results.jsonl") as f:
      results = [json.loads(line) for line in f]
    assert [(r["instance_id"], r["outcome"]) for r in results] == [
        (instance.instance_id, outcome)], results
  assert not (tmp_path / "shared").exists()     # no point wrote to the shared output_dir
  assert not base.exists()
