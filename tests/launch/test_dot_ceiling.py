"""launch/benchmarks/dot_ceiling.py: a step's dots found with their executions per step, and
timed alone."""
import os
import sys

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launch.benchmarks import dot_ceiling


def _hlo(fn, *args):
  return jax.jit(fn).lower(*args).compile().as_text()


@settings(max_examples=5, deadline=None)
@given(outer=st.integers(1, 4), inner=st.integers(1, 3), m=st.sampled_from([8, 24]),
       k=st.sampled_from([16, 40]))
def test_dots_inside_nested_loops_count_every_trip(outer, inner, m, k):
  x, w = jnp.ones((m, k)), jnp.ones((k, k))

  def fn(x, w):
    def step(c, _):
      return jax.lax.fori_loop(0, inner, lambda i, cc: jnp.tanh(cc @ w), c), None
    return jax.lax.scan(step, x, None, length=outer)[0]

  dots, unknown = dot_ceiling.step_dots(_hlo(fn, x, w))
  assert unknown == 0
  assert sum(dots.values()) == outer * inner
  assert sum(d.flops * n for d, n in dots.items()) == 2 * m * k * k * outer * inner


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 3), m=st.integers(2, 9), n=st.integers(2, 9), k=st.integers(2, 9))
def test_a_batched_dot_has_the_textbook_flop_count(b, m, n, k):
  # einsum "bmk,bkn->bmn": 2 b m n k FLOPs whatever layout XLA picks for it.
  x, y = jnp.ones((b, m, k)), jnp.ones((b, k, n))
  dots, _ = dot_ceiling.step_dots(_hlo(lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y) * 2.0,
                                       x, y))
  assert dots
  assert sum(d.flops * c for d, c in dots.items()) == 2 * b * m * n * k


def test_a_gradient_step_is_timed_and_its_dots_carry_its_matmul_flops():
  x, w = jnp.ones((64, 32)), jnp.ones((32, 48))

  def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)

  text = _hlo(jax.grad(loss), w, x)
  ceiling = dot_ceiling.measure(text, repeats=2)
  # Forward x @ w and the backward x^T @ g: two 64 x 32 x 48 matmuls.
  assert ceiling.flops == 2 * (2 * 64 * 32 * 48)
  assert ceiling.executions == 2 and ceiling.seconds > 0
  assert ceiling.flops_per_s() == pytest.approx(ceiling.flops / ceiling.seconds)
  assert ceiling.seconds == pytest.approx(sum(n * s for _, n, s in ceiling.breakdown))
  assert len(ceiling.format_top().splitlines()) == ceiling.dots


def test_text_without_an_entry_is_refused():
  with pytest.raises(ValueError, match="ENTRY"):
    dot_ceiling.step_dots("HloModule m\n%f (p: f32[2]) -> f32[2] {\n}\n")
