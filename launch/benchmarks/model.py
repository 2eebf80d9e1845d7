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

Roofline rows (launch/benchmarks/roofline.py): the same run measures this machine's float32
matmul peak on a 2048^3 matmul, same threads, through torch and through XLA (XLA:CPU's dot
kernel, which every matmul of ours runs through), and XLA's memory bandwidth (STREAM triad).
Each case then prints
- the step's FLOPs and bytes from XLA's cost analysis of the compiled step (every loop body
  weighted by its trip count), beside the model FLOPs (`model_flops_per_token`: 6 x matmul
  parameters active per token + causal attention and Gated DeltaNet terms, the PaLM paper's
  MFU convention, appendix B; recomputation and wasted work not counted);
- the fraction of the roofline reached with model FLOPs at the XLA peak (model FLOP/s over
  the XLA matmul peak; the project's target at `small` is >= 0.5): no XLA-compiled
  implementation of the same model can exceed 1.0 (a large square matmul is the kernel's best
  case; a training step's matmuls are smaller and come with non-matmul work);
- the same at torch's peak for both sides (transformers' fraction of its own roofline);
- the fraction of the roofline of XLA's own step cost, max(FLOPs / peak, bytes / bandwidth)
  over the step time: how close the compiled program runs to the machine's limit for the work
  it actually does (what remains is overhead: launch, copies, single-threaded ops);
- the step's matmuls timed alone at their own shapes (launch/benchmarks/dot_ceiling.py: each
  distinct dot of the compiled step compiled by itself, times its executions per step): their
  GFLOP/s beside the 2048^3 peak, and the ceiling they set on the first fraction, model
  roofline seconds over the matmuls' seconds: the most that fraction can reach with XLA:CPU's
  kernels at the step's shapes if every other op were free (an estimate: a dot alone may run
  faster or slower than inside the step).

Where the time goes: with ORCHARD_BENCH_PROFILE=DIR in the environment (`bench.py --profile
DIR`), the orchard_jax worker of each case traces one more step with jax.profiler after the
timed ones (launch/benchmarks/step_profile.py) and writes DIR/model_PRESET/: the Perfetto trace
(perfetto_trace.json.gz under plugins/profile/) and breakdown.json (op time by category:
matmul, dynamic-slice/update-slice, copy/transpose, reduce, elementwise fusions,
sort/scatter/gather, control flow, other; and the top ops with the JAX operation each came
from); the bench prints the breakdown beside each case. The traced step is not a timed one.
ORCHARD_BENCH_CASES=PRESET[,PRESET] (`bench.py --cases`) runs only those cases.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from launch import host_malloc, xla_env
from launch.benchmarks import common, dot_ceiling, roofline, step_profile

THREADS = 2
CASES = (  # (preset, architecture label, batch, seq, warmup, repeats)
    ("tiny", "qwen3_moe", 4, 512, 2, 5),
    ("tiny_qwen3_5", "qwen3_5_moe", 4, 512, 2, 5),
    ("small", "qwen3_moe", 4, 1024, 1, 3),
    ("small_qwen3_5", "qwen3_5_moe", 4, 1024, 1, 3),
)


def run() -> list[common.Row]:
  import transformers
  baseline = f"transformers {transformers.__version__} (torch, {THREADS} threads, fp32)"
  rows = []
  peaks = _subprocess("peak", "", 0, 0, 0, 0)
  machine = roofline.Machine(matmul_flops_per_s=peaks["jax"], bytes_per_s=peaks["bandwidth"])
  rows.append(common.Row(case="this machine, same run", metric="fp32 matmul peak GFLOP/s "
                         "(2048^3)", ours=peaks["jax"] / 1e9, baseline=peaks["torch"] / 1e9,
                         baseline_name=f"torch ({THREADS} threads)"))
  rows.append(common.Row(case="this machine, same run", metric="memory bandwidth GB/s (STREAM "
                         "triad through XLA)", ours=peaks["bandwidth"] / 1e9))
  for preset, arch, batch, seq, warmup, repeats in selected_cases():
    ours = _subprocess("ours", preset, batch, seq, warmup, repeats)
    if "profile" in ours:
      print(step_profile.format_summary(ours["profile"], title=f"{preset} ({arch}) fwd+bwd: "),
            flush=True)
    print(f"{preset} ({arch}) fwd+bwd: the step's matmuls alone, largest total time first "
          f"(share of their {ours['dot_seconds']:.2f} s):\n{ours['dot_top']}", flush=True)
    theirs = _subprocess("transformers", preset, batch, seq, warmup, repeats)
    case = f"{preset} ({arch}) fwd+bwd {batch}x{seq}"
    rows.append(common.Row(case=case, metric="tokens/s", ours=ours["tokens_per_s"],
                           baseline=theirs["tokens_per_s"], baseline_name=baseline))
    rows.append(common.Row(case=case, metric="peak RSS GB", ours=ours["peak_rss_gb"],
                           baseline=theirs["peak_rss_gb"], baseline_name=baseline,
                           higher_is_better=False, target=1.0 if preset.startswith("small")
                           else None))
    rows.append(common.Row(case=case, metric="CPU s/step", ours=ours["cpu_s_per_step"],
                           baseline=theirs["cpu_s_per_step"], baseline_name=baseline,
                           higher_is_better=False))
    rows.extend(roofline_rows(case, _config(preset), batch, seq, ours, theirs, peaks, machine,
                              baseline))
  return rows


def selected_cases() -> tuple:
  """CASES, or those whose preset ORCHARD_BENCH_CASES names (comma-separated).

  Raises:
    ValueError: ORCHARD_BENCH_CASES names a preset that is not a case.
  """
  names = [n.strip() for n in os.environ.get("ORCHARD_BENCH_CASES", "").split(",") if n.strip()]
  known = [case[0] for case in CASES]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"ORCHARD_BENCH_CASES names {unknown}; expected presets among {known}")
  return tuple(case for case in CASES if not names or case[0] in names)


def roofline_rows(case: str, config, batch: int, seq: int, ours: dict, theirs: dict,
                  peaks: dict, machine: roofline.Machine, baseline: str) -> list[common.Row]:
  """The case's place under this machine's roofline (module docstring, "Roofline rows")."""
  flops = model_flops_per_token(config, seq)
  step_s = batch * seq / ours["tokens_per_s"]
  cost = roofline.Cost(flops=ours["xla_flops"], bytes_accessed=ours["xla_bytes"],
                       compulsory_bytes=ours["compulsory_bytes"],
                       unknown_trip_loops=ours["unknown_trip_loops"])
  unknown = f", {cost.unknown_trip_loops} loops counted once" if cost.unknown_trip_loops else ""
  model_roofline_s = flops * batch * seq / peaks["jax"]
  return [
      common.Row(case=case, metric="step GFLOP: XLA cost analysis" + unknown,
                 ours=cost.flops / 1e9, baseline=flops * batch * seq / 1e9,
                 baseline_name="model FLOPs (6 x active params + attention / DeltaNet)",
                 higher_is_better=False),
      common.Row(case=case, metric="step GB accessed: XLA cost analysis (cache traffic too)",
                 ours=cost.bytes_accessed / 1e9),
      common.Row(case=case, metric="step GB compulsory (arguments + outputs)",
                 ours=cost.compulsory_bytes / 1e9),
      common.Row(case=case, metric="fraction of roofline at XLA:CPU peak (model FLOPs)",
                 ours=ours["tokens_per_s"] * flops / peaks["jax"], baseline=1.0,
                 baseline_name="the roofline", target=0.5 if case.startswith("small") else None),
      common.Row(case=case, metric="fraction of roofline at torch's peak (model FLOPs)",
                 ours=ours["tokens_per_s"] * flops / peaks["torch"],
                 baseline=theirs["tokens_per_s"] * flops / peaks["torch"],
                 baseline_name=baseline + " (its own)"),
      common.Row(case=case, metric=f"fraction of roofline of XLA's step cost "
                 f"({machine.bound(cost)}-bound)", ours=machine.fraction(cost, step_s),
                 baseline=1.0, baseline_name="the roofline"),
      common.Row(case=case, metric=f"step's matmuls alone: GFLOP/s at its {ours['dots']} dot "
                 f"shapes ({ours['dot_executions']} per step)",
                 ours=ours["dot_flops"] / ours["dot_seconds"] / 1e9,
                 baseline=peaks["jax"] / 1e9, baseline_name="XLA:CPU 2048^3 peak"),
      common.Row(case=case, metric="step's matmuls alone: seconds per step",
                 ours=ours["dot_seconds"], baseline=step_s, baseline_name="the whole step",
                 higher_is_better=False),
      common.Row(case=case, metric="ceiling on the fraction at XLA:CPU peak set by the "
                 "matmuls alone (estimate)", ours=model_roofline_s / ours["dot_seconds"],
                 baseline=1.0, baseline_name="the roofline"),
  ]


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
  xla_env.configure(env)                     # the schedule launched jobs use (xla_env.py)
  if side == "transformers":                 # transformers as its users run it: glibc's
    env.pop(host_malloc.GLIBC_ENV, None)     # default malloc
  else:                                      # ours as launched jobs run (host_malloc.py)
    host_malloc.configure(env)
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
  """This process's limits, THREADS threads: float32 matmul FLOP/s of a 2048^3 matmul through
  torch and through XLA, and XLA's STREAM-triad memory bandwidth in bytes/s."""
  import numpy as np
  import torch
  torch.set_num_threads(THREADS)
  n = 2048
  ta = torch.from_numpy(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
  torch_s = min(common.time_calls(lambda: ta @ ta, warmup=2, repeats=8))
  machine = roofline.measure_machine(matmul_n=n)
  return {"torch": 2 * n ** 3 / torch_s, "jax": machine.matmul_flops_per_s,
          "bandwidth": machine.bytes_per_s}


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

  step = jax.jit(jax.value_and_grad(loss_fn)).lower(params).compile()
  cost = roofline.compiled_cost(step)
  median, cpu = _time(lambda: jax.block_until_ready(step(params)), warmup, repeats)
  result = {"tokens_per_s": batch * seq / median, "peak_rss_gb": _peak_rss_gb(),
            "cpu_s_per_step": cpu, "xla_flops": cost.flops, "xla_bytes": cost.bytes_accessed,
            "compulsory_bytes": cost.compulsory_bytes,
            "unknown_trip_loops": cost.unknown_trip_loops}
  ceiling = dot_ceiling.measure(step.as_text())   # after peak RSS: its operands are small
  result.update(dot_seconds=ceiling.seconds, dot_flops=ceiling.flops, dots=ceiling.dots,
                dot_executions=ceiling.executions, dot_top=ceiling.format_top())
  if os.environ.get("ORCHARD_BENCH_PROFILE"):
    result["profile"] = _profile(step, (params,), f"model_{preset}")
  return result


def _profile(compiled, args: tuple, name: str) -> dict:
  """Traces one more call of `compiled` into ORCHARD_BENCH_PROFILE/name and returns its
  breakdown's summary (also written there as breakdown.json)."""
  out_dir = os.path.join(os.environ["ORCHARD_BENCH_PROFILE"], name)
  summary = step_profile.profile_step(compiled, args, out_dir).summary(top=15)
  with open(os.path.join(out_dir, "breakdown.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


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
