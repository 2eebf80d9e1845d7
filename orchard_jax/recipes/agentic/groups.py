"""GRPO groups of rollouts assembled by Balanced Adaptive Rollout (docs/algorithms.md section 2).

`balanced_groups` runs BAR for many prompts at once through `rl.balanced_adaptive_rollout`
(the one BAR driver): each round asks every prompt without a group for its next stride, the
runner executes all of them side by side, and each prompt's pool is offered to the assembly.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from orchard_jax import rl
from orchard_jax.recipes.agentic.rollouts import (Rollout, RolloutRequest, RolloutRunner,
                                                  rollout_seed)


@dataclasses.dataclass
class PromptGroup:
  """BAR's result for one prompt: every rollout generated, and the assembled group."""
  task: Any
  rollouts: list[Rollout]
  assembly: rl.Assembly
  stride: int
  group_size: int

  @property
  def group(self) -> list[Rollout]:
    """The assembled group's rollouts."""
    return [self.rollouts[s.rollout_id] for s in self.assembly.rollouts]

  @property
  def first_rollouts(self) -> list[Rollout]:
    """The rollouts BAR generates whatever their results: the first stride, or the first
    ceil(N / s) strides when a stride is smaller than the group (no group can assemble
    before N rollouts exist). An unbiased sample of the policy's success rate on this
    prompt; later strides depend on earlier results."""
    always = -(-self.group_size // self.stride) * self.stride
    return [r for r in self.rollouts if r.request.attempt < always]


def balanced_groups(runner: RolloutRunner, tasks: Sequence[Any], bar: rl.BARConfig, *,
                    iteration: int, seed: int, policy_version: Optional[int] = None,
                    progress_factory: Optional[Callable[[int, str], Any]] = None
                    ) -> list[PromptGroup]:
  """BAR for every prompt at once (module docstring).

  Args:
    runner: runs the rollouts.
    tasks: one prompt each (a task given twice samples each group with its own seeds).
    bar: BARConfig.
    iteration: stored on the trajectories; part of the rollout seeds.
    seed: base seed.
    policy_version: stored on the trajectories.
    progress_factory: (total, description) -> progress bar with update/close, or None.
  Returns:
    One PromptGroup per task, in order.
  """
  pools: list[list[Rollout]] = [[] for _ in tasks]
  rounds = [0]
  # A task given twice (more prompts than tasks) samples its second group with other seeds:
  # the same seeds would sample the same group again.
  task_ids = [runner.domain.task_id(t) for t in tasks]
  seed_parts = [(task_id,) if task_ids[:p].count(task_id) == 0
                else (task_id, task_ids[:p].count(task_id)) for p, task_id in enumerate(task_ids)]

  def generate(counts: Sequence[int]) -> list[list[rl.ScoredRollout]]:
    requests = []
    for p, count in enumerate(counts):
      for attempt in range(len(pools[p]), len(pools[p]) + count):
        requests.append(RolloutRequest(tasks[p], attempt, rollout_seed(
            seed, iteration, *seed_parts[p], attempt), prompt=p))
    finished = runner.run_with_progress(requests, f"rollouts it{iteration} r{rounds[0]}",
                                        progress_factory, iteration=iteration,
                                        policy_version=policy_version)
    rounds[0] += 1
    new: list[list[rl.ScoredRollout]] = [[] for _ in tasks]
    for rollout in finished:      # every request yields a rollout, in request order
      pool = pools[rollout.request.prompt]
      new[rollout.request.prompt].append(rollout.scored(len(pool)))
      pool.append(rollout)
    return new

  assemblies = rl.balanced_adaptive_rollout(generate, bar, num_prompts=len(tasks))
  return [PromptGroup(task, pools[p], assemblies[p], bar.stride, bar.group_size)
          for p, task in enumerate(tasks)]
