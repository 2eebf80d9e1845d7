"""`grpo.pack_updates`: RL rows are as long as the iteration's longest sequence needs (rounded
up to rl.chunk_size, at most rl.seq_len), not the configured context: an external harness's
context is raised to 24576 tokens while its rows are ~9-17k, and attention's cost grows with the
row length squared. Every token of every sequence that fits is kept, at its place."""
import hypothesis
import numpy as np
from hypothesis import strategies as st
from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes.agentic import grpo


def _sequence(n: int, k: int) -> data.TrainingSequence:
  ids = (np.arange(n) * 7 + k) % 97 + 1
  weights = (np.arange(n) % 2).astype(np.float32)           # a loss token every other place
  return data.TrainingSequence(input_ids=ids.astype(np.int32), loss_weights=weights,
                               old_logprobs=-weights, action_ids=np.zeros(n, np.int32),
                               advantages=np.full(n, 1.0, np.float32), session_id=f"s{k}")


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(lengths=st.lists(st.integers(2, 300), min_size=1, max_size=6),
                  chunk=st.sampled_from([1, 16, 64]), seq_len=st.integers(64, 512))
def test_rows_are_as_long_as_the_longest_sequence_needs(lengths, chunk, seq_len):
  config = ConfigDict(dict(rl=dict(batch_size=2, seq_len=seq_len, chunk_size=chunk,
                                   max_updates_per_iteration=100)))
  sequences = [_sequence(n, k) for k, n in enumerate(lengths)]
  batches, stats = grpo.pack_updates(sequences, config, data_parallel_size=1, seed=0)
  expected = min(seq_len, -(-max(lengths) // chunk) * chunk)
  assert batches and all(b["input_ids"].shape == (2, expected) for b in batches)
  # every loss token of a sequence that fits is trained (none lost to the shorter rows)
  fitting = sum(float(s.loss_weights[1:].sum()) for s in sequences if len(s) <= expected)
  trained = sum(float(np.sum(b["loss_weights"])) for b in batches)
  assert trained >= fitting
