"""`python launch/bench.py --suite gpu`: the accelerator path users train on, in one run.

On a machine with an accelerator (jax.default_backend() is "gpu" or "tpu"), one run of a few
minutes on its first device measures:
- train-step MFU: one full train step of `orchard_jax.train` (SFT loss, AdamW) of a qwen3_moe of
  about 1.9B parameters with 64 routed experts, top 8 (`accelerator_config`), at 8 x 4096
  tokens, in the configuration a user trains with on an accelerator: bfloat16 compute with
  float32 master weights (ModelConfig.dtype / param_dtype), ragged-dot MoE dispatch
  (jax.lax.ragged_dot, a grouped matmul on GPU and TPU), each decoder layer rematerialised,
  the old state donated. MFU = model FLOPs per token (launch/benchmarks/model.py's
  `model_flops_per_token`, the PaLM paper's convention, appendix B) x tokens/s over the
  device's dense bf16 peak (`PEAK_BF16` by device kind; target 0.4); the same run's bf16
  matmul peak and XLA's cost of the step are printed beside it.
- decode throughput of the embedded engine (rollout.Engine) serving the same architecture in
  bfloat16: greedy, 128-token random prompts, exactly 128 new tokens, at batch 1, 32 and 256;
  new tokens per second over the whole call (prefill included), median of 2 after a warm-up.
- bf16 logits agreement: the same float32 weights run forward in float32 and in bfloat16
  compute over 2 x 1024 random tokens; top-1 agreement, mean KL(fp32 || bf16) per token and
  the largest |log-prob difference| of the float32 argmax token.

Without an accelerator the suite runs in CPU mode: the same code paths at tiny shapes (the
`tiny` preset with ragged-dot dispatch, bf16 compute, remat), every case labelled
"CPU mode"; its numbers check that the suite runs, they are not accelerator numbers. CI runs
it so (tests/launch/test_bench_gpu.py).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import numpy as np

from launch.benchmarks import common

# Dense bf16 peak FLOP/s by device kind (vendor datasheets; substring of jax's device_kind).
PEAK_BF16 = (
    ("H200", 989e12), ("H100", 989e12), ("H800", 989e12), ("GH200", 989e12),
    ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12),
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v4", 275e12),
)


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The sizes one mode runs at."""
  label: str
  train_batch: int
  train_seq: int
  decode_batches: tuple[int, ...]
  prompt: int
  new_tokens: int
  logits_batch: int
  logits_seq: int
  matmul_n: int


ACCELERATOR = Shapes("", train_batch=8, train_seq=4096, decode_batches=(1, 32, 256), prompt=128,
                     new_tokens=128, logits_batch=2, logits_seq=1024, matmul_n=8192)
CPU_MODE = Shapes("[CPU mode: tiny shapes, not accelerator numbers] ", train_batch=2,
                  train_seq=128, decode_batches=(1, 4), prompt=16, new_tokens=8, logits_batch=2,
                  logits_seq=64, matmul_n=512)


def accelerator_config(backend: str = "gpu"):
  """The train-step model: qwen3_moe, 16 layers, hidden 1024, 16 q / 4 kv heads of 128, 64
  experts top 8 of width 512, Qwen's 151,936-token vocabulary: 2.0B parameters (0.60B active
  per token), bf16 compute, float32 master weights, ragged-dot dispatch, remat, fused
  attention (cuDNN's on a GPU, XLA's jax.nn.dot_product_attention elsewhere)."""
  from orchard_jax import models
  return dataclasses.replace(
      models.get_preset("small"), architecture="qwen3_moe", vocab_size=151936,
      hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
      head_dim=128, moe_intermediate_size=512, num_experts=64, num_experts_per_tok=8,
      shared_expert_intermediate_size=0, layer_types=(), moe_dispatch="ragged",
      dtype="bfloat16", param_dtype="float32", remat=True,
      attention_impl="cudnn" if backend == "gpu" else "xla")


def cpu_mode_config():
  """The same paths at the `tiny` preset's sizes (XLA's fused attention)."""
  from orchard_jax import models
  return dataclasses.replace(models.get_preset("tiny"), moe_dispatch="ragged",
                             dtype="bfloat16", param_dtype="float32", remat=True,
                             attention_impl="xla")


def peak_bf16(device_kind: str) -> float | None:
  """The dense bf16 peak FLOP/s of a device kind, or None when `PEAK_BF16` lacks it."""
  for name, peak in PEAK_BF16:
    if name.lower() in device_kind.lower():
      return peak
  return None


def run() -> list[common.Row]:
  import jax
  accelerator = jax.default_backend() != "cpu"
  shapes = ACCELERATOR if accelerator else CPU_MODE
  config = accelerator_config(jax.default_backend()) if accelerator else cpu_mode_config()
  device = jax.devices()[0]
  if not accelerator:
    print("bench --suite gpu: no accelerator here; running in CPU mode (tiny shapes).",
          file=sys.stderr)
  rows = _train_rows(config, shapes, device)
  rows += _decode_rows(config, shapes)
  rows += _agreement_rows(config, shapes)
  return rows


def _train_rows(config, shapes: Shapes, device) -> list[common.Row]:
  from launch.benchmarks.model import model_flops_per_token
  from launch.benchmarks.train import train_step_throughput
  from orchard_jax.models import params

  measured = _bf16_matmul_peak(shapes.matmul_n)
  spec = peak_bf16(device.device_kind)
  rows = []
  try:
    tokens_per_s, cost = train_step_throughput(config, shapes.train_batch, shapes.train_seq, 1,
                                               warmup=2, repeats=5)
  except Exception as error:  # cuDNN refuses some shapes and versions: say so, use XLA
    if config.attention_impl != "cudnn":
      raise
    print(f"bench --suite gpu: cuDNN attention failed ({str(error).splitlines()[0][:200]}); "
          "measuring with XLA's attention", file=sys.stderr)
    config = dataclasses.replace(config, attention_impl="xla")
    tokens_per_s, cost = train_step_throughput(config, shapes.train_batch, shapes.train_seq, 1,
                                               warmup=2, repeats=5)
  flops = model_flops_per_token(config, shapes.train_seq)
  counts = params.count_params(config)
  case = (f"{shapes.label}{device.device_kind}: qwen3_moe {counts.total / 1e9:.2f}B params "
          f"({counts.active / 1e9:.2f}B active, {config.num_experts} experts top "
          f"{config.num_experts_per_tok}) train step {shapes.train_batch}x{shapes.train_seq}, "
          f"bf16 compute / fp32 master, ragged dispatch, remat, {config.attention_impl} attention")
  achieved = tokens_per_s * flops
  rows += [
      common.Row(case=case, metric="tokens/s", ours=tokens_per_s),
      common.Row(case=case, metric="model TFLOP/s (ratio = MFU at the datasheet bf16 peak)",
                 ours=achieved / 1e12, baseline=None if spec is None else spec / 1e12,
                 baseline_name=f"{device.device_kind} dense bf16 peak" if spec else
                 "datasheet peak unknown for this device", target=0.4 if spec else None),
      common.Row(case=case, metric="model TFLOP/s (ratio = MFU at the measured bf16 matmul "
                 f"peak, {shapes.matmul_n}^3)", ours=achieved / 1e12,
                 baseline=measured / 1e12, baseline_name="bf16 matmul, same run"),
      common.Row(case=case, metric="step TFLOP: XLA cost analysis", ours=cost.flops / 1e12,
                 baseline=flops * shapes.train_batch * shapes.train_seq / 1e12,
                 baseline_name="model FLOPs", higher_is_better=False),
  ]
  return rows


def _bf16_matmul_peak(n: int) -> float:
  import jax
  import jax.numpy as jnp
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.bfloat16)
  matmul = jax.jit(lambda x: x @ x)
  seconds = min(common.time_calls(lambda: matmul(a).block_until_ready(), warmup=2, repeats=10))
  return 2.0 * n ** 3 / seconds


def _decode_rows(config, shapes: Shapes) -> list[common.Row]:
  from flax import nnx

  from orchard_jax.data import tiny_tokenizer
  from orchard_jax.models import CausalLM
  from orchard_jax.rollout import Engine, EngineConfig, SamplingParams, SingleGenerateRequest

  serving = dataclasses.replace(config, param_dtype="bfloat16", remat=False)
  model = CausalLM(serving, rngs=nnx.Rngs(0))
  largest = max(shapes.decode_batches)
  length = shapes.prompt + shapes.new_tokens
  engine_config = EngineConfig(
      max_batch_size=largest, batch_buckets=shapes.decode_batches, max_seq_len=length,
      cache_len_buckets=(length,), prefill_chunk_buckets=(shapes.prompt,), decode_steps=32,
      seed=0, prefix_cache=False)
  sampling = SamplingParams(max_new_tokens=shapes.new_tokens, temperature=0.0, ignore_eos=True)
  rng = np.random.default_rng(0)
  rows = []
  with Engine(model, tiny_tokenizer(), config=engine_config) as engine:
    for batch in shapes.decode_batches:
      prompts = rng.integers(10, min(serving.vocab_size, 8000), size=(batch, shapes.prompt))
      requests = [SingleGenerateRequest(input_ids=row.tolist(), sampling_params=sampling)
                  for row in prompts]

      def call(requests=requests):
        outs = engine.generate(requests)
        if any(len(o.output_ids) != shapes.new_tokens for o in outs):
          raise RuntimeError("the engine returned fewer tokens than asked for")

      seconds = statistics.median(common.time_calls(call, warmup=1, repeats=2))
      rows.append(common.Row(
          case=f"{shapes.label}engine greedy decode, bf16, batch {batch}, {shapes.prompt}-token "
               f"prompt, {shapes.new_tokens} new", metric="new tokens/s",
          ours=batch * shapes.new_tokens / seconds))
  return rows


def _agreement_rows(config, shapes: Shapes) -> list[common.Row]:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from orchard_jax.models import CausalLM

  fp32 = dataclasses.replace(config, dtype="float32", param_dtype="float32", remat=False)
  graphdef, state = nnx.split(CausalLM(fp32, rngs=nnx.Rngs(0)))
  bf16_graphdef = nnx.split(nnx.eval_shape(lambda: CausalLM(
      dataclasses.replace(fp32, dtype="bfloat16"), rngs=nnx.Rngs(0))))[0]
  b, t = shapes.logits_batch, shapes.logits_seq
  ids = jnp.asarray(np.random.default_rng(1).integers(0, fp32.vocab_size, (b, t)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))

  def logprobs(graph):
    @jax.jit
    def fn(state):
      logits = nnx.merge(graph, state)(ids, positions, jnp.ones_like(ids))[0]
      return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return fn

  ref, low = logprobs(graphdef)(state), logprobs(bf16_graphdef)(state)
  agreement = logits_agreement(np.asarray(ref), np.asarray(low))
  case = f"{shapes.label}bf16 compute vs float32, same weights, {b}x{t} tokens"
  return [common.Row(case=case, metric="top-1 agreement", ours=agreement["top1"]),
          common.Row(case=case, metric="mean KL(fp32 || bf16) nats/token", ours=agreement["kl"]),
          common.Row(case=case, metric="max |log p diff| of the fp32 argmax token",
                     ours=agreement["max_abs_logprob"])]


def logits_agreement(ref: np.ndarray, low: np.ndarray) -> dict[str, float]:
  """How closely log-probs `low` follow the reference `ref`, both [..., vocab] log-softmax.

  Returns:
    {"top1": share of positions with the same argmax, "kl": mean over positions of
    sum_v p_ref (log p_ref - log p_low), "max_abs_logprob": max over positions of
    |log p_ref - log p_low| at the reference's argmax}.
  """
  top = ref.argmax(-1)
  kl = np.sum(np.exp(ref) * (ref - low), axis=-1)
  at_top = np.take_along_axis(ref - low, top[..., None], axis=-1)[..., 0]
  return {"top1": float(np.mean(top == low.argmax(-1))), "kl": float(np.mean(kl)),
          "max_abs_logprob": float(np.max(np.abs(at_top)))}
