"""Orchard-GUI data distillation: a teacher runs the browser harness on the GUI task set, k
attempts per task, graded, into the trajectory store (orchard_jax/recipes/agentic/distill.py has
the details: resuming, aborted attempts, budgets).

  python launch/run.py --config experiments/gui_distill.py                 # collect (resumable)
  python launch/run.py --config experiments/gui_distill.py --config.job=gui_distill.stats

By default the teacher is the embedded engine serving a freshly initialised tiny_vl policy (no
network, no checkpoint: it exercises the pipeline and solves nothing). A real teacher sees every
turn's screenshot as an OpenAI image part (the last agent.screenshots_in_context of them):
  --config.teacher.url=https://api.example.com/v1 --config.teacher.model=NAME \\
      --config.teacher.api_key_env=EXAMPLE_API_KEY      # a hosted VLM, text-only records
  --config.teacher.checkpoint=runs/gui_sft_tiny/checkpoints    # a trained policy, embedded
The stored trajectories train SFT: --config.sft.source=<workdir>/store with experiments/gui_sft.py.
"""
import ml_collections

from experiments import common


def get_config(preset="tiny"):
  config = common.gui_base(preset)
  big = preset != "tiny"
  config.job = "gui_distill.collect"
  config.name = "gui_distill"
  config.experiment = "gui_distill"     # stored on every trajectory; resuming filters on it
  config.workdir = f"runs/gui_distill_{preset}"
  config.teacher = ml_collections.ConfigDict(dict(
      url="",                   # "" = embedded engine; else the endpoint's base URL
      api="openai",             # with url: "openai" (text-only records) or "sglang" (token ids)
      model="",                 # model name requested upstream
      api_key_env="OPENAI_API_KEY",  # environment variable holding the endpoint's key
      timeout_s=600.0, max_retries=3,
      checkpoint="",            # embedded: orbax or Hugging Face folder ("" = fresh init)
      preset=config.policy.preset,   # embedded: models.get_preset name
      model_overrides=ml_collections.ConfigDict(dict(dtype="float32")),
      seed=0,                   # initialisation seed when there is no checkpoint
      tokenizer=config.policy.tokenizer,   # embedded / sglang: the teacher's tokenizer
      tool_call_parser=config.policy.tool_call_parser,
      engine=ml_collections.ConfigDict(dict(   # embedded engine (rollout.EngineConfig)
          batch_buckets=(), max_seq_len=config.engine.max_seq_len,
          cache_len_buckets=(config.engine.max_seq_len,), prefill_chunk_buckets=(512,),
          decode_steps=16, seed=0)),
  ))
  config.distill = ml_collections.ConfigDict(dict(
      attempts_per_task=4 if big else 1,   # k
      parallel=16 if big else 1,           # attempts at once, each in its own browser sandbox
      evaluate=True,            # grade every attempt (the task's reward, checker or judge)
      retry_aborted=True,       # a later run tries aborted attempts again
      max_attempts=0, max_wall_time_s=0.0, max_tokens=0,   # per-run budgets, 0 = none
  ))
  config.stats = ml_collections.ConfigDict(dict(
      tokenizer=config.policy.tokenizer,   # the student's: counts tokens of text-only records
      preset=config.policy.preset,         # ... and its vision encoder, their images' tokens
      max_tokens=config.sft.max_tokens, plots_dir=""))
  config.export = ml_collections.ConfigDict(dict(miniswe_dir="none", hf_path=""))
  return config
