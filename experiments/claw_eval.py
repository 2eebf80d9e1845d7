"""Orchard-Claw evaluation: a checkpoint (default: the claw_rl run of the same preset) on the
hand-written evaluation tasks, 3 trials each, with the configured harness
(`--config.agent.harness=react|codex|claude_code`); prints pass@3 and pass^3 per service and
overall."""
from experiments import common


def get_config(preset="tiny"):
  config = common.claw_base(preset)
  config.job = "claw.evaluate"
  config.name = "claw_eval"
  config.checkpoint = f"runs/claw_rl_{preset}" if preset != "cluster" else ""
  config.eval.splits = ("heldout",)   # the evaluation tasks (ClawDomain.split_tasks)
  config.eval.max_instances = 0
  config.eval.k = 3
  config.eval.baseline = False
  return config
