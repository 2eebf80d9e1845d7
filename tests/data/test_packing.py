"""Packing, checked by unpacking the batches again with code written here."""
import numpy as np
import pytest

from orchard_jax.data import PackingError, TrainingSequence, pack_sequences


def _random_sequences(n, rng, max_len=60, teacher_every=0):
  seqs = []
  for i in range(n):
    length = int(rng.integers(2, max_len + 1))
    weights = (rng.random(length) < 0.6).astype(np.float32)
    weights[0] = 0.0
    weights[-1] = 1.0
    kwargs = {}
    if teacher_every and i % teacher_every == 0:
      kwargs = dict(teacher_logprobs=-rng.random(length), teacher_mask=np.ones(length))
    seqs.append(TrainingSequence(
      input_ids=np.concatenate([[i], rng.integers(100, 8000, length - 1)]),  # first id = index
      loss_weights=weights, old_logprobs=-rng.random(length), action_ids=np.zeros(length),
      temperatures=rng.choice([0.7, 1.0, 1.3], length), **kwargs).with_advantage(
        float(rng.normal())))
  return seqs


def _unpack(batches):
  """Independent unpacking: walk each row's segment ids and positions."""
  found = []
  for batch in batches:
    rows, seq_len = batch["input_ids"].shape
    for r in range(rows):
      seg = batch["segment_ids"][r]
      assert np.all(np.diff(seg[seg > 0]) >= 0), "segment ids increase along a row"
      padding = seg == 0
      assert not batch["loss_weights"][r][padding].any()
      for s in np.unique(seg[seg > 0]):
        idx = np.flatnonzero(seg == s)
        assert np.array_equal(idx, np.arange(idx[0], idx[-1] + 1)), "segments are contiguous"
        assert np.array_equal(batch["positions"][r, idx], np.arange(len(idx)))
        found.append({k: v[r, idx] for k, v in batch.items()})
  return found


def _first_fit_decreasing_rows(lengths, capacity):
  """Reference first-fit decreasing: list of row fills."""
  rows = []
  for n in sorted(lengths, reverse=True):
    for j, fill in enumerate(rows):
      if fill + n <= capacity:
        rows[j] += n
        break
    else:
      rows.append(n)
  return rows


def test_unpacking_gives_back_every_sequence():
  rng = np.random.default_rng(0)
  seqs = _random_sequences(200, rng, teacher_every=3)
  packed = pack_sequences(seqs, batch_size=8, seq_len=128, data_parallel_size=4, seed=1)
  shapes = {(k, v.shape, v.dtype.name) for b in packed.batches for k, v in b.items()}
  assert {s[1] for s in shapes} == {(8, 128)}
  assert {k for k, _, _ in shapes} == {"input_ids", "positions", "segment_ids", "loss_weights",
                                        "old_logprobs", "advantages", "temperatures",
                                        "teacher_logprobs", "teacher_mask"}
  assert {(k, d) for k, _, d in shapes if k in ("input_ids", "positions", "segment_ids")} == {
    ("input_ids", "int32"), ("positions", "int32"), ("segment_ids", "int32")}
  segments = _unpack(packed.batches)
  assert len(segments) == len(seqs)
  by_first_id = {int(s["input_ids"][0]): s for s in segments}
  for i, seq in enumerate(seqs):
    got = by_first_id[i]
    np.testing.assert_array_equal(got["input_ids"], seq.input_ids)
    np.testing.assert_array_equal(got["loss_weights"], seq.loss_weights)
    np.testing.assert_array_equal(got["old_logprobs"], seq.old_logprobs)
    np.testing.assert_array_equal(got["advantages"], seq.advantages)
    np.testing.assert_array_equal(got["temperatures"], seq.temperatures)
    if seq.teacher_logprobs is not None:
      np.testing.assert_array_equal(got["teacher_logprobs"], seq.teacher_logprobs)
      assert got["teacher_mask"].all()
    else:
      assert not got["teacher_mask"].any()
    p = packed.placements[i]
    np.testing.assert_array_equal(
      packed.batches[p.batch]["input_ids"][p.row, p.start:p.start + p.length], seq.input_ids)
  stats = packed.stats
  assert stats.packed == 200 and stats.truncated == stats.dropped_too_long == 0
  assert stats.tokens == sum(map(len, seqs))
  assert stats.loss_tokens == sum(s.num_loss_tokens for s in seqs)
  reference_rows = _first_fit_decreasing_rows([len(s) for s in seqs], 128)
  assert stats.rows == len(reference_rows)
  assert stats.batches == -(-len(reference_rows) // 8)
  assert stats.padding_rows == stats.batches * 8 - stats.rows


def test_deterministic_given_the_seed():
  rng = np.random.default_rng(1)
  seqs = _random_sequences(50, rng)
  a = pack_sequences(seqs, batch_size=4, seq_len=100, seed=7)
  b = pack_sequences(seqs, batch_size=4, seq_len=100, seed=7)
  c = pack_sequences(seqs, batch_size=4, seq_len=100, seed=8)
  for x, y in zip(a.batches, b.batches):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  assert any(not np.array_equal(x["input_ids"], y["input_ids"])
             for x, y in zip(a.batches, c.batches))


def test_filtered_groups_never_change_the_per_device_shape():
  """docs/cases.md 4: 3 of 8 groups dropped -> padding rows with zero weight, same shapes."""
  rng = np.random.default_rng(2)
  full = _random_sequences(8 * 4, rng, max_len=100)  # 8 groups of 4 rollouts
  kept = full[: 5 * 4]
  for seqs in (full, kept):
    packed = pack_sequences(seqs, batch_size=32, seq_len=100, data_parallel_size=8,
                            num_batches=1, shuffle=False)
    (batch,) = packed.batches
    per_device = batch["input_ids"].reshape(8, 4, 100)
    assert per_device.shape == (8, 4, 100)
    empty = ~batch["segment_ids"].any(axis=1)
    assert empty.sum() == packed.stats.padding_rows
    assert not batch["loss_weights"][empty].any()
  with pytest.raises(PackingError, match="does not split evenly"):
    pack_sequences(kept, batch_size=6, seq_len=100, data_parallel_size=4)


def test_overflow_policies_are_counted():
  long = TrainingSequence(input_ids=np.arange(10), loss_weights=[0] + [1] * 9,
                          old_logprobs=np.zeros(10), action_ids=np.zeros(10))
  tail_only = TrainingSequence(input_ids=np.arange(10), loss_weights=[0] * 8 + [1, 1],
                               old_logprobs=np.zeros(10), action_ids=np.zeros(10))
  short = TrainingSequence(input_ids=[1, 2, 3], loss_weights=[0, 1, 1],
                           old_logprobs=np.zeros(3), action_ids=np.zeros(3))
  no_loss = TrainingSequence(input_ids=[1, 2], loss_weights=[0, 0], old_logprobs=[0, 0],
                             action_ids=[0, 0])
  seqs = [long, tail_only, short, no_loss]
  t = pack_sequences(seqs, batch_size=2, seq_len=6, overflow="truncate")
  assert (t.stats.truncated, t.stats.dropped_no_loss, t.stats.packed) == (2, 2, 2)
  assert t.stats.truncated_loss_tokens == 4 + 2
  assert t.placements[0].length == 6 and t.placements[1] is None and t.placements[3] is None
  d = pack_sequences(seqs, batch_size=2, seq_len=6, overflow="drop")
  assert (d.stats.dropped_too_long, d.stats.dropped_no_loss, d.stats.packed) == (2, 1, 1)
  with pytest.raises(PackingError, match="more than seq_len"):
    pack_sequences(seqs, batch_size=2, seq_len=6, overflow="error")


def test_batch_count_options():
  rng = np.random.default_rng(3)
  seqs = _random_sequences(10, rng, max_len=50)
  multiple = pack_sequences(seqs, batch_size=1, seq_len=50, num_batches_multiple_of=4)
  assert multiple.stats.batches % 4 == 0 and multiple.stats.batches >= multiple.stats.rows
  exact = pack_sequences(seqs, batch_size=4, seq_len=50, num_batches=6)
  assert len(exact.batches) == 6
  with pytest.raises(PackingError, match="more than num_batches"):
    pack_sequences(seqs, batch_size=1, seq_len=50, num_batches=1)
  assert pack_sequences([], batch_size=2, seq_len=8).batches == []


def test_ref_logprobs_on_some_sequences_only_is_an_error():
  a = TrainingSequence(input_ids=[1, 2], loss_weights=[0, 1], old_logprobs=[0, 0],
                       action_ids=[0, 0], ref_logprobs=[0, -1])
  b = TrainingSequence(input_ids=[1, 2], loss_weights=[0, 1], old_logprobs=[0, 0],
                       action_ids=[0, 0])
  with pytest.raises(PackingError, match="ref_logprobs"):
    pack_sequences([a, b], batch_size=1, seq_len=4)
  both = pack_sequences([a, a], batch_size=1, seq_len=4)
  np.testing.assert_array_equal(both.batches[0]["ref_logprobs"][0], [0, -1, 0, -1])


def test_value_labels_follow_each_sequence_and_feed_the_value_loss():
  """The value model's batches: each sequence's label on its tokens (0 on padding), exactly the
  `value_labels` key train.ValueLoss reads; the value BCE on those batches equals a NumPy BCE
  at each sequence's final token written here (docs/algorithms.md section 6)."""
  from orchard_jax import rl
  from orchard_jax.train import ValueLoss
  rng = np.random.default_rng(3)
  seqs = _random_sequences(23, rng, max_len=40)
  labels = (rng.random(len(seqs)) < 0.5).astype(np.float32)
  packed = pack_sequences(seqs, batch_size=4, seq_len=64, data_parallel_size=2, seed=5,
                          value_labels=labels)
  assert all(set(ValueLoss.keys) <= set(batch) for batch in packed.batches)
  found = _unpack(packed.batches)
  assert sorted(int(f["input_ids"][0]) for f in found) == list(range(len(seqs)))
  for f in found:
    assert np.all(f["value_labels"] == labels[int(f["input_ids"][0])])
  for batch in packed.batches:
    assert batch["value_labels"].dtype == np.float32
    assert not batch["value_labels"][batch["segment_ids"] == 0].any()
  # Without labels, no value_labels key (policy batches keep their keys).
  assert "value_labels" not in pack_sequences(seqs, batch_size=4, seq_len=64).batches[0]

  bce, count = 0.0, 0
  logits = [rng.normal(size=b["input_ids"].shape).astype(np.float32) for b in packed.batches]
  for batch, x in zip(packed.batches, logits):
    seg = batch["segment_ids"]
    for r in range(seg.shape[0]):
      for s in np.unique(seg[r][seg[r] > 0]):
        last = np.flatnonzero(seg[r] == s)[-1]
        y, p = batch["value_labels"][r, last], 1 / (1 + np.exp(-float(x[r, last])))
        bce -= y * np.log(p) + (1 - y) * np.log(1 - p)
        count += 1
  assert count == len(seqs)
  total = 0.0
  for batch, x in zip(packed.batches, logits):
    weights = rl.value_loss_weights(batch["segment_ids"])
    loss, _ = rl.value_loss(x, batch["value_labels"], weights, batch["segment_ids"],
                            normalizer=np.float32(count))
    total += float(loss)
  assert total == pytest.approx(bce / count, rel=1e-5)


def test_value_labels_must_be_one_finite_label_per_sequence():
  seqs = _random_sequences(3, np.random.default_rng(0))
  with pytest.raises(PackingError, match="one label per sequence"):
    pack_sequences(seqs, batch_size=2, seq_len=64, value_labels=[1.0, 0.0])
  with pytest.raises(PackingError, match="NaN"):
    pack_sequences(seqs, batch_size=2, seq_len=64, value_labels=[1.0, float("nan"), 0.0])
