"""The leak scan's text form against an independent oracle: for any file and any edit, the fixed
file itself (and a copy differing only in trailing whitespace) is found, and the unfixed file is
not, when every line is distinct (then no fixed block can occur in the base by coincidence)."""
import difflib

from hypothesis import given, settings, strategies as st

from orchard_jax.tasks.swe import leak_scan


@st.composite
def edits(draw):
  n = draw(st.integers(3, 30))
  base = [f"line_{i} = {i}" for i in range(n)]
  start = draw(st.integers(0, n))
  stop = draw(st.integers(start, min(n, start + 5)))
  new = [f"fixed_{i} = -{i}" for i in range(draw(st.integers(0, 4)))]
  fixed = base[:start] + new + base[stop:]
  return base, fixed


def _patch(base, fixed):
  diff = difflib.unified_diff([l + "\n" for l in base], [l + "\n" for l in fixed],
                              "a/pkg/mod.py", "b/pkg/mod.py")
  return "diff --git a/pkg/mod.py b/pkg/mod.py\n" + "".join(diff)


@settings(max_examples=200, deadline=None)
@given(edits())
def test_fixed_file_found_base_file_not(edit):
  base, fixed = edit
  sources = leak_scan.fixed_sources(_patch(base, fixed))
  if base == fixed:
    assert sources == []
    return
  for source in sources:
    assert source.path == "pkg/mod.py"
    assert leak_scan._copies("\n".join(fixed) + "\n", source)
    assert leak_scan._copies("\n".join(l + "   " for l in fixed), source)
    assert not leak_scan._copies("\n".join(base) + "\n", source)


def test_whitespace_only_and_tiny_hunks_are_not_counted():
  assert leak_scan.fixed_sources(
      "diff --git a/R b/R\n--- a/R\n+++ b/R\n@@ -1,3 +1,3 @@\n a\n-b  \n+b\n c\n") == []
  assert leak_scan.fixed_sources(
      "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == []
