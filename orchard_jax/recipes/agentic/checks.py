"""Settings the loop's jobs refuse before any work: a typo must cost one line, not minutes of
task building, seed trajectories and SFT first. Each check raises a ConfigError (launch/run.py
prints it as one line, exit status 2)."""
from __future__ import annotations

import os
from typing import Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError

# Config fields the cluster preset (experiments/common.py) fills from the environment that the
# training Job sets (launch/k8s/training.py), and the variable each comes from.
CLUSTER_VARIABLES = {
    "workdir": "ORCHARD_CHECKPOINT_DIR",
    "env.url": "ORCHARD_ENV_URL",
    "engine.urls": "ORCHARD_SGLANG_POLICY_URLS",
    "opd.teacher_urls": "ORCHARD_SGLANG_TEACHER_URLS",
}

SFT_MODES = ("credit", "resolved_only")
SFT_METHODS = ("full", "cached_last_layer")
REWARDS = ("binary", "rpr")


def check_cluster_settings(config: ConfigDict, fields: Sequence[str]) -> None:
  """With the cluster preset, checks before any work that each of `fields` (keys of
  CLUSTER_VARIABLES) is set: outside a training Job the preset leaves them empty, and the run
  would otherwise fail late on what it reads next (the tokenizer on the models volume).

  Raises:
    ConfigError: a field is empty; the message names its environment variable.
  """
  if config.get("preset") != "cluster":
    return
  missing = []
  for field in fields:
    value = config
    for part in field.split("."):
      value = value[part]
    if not str(value).strip():
      missing.append(f"{CLUSTER_VARIABLES[field]} (config.{field})")
  if missing:
    raise ConfigError(
        "the cluster preset reads the fleet's addresses from the environment of a training Job "
        f"(launch/fleet.py train); not set here: {', '.join(missing)}. Run it in that Job, "
        "export the variables, or set the fields with --config.FIELD=VALUE")


def check_sft_config(c: ConfigDict) -> None:
  """Raises ConfigError for an unknown sft.mode or sft.method, or sft.min_target_prob outside
  [0, 1)."""
  if c.sft.mode not in SFT_MODES:
    raise ConfigError(f"sft.mode is {c.sft.mode!r}; expected one of {SFT_MODES}")
  method = c.sft.get("method", "full")
  if method not in SFT_METHODS:
    raise ConfigError(f"sft.method is {method!r}; expected one of {SFT_METHODS}")
  prob = float(c.sft.get("min_target_prob", 0.0) or 0.0)
  if not 0.0 <= prob < 1.0:
    raise ConfigError(f"sft.min_target_prob is {prob}; expected 0 (off) or a probability in "
                      "(0, 1)")


def check_sft_source(c: ConfigDict) -> None:
  """Raises ConfigError when sft.source is neither "expert" (the domain's seed trajectories)
  nor an existing folder."""
  if c.sft.source != "expert" and not os.path.exists(c.sft.source):
    raise ConfigError(f"sft.source: {c.sft.source!r} does not exist; expected 'expert', a "
                      "trajectory store folder or a mini-swe-agent trajectory folder")


def check_rl_config(c: ConfigDict) -> None:
  """Settings the RL job would otherwise reject only after the task set and SFT (minutes in).

  Raises:
    ConfigError: an unknown rl.reward or opd.mode, OPD without a teacher, a negative
      rl.iterations or a non-positive rl.prompts_per_iteration, BAR settings BARConfig
      refuses, an unusable eval block, or an opd.teacher_init folder that does not exist.
  """
  from orchard_jax.recipes.agentic import policy
  from orchard_jax.train import OPD_MODES
  if int(c.rl.iterations) < 0:
    raise ConfigError(f"rl.iterations is {c.rl.iterations}; expected 0 (SFT and the final "
                      "evaluation only) or a positive count")
  if int(c.rl.prompts_per_iteration) < 1 or int(c.rl.oversample) < 0:
    raise ConfigError(f"rl.prompts_per_iteration is {c.rl.prompts_per_iteration} and "
                      f"rl.oversample {c.rl.oversample}; expected at least 1 and at least 0")
  bar_config(c)
  if c.rl.reward not in REWARDS:
    raise ConfigError(f"rl.reward is {c.rl.reward!r}; expected 'binary' or 'rpr'")
  if c.opd.mode not in OPD_MODES:
    raise ConfigError(f"opd.mode is {c.opd.mode!r}; expected one of {OPD_MODES}")
  if c.opd.mode != "none" and not (str(c.opd.teacher_urls).strip() or c.opd.teacher_init):
    raise ConfigError(f"opd.mode is {c.opd.mode!r} but there is no teacher: set "
                      "opd.teacher_urls (SGLang servers) or opd.teacher_init (a checkpoint, run "
                      "or Hugging Face folder served by a second embedded engine, e.g. "
                      "--config.opd.teacher_init=runs/swe_rpr_tiny)")
  if c.opd.mode != "none" and not str(c.opd.teacher_urls).strip():
    policy.check_checkpoint(c.opd.teacher_init, field="opd.teacher_init")
  check_eval_config(c)


def check_eval_config(c: ConfigDict) -> None:
  """Raises ConfigError for eval.k < 1 or an eval.splits entry other than "train"/"heldout"."""
  if int(c.eval.k) < 1:
    raise ConfigError(f"eval.k is {c.eval.k}; expected at least 1 attempt per task")
  unknown = [s for s in tuple(c.eval.splits) if s not in ("train", "heldout")]
  if unknown:
    raise ConfigError(f"eval.splits has {unknown}; expected 'train' and/or 'heldout'")


def check_batch_sizes(c: ConfigDict, blocks: Sequence[str]) -> None:
  """Each block's batch_size splits evenly into microbatches over the data-parallel devices of
  config.mesh (the packer and the trainer need equal rows per device and microbatch).

  Raises:
    ConfigError: a mesh the devices cannot form, or a batch_size that is not a multiple of
      microbatches x data-parallel devices (the message names the block and the multiple).
  """
  from orchard_jax import parallel, train
  try:
    mesh = parallel.make_mesh(c.mesh)
  except parallel.ParallelError as e:
    raise ConfigError(f"mesh: {e}") from e
  dp = train.data_parallel_size(mesh)
  for block in blocks:
    size, micro = int(c[block].batch_size), int(c[block].get("microbatches", 1))
    if micro < 1 or size < 1 or size % (micro * dp):
      raise ConfigError(f"{block}.batch_size is {size} with {block}.microbatches={micro}; over "
                        f"{dp} data-parallel device(s) it must be a positive multiple of "
                        f"{max(micro, 1) * dp}")


def bar_config(c: ConfigDict):
  """rl.BARConfig from the rl.bar block.

  Raises:
    ConfigError: settings BARConfig refuses (the message names rl.bar).
  """
  from orchard_jax import rl as rl_lib
  b = c.rl.bar
  try:
    return rl_lib.BARConfig(group_size=int(b.group_size), max_rollouts=int(b.max_rollouts),
                            stride=int(b.stride), positive_fraction=tuple(b.positive_fraction))
  except rl_lib.RLError as e:
    raise ConfigError(f"rl.bar: {e}") from e
