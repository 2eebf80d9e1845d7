"""Orchard-SWE main job: GRPO with Balanced Adaptive Rollout and rubric-based process reward.

    python launch/run.py --config experiments/swe_rpr.py                 # tiny, embedded, CPU
    python launch/run.py --config experiments/swe_rpr.py:qwen3_5_35b_a3b # published setting
    python launch/run.py --config experiments/swe_rpr.py:cluster         # on the fleet

Builds or loads the task set, warm-starts the policy with credit-assignment SFT on replay-expert
trajectories (unless policy.init names a checkpoint), then runs RL iterations: BAR rollouts
through the recording proxy in sandboxes, evaluation in fresh sandboxes, judging on the seven
rubrics (R' = R_bin + rpr_alpha * J; docs/algorithms.md sections 2 and 5), the group filter, packed
updates, weight sync, checkpoints, and a final checkpoint evaluation. The offline evidence judge
is the default; an LLM judge is `--config.judge.kind=llm --config.judge.url=... 
--config.judge.model=... --config.judge.api_key_env=VAR`.
"""
from experiments import common


def get_config(preset="tiny"):
  config = common.swe_base(preset)
  config.job = "swe.rl"
  config.name = "swe_rpr"
  config.rl.reward = "rpr"
  config.rl.rpr_alpha = 0.5
  if preset == "tiny":      # the default run's time budget: evaluate the training subset only
    config.eval.splits = ("train",)
  return config
