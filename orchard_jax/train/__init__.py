"""The sharded trainer: train step, optimiser, orbax checkpoints, metrics."""
