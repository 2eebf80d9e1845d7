"""launch/benchmarks/roofline.py: XLA's cost of a step with every loop counted trip-count times."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launch.benchmarks import roofline


def test_a_loop_free_program_costs_what_xla_says():
  x, w = jnp.ones((64, 96)), jnp.ones((96, 32))
  def fn(x, w):
    return jnp.tanh(x @ w).sum(0)

  ours = roofline.program_cost(fn, x, w)
  xla = jax.jit(fn).lower(x, w).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, list) else xla
  assert ours.flops == pytest.approx(xla["flops"])
  assert ours.bytes_accessed == pytest.approx(xla["bytes accessed"])
  assert ours.unknown_trip_loops == 0


@settings(max_examples=6, deadline=None)
@given(outer=st.integers(1, 5), inner=st.integers(1, 4), m=st.sampled_from([8, 24]),
       k=st.sampled_from([16, 40]))
def test_nested_loops_count_every_trip(outer, inner, m, k):
  # A scan of `outer` steps around a fori_loop of `inner` matmuls: outer x inner matmuls of
  # 2 m k k FLOPs each (XLA's own cost_analysis counts each loop body once).
  x, w = jnp.ones((m, k)), jnp.ones((k, k))

  def fn(x, w):
    def step(c, _):
      return jax.lax.fori_loop(0, inner, lambda i, cc: cc @ w, c), None
    return jax.lax.scan(step, x, None, length=outer)[0]

  cost = roofline.program_cost(fn, x, w)
  assert cost.flops == pytest.approx(outer * inner * 2 * m * k * k, rel=1e-3)
  assert cost.unknown_trip_loops == 0


def test_a_data_dependent_loop_counts_once_and_is_reported():
  def fn(x):
    return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0, x)

  assert roofline.program_cost(fn, jnp.ones((8,))).unknown_trip_loops == 1


def test_the_roofline_is_the_slower_of_compute_and_memory():
  machine = roofline.Machine(matmul_flops_per_s=1e11, bytes_per_s=1e10)
  compute = roofline.Cost(flops=2e11, bytes_accessed=0.0, compulsory_bytes=1e9)  # 2 s / 0.1 s
  memory = roofline.Cost(flops=1e9, bytes_accessed=0.0, compulsory_bytes=3e10)   # 0.01 s / 3 s
  assert machine.seconds(compute) == 2.0 and machine.bound(compute) == "compute"
  assert machine.seconds(memory) == 3.0 and machine.bound(memory) == "memory"
  assert machine.fraction(compute, 4.0) == 0.5
  assert np.isfinite(machine.fraction(memory, 3.0))


def test_compulsory_bytes_are_arguments_and_outputs_read_or_written_once():
  # A chain of elementwise ops over a (512, 256) float32 array and a matmul with a (256, 256)
  # weight: XLA's per-op count grows with the number of ops, the compulsory traffic does not.
  x, w = jnp.ones((512, 256)), jnp.ones((256, 256))
  def fn(x, w):
    y = x @ w
    for _ in range(6):
      y = jnp.tanh(y) * 1.5 + y
    return y

  cost = roofline.program_cost(fn, x, w)
  assert cost.compulsory_bytes == 4 * (512 * 256 + 256 * 256 + 512 * 256)
  # A donated argument updated in place (a KV cache) is read and written through one buffer.
  cache = jnp.zeros((64, 128))
  step = jax.jit(lambda c, v: c.at[3].set(v), donate_argnums=0)
  donated = roofline.program_cost(step, cache, jnp.ones((128,)))
  assert donated.compulsory_bytes == 4 * (64 * 128 + 128)


def test_bandwidth_at_a_footprint_is_measured_and_refuses_nonsense():
  assert np.isfinite(roofline.measure_bandwidth(4e6, repeats=2))
  assert roofline.measure_bandwidth(4e6, repeats=2) > 0
  with pytest.raises(ValueError, match="footprint_bytes"):
    roofline.measure_bandwidth(0.0)


def test_the_triad_writes_in_place():
  """STREAM's triad reuses its destination buffer: a fresh output every call would time the
  C library's mapping of new pages (launch/host_malloc.py maps large buffers afresh), not the
  memory."""
  run, result = roofline.stream_triad(1 << 20)
  run()
  before = result().unsafe_buffer_pointer()
  for _ in range(3):
    run()
  assert result().unsafe_buffer_pointer() == before
  np.testing.assert_array_equal(np.asarray(result()), np.full(1 << 20, 7.0, np.float32))


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 8, 64])
def test_a_decode_step_moves_only_the_weights_it_can_read(batch):
  """The sampler's roofline counts, of the embedding, the batch's rows and, of each MoE layer,
  at most batch x top-k experts: here against the tiny model's own parameter arrays."""
  from flax import nnx

  from launch.benchmarks.sampler import step_read_bytes
  from orchard_jax.models import CausalLM, get_preset

  config = get_preset("tiny")
  params = nnx.to_flat_state(nnx.state(CausalLM(config, rngs=nnx.Rngs(0)), nnx.Param))
  sizes = {"/".join(map(str, path)): np.asarray(v.get_value()).nbytes for path, v in params}
  embedding = sizes["model/embed_tokens"]
  experts = sum(n for name, n in sizes.items() if "/mlp/w_" in name)
  total = float(sum(sizes.values()))
  read_experts = experts * min(batch * config.num_experts_per_tok, config.num_experts) \
      / config.num_experts
  expected = total - embedding - experts + embedding * batch / config.vocab_size + read_experts
  assert step_read_bytes(config, batch, total) == pytest.approx(expected, rel=1e-12)
