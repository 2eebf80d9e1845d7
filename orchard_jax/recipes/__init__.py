"""Pipelines that wire models, trainer, env, rollout, tasks and harness together.

  agentic/   the agentic RL loop, written once for every domain (SFT, RL with BAR / RPR / OPD,
             evaluation, value model, distillation); it imports no domain
  swe/       the SWE domain (`SWEDomain`) and its jobs
  claw.py    the Claw domain (`ClawDomain`, assistant tasks on sandboxed services) and its jobs
  gui.py     the GUI domain (`GUIDomain`, browser tasks in sandboxed Chromium) and its jobs
  lm.py      plain language-model SFT on a text corpus

`launch/run.py` reads an experiment config and calls `run_job(config)`, which looks up
`config.job` in `JOBS` and calls the recipe function it names. Recipe modules are imported
only when their job runs, so a light job never pays for a heavy one's imports.
"""
import importlib
import math

from ml_collections import ConfigDict

# job name -> "module:function" inside orchard_jax.recipes. One line per job.
JOBS = {
    "lm.sft": "lm:sft",
    "claw.tasks": "claw:build_tasks",
    "claw.sft": "claw:sft",
    "claw.rl": "claw:train_rl",
    "claw.evaluate": "claw:evaluate",
    "gui.tasks": "gui:build_tasks",
    "gui.sft": "gui:sft",
    "gui.rl": "gui:train_rl",
    "gui.evaluate": "gui:evaluate",
    "gui_distill.collect": "gui:distill",
    "gui_distill.stats": "agentic.trajectory_data:stats",
    "gui_distill.export": "agentic.trajectory_data:export",
    "swe.build_tasks": "swe:build_tasks",
    "swe.evaluate": "swe:evaluate",
    "swe.sft": "swe:sft",
    "swe.rl": "swe:train_rl",
    "swe.value": "swe:value",
    "swe_distill.collect": "swe.distill:collect",
    "swe_distill.stats": "agentic.trajectory_data:stats",
    "swe_distill.export": "agentic.trajectory_data:export",
    "swe_distill.import": "agentic.trajectory_data:import_trajectories",
}


# config.resume: resume only a run of the same identity from the run folder, or whatever it
# holds (agentic/run_config.py).
RESUME_MODES = ("auto", "force")


class ConfigError(ValueError):
  """The config names something that does not exist or cannot be used (a job, a checkpoint, a
  predictions file, a tokenizer, a store): the user's mistake, which launch/run.py reports as
  one line (`error: ...`, exit status 2) instead of a traceback. Each recipe's own error type
  for bad settings (PolicyError, DistillError, TeacherError, ServingError) derives from it."""


class UnknownJobError(ConfigError):
  """Raised when a config names a job that no recipe provides."""


def check_job(config: ConfigDict) -> str:
  """Returns `config.job` once it names a job in JOBS, without importing the recipe's module.

  Raises:
    UnknownJobError: the config has no `job` field or names an unknown job; the message lists
      the known jobs.
  """
  if "job" not in config:
    raise UnknownJobError("the config has no 'job' field; set config.job in get_config()")
  _check_name(config.job)
  return config.job


def resolve_job(name: str):
  """Returns the recipe function registered for job `name`.

  Raises:
    UnknownJobError: `name` is not in JOBS; the message lists the known jobs.
  """
  _check_name(name)
  module_name, function_name = JOBS[name].split(":")
  module = importlib.import_module(f"orchard_jax.recipes.{module_name}")
  return getattr(module, function_name)


def load_tokenizer(name: str, *, field: str):
  """`data.load_tokenizer(name)` for the config field `field` (e.g. "policy.tokenizer").

  Raises:
    ConfigError: nothing loadable at `name` (a missing folder, an unknown hub name); the
      message names the field.
  """
  from orchard_jax import data      # here, not at the top: this module stays light
  try:
    return data.load_tokenizer(name)
  except data.TokenizerError as e:
    raise ConfigError(f"{field}: {e}") from e


def check_values(config: ConfigDict) -> None:
  """Refuses, before any work, values no job can use, which the command line parses without
  complaint: a NaN anywhere in the config (`--config.rl.lr=nan`), a `resume` mode not in
  RESUME_MODES, and a `sampling` block outside what every engine accepts (temperature finite
  and >= 0, top_p in (0, 1], max_tokens >= 0). The engines refused such sampling request by
  request, after the task set and SFT, as rollouts aborted minutes into the run.

  Raises:
    ConfigError: names the field, its value and what was expected.
  """
  for field, value in _leaves(config):
    if isinstance(value, float) and math.isnan(value):
      raise ConfigError(f"{field} is nan; expected a number")
  if config.get("resume", "auto") not in RESUME_MODES:
    raise ConfigError(f"resume is {config.resume!r}; expected one of {RESUME_MODES}")
  sampling = config.get("sampling")
  if not isinstance(sampling, ConfigDict):
    return
  temperature, top_p = sampling.get("temperature"), sampling.get("top_p")
  max_tokens = sampling.get("max_tokens")
  if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
    raise ConfigError(f"sampling.temperature is {temperature}; expected a finite number >= 0 "
                      "(0 decodes greedily)")
  if top_p is not None and not 0 < top_p <= 1:
    raise ConfigError(f"sampling.top_p is {top_p}; expected a number in (0, 1]")
  if max_tokens is not None and max_tokens < 0:
    raise ConfigError(f"sampling.max_tokens is {max_tokens}; expected a count >= 0")


def _leaves(config: ConfigDict, prefix: str = ""):
  """(dotted field, value) of every non-block field of `config`."""
  for key, value in config.items():
    if isinstance(value, ConfigDict):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _check_name(name: str) -> None:
  if name not in JOBS:
    known = ", ".join(sorted(JOBS)) or "(none registered)"
    raise UnknownJobError(f"config.job is {name!r}; expected one of: {known}")


def run_job(config: ConfigDict):
  """Runs the recipe that `config.job` names and returns what it returns.

  Raises:
    UnknownJobError: the config has no `job` field or names an unknown job.
  """
  return resolve_job(check_job(config))(config)
