"""`--suite train`: train-step throughput and model FLOPs utilisation for the tiny and small presets.

For each preset, at docs/peers.md's shapes (tiny 4 x 512, small 4 x 1024), float32, random init and
random token ids:
- orchard_jax: one full train step (forward, backward with chunked log-probs, AdamW update) of
  `orchard_jax.train` on all local devices, median of 5 after 2 warm-ups; tokens/s (small:
  4 rows as 4 accumulated microbatches, the same tokens per optimiser step).
- transformers (the same config through models.hf.config_to_hf; torch on 2 threads as docs/peers.md
  measured it): forward with labels + backward, no optimiser step; tokens/s.
- model FLOPs utilisation: training FLOPs per token from the config (6 x active matmul
  parameters incl. the LM head, plus causal attention 6 x layers x heads x head_dim x seq)
  times tokens/s, against the machine's fp32 matmul peak measured in the same run (a jitted
  2048 x 2048 @ 2048 x 2048 matmul through XLA, best of 8). The ratio column of that row is
  the MFU.
- the roofline of the step as compiled (launch/benchmarks/roofline.py): its FLOPs and bytes
  from XLA's cost analysis (loops weighted by trip count), the same-run memory bandwidth
  (STREAM triad), and the fraction max(FLOPs / peak, bytes / bandwidth) / step time.
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time

import numpy as np

from launch.benchmarks import common, roofline

# preset -> (batch, seq, microbatches). The small step accumulates 4 microbatches of one row:
# in one piece its backward needs ~15 GB of XLA temp memory on CPU (the MoE dispatch and the
# unfused attention keep large residuals), more than a shared 24 GB machine can spare.
_SHAPES = {"tiny": (4, 512, 1), "small": (4, 1024, 4)}
_WARMUP, _REPEATS = 2, 5


def train_flops_per_token(config, seq_len: int) -> float:
  """Training (forward + backward) FLOPs per token of a qwen3 / qwen3_moe config.

  6 FLOPs per active matmul parameter per token (Kaplan et al. 2020), plus attention scores and
  values over a causal window (on average half of seq_len keys): 6 * L * H * Dh * seq.
  """
  c = config
  if c.architecture not in ("qwen3", "qwen3_moe"):
    raise ValueError(f"FLOPs formula covers qwen3 and qwen3_moe; got {c.architecture}")
  attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
  per_layer = []
  for i in range(c.num_hidden_layers):
    moe = (c.num_experts > 0 and i not in c.mlp_only_layers
           and (i + 1) % c.decoder_sparse_step == 0)
    if moe:
      mlp = (c.num_experts_per_tok * 3 * c.hidden_size * c.moe_intermediate_size
             + c.hidden_size * c.num_experts)
    else:
      mlp = 3 * c.hidden_size * c.intermediate_size
    per_layer.append(attention + mlp)
  matmul_params = sum(per_layer) + c.hidden_size * c.vocab_size
  attention_flops = 6 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seq_len
  return 6.0 * matmul_params + attention_flops


def _batch(vocab: int, batch: int, seq: int) -> dict:
  rng = np.random.default_rng(0)
  weights = np.ones((batch, seq), np.float32)
  weights[:, 0] = 0.0
  return dict(input_ids=rng.integers(0, vocab, (batch, seq)).astype(np.int32),
              positions=np.tile(np.arange(seq, dtype=np.int32), (batch, 1)),
              segment_ids=np.ones((batch, seq), np.int32), loss_weights=weights)


def _ours(preset: str, batch: int, seq: int, microbatches: int
          ) -> tuple[float, roofline.Cost]:
  from orchard_jax import models
  return train_step_throughput(models.get_preset(preset), batch, seq, microbatches,
                               warmup=_WARMUP, repeats=_REPEATS)


def train_step_throughput(config, batch: int, seq: int, microbatches: int, *, warmup: int,
                          repeats: int) -> tuple[float, roofline.Cost]:
  """Tokens/s of one full orchard_jax train step (SFT loss, AdamW) and XLA's cost of it.

  Args:
    config: models.ModelConfig (its dtype is the compute dtype, param_dtype the master
      weights').
    batch, seq: rows and tokens per row of the global batch (random ids).
    microbatches: gradient-accumulation steps.
    warmup, repeats: untimed steps after compilation, then timed ones (median counts).
  Returns:
    (tokens per second, roofline.Cost of the compiled step).
  """
  import jax
  from flax import nnx

  from orchard_jax import models, parallel, train
  mesh = parallel.make_mesh({"data": -1}) if batch % len(jax.devices()) == 0 else \
      parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
  model = parallel.create_sharded(lambda: models.CausalLM(config, rngs=nnx.Rngs(0)), mesh)
  parts = train.ModelParts.of(model)
  opt_config = train.OptimizerConfig(learning_rate=1e-4, warmup_steps=0, total_steps=100)
  optimizer = train.make_optimizer(opt_config)
  params = parts.pure_params()
  shardings = train.state_shardings(optimizer, params, mesh, parts.param_shardings(mesh))
  state = {"s": train.init_train_state(optimizer, params, seed=0, shardings=shardings)}
  step = train.build_train_step(parts, train.SFTLoss(chunk_size=512), optimizer,
                                train.learning_rate_schedule(opt_config), mesh=mesh,
                                shardings=shardings, microbatches=microbatches,
                                load_balancing_coef=config.router_aux_loss_coef)
  data = _batch(config.vocab_size, batch, seq)
  with jax.set_mesh(mesh):
    compiled = step.jitted.lower(state["s"], data).compile()
  cost = roofline.compiled_cost(compiled)

  def one():
    with jax.set_mesh(mesh):
      state["s"], metrics = compiled(state["s"], data)
    jax.block_until_ready(metrics["loss"])

  times = common.time_calls(one, warmup=warmup, repeats=repeats)
  del state, model
  return batch * seq / statistics.median(times), cost


def _transformers(preset: str, batch: int, seq: int) -> tuple[float, str]:
  import torch
  import transformers

  from orchard_jax.models import get_preset, hf
  torch.set_num_threads(2)
  torch.manual_seed(0)
  config = get_preset(preset)
  hf_config = hf.config_to_hf(dataclasses.replace(config, param_dtype="float32"))
  model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**hf_config)).train()
  ids = torch.as_tensor(_batch(config.vocab_size, batch, seq)["input_ids"], dtype=torch.long)

  def one():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()

  times = common.time_calls(one, warmup=_WARMUP, repeats=_REPEATS)
  del model
  name = f"transformers {transformers.__version__} (torch {torch.__version__}, 2 threads), fwd+bwd"
  return batch * seq / statistics.median(times), name


def run() -> list[common.Row]:
  from orchard_jax import models
  start = time.perf_counter()
  machine = roofline.measure_machine()
  peak = machine.matmul_flops_per_s
  rows = [common.Row(case="this machine, same run", metric="memory bandwidth GB/s (STREAM "
                     "triad through XLA)", ours=machine.bytes_per_s / 1e9)]
  for preset, (batch, seq, microbatches) in _SHAPES.items():
    theirs, name = _transformers(preset, batch, seq)
    gc.collect()
    ours, cost = _ours(preset, batch, seq, microbatches)
    gc.collect()
    case = f"{preset} qwen3_moe train step {batch}x{seq}"
    rows.append(common.Row(case=case, metric="tokens/s (ours: incl. AdamW)", ours=ours,
                           baseline=theirs, baseline_name=name))
    flops = train_flops_per_token(models.get_preset(preset), seq)
    rows.append(common.Row(case=case, metric="model GFLOP/s (ratio = MFU)", ours=ours * flops / 1e9,
                           baseline=peak / 1e9, baseline_name="fp32 matmul peak, measured"))
    unknown = f", {cost.unknown_trip_loops} loops counted once" if cost.unknown_trip_loops else ""
    rows.append(common.Row(case=case, metric="step GFLOP: XLA cost analysis" + unknown,
                           ours=cost.flops / 1e9, baseline=flops * batch * seq / 1e9,
                           baseline_name="model FLOPs (6 x active params + attention)",
                           higher_is_better=False))
    rows.append(common.Row(case=case, metric="step GB accessed: XLA cost analysis (cache "
                           "traffic too)", ours=cost.bytes_accessed / 1e9))
    rows.append(common.Row(case=case, metric="step GB compulsory (arguments + outputs)",
                           ours=cost.compulsory_bytes / 1e9))
    rows.append(common.Row(case=case, metric="fraction of roofline of XLA's step cost "
                           f"({machine.bound(cost)}-bound)",
                           ours=machine.fraction(cost, batch * seq / ours), baseline=1.0,
                           baseline_name="the roofline"))
  rows.append(common.Row(case="suite wall time", metric="s", ours=time.perf_counter() - start,
                         higher_is_better=False))
  return rows
