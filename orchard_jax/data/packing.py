"""Packing training sequences into fixed-shape [batch, seq] batches (docs/contracts.md, packed batch).

Sequences are placed into rows of `seq_len` tokens by first-fit decreasing (longest first, each
into the first row with room), rows are shuffled with a seed and grouped into batches of
`batch_size` rows. Every batch has the same shape, so a jitted train step never recompiles;
rows without data are padding (segment id 0, weight 0); `batch_size` must divide evenly over
the data-parallel devices, so that no device ever sees a different shape (docs/cases.md 4).

A batch is a dict of numpy arrays, all [batch_size, seq_len]:
  input_ids int32, positions int32 (0, 1, ... restarting at every segment), segment_ids int32
  (1..k in each row, 0 = padding), loss_weights float32, old_logprobs float32, advantages
  float32, temperatures float32 (the softmax temperature each token was sampled at, which
  old_logprobs are of; 1 on context tokens and padding); and, when any sequence carries them, teacher_logprobs + teacher_mask float32 (OPD)
  and ref_logprobs float32 (KL); with `value_labels` given, value_labels float32 (each
  sequence's label, e.g. its trajectory's resolved outcome, on all of its tokens; 0 on padding:
  what `train.ValueLoss` reads). Per-token values keep the alignment of the sequences: the
  value at [b, t] describes predicting input_ids[b, t].

Vision-language sequences (TrainingSequence.images) also take image slots: each row holds at
most `images_per_row` images, and `PackedData.row_images[batch][row]` lists the digests of the
images of that row in placeholder order (train.multimodal turns them into pixel arrays and 3-D
position ids beside the batch). A sequence cut by truncation keeps only whole images: the cut
moves back to the start of an image it would split, and to the start of the first image
beyond the row's slots.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from orchard_jax.data.errors import PackingError
from orchard_jax.data.sequences import TrainingSequence

PackedBatch = dict  # str -> np.ndarray [batch, seq]

REQUIRED_KEYS = ("input_ids", "positions", "segment_ids", "loss_weights", "old_logprobs",
                 "advantages", "temperatures")
_FLOAT_KEYS = ("loss_weights", "old_logprobs", "advantages", "temperatures",
               "teacher_logprobs", "teacher_mask", "ref_logprobs")
OVERFLOW_POLICIES = ("truncate", "drop", "error")


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one input sequence went: batches[batch][row, start:start + length]."""
  batch: int
  row: int
  start: int
  length: int


@dataclasses.dataclass(frozen=True)
class PackingStats:
  """Counts of one packing (log them: silent truncation hides data loss).

  Attributes:
    sequences: sequences given.
    packed: sequences placed in a batch.
    truncated: sequences cut to seq_len (overflow="truncate"); their tails are lost.
    dropped_too_long: sequences longer than seq_len left out (overflow="drop").
    dropped_no_loss: sequences with no loss token (after truncation) left out.
    truncated_loss_tokens: loss tokens cut off by truncation.
    rows, padding_rows: rows holding data, rows of padding.
    batches: number of batches.
    tokens, loss_tokens: real tokens and loss-carrying tokens placed.
    fill: tokens / (batches * batch_size * seq_len).
  """
  sequences: int
  packed: int
  truncated: int
  dropped_too_long: int
  dropped_no_loss: int
  truncated_loss_tokens: int
  rows: int
  padding_rows: int
  batches: int
  tokens: int
  loss_tokens: int
  fill: float

  def as_dict(self, prefix: str = "packing/") -> dict[str, float]:
    return {prefix + k: v for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class PackedData:
  """Result of `pack_sequences`.

  Attributes:
    batches: fixed-shape batches (see the module docstring).
    placements: one per input sequence, None for a sequence left out.
    stats: `PackingStats`.
    row_images: with images, per batch and row the image digests in placeholder order
      (None when no sequence has images).
  """
  batches: list[PackedBatch]
  placements: list[Placement | None]
  stats: PackingStats
  row_images: list[list[tuple[str, ...]]] | None = None


def pack_sequences(sequences: Sequence[TrainingSequence], *, batch_size: int, seq_len: int,
                   data_parallel_size: int = 1, overflow: str = "truncate", seed: int = 0,
                   shuffle: bool = True, num_batches: int | None = None,
                   num_batches_multiple_of: int = 1, pad_id: int = 0,
                   value_labels: Sequence[float] | None = None,
                   images_per_row: int | None = None,
                   image_token_id: int | None = None) -> PackedData:
  """Pack sequences into fixed-shape batches by first-fit decreasing.

  Deterministic: the same sequences, arguments and seed give the same batches. Ties in length
  are ordered by a seeded permutation, and rows are shuffled with the seed (shuffle=False keeps
  the first-fit order).

  Args:
    sequences: `TrainingSequence`s (ids, loss weights, old log-probs, advantages, optional
      teacher/ref log-probs).
    batch_size: rows per batch; a multiple of data_parallel_size.
    seq_len: tokens per row.
    data_parallel_size: devices the batch axis is split over (product of the mesh's data
      axes).
    overflow: what to do with a sequence longer than seq_len: "truncate" (keep its first
      seq_len tokens), "drop", or "error".
    seed: seed of tie-breaking and row shuffling.
    shuffle: shuffle rows before cutting them into batches.
    num_batches: exact number of batches wanted (padding batches are added; PackingError when
      the data needs more); None for as many as needed.
    num_batches_multiple_of: round the number of batches up to a multiple of this (gradient
      accumulation steps, hosts); ignored when num_batches is given.
    pad_id: input id of padding positions.
    value_labels: one float per sequence (the value model's target: 1.0 resolved, 0.0 not);
      when given, every batch carries `value_labels` [batch_size, seq_len] with each
      sequence's label on its tokens (a scalar per segment, as docs/algorithms.md section 6 trains
      at the final token or every prefix of a trajectory) and 0 on padding.
    images_per_row: image slots per row; required when a sequence has images. A sequence with
      more images than this overflows (the overflow policy applies).
    image_token_id: the image placeholder id; required with images (cuts keep whole images).
  Returns:
    `PackedData` (batches, placements, stats). With no data and num_batches None, zero batches.
  Raises:
    PackingError: bad sizes, overflow="error" with a long sequence, inconsistent optional
      arrays, or more data than num_batches can hold.
  """
  if batch_size <= 0 or seq_len <= 1:
    raise PackingError(f"need batch_size >= 1 and seq_len >= 2, got {batch_size} and {seq_len}")
  if data_parallel_size <= 0 or batch_size % data_parallel_size:
    raise PackingError(
      f"batch_size {batch_size} does not split evenly over {data_parallel_size} data-parallel "
      "devices; every device must get the same number of rows")
  if overflow not in OVERFLOW_POLICIES:
    raise PackingError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
  if num_batches_multiple_of <= 0:
    raise PackingError(f"num_batches_multiple_of must be >= 1, got {num_batches_multiple_of}")
  optional = _optional_keys(sequences)
  with_images = any(seq.images for seq in sequences)
  if with_images and (not images_per_row or images_per_row < 1 or image_token_id is None):
    raise PackingError(
      "sequences carry images: pass images_per_row >= 1 (image slots of a row) and "
      f"image_token_id; got {images_per_row} and {image_token_id}")
  if value_labels is not None:
    value_labels = np.asarray(value_labels, np.float32)
    if value_labels.shape != (len(sequences),):
      raise PackingError(f"value_labels needs one label per sequence ({len(sequences)}), got "
                         f"shape {value_labels.shape}")
    if not np.all(np.isfinite(value_labels)):
      raise PackingError("value_labels holds NaN or infinity; labels are resolved outcomes "
                         "(1.0 or 0.0) or probabilities")

  kept, lengths, image_counts = [], [], []
  truncated = dropped_long = dropped_empty = lost_loss = 0
  for i, seq in enumerate(sequences):
    n = len(seq)
    runs = _image_runs(seq, image_token_id, i) if with_images else []
    too_many = len(runs) > (images_per_row or 0)
    if n > seq_len or too_many:
      what = (f"{n} tokens, more than seq_len {seq_len}" if n > seq_len else
              f"{len(runs)} images, more than images_per_row {images_per_row}")
      if overflow == "error":
        raise PackingError(f"sequence {i} has {what} (overflow='error')")
      if overflow == "drop":
        dropped_long += 1
        continue
      truncated += 1
      n = min(n, seq_len)
      if too_many:
        n = min(n, runs[images_per_row][0])
      for start, end in runs:
        if start < n < end:
          n = start                               # never split an image
      lost_loss += int(np.count_nonzero(seq.loss_weights[n:]))
    if not np.any(seq.loss_weights[:n]):
      dropped_empty += 1
      continue
    kept.append(i)
    lengths.append(n)
    image_counts.append(sum(end <= n for _, end in runs))

  rng = np.random.default_rng(seed)
  tie_break = rng.permutation(len(kept))
  order = sorted(range(len(kept)), key=lambda k: (-lengths[k], tie_break[k]))
  if with_images:
    row_of, start_of, row_fill = _first_fit_two(lengths, image_counts, order, seq_len,
                                                images_per_row)
  else:
    row_of, start_of, row_fill = _first_fit(lengths, order, seq_len)
  num_rows = len(row_fill)
  row_order = rng.permutation(num_rows) if shuffle else np.arange(num_rows)

  rows_needed = -(-num_rows // batch_size)
  if num_batches is None:
    total_batches = -(-rows_needed // num_batches_multiple_of) * num_batches_multiple_of
  else:
    if rows_needed > num_batches:
      raise PackingError(
        f"the data fills {num_rows} rows = {rows_needed} batches of {batch_size}, more than "
        f"num_batches={num_batches}; raise num_batches or seq_len, or pack fewer sequences")
    total_batches = num_batches

  shape = (total_batches * batch_size, seq_len)
  arrays = {"input_ids": np.full(shape, pad_id, np.int32),
            "positions": np.zeros(shape, np.int32),
            "segment_ids": np.zeros(shape, np.int32)}
  for key in REQUIRED_KEYS[3:] + optional + (("value_labels",) if value_labels is not None
                                              else ()):
    arrays[key] = np.zeros(shape, np.float32)
  arrays["temperatures"][:] = 1.0
  slot = np.empty(num_rows, np.int64)
  slot[row_order] = np.arange(num_rows)  # final row index of each first-fit row
  segments_in_row = np.zeros(num_rows, np.int32)
  placements: list[Placement | None] = [None] * len(sequences)
  images_of_row: list[list[str]] = [[] for _ in range(total_batches * batch_size)]
  for k in order:  # placement order, so segment ids increase along each row
    i, n, r, start = kept[k], lengths[k], row_of[k], start_of[k]
    if with_images:
      images_of_row[slot[r]].extend(sequences[i].images[:image_counts[k]])
    seq, out = sequences[i], slot[r]
    segments_in_row[r] += 1
    span = slice(start, start + n)
    arrays["input_ids"][out, span] = seq.input_ids[:n]
    arrays["positions"][out, span] = np.arange(n)
    arrays["segment_ids"][out, span] = segments_in_row[r]
    arrays["loss_weights"][out, span] = seq.loss_weights[:n]
    arrays["loss_weights"][out, start] = 0.0  # nothing predicts a segment's first token
    arrays["old_logprobs"][out, span] = seq.old_logprobs[:n]
    arrays["advantages"][out, span] = seq.advantages[:n]
    arrays["temperatures"][out, span] = seq.temperatures[:n]
    for key in optional:
      value = getattr(seq, key)
      if value is not None:
        arrays[key][out, span] = value[:n]
    if value_labels is not None:
      arrays["value_labels"][out, span] = value_labels[i]
    placements[i] = Placement(int(out) // batch_size, int(out) % batch_size, start, n)

  batches = [{key: value[b * batch_size:(b + 1) * batch_size] for key, value in arrays.items()}
             for b in range(total_batches)]
  tokens = int(sum(lengths))
  stats = PackingStats(
    sequences=len(sequences), packed=len(kept), truncated=truncated,
    dropped_too_long=dropped_long, dropped_no_loss=dropped_empty,
    truncated_loss_tokens=lost_loss, rows=num_rows,
    padding_rows=total_batches * batch_size - num_rows, batches=total_batches, tokens=tokens,
    loss_tokens=int(np.count_nonzero(arrays["loss_weights"])),
    fill=tokens / (total_batches * batch_size * seq_len) if total_batches else 0.0)
  row_images = None
  if with_images:
    row_images = [[tuple(images_of_row[b * batch_size + r]) for r in range(batch_size)]
                  for b in range(total_batches)]
  return PackedData(batches, placements, stats, row_images)


def _image_runs(seq: TrainingSequence, image_token_id: int, index: int) -> list[tuple[int, int]]:
  """(start, end) of each image placeholder run of seq, checked against its images."""
  is_image = np.concatenate([[False], seq.input_ids == image_token_id, [False]])
  edges = np.flatnonzero(is_image[1:] != is_image[:-1])
  runs = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]
  if len(runs) != len(seq.images):
    raise PackingError(f"sequence {index} lists {len(seq.images)} images but its ids hold "
                       f"{len(runs)} runs of the image placeholder {image_token_id}")
  return runs


def _first_fit_two(lengths: list[int], images: list[int], order: list[int], capacity: int,
                   slots: int) -> tuple[list[int], list[int], list[int]]:
  """First fit with two capacities per row (tokens and image slots): each item goes to the
  lowest row with room for both. Returns (row of each item, start of each item, fill per
  row)."""
  free_tokens: list[int] = []
  free_slots: list[int] = []
  row_of, start_of = [0] * len(lengths), [0] * len(lengths)
  for k in order:
    for row in range(len(free_tokens)):
      if free_tokens[row] >= lengths[k] and free_slots[row] >= images[k]:
        break
    else:
      free_tokens.append(capacity)
      free_slots.append(slots)
      row = len(free_tokens) - 1
    row_of[k], start_of[k] = row, capacity - free_tokens[row]
    free_tokens[row] -= lengths[k]
    free_slots[row] -= images[k]
  return row_of, start_of, [capacity - f for f in free_tokens]


def _optional_keys(sequences: Sequence[TrainingSequence]) -> tuple[str, ...]:
  keys = []
  if any(s.teacher_logprobs is not None for s in sequences):
    keys += ["teacher_logprobs", "teacher_mask"]  # sequences without them get mask 0
  with_ref = sum(s.ref_logprobs is not None for s in sequences)
  if with_ref:
    if with_ref != len(sequences):
      raise PackingError(
        f"{with_ref} of {len(sequences)} sequences carry ref_logprobs; the KL term needs "
        "them on every sequence or none")
    keys.append("ref_logprobs")
  return tuple(keys)


def _first_fit(lengths: list[int], order: list[int], capacity: int
               ) -> tuple[list[int], list[int], list[int]]:
  """First fit over rows in `order`: a max segment tree over row free space finds the lowest
  row with room in O(log rows). Returns (row of each item, start of each item, fill per row)."""
  size = 1
  while size < max(1, len(lengths)):
    size *= 2
  free = [capacity] * (2 * size)  # leaves size.. are rows; unopened rows are empty
  row_of, start_of = [0] * len(lengths), [0] * len(lengths)
  used = 0
  for k in order:
    need = lengths[k]
    node = 1
    while node < size:
      node = 2 * node if free[2 * node] >= need else 2 * node + 1
    row = node - size
    start_of[k] = capacity - free[node]
    row_of[k] = row
    used = max(used, row + 1)
    free[node] -= need
    node //= 2
    while node:
      free[node] = max(free[2 * node], free[2 * node + 1])
      node //= 2
  fill = [capacity - free[size + r] for r in range(used)]
  return row_of, start_of, fill
