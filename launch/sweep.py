"""Runs a grid of one experiment: `python launch/sweep.py --config experiments/NAME.py[:preset]
--sweep FIELD=V1,V2 [--sweep FIELD=V1,V2 ...] [--config.FIELD=VALUE ...] [--render]`.

Each `--sweep` names a config field and its values; the grid is their Cartesian product (the
first --sweep varies slowest). Fixed `--config.FIELD=VALUE` overrides apply to every point.
Without `--render` the points run here one after another, each as its own
`launch/run.py` process (so one point's failure or memory does not touch the next) with its own
run folder: when the config has a `workdir` field, point i gets
`--config.workdir=<base>-<field>=<value>,...` next to the base run folder (base: a fixed
`--config.workdir=`, else the config's workdir, else `runs/<name>_<preset>` as the SWE recipes
name it), so points never resume from or overwrite each other's checkpoints and stores. The
exit status is non-zero when any point failed. With `--render` nothing runs: one Kubernetes training
Job per point (launch/k8s/training.py, multi-host under jax.distributed) is printed as YAML
for `kubectl apply -f -`, using the fleet config given by `--fleet` (default the cluster
preset); each Job's run folder is $ORCHARD_CHECKPOINT_DIR = <checkpoints volume>/<job name>,
one per point. Every field and value is checked against the experiment's config before anything
runs or renders.

  python launch/sweep.py --config experiments/swe_rpr.py --sweep rl.rpr_alpha=0.25,0.5 \\
      --sweep rl.lr=1e-6,3e-6
  python launch/sweep.py --config experiments/swe_rpr.py:cluster --sweep rl.lr=1e-6,3e-6 \\
      --render | kubectl apply -f -
"""
import dataclasses
import itertools
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import overrides  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file: experiments/NAME.py[:preset].", lock_config=True)
_FLEET = overrides.define_config_file(     # the default is loaded now: see there
    "fleet", os.path.join(_HERE, "k8s", "config.py") + ":cluster",
    "--render: fleet config (launch/k8s/config.py[:default|cluster]).")
_SWEEP = flags.DEFINE_multi_string("sweep", [], "FIELD=V1,V2,...: a swept config field.")
_RENDER = flags.DEFINE_bool("render", False, "Print one Kubernetes Job per point; run nothing.")
_NAME = flags.DEFINE_string("name", None, "--render: Job name prefix (default: the "
                            "experiment file's name, e.g. swe-rpr).")


class SweepError(ValueError):
  """A --sweep argument names no field of the config, or a value of the wrong type."""


@dataclasses.dataclass(frozen=True)
class Axis:
  """One swept field and the values it takes, as command-line text."""
  field: str
  values: tuple[str, ...]


def parse_axis(text: str) -> Axis:
  """"rl.lr=1e-6,3e-6" -> Axis("rl.lr", ("1e-6", "3e-6")).

  Raises:
    SweepError: not FIELD=V1[,V2...], or a value is empty or repeated.
  """
  field, sep, values = text.partition("=")
  field = field.strip().removeprefix("--config.").removeprefix("config.")
  parts = tuple(v.strip() for v in values.split(","))
  if not sep or not field or not all(parts):
    raise SweepError(f"--sweep takes FIELD=V1,V2,...; saw {text!r}")
  if len(set(parts)) != len(parts):
    raise SweepError(f"--sweep {field} repeats a value: {values!r}")
  return Axis(field, parts)


def grid(axes: list[Axis]) -> list[list[tuple[str, str]]]:
  """Every point of the grid as [(field, value), ...]; the first axis varies slowest.

  Raises:
    SweepError: a field is swept twice.
  """
  fields = [a.field for a in axes]
  if len(set(fields)) != len(fields):
    raise SweepError(f"a field is swept twice: {fields}")
  return [list(zip(fields, values)) for values in itertools.product(*(a.values for a in axes))]


def check_point(config, point: list[tuple[str, str]]) -> None:
  """Applies the point's values to a copy of `config`, as launch/run.py would.

  Raises:
    SweepError: a field the config does not have, or a value its type cannot parse.
  """
  try:
    overrides.check(config, point, flag="--sweep")
  except overrides.OverrideError as e:
    raise SweepError(str(e)) from None


def fixed_overrides(argv: list[str]) -> list[str]:
  """The `--config.FIELD=VALUE` arguments of the command line (applied to every point)."""
  overrides, args = [], iter(argv)
  for arg in args:
    if arg.startswith("--config.") and "=" in arg:
      overrides.append(arg)
    elif arg.startswith("--config."):                   # "--config.x VALUE"
      overrides.append(f"{arg}={next(args, '')}")
  return overrides


def point_args(point: list[tuple[str, str]]) -> list[str]:
  return [f"--config.{field}={value}" for field, value in point]


def point_workdirs(config, points) -> list[str | None]:
  """Each point's run folder (module docstring), or None for every point when the config has
  no top-level `workdir` field or the sweep itself varies it.

  Args:
    config: the experiment config with the fixed overrides applied.
    points: `grid(...)`.
  """
  if "workdir" not in config or any(f == "workdir" for point in points for f, _ in point):
    return [None] * len(points)
  base = config.workdir
  if not base:
    name = config.get("name") or "run"
    base = os.path.join("runs", f"{name}_{config.preset}" if config.get("preset") else name)
  base = base.rstrip("/")
  out = []
  for point in points:
    slug = ",".join(f"{field}={value}" for field, value in point)
    out.append(f"{base}-{re.sub(r'[^A-Za-z0-9._=,+-]', '_', slug)}")
  return out


def run_locally(config_arg: str, fixed: list[str], points, workdirs=None) -> int:
  """Runs every point as `launch/run.py` one after another, point i in `workdirs[i]` (None:
  the config's own); returns how many failed."""
  failed = []
  workdirs = workdirs or [None] * len(points)
  for index, (point, workdir) in enumerate(zip(points, workdirs)):
    where = [f"--config.workdir={workdir}"] if workdir else []
    kept = [a for a in fixed if not (workdir and a.startswith("--config.workdir="))]
    args = [sys.executable, os.path.join(_HERE, "run.py"), "--config", config_arg,
            *kept, *point_args(point), *where]
    label = " ".join(point_args(point))
    print(f"[sweep] point {index + 1}/{len(points)}: {label}"
          + (f" -> {workdir}" if workdir else ""), flush=True)
    code = subprocess.call(args)
    if code != 0:
      failed.append((index, label, code))
      print(f"[sweep] point {index + 1} failed with exit status {code}", flush=True)
  print(f"[sweep] {len(points) - len(failed)}/{len(points)} points succeeded", flush=True)
  for index, label, code in failed:
    print(f"[sweep]   failed: point {index + 1} ({label}), exit status {code}", flush=True)
  return len(failed)


def render(fleet, config_arg: str, fixed: list[str], points, name: str) -> list[dict]:
  """One training Job (and its headless Service) per point, labelled with the sweep's name."""
  from launch.k8s import training
  if any(a.startswith("--config.workdir=") for a in fixed):
    raise SweepError("--render: a fixed --config.workdir would give every point's Job the same "
                     "run folder (each resumes from the others' checkpoints); each Job has its "
                     "own $ORCHARD_CHECKPOINT_DIR, which the cluster preset reads")
  try:
    experiment = overrides.cluster_experiment(config_arg)
  except overrides.OverrideError as e:
    raise SweepError(f"--render: {e}") from None
  objects = []
  for index, point in enumerate(points):
    job_config = fleet.copy_and_resolve_references()
    job_config.unlock()
    job_config.training.experiment = experiment
    labels = {"orchard.dev/sweep": name, "orchard.dev/sweep-point": str(index)}
    objects += training.training_job(job_config, name=f"{name}-{index}",
                                     overrides=[*fixed, *point_args(point)], labels=labels)
  return objects


def default_name(config_arg: str) -> str:
  """"experiments/swe_rpr.py:cluster" -> "swe-rpr" (a DNS label prefix)."""
  stem = os.path.splitext(os.path.basename(config_arg.split(":")[0]))[0]
  return re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40] or "sweep"


def _config_argument(argv: list[str]) -> str:
  for i, arg in enumerate(argv):
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
  raise app.UsageError("--config is required, e.g. --config experiments/swe_rpr.py")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/swe_rpr.py")
  if not _SWEEP.value:
    raise app.UsageError("give at least one --sweep FIELD=V1,V2")
  try:
    points = grid([parse_axis(text) for text in _SWEEP.value])
    for point in points:
      check_point(config, point)
  except SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  config_arg = _config_argument(sys.argv)
  fixed = fixed_overrides(sys.argv[1:])
  if _RENDER.value:
    from launch.k8s import common
    try:
      objects = render(_FLEET.value, config_arg, fixed, points,
                       _NAME.value or default_name(config_arg))
    except (common.FleetError, SweepError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    sys.stdout.write(common.to_yaml(objects))
    return 0
  return 1 if run_locally(config_arg, fixed, points, point_workdirs(config, points)) else 0


if __name__ == "__main__":
  app.run(overrides.usage_errors_as_one_line(main),
          flags_parser=overrides.flags_parser("config", "fleet"))
