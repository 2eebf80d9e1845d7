"""Which training tasks an RL iteration rolls out (`grpo.choose_prompts`) and the seeds their
groups sample with (`groups.balanced_groups`).

Found by the toy domain (tests/recipes/test_toy_domain.py): with 6 prompts an iteration over 8
tasks, an epoch boundary inside an iteration gave one task twice, both groups sampled with the
same seeds, so the same group was trained twice.
"""
import collections

import hypothesis
from hypothesis import strategies as st

from orchard_jax import data, rl
from orchard_jax.recipes.agentic import grpo, groups
from orchard_jax.recipes.agentic.rollouts import Rollout

_SETTINGS = hypothesis.settings(max_examples=100, deadline=None)


@_SETTINGS
@hypothesis.given(n=st.integers(1, 12), data=st.data(), iterations=st.integers(1, 10),
                  seed=st.integers(0, 2**31 - 1))
def test_an_iteration_never_repeats_a_task_while_there_are_enough(n, data, iterations, seed):
  count = data.draw(st.integers(1, n))
  tasks = [f"t{i}" for i in range(n)]
  drawn = collections.Counter()
  for it in range(iterations):
    chosen = grpo.choose_prompts(tasks, count, iteration=it, seed=seed)
    assert len(chosen) == count and len(set(chosen)) == count and set(chosen) <= set(tasks)
    assert chosen == grpo.choose_prompts(tasks, count, iteration=it, seed=seed)  # resumable
    drawn.update(chosen)
    counts = [drawn[t] for t in tasks]   # still every task once before any repeats
    assert max(counts) - min(counts) <= 1, (it, counts)


@_SETTINGS
@hypothesis.given(n=st.integers(1, 10), seed=st.integers(0, 2**31 - 1))
def test_whole_epochs_per_iteration_are_the_seeded_permutations(n, seed):
  """count = len(tasks) (the tiny SWE preset's 2 prompts over 2 tasks): iteration i is epoch
  i's permutation, as before the deferral rule."""
  import numpy as np
  tasks = list(range(n))
  for it in range(3):
    expected = [int(i) for i in np.random.default_rng([seed, it]).permutation(n)]
    assert grpo.choose_prompts(tasks, n, iteration=it, seed=seed) == expected


class _Domain:
  def task_id(self, task):
    return task


class _Runner:
  """Records the requests balanced_groups makes and answers each with a resolved rollout
  (no model, no sandbox: the seeds are what this test is about)."""
  domain = _Domain()

  def __init__(self):
    self.requests = []

  def run_with_progress(self, requests, description, progress_factory, **_):
    self.requests += requests
    return [Rollout(request=r, session_id=f"s{len(self.requests)}-{i}", aborted=False,
                    seconds=0.0, reward=1.0 if r.attempt % 2 else -1.0,
                    trajectory=data.Trajectory(
                        trajectory_id=f"{r.task}-{r.attempt}", task_id=r.task,
                        exit_status="Submitted", outcome={"resolved": bool(r.attempt % 2)}))
            for i, r in enumerate(requests)]


def test_a_task_given_twice_samples_each_group_with_its_own_seeds():
  runner = _Runner()
  bar = rl.BARConfig(group_size=2, max_rollouts=2, stride=2, positive_fraction=(0.0, 1.0))
  groups.balanced_groups(runner, ["a", "b", "a"], bar, iteration=3, seed=7)
  seeds = collections.defaultdict(list)
  for r in runner.requests:
    seeds[r.prompt].append(r.seed)
  assert len(runner.requests) == 6
  assert not set(seeds[0]) & set(seeds[2]), seeds
  # A task given once keeps the seeds it always had.
  from orchard_jax.recipes.agentic.rollouts import rollout_seed
  assert seeds[1] == [rollout_seed(7, 3, "b", 0), rollout_seed(7, 3, "b", 1)]
  assert seeds[0] == [rollout_seed(7, 3, "a", 0), rollout_seed(7, 3, "a", 1)]
