"""Validation patterns anchor at the end of the text, not before a trailing newline.

In Python's `re`, `$` (without re.MULTILINE) also matches just before a final "\n", so
`re.match(r"^[a-z]+$", "alice\n")` succeeds: a tenant name, an image digest, a Kubernetes job
name or a field name checked that way let a trailing newline through (a CI run found the last:
a one-line error message that was two lines). Every anchored pattern in the package and the
launch scripts ends in `\\Z` instead; this test keeps it so, and checks the validators that
depend on it refuse such values.
"""
import pathlib
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from launch.k8s.training import check_job_name
from orchard_jax.data.images import is_digest
from orchard_jax.env.tenants import check_tenant
from orchard_jax.tasks.claw.services import schema

_ROOT = pathlib.Path(__file__).resolve().parents[1]
# A pattern literal that starts with ^ and ends with an unescaped $, in re.compile/match/search.
_DOLLAR_ANCHORED = re.compile(r"""re\.(?:compile|match|search)\(\s*r?(["'])\^.*?(?<!\\)\$\1(.{0,40})""")


def test_no_anchored_pattern_ends_in_dollar():
  found = []
  for folder in ("orchard_jax", "launch"):
    for path in sorted((_ROOT / folder).rglob("*.py")):
      lines = path.read_text(encoding="utf-8").splitlines()
      for i, line in enumerate(lines):
        match = _DOLLAR_ANCHORED.search(line)
        following = match.group(2) + (lines[i + 1] if i + 1 < len(lines) else "") if match else ""
        if match and not re.match(r"\s*,\s*re\.(M|MULTILINE)\b", following):
          found.append(f"{path.relative_to(_ROOT)}:{i + 1}")
  assert not found, f"anchored with $ (matches before a trailing newline; use \\Z): {found}"


_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)


@settings(max_examples=50)
@given(name=_LABEL, tail=st.sampled_from(["\n", "\r\n"]))
def test_validators_refuse_a_trailing_newline(name, tail):
  assert check_tenant(name) == name
  with pytest.raises(ValueError):
    check_tenant(name + tail)
  job = "j" + name[:40]
  assert check_job_name(job) == job
  with pytest.raises(Exception, match="DNS label"):
    check_job_name(job + tail)
  digest = "sha256:" + "0" * 64
  assert is_digest(digest) and not is_digest(digest + tail)


@settings(max_examples=50)
@given(names=st.lists(st.text(max_size=8), min_size=1, max_size=4))
@example(names=["0\n"])   # the CI run's field name
def test_field_names_in_messages_stay_on_one_line(names):
  shown = schema._names(names)
  assert "\n" not in shown and "\r" not in shown
