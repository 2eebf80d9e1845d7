"""Data distillation on the SWE domain: a teacher runs the bash agent on the SWE task set, k
attempts per task, into the trajectory store (recipes/agentic/distill.py has the details:
resuming, aborted attempts, budgets).

Jobs (experiments/swe_distill.py; choose one with --config.job=NAME):
  swe_distill.collect  k attempts per task, `distill.parallel` at a time, each in its own
                       sandbox, every model call through the recording proxy, every submission
                       graded in a fresh sandbox; resumable, with budgets and a progress bar
  swe_distill.stats, swe_distill.export, swe_distill.import   see agentic/trajectory_data.py
"""
from __future__ import annotations

from ml_collections import ConfigDict

from orchard_jax.recipes.agentic import distill
from orchard_jax.recipes.agentic.trajectory_data import DistillError, store_path
from orchard_jax.recipes.swe.domain import SWEDomain

Budget = distill.Budget
CollectionSummary = distill.CollectionSummary


def collect(config: ConfigDict) -> distill.CollectionSummary:
  """Job "swe_distill.collect": collect teacher trajectories on the SWE task set, print the run
  summary and the store's statistics for the experiment."""
  return distill.collect(config, SWEDomain(config))


__all__ = ["Budget", "CollectionSummary", "DistillError", "collect", "store_path"]
