"""Orchard-Claw RL (docs/algorithms.md section 8): SFT warm start, then GRPO with BAR on the
synthetic training tasks, 8 prompts x group 8 at the published setting; every model call of a
rollout trains with its rollout's +-1 reward (task_score >= 0.75 passes); a 10-minute
wall-clock budget per task. Prints pass@1 on the training subset before and after."""
from experiments import common


def get_config(preset="tiny"):
  config = common.claw_base(preset)
  config.job = "claw.rl"
  config.name = "claw_rl"
  return config
