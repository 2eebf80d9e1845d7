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

from launch import host_malloc  # noqa: E402
from launch import overrides  # noqa: E402
from launch import xla_env  # noqa: E402
from launch.benchmarks import common  # noqa: E402

_SUITE = flags.DEFINE_string("suite", None, "Benchmark suite: one of " + ", ".join(common.SUITES))
_JSON = flags.DEFINE_string("json", None, "Also write the rows as JSON to this path.")
_PROFILE = flags.DEFINE_string(
    "profile", None, "--suite model: trace one step of each case with jax.profiler into this "
    "folder and print where its time goes (launch/benchmarks/step_profile.py).")
_CASES = flags.DEFINE_list("cases", None, "--suite model: run only these presets' cases.")
# Suites that honour --profile / --cases (through the environment, so workers see them).
_CASE_SUITES = ("model",)


def main(argv):
  del argv
  if _SUITE.value is None:
    raise app.UsageError(f"--suite is required: one of {list(common.SUITES)}, e.g. "
                         "--suite model")
  if _SUITE.value not in common.SUITES:
    raise app.UsageError(f"--suite is {_SUITE.value!r}; expected one of {list(common.SUITES)}")
  if (_PROFILE.value or _CASES.value) and _SUITE.value not in _CASE_SUITES:
    raise app.UsageError(f"--profile and --cases apply to --suite {', '.join(_CASE_SUITES)}; "
                         f"got --suite {_SUITE.value}")
  if _PROFILE.value:
    os.environ["ORCHARD_BENCH_PROFILE"] = os.path.abspath(_PROFILE.value)
  if _CASES.value:
    os.environ["ORCHARD_BENCH_CASES"] = ",".join(_CASES.value)
  # The schedule launched jobs compile with (launch/xla_env.py), here and in bench workers.
  xla_env.configure()
  host_malloc.configure()    # and their malloc settings (launch/host_malloc.py)
  rows = common.load_suite(_SUITE.value).run()
  common.print_table(_SUITE.value, rows)
  if _JSON.value:
    common.write_json(_JSON.value, rows)


if __name__ == "__main__":
  app.run(overrides.usage_errors_as_one_line(main))
