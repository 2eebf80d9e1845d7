"""launch/benchmarks/step_profile.py: a traced step's op time by category and by instruction."""
import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launch.benchmarks import step_profile  # noqa: E402


def _loop_of_matmuls(x, w):
  def body(c, _):
    return jnp.tanh(c @ w), None
  y = jax.lax.scan(body, x, None, length=3)[0]
  return jnp.sort(y, axis=-1).sum()


def test_each_instruction_takes_the_category_of_what_it_computes():
  x, w = jnp.ones((64, 64)), jnp.ones((64, 64))

  def fn(x, w, i):
    moved = jax.lax.dynamic_update_slice(x, (x @ w)[:8], (i, 0))
    return jnp.sort(moved, axis=0), moved.T.sum(0)

  text = jax.jit(fn).lower(x, w, 3).compile().as_text()
  categories, sources = step_profile.categorize(text)
  by_source = {}
  for name, source in sources.items():
    by_source.setdefault(source.rsplit("/", 1)[-1], set()).add(categories[name])
  # Each JAX op's instructions include one of its kind (the rest are its tuple plumbing, the
  # sort's comparator, layout copies).
  assert "matmul" in by_source["dot_general"]
  assert "sort/scatter/gather" in by_source["sort"]
  assert "dynamic-slice/update-slice" in by_source["dynamic_update_slice"]
  assert "reduce" in by_source["reduce_sum"]
  assert set(categories.values()) <= set(step_profile.CATEGORIES)


@pytest.mark.parametrize("opcodes, category", [
    ({"parameter", "dot", "add", "dynamic-slice"}, "matmul"),        # a matmul fusion
    ({"parameter", "dynamic-update-slice", "add"}, "dynamic-slice/update-slice"),
    ({"parameter", "multiply", "reduce"}, "reduce"),
    ({"parameter", "transpose", "bitcast"}, "copy/transpose"),
    ({"parameter", "copy"}, "copy/transpose"),
    ({"parameter", "broadcast", "exponential", "multiply"}, "elementwise fusion"),
    ({"scatter", "add"}, "sort/scatter/gather"),
    ({"while"}, "control flow"),
    ({"iota"}, "other"),
])
def test_a_fusion_is_categorised_by_its_most_specific_op(opcodes, category):
  assert step_profile._category(opcodes) == category


def test_nested_events_count_their_exclusive_time_once():
  # A loop (0..100 us) enclosing two body ops (30 and 20 us), then a copy (10 us); a second
  # thread runs a dot concurrently (40 us). Exclusive: loop 50, body ops 30 + 20, copy 10,
  # dot 40; op time 150 us, every microsecond once.
  text = """HloModule jit_g, entry_computation_layout={()->f32[]}

%body (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  ROOT %wrapped_tanh = f32[] tanh(%p), metadata={op_name="jit(g)/tanh"}
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8]{1,0} parameter(0)
  %while.1 = f32[] while(%a), condition=%body, body=%body
  %copy.2 = f32[8,8]{1,0} copy(%a)
  ROOT %dot.3 = f32[8,8]{1,0} dot(%a, %copy.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(g)/dot_general"}
}
"""
  def event(name, ts, dur, tid=1, module="jit_g"):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name,
            "args": {"hlo_op": name, "hlo_module": module}}
  trace = {"traceEvents": [
      event("while.1", 0, 100), event("wrapped_tanh", 10, 30), event("wrapped_tanh", 50, 20),
      event("copy.2", 100, 10), event("dot.3", 20, 40, tid=2),
      event("dot.3", 0, 1000, module="another_program"),          # not this module's
      {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 500, "name": "ThunkExecutor::Execute"},
  ]}
  result = step_profile.breakdown(trace, text, wall_seconds=1.0)
  assert result.op_seconds == pytest.approx(150e-6)
  assert result.by_category["control flow"] == pytest.approx(50e-6)
  assert result.by_category["elementwise fusion"] == pytest.approx(50e-6)
  assert result.by_category["copy/transpose"] == pytest.approx(10e-6)
  assert result.by_category["matmul"] == pytest.approx(40e-6)
  assert sum(result.by_category.values()) == pytest.approx(result.op_seconds)
  tanh = next(o for o in result.ops if o.name == "wrapped_tanh")
  assert (tanh.count, tanh.source) == (2, "jit(g)/tanh")
  assert [o.name for o in result.ops][2:] == ["dot.3", "copy.2"]       # most time first


def test_a_trace_without_this_program_is_an_error():
  text = "HloModule jit_h\n\nENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n"
  with pytest.raises(RuntimeError, match="jit_h"):
    step_profile.breakdown({"traceEvents": []}, text)


def test_a_traced_step_is_broken_down_and_its_trace_written(tmp_path):
  x, w = jnp.ones((128, 128)), jnp.full((128, 128), 0.01)
  grad = jax.value_and_grad(_loop_of_matmuls, argnums=1)
  result = step_profile.profile_compiled_callable(grad, (x, w), str(tmp_path))
  assert os.path.exists(result.trace_path) and result.trace_path.startswith(str(tmp_path))
  assert result.op_seconds > 0 and result.wall_seconds > 0
  assert sum(result.share(c) for c in step_profile.CATEGORIES) == pytest.approx(1.0)
  # The forward loop's matmul runs once per trip of the 3-step scan.
  forward = [o for o in result.ops if o.category == "matmul" and "transpose" not in o.source]
  assert forward and all(o.count % 3 == 0 for o in forward)
  assert result.by_category["sort/scatter/gather"] > 0
  text = step_profile.format_summary(result.summary(top=3), title="tiny ")
  assert text.startswith("tiny step profile:") and "matmul" in text
