"""`bench --suite gpu` in CPU mode (what CI runs): the accelerator suite's code paths at tiny
shapes, every row labelled, every number finite, and bf16 logits following float32."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from launch.benchmarks import gpu  # noqa: E402


@pytest.mark.slow
def test_the_gpu_suite_runs_in_labelled_cpu_mode(tmp_path):
  out = tmp_path / "gpu.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  result = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "bench.py"), "--suite",
                           "gpu", "--json", str(out)], capture_output=True, text=True,
                          env=env, timeout=1500)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "running in CPU mode" in result.stderr
  rows = json.loads(out.read_text())
  assert all(r["case"].startswith("[CPU mode") for r in rows)
  assert all(math.isfinite(r["ours"]) and r["ours"] >= 0 for r in rows)
  decode = [r for r in rows if "decode" in r["case"]]
  assert [int(r["case"].split("batch ")[1].split(",")[0]) for r in decode] == list(
      gpu.CPU_MODE.decode_batches)
  agreement = {r["metric"]: r["ours"] for r in rows if "bf16 compute vs float32" in r["case"]}
  assert agreement["top-1 agreement"] >= 0.8
  assert agreement["mean KL(fp32 || bf16) nats/token"] < 1e-3
  train = [r for r in rows if "train step" in r["case"] and r["metric"] == "tokens/s"]
  assert len(train) == 1 and train[0]["ours"] > 0


def test_logits_agreement_against_hand_computed_values():
  ref = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
  low = np.log(np.array([[0.6, 0.3, 0.1], [0.1, 0.5, 0.4]]))
  got = gpu.logits_agreement(ref, low)
  kl = [0.7 * np.log(0.7 / 0.6) + 0.2 * np.log(0.2 / 0.3),
        0.3 * np.log(0.3 / 0.5) + 0.6 * np.log(0.6 / 0.4)]
  assert got["top1"] == 0.5
  assert got["kl"] == pytest.approx(np.mean(kl))
  assert got["max_abs_logprob"] == pytest.approx(np.log(0.6 / 0.4))


def test_datasheet_peaks_by_device_kind():
  assert gpu.peak_bf16("NVIDIA H200") == 989e12
  assert gpu.peak_bf16("NVIDIA H100 80GB HBM3") == 989e12
  assert gpu.peak_bf16("TPU v5 lite") == 197e12
  assert gpu.peak_bf16("cpu") is None
