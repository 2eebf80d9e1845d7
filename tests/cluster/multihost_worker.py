"""One host of the multi-host test: joins jax.distributed from the environment (as
launch/run.py does on a cluster), trains a small MoE policy with the unchanged Trainer on a
mesh over every process's devices, and prints one JSON line with what it saw.

  python multihost_worker.py WORKDIR STEPS
"""
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from orchard_jax.parallel import distributed  # noqa: E402

joined = distributed.initialize_from_env()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from orchard_jax import models  # noqa: E402
from orchard_jax.models import hf  # noqa: E402
from orchard_jax import train  # noqa: E402

BATCH, SEQ = 8, 48


def batches(vocab: int, steps: int) -> list[dict]:
  """The same packed batches on every process: two segments per row, some padding."""
  rng = np.random.default_rng(1234)
  out = []
  for _ in range(steps):
    ids = rng.integers(1, vocab, size=(BATCH, SEQ)).astype(np.int32)
    segments = np.ones((BATCH, SEQ), np.int32)
    segments[:, 30:] = 2
    segments[::3, 42:] = 0                       # padding at the end of some rows
    positions = np.concatenate([np.arange(30), np.arange(SEQ - 30)])[None].repeat(BATCH, 0)
    weights = (segments > 0).astype(np.float32)
    weights[:, 0] = weights[:, 30] = 0.0         # a segment's first token is never scored
    out.append(dict(input_ids=ids, positions=positions.astype(np.int32),
                    segment_ids=segments, loss_weights=weights))
  return out


def main(workdir: str, steps: int) -> None:
  config = dataclasses.replace(
      models.get_preset("tiny"), vocab_size=256, hidden_size=64, num_hidden_layers=1,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=64,
      num_experts=4, num_experts_per_tok=2)
  # One mesh over every device of every process: ("data", "fsdp") = (4, 2).
  mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "fsdp"))
  model = models.CausalLM(config, rngs=nnx.Rngs(0))
  trainer_config = train.TrainerConfig(
      workdir=workdir, total_steps=steps, save_every=10_000, tensorboard=False, progress=False,
      async_checkpoints=False, load_balancing_coef=config.router_aux_loss_coef,
      optimizer=train.OptimizerConfig(learning_rate=3e-3, warmup_steps=0, schedule="constant"))
  losses = []
  with train.Trainer(model, train.SFTLoss(), trainer_config, mesh=mesh) as trainer:
    for batch in batches(config.vocab_size, steps):
      losses.append(float(trainer.train_step(batch)["loss"]))
    # Hugging Face export of parameters sharded across both hosts: every process calls it
    # (collective gather), process 0 writes.
    written = hf.save_pretrained(trainer.model(), config, os.path.join(workdir, "hf"))
  print(json.dumps({"joined": joined, "hf_files": written, "process_index": jax.process_index(),
                    "process_count": jax.process_count(), "devices": jax.device_count(),
                    "local_devices": jax.local_device_count(), "losses": losses}), flush=True)
  distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))
