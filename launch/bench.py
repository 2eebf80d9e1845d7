"""Benchmarks: `python launch/bench.py --suite NAME`.

Each suite lives in launch/benchmarks/NAME.py and defines `run() -> list[Row]`. It measures
orchard_jax and a baseline (a peer library, or the machine's own floor) in the same run, so
the printed ratio compares like with like on whatever machine runs it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from launch import overrides  # noqa: E402
from launch.benchmarks import common  # noqa: E402

_SUITE = flags.DEFINE_string("suite", None, "Benchmark suite: one of " + ", ".join(common.SUITES))
_JSON = flags.DEFINE_string("json", None, "Also write the rows as JSON to this path.")


def main(argv):
  del argv
  if _SUITE.value is None:
    raise app.UsageError(f"--suite is required: one of {list(common.SUITES)}, e.g. "
                         "--suite model")
  if _SUITE.value not in common.SUITES:
    raise app.UsageError(f"--suite is {_SUITE.value!r}; expected one of {list(common.SUITES)}")
  rows = common.load_suite(_SUITE.value).run()
  common.print_table(_SUITE.value, rows)
  if _JSON.value:
    common.write_json(_JSON.value, rows)


if __name__ == "__main__":
  app.run(overrides.usage_errors_as_one_line(main))
