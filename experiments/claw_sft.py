"""Orchard-Claw SFT: the policy learns from successful trajectories, by default the reference
solutions of the training tasks played through the ReAct harness against the real services
(`--config.sft.source=STORE` trains on a trajectory store instead, e.g. a teacher's rollouts,
recorded by the proxy whatever harness made them)."""
from experiments import common


def get_config(preset="tiny"):
  config = common.claw_base(preset)
  config.job = "claw.sft"
  config.name = "claw_sft"
  return config
