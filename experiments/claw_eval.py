"""Orchard-Claw evaluation: a checkpoint (default: the claw_rl run of the same preset) on the
hand-written evaluation tasks, 3 trials each, with the configured harness
(`--config.agent.harness=react|codex|claude_code`); prints pass@3 and pass^3 per service and
overall, then where the rollouts spent their time (services up, model calls, the rest; prompt
and output tokens), also written to <run>/eval/rollout_times.json.

What one rollout may cost, all settable on the command line:
  agent.step_limit          model calls per episode (tiny 4, else 30); an external harness gets
                            it as its turn limit
  sampling.max_tokens       new tokens per model call (tiny 64: a tiny tool call is ~40;
                            else 2048)
  agent.max_consecutive_format_errors
                            replies in a row that are neither a tool call nor an answer before
                            the episode ends (tiny 2)
  agent.wall_time_limit_s   the published 10-minute budget per task (600)
  eval.parallel             rollouts at a time (0: rl.parallel_rollouts, i.e. engine.max_batch_size
                            on tiny: more would only queue at the engine while their sandboxes
                            and wall clocks run)
  eval.max_instances        the first N evaluation tasks (0: all 48)
Measured on 2 cores (tiny, ReAct): a rollout's time is ~97% model calls, almost all of it
prefilling the first prompt (0.4k-5.4k tokens: the task's tool schemas; ~314k tokens for the
48 tasks x 3 trials), then decoding; services up ~1 s, tool calls and grading < 1 s. The loop
starts a task's next trial one block of eval.parallel requests after the last
(evaluation.trial_order), so the engine's prefix cache can serve the shared first prompt.
The whole evaluation (48 x 3, ReAct, claw_rl tiny checkpoint) took 12.3 min (737 s wall,
1,352 CPU-s) on 2 cores with the cores to itself (load 3.3-4.7, the test suite running beside
it at nice 19; 2026-12-01 19:32), services up p50 0.23 s / p99 0.84 s; on the shared machine at
load 6-29 (mostly 7-14), with 0.58 of a core on average, it took 33.4 min.
"""
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
  config.eval.parallel = 0
  return config
