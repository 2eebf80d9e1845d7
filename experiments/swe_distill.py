"""Data distillation: a teacher runs the SWE harness, k attempts per task, into the trajectory
store (orchard_jax/recipes/agentic/distill.py has the details).

  python launch/run.py --config experiments/swe_distill.py                 # collect (resumable)
  python launch/run.py --config experiments/swe_distill.py --config.job=swe_distill.stats
  python launch/run.py --config experiments/swe_distill.py --config.job=swe_distill.export
  python launch/run.py --config experiments/swe_distill.py --config.job=swe_distill.import \\
      --config.import_from=path/to/mini-swe-agent/run

By default the teacher is the embedded engine serving a freshly initialised tiny policy (no
network, no checkpoint: it exercises the whole pipeline and resolves nothing) on the first 3
tasks of the default task set, 2 attempts each. A real teacher:
  --config.teacher.checkpoint=runs/swe_sft_tiny/checkpoints          # a trained policy, embedded
  --config.teacher.url=https://api.example.com/v1 --config.teacher.model=NAME \\
      --config.teacher.api_key_env=EXAMPLE_API_KEY                    # hosted, text-only records
  --config.teacher.url=http://sglang:30000 --config.teacher.api=sglang \\
      --config.teacher.tokenizer=Qwen/Qwen3.5-35B-A3B                  # SGLang, token ids recorded
and a bigger run: --config.tasks.limit=0 --config.distill.attempts_per_task=8
--config.distill.parallel=16 --config.agent.step_limit=100 --config.sampling.max_tokens=0.

Presets: "tiny" (above) and "cluster": the fleet's Orchard Env and SGLang teacher servers
(launch/fleet.py with the teacher server enabled; ORCHARD_ENV_URL, ORCHARD_ENV_API_KEY,
ORCHARD_SGLANG_TEACHER_URL(S), ORCHARD_CHECKPOINT_DIR), every task, 4 attempts each, 64 at a
time; set --config.teacher.tokenizer=/models/NAME to the teacher's model folder.
"""
import os

import ml_collections

from experiments import common

PRESETS = ("tiny", "cluster")


def get_config(preset="tiny"):
  if preset not in PRESETS:
    raise ValueError(f"preset {preset!r} is not one of {PRESETS}")
  config = ml_collections.ConfigDict()
  config.job = "swe_distill.collect"
  config.experiment = "swe_distill"   # stored on every trajectory; resuming and stats filter on it
  config.workdir = f"runs/swe_distill_{preset}"   # store/, eval_logs/, stats/, export/
  config.resume = "auto"              # "force": continue the folder's collection even when its
                                      # teacher, task set or experiment differ
  config.store = ""                   # trajectory store folder ("" = workdir/store)
  config.progress = True

  config.tasks = common.swe_tasks()
  config.tasks.limit = 3              # the first 3 tasks of the default set (0 = all)
  config.env = common.sandbox_env()
  config.agent = common.swe_agent()
  config.agent.step_limit = 4
  config.agent.wall_time_limit_s = 300.0
  config.agent.command_timeout_s = 30.0

  config.teacher = ml_collections.ConfigDict(dict(
      url="",                   # "" = embedded engine; else the endpoint's base URL
      api="openai",             # with url: "openai" (text-only records) or "sglang" (token ids)
      model="",                 # model name requested upstream ("" = "teacher")
      api_key_env="OPENAI_API_KEY",  # environment variable holding the endpoint's key
      timeout_s=600.0, max_retries=3,
      checkpoint="",            # embedded: orbax or Hugging Face folder ("" = fresh init)
      preset=preset,            # embedded: models.get_preset name for an orbax checkpoint
      model_overrides=ml_collections.ConfigDict(dict(dtype="float32")),
      seed=0,                   # initialisation seed when there is no checkpoint
      tokenizer="tiny",         # embedded / sglang: the teacher's tokenizer
      tool_call_parser="qwen3",
      engine=ml_collections.ConfigDict(dict(   # embedded engine (rollout.EngineConfig);
          batch_buckets=(),                    # max_batch_size = distill.parallel
          max_seq_len=2048, cache_len_buckets=(2048,), prefill_chunk_buckets=(512,),
          decode_steps=16, seed=0)),
  ))
  # Sent by the harness with every request (0 / None: the endpoint's default).
  config.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_p=1.0, max_tokens=96))

  config.distill = ml_collections.ConfigDict(dict(
      attempts_per_task=2,      # k
      parallel=2,               # attempts at once, each with its own sandboxes
      evaluate=True,            # grade every submission in a fresh sandbox
      retry_aborted=True,       # a later run tries aborted attempts again
      max_attempts=0,           # per-run budgets, 0 = none: attempts started,
      max_wall_time_s=0.0,      # seconds,
      max_tokens=0,             # prompt + completion tokens
  ))
  config.stats = ml_collections.ConfigDict(dict(
      tokenizer="tiny",         # the student's: counts tokens of text-only trajectories
      max_tokens=4096,          # the student's context: longer trajectories are "too_long"
      plots_dir="",             # "" = workdir/stats
  ))
  config.export = ml_collections.ConfigDict(dict(
      miniswe_dir="",           # "" = workdir/export/miniswe; "none" skips
      hf_path="",               # "" = workdir/export/trajectories.parquet; "none" skips
  ))
  config.import_from = ""       # mini-swe-agent trajectory file or folder (job swe_distill.import)
  config.import_experiment = "imported"  # experiment of imported trajectories that name none
  if preset == "cluster":
    config.workdir = os.path.join(os.environ.get("ORCHARD_CHECKPOINT_DIR", "runs"), "swe_distill")
    config.env.url = os.environ.get("ORCHARD_ENV_URL", "")
    config.env.api_key = os.environ.get("ORCHARD_ENV_API_KEY", "")
    config.teacher.url = (os.environ.get("ORCHARD_SGLANG_TEACHER_URLS")
                          or os.environ.get("ORCHARD_SGLANG_TEACHER_URL", ""))
    config.teacher.api, config.teacher.tokenizer = "sglang", ""
    config.teacher.preset = "qwen3_5_35b_a3b"   # only if teacher.url is cleared (embedded)
    config.teacher.tool_call_parser = "qwen3_xml"
    config.tasks.limit = 0
    config.agent.step_limit, config.agent.wall_time_limit_s = 100, 1800.0
    config.agent.command_timeout_s = 60.0
    config.sampling.update(dict(temperature=0.95, top_p=0.95, max_tokens=4096))
    config.distill.update(dict(attempts_per_task=4, parallel=64))
    config.stats.max_tokens = 65536
  return config
