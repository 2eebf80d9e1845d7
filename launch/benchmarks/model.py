"""`python launch/bench.py --suite model`: policy forward+backward throughput and peak memory,
orchard_jax vs transformers (PyTorch), same config, same batch, same threads, float32.

Cases follow docs/peers.md: the `tiny` and `small` presets of both architectures
(qwen3_moe: tiny, small; qwen3_5_moe: tiny_qwen3_5, small_qwen3_5) at batch 4 x 512 (tiny) and
4 x 1024 (small), random token ids, loss = mean next-token cross-entropy over the batch
(transformers: `model(input_ids, labels=input_ids).loss`, its own shifted cross-entropy over
materialised logits; orchard_jax: `models.next_token_loss`, the same quantity with the LM head
and cross-entropy fused chunk by chunk, models.losses). Neither side adds the router's
load-balancing loss (transformers only does with output_router_logits), to compare the same
work. Both sides compute in float32 (no reduced-precision matmuls).

Each side runs in its own subprocess (so peak RSS is its own), with the same cores: torch
with torch.set_num_threads(THREADS) (and OMP_NUM_THREADS); XLA:CPU sizes its thread pool to
the cores the process may run on, so on a machine with more than THREADS cores both workers
are pinned to cores 0..THREADS-1 with taskset (on this project's 2-core machines THREADS is
all of them). Timing: `warmup` untimed steps, then the median of `repeats` steps
(tiny 2 + 5, small 1 + 3). Besides tokens/s (wall clock) each case reports the process's CPU
seconds per step (all threads): the work done, which stays meaningful when other jobs share
the cores and wall-clock ratios are only provisional. orchard_jax's step is one jitted function computing the loss and
the gradients of all parameters (the first call, compilation, is excluded like warm-ups).

Roofline rows: the same run measures this machine's float32 matmul peak on a 2048^3 matmul,
same threads, for torch and for JAX (XLA:CPU's own dot kernel, which every matmul of ours
runs through), and divides each by the case's model FLOPs per token (`model_flops_per_token`:
6 x matmul parameters active per token + causal attention and Gated DeltaNet terms, the PaLM
paper's MFU convention, appendix B). The best of the two is the throughput no implementation
can exceed in float32 here; the JAX one is what no XLA-compiled implementation of the same
FLOPs can exceed (a large square matmul is the kernel's best case; a training step's matmuls
are smaller and come with non-matmul work). Its ratio to transformers is therefore the largest
ratio reachable by orchard_jax on this machine without hand-written CPU kernels. Each side's
achieved model TFLOP/s (MFU numerator) is printed beside it.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from launch.benchmarks import common  # noqa: E402

THREADS = 2
CASES = (  # (preset, architecture label, batch, seq, warmup, repeats, target ratio)
    ("tiny", "qwen3_moe", 4, 512, 2, 5, None),
    ("tiny_qwen3_5", "qwen3_5_moe", 4, 512, 2, 5, None),
    ("small", "qwen3_moe", 4, 1024, 1, 3, 2.0),
    ("small_qwen3_5", "qwen3_5_moe", 4, 1024, 1, 3, 2.0),
)


def run() -> list[common.Row]:
  import transformers
  baseline = f"transformers {transformers.__version__} (torch, {THREADS} threads, fp32)"
  rows = []
  peaks = _subprocess("peak", "", 0, 0, 0, 0)
  peak, jax_peak = max(peaks["torch"], peaks["jax"]), peaks["jax"]
  for preset, arch, batch, seq, warmup, repeats, target in CASES:
    ours = _subprocess("ours", preset, batch, seq, warmup, repeats)
    theirs = _subprocess("transformers", preset, batch, seq, warmup, repeats)
    case = f"{preset} ({arch}) fwd+bwd {batch}x{seq}"
    rows.append(common.Row(case=case, metric="tokens/s", ours=ours["tokens_per_s"],
                           baseline=theirs["tokens_per_s"], baseline_name=baseline,
                           target=target))
    rows.append(common.Row(case=case, metric="peak RSS GB", ours=ours["peak_rss_gb"],
                           baseline=theirs["peak_rss_gb"], baseline_name=baseline,
                           higher_is_better=False))
    rows.append(common.Row(case=case, metric="CPU s/step", ours=ours["cpu_s_per_step"],
                           baseline=theirs["cpu_s_per_step"], baseline_name=baseline,
                           higher_is_better=False))
    flops = model_flops_per_token(_config(preset), seq)
    rows.append(common.Row(case=case, metric="model TFLOP/s", ours=ours["tokens_per_s"] * flops
                           / 1e12, baseline=theirs["tokens_per_s"] * flops / 1e12,
                           baseline_name=baseline))
    rows.append(common.Row(case=case, metric=f"tokens/s at fp32 peak ({peak / 1e9:.0f} GF/s)",
                           ours=peak / flops, baseline=theirs["tokens_per_s"],
                           baseline_name=baseline + " (achieved)"))
    rows.append(common.Row(case=case,
                           metric=f"tokens/s at XLA:CPU matmul peak ({jax_peak / 1e9:.0f} GF/s)",
                           ours=jax_peak / flops, baseline=theirs["tokens_per_s"],
                           baseline_name=baseline + " (achieved)"))
  return rows


def model_flops_per_token(config, seq: int) -> float:
  """Model FLOPs of one training token (forward + backward), float multiply-adds x 2.

  6 x (matmul parameters active per token: every non-embedding weight, top-k of the routed
  experts, and the LM head) + per full-attention layer 6 x seq x heads x head_dim (QK^T and PV
  over a causal window of seq/2 on average, forward 2 matmuls x 2 FLOPs, backward twice that)
  + per Gated DeltaNet layer 6 x value heads x (2 x k_dim x v_dim + 64 x (k_dim + v_dim)) (state
  read and update, and the intra-chunk terms of a 64-token chunk). Recomputation (remat) is not
  counted: MFU convention of the PaLM paper, appendix B.

  Args:
    config: models.ModelConfig.
    seq: tokens per sequence.
  """
  from orchard_jax.models import params
  counts = params.count_params(config)
  lookup = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
  flops = 6.0 * (counts.active - lookup)
  layer_types = config.layer_types or ("full_attention",) * config.num_hidden_layers
  for kind in layer_types:
    if kind == "full_attention":
      flops += 6.0 * seq * config.num_attention_heads * config.head_dim
    else:
      k, v = config.linear_key_head_dim, config.linear_value_head_dim
      flops += 6.0 * config.linear_num_value_heads * (2 * k * v + 64 * (k + v))
  return flops


def _config(preset: str):
  import dataclasses

  from orchard_jax import models
  return dataclasses.replace(models.get_preset(preset), dtype="float32", param_dtype="float32")


def _subprocess(side: str, preset: str, batch: int, seq: int, warmup: int,
                repeats: int) -> dict:
  cmd = [sys.executable, "-m", "launch.benchmarks.model", side, preset, str(batch), str(seq),
         str(warmup), str(repeats)]
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)                 # one CPU device, not the tests' eight
  env["JAX_PLATFORMS"] = "cpu"
  env["OMP_NUM_THREADS"] = str(THREADS)
  if _has_taskset() and os.cpu_count() and os.cpu_count() > THREADS:
    cmd = ["taskset", "-c", f"0-{THREADS - 1}"] + cmd
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"benchmark worker {side} {preset} failed:\n{out.stderr[-4000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def _has_taskset() -> bool:
  from shutil import which
  return which("taskset") is not None


def _peak_rss_gb() -> float:
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20   # KiB on Linux


def _batch(vocab: int, batch: int, seq: int):
  import numpy as np
  rng = np.random.default_rng(0)
  return rng.integers(0, vocab, (batch, seq)).astype(np.int32)


def _time(step, warmup: int, repeats: int) -> tuple[float, float]:
  """Median wall seconds and median process CPU seconds (all threads) of one step."""
  for _ in range(warmup):
    step()
  walls, cpus = [], []
  for _ in range(repeats):
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
  return common.median(walls), common.median(cpus)


def _worker_peak(*_) -> dict:
  """Float32 matmul FLOP/s of a 2048^3 matmul, THREADS threads: {"torch": ..., "jax": ...}."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  torch.set_num_threads(THREADS)
  n = 2048
  a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  ta = torch.from_numpy(a)
  ja = jnp.asarray(a)
  matmul = jax.jit(lambda x: x @ x)
  torch_s = min(common.time_calls(lambda: ta @ ta, warmup=2, repeats=8))
  jax_s = min(common.time_calls(lambda: matmul(ja).block_until_ready(), warmup=2, repeats=8))
  return {"torch": 2 * n ** 3 / torch_s, "jax": 2 * n ** 3 / jax_s}


def _worker_ours(preset: str, batch: int, seq: int, warmup: int, repeats: int) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from orchard_jax import models
  config = _config(preset)
  model = models.CausalLM(config, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  ids = jnp.asarray(_batch(config.vocab_size, batch, seq))
  positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
  segments = jnp.ones((batch, seq), jnp.int32)

  def loss_fn(params):
    loss, _ = models.next_token_loss(nnx.merge(graphdef, params), ids, positions, segments)
    return loss

  step = jax.jit(jax.value_and_grad(loss_fn))
  jax.block_until_ready(step(params))        # compile
  median, cpu = _time(lambda: jax.block_until_ready(step(params)), warmup, repeats)
  return {"tokens_per_s": batch * seq / median, "peak_rss_gb": _peak_rss_gb(),
          "cpu_s_per_step": cpu}


def _worker_transformers(preset: str, batch: int, seq: int, warmup: int, repeats: int) -> dict:
  import torch
  import transformers

  from orchard_jax import models
  from orchard_jax.models import hf
  torch.set_num_threads(THREADS)
  torch.manual_seed(0)
  config = models.get_preset(preset)
  hf_config = transformers.AutoConfig.for_model(
      **dict(hf.config_to_hf(config), dtype="float32"))
  model = transformers.AutoModelForCausalLM.from_config(hf_config).float().train()
  ids = torch.tensor(_batch(config.vocab_size, batch, seq), dtype=torch.long)

  def step():
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()

  median, cpu = _time(step, warmup, repeats)
  return {"tokens_per_s": batch * seq / median, "peak_rss_gb": _peak_rss_gb(),
          "cpu_s_per_step": cpu}


if __name__ == "__main__":
  side, preset, batch, seq, warmup, repeats = sys.argv[1:7]
  worker = {"ours": _worker_ours, "transformers": _worker_transformers,
            "peak": _worker_peak}[side]
  result = worker(preset, int(batch), int(seq), int(warmup), int(repeats))
  print(json.dumps(result))
