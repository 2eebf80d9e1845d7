"""`--suite sampler`: decode throughput of the embedded engine against transformers' generate.

Both sides run the tiny Qwen3-MoE preset (docs/peers.md: vocab 8192, hidden 256, 4 layers, 4 q / 2
kv heads, head_dim 64, 8 experts top-2, moe_intermediate 256, float32, random init), greedy,
a 128-token random prompt per row and exactly 128 new tokens, at batch 1 and 8. Throughput is
new tokens per second over the whole call (prefill included), median of `_REPEATS` runs after a
warm-up run (which compiles / allocates). transformers runs `generate(do_sample=False,
use_cache=True)` with torch limited to 2 threads, as docs/peers.md measured it. The engine uses the
same 2 cores as 2 data-parallel schedulers of 4 rows each (EngineConfig.data_parallel; a batch
of 1 runs on one of them), the configuration the engine's docstring recommends for a CPU with
2 or more cores; one more row gives the engine with one scheduler of 8 rows (no target).
The engine's prefix cache is off: every repeat sends the same prompts, which it
would otherwise not prefill again (transformers prefills them every time).

Roofline rows (launch/benchmarks/roofline.py): the same run measures XLA's float32 matmul peak
and memory bandwidth; XLA's cost analysis gives the FLOPs and its buffer assignment the
compulsory bytes (arguments + outputs) of the work one call
does at each batch: one prefill of the batch's prompts plus `_NEW` decode steps over a cache of
`_PROMPT + _NEW` positions, with the MoE dispatch the engine picks for decode steps. The
roofline time of the call is max(FLOPs / peak, bytes / bandwidth) summed over those programs,
a decode step's bandwidth being the larger of DRAM's and that of a triad over the step's own
footprint (a tiny model's weights and cache can stay in cache between steps);
the fraction printed is that time over the measured one (sampling, scheduling and the host
loop count against it, as they do for a user).
"""
from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from launch.benchmarks import common, roofline

_PROMPT, _NEW, _REPEATS = 128, 128, 3
_BATCHES = (1, 8)
_DATA_PARALLEL = 2


def _ours(prompts: dict[int, np.ndarray], data_parallel: int,
          batches: tuple[int, ...]) -> tuple[dict[int, float], int]:
  from flax import nnx

  from orchard_jax.data import tiny_tokenizer
  from orchard_jax.models import CausalLM, get_preset
  from orchard_jax.rollout import Engine, EngineConfig, SamplingParams, SingleGenerateRequest

  model = CausalLM(get_preset("tiny"), rngs=nnx.Rngs(0))
  config = EngineConfig(max_batch_size=8, batch_buckets=(1, 8), max_seq_len=_PROMPT + _NEW,
                        cache_len_buckets=(_PROMPT + _NEW,), prefill_chunk_buckets=(_PROMPT,),
                        decode_steps=32, seed=0, prefix_cache=False,
                        data_parallel=data_parallel)
  params = SamplingParams(max_new_tokens=_NEW, temperature=0.0, ignore_eos=True)
  results = {}
  with Engine(model, tiny_tokenizer(), config=config) as engine:
    for batch in batches:
      requests = [SingleGenerateRequest(input_ids=row.tolist(), sampling_params=params)
                  for row in prompts[batch]]

      def run():
        outs = engine.generate(requests)
        assert all(len(o.output_ids) == _NEW for o in outs)

      times = common.time_calls(run, warmup=1, repeats=_REPEATS)
      results[batch] = batch * _NEW / statistics.median(times)
    compiles = engine.compile_count
  return results, compiles


def _transformers(prompts: dict[int, np.ndarray]) -> tuple[dict[int, float], str]:
  import torch
  import transformers

  from orchard_jax.models import get_preset, hf

  torch.set_num_threads(2)
  torch.manual_seed(0)
  config = transformers.Qwen3MoeConfig(**hf.config_to_hf(get_preset("tiny")))
  model = transformers.Qwen3MoeForCausalLM(config).eval()
  results = {}
  for batch in _BATCHES:
    ids = torch.as_tensor(prompts[batch], dtype=torch.long)

    def run():
      with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             use_cache=True, max_new_tokens=_NEW, min_new_tokens=_NEW,
                             pad_token_id=0)
      assert out.shape[1] == _PROMPT + _NEW

    times = common.time_calls(run, warmup=1, repeats=_REPEATS)
    results[batch] = batch * _NEW / statistics.median(times)
  return results, f"transformers {transformers.__version__} (torch {torch.__version__}, 2 threads)"


def call_costs(batch: int) -> tuple[roofline.Cost, roofline.Cost]:
  """XLA's cost of the prefill of `batch` prompts and of one decode step of `batch` rows
  (tiny preset, the engine's decode MoE dispatch, a cache of _PROMPT + _NEW positions)."""
  import dataclasses

  import jax.numpy as jnp
  from flax import nnx

  from orchard_jax.models import CausalLM, get_preset
  from orchard_jax.rollout.engine import _decode_dispatch

  config = get_preset("tiny")
  graphdef, state = nnx.split(CausalLM(config, rngs=nnx.Rngs(0)))
  decode = _decode_dispatch("auto", config)
  decode_graphdef = graphdef if decode is None else nnx.split(CausalLM(
      dataclasses.replace(config, moe_dispatch=decode), rngs=nnx.Rngs(0)))[0]
  cache = nnx.merge(graphdef, state).init_cache(batch, _PROMPT + _NEW)

  def forward(graph):
    def fn(state, cache, ids, positions):       # as rollout.runner: logits of the last column
      model = nnx.merge(graph, state)
      hidden, _, cache = model.model(ids, positions, jnp.ones_like(ids), cache=cache)
      return model.logits(hidden[:, -1]), cache
    return fn

  prompt = jnp.zeros((batch, _PROMPT), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(_PROMPT, dtype=jnp.int32), (batch, _PROMPT))
  prefill = roofline.program_cost(forward(graphdef), state, cache, prompt, positions)
  step = roofline.program_cost(forward(decode_graphdef), state, cache, prompt[:, :1],
                               positions[:, -1:])
  return prefill, step


def step_read_bytes(config, batch: int, compulsory_bytes: float) -> float:
  """The bytes a decode step of `batch` rows must move at least: its compulsory bytes
  (arguments + outputs, every weight counted whole) less the weights no row can read. Of the
  embedding table [vocab, hidden] a step gathers one row per batch row; of a MoE layer's
  num_experts experts (gate, up and down projections, [hidden, moe_intermediate] each) it
  runs at most batch x num_experts_per_tok. float32 weights (4 bytes an element)."""
  embedding = 4.0 * config.vocab_size * config.hidden_size
  unread = embedding * (1.0 - min(1.0, batch / config.vocab_size))
  if config.num_experts:
    experts = 4.0 * 3 * config.num_experts * config.hidden_size * config.moe_intermediate_size
    moe_layers = sum(config.is_moe_layer(i) for i in range(config.num_hidden_layers))
    used = min(1.0, batch * config.num_experts_per_tok / config.num_experts)
    unread += moe_layers * experts * (1.0 - used)
  return compulsory_bytes - unread


def run() -> list[common.Row]:
  from orchard_jax.models import get_preset

  rng = np.random.default_rng(0)
  prompts = {b: rng.integers(10, 8000, size=(b, _PROMPT)) for b in _BATCHES}
  machine = roofline.measure_machine()
  theirs, name = _transformers(prompts)
  ours, compiles = _ours(prompts, _DATA_PARALLEL, _BATCHES)
  single, _ = _ours(prompts, 1, (8,))
  rows = []
  case = f"tiny qwen3_moe greedy decode, batch {{}}, {_PROMPT}-token prompt, {_NEW} new"
  for batch in _BATCHES:
    rows.append(common.Row(
      case=case.format(batch) + f" (engine: {_DATA_PARALLEL} data-parallel schedulers)",
      metric="new tokens/s", ours=ours[batch], baseline=theirs[batch], baseline_name=name,
      higher_is_better=True))
  rows.append(common.Row(
    case=case.format(8) + " (engine: one scheduler of 8 rows)", metric="new tokens/s",
    ours=single[8], baseline=theirs[8], baseline_name=name, higher_is_better=True))
  rows.append(common.Row(case="this machine, same run", metric="fp32 matmul peak GFLOP/s "
                         "(XLA, 2048^3)", ours=machine.matmul_flops_per_s / 1e9))
  rows.append(common.Row(case="this machine, same run", metric="memory bandwidth GB/s (STREAM "
                         "triad through XLA)", ours=machine.bytes_per_s / 1e9))
  for batch in _BATCHES:
    prefill, step = call_costs(batch)
    step = dataclasses.replace(step, compulsory_bytes=step_read_bytes(
        get_preset("tiny"), batch, step.compulsory_bytes))
    # The decode step's compulsory bytes (weights + cache, tens of MB for tiny) may stay in a
    # cache between steps: its memory side is bounded by the bandwidth at that footprint.
    at_footprint = roofline.Machine(
        matmul_flops_per_s=machine.matmul_flops_per_s,
        bytes_per_s=max(machine.bytes_per_s, roofline.measure_bandwidth(step.compulsory_bytes)))
    seconds = machine.seconds(prefill) + _NEW * at_footprint.seconds(step)
    call = case.format(batch)
    rows.append(common.Row(case=call, metric="memory bandwidth GB/s at the decode step's "
                           f"footprint ({step.compulsory_bytes / 1e6:.0f} MB, same run)",
                           ours=at_footprint.bytes_per_s / 1e9))
    rows.append(common.Row(case=call, metric="decode step MFLOP (XLA cost analysis)",
                           ours=step.flops / 1e6))
    rows.append(common.Row(case=call, metric="decode step MB accessed (XLA cost analysis, "
                           "cache traffic too)", ours=step.bytes_accessed / 1e6))
    rows.append(common.Row(case=call, metric="decode step MB it must move (weights it can "
                           f"read + cache + outputs; {at_footprint.bound(step)}-bound)",
                           ours=step.compulsory_bytes / 1e6))
    rows.append(common.Row(case=call, metric="roofline new tokens/s (prefill + decode steps)",
                           ours=batch * _NEW / seconds))
    rows.append(common.Row(case=call, metric="fraction of roofline reached",
                           ours=ours[batch] * seconds / (batch * _NEW), baseline=1.0,
                           baseline_name="the roofline"))
  rows.append(common.Row(case="engine compilations for both batch sizes (buckets 1, 8 over "
                              f"{_DATA_PARALLEL} schedulers: 1, {8 // _DATA_PARALLEL} each)",
                         metric="count", ours=float(compiles), higher_is_better=False))
  return rows
