"""A training run in its own process, for tests/train/test_checkpoint.py.

`python resume_worker.py WORKDIR [--kill-at-commit STEP]` trains the small CausalLM for 6 steps
(checkpoint every 2), printing each step's loss as JSON. With --kill-at-commit, the process
SIGKILLs itself inside orbax's commit of that step's checkpoint, after every file of it was
written and before the atomic rename that publishes it: the worst moment for a crash.
"""
import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from conftest import packed_batch, small_config  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--kill-at-commit", type=int, default=None)
  args = parser.parse_args()
  if args.kill_at_commit is not None:
    from orchard_jax.train import checkpoint  # noqa: F401  (orbax imported)
    from orbax.checkpoint._src.path import atomicity
    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self, *a, **k):
      if self.get_final().name == str(args.kill_at_commit):
        os.kill(os.getpid(), signal.SIGKILL)
      return await original(self, *a, **k)
    atomicity.AtomicRenameTemporaryPath.finalize = finalize

  from flax import nnx

  from orchard_jax import models, train
  model = models.CausalLM(small_config(), rngs=nnx.Rngs(0))
  config = train.TrainerConfig(
      workdir=args.workdir, total_steps=6, save_every=2, keep_checkpoints=5, progress=False,
      optimizer=train.OptimizerConfig(learning_rate=1e-2, warmup_steps=2, total_steps=6))
  with train.Trainer(model, train.SFTLoss(chunk_size=8), config) as trainer:
    print(json.dumps({"start": trainer.step}), flush=True)
    while trainer.step < config.total_steps:
      metrics = trainer.train_step(packed_batch(100 + trainer.step))
      print(json.dumps({"step": trainer.step, "loss": metrics["loss"]}), flush=True)
    trainer.save(force=True)


if __name__ == "__main__":
  main()
