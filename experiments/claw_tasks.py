"""Orchard-Claw task sets: build (or read from the cache) the synthetic training tasks, each
validated by playing its reference solution, and print them beside the evaluation set."""
from experiments import common


def get_config(preset="tiny"):
  config = common.claw_base(preset)
  config.job = "claw.tasks"
  return config
