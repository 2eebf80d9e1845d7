"""Next-token SFT of the tiny policy on the Python standard library's source (trainer check).

`python launch/run.py --config experiments/lm_sft.py` trains for a few minutes on 2 CPU cores
and prints held-out loss beside the unigram baseline; curves: `tensorboard --logdir runs/`.
"""
import ml_collections


def get_config(preset="tiny"):
  from orchard_jax.models.presets import PRESETS
  if preset not in PRESETS:
    raise ValueError(f"preset {preset!r} is not one of the model presets {sorted(PRESETS)}")
  config = ml_collections.ConfigDict()
  config.job = "lm.sft"
  config.preset = preset                      # models.get_preset(name)
  config.workdir = f"runs/lm_sft_{preset}"    # checkpoints/, metrics.jsonl, tensorboard/
  config.resume = "auto"     # "force": resume the folder's run even if its identity differs
  # ModelConfig overrides of the preset: bfloat16 compute over float32 master weights is
  # dtype="bfloat16", param_dtype="float32" (AdamW moments follow param_dtype).
  config.model = ml_collections.ConfigDict(dict(dtype="float32", param_dtype="float32",
                                                remat=False))
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
  config.data = ml_collections.ConfigDict(dict(
      tokenizer="tiny",            # data.load_tokenizer: "tiny" or a Hugging Face folder
      max_chars_per_file=20_000,   # characters kept from each standard-library file
      heldout_fraction=0.05,       # of files, chosen by a hash of their text
      seq_len=256, batch_size=8, eval_batches=4, seed=0))
  config.train = ml_collections.ConfigDict(dict(
      total_steps=120, microbatches=1, chunk_size=256,
      load_balancing_coef=0.001,   # -1: the model config's router_aux_loss_coef
      save_every=40, keep_checkpoints=3, async_checkpoints=True,
      eval_every=40, log_every=1, seed=0, tensorboard=True, progress=True))
  config.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=3e-3, end_learning_rate=3e-4, warmup_steps=10, schedule="cosine",
      weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8, max_grad_norm=1.0))
  return config
