"""Independent NumPy references for the rl tests, written from docs/algorithms.md, loop by loop."""
import numpy as np


def random_packed(rng, batch=3, seq=16, max_segments=3):
  """A random packed layout: segment ids 1..n per row then padding, weight 0 on the first token
  of every segment and on padding, 0/1 elsewhere."""
  segment_ids = np.zeros((batch, seq), np.int32)
  for b in range(batch):
    t, s = 0, 1
    while t < seq and s <= max_segments:
      length = int(rng.integers(1, seq // 2 + 1))
      segment_ids[b, t:t + length] = s
      t += length
      s += 1
  weights = (rng.random((batch, seq)) < 0.7).astype(np.float32)
  first = np.zeros_like(weights, bool)
  first[:, 0] = True
  first[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
  weights[first | (segment_ids == 0)] = 0.0
  return segment_ids, weights


def sequences(segment_ids):
  """[(row, boolean mask over the row)] for every non-padding segment."""
  out = []
  for b in range(segment_ids.shape[0]):
    for s in np.unique(segment_ids[b]):
      if s > 0:
        out.append((b, segment_ids[b] == s))
  return out


def aggregate(x, w, segment_ids, mode, max_tokens=None):
  x = np.asarray(x, np.float64)
  w = np.asarray(w, np.float64)
  if mode == "token_mean":
    valid = segment_ids > 0
    total = w[valid].sum()
    return float((x * w)[valid].sum() / total) if total > 0 else 0.0
  per_sequence = []
  for b, sel in sequences(segment_ids):
    ws = w[b][sel]
    if ws.sum() > 0:
      per_sequence.append(((x[b][sel] * ws).sum(), ws.sum()))
  if not per_sequence:
    return 0.0
  if mode == "sequence_mean":
    return float(np.mean([num / den for num, den in per_sequence]))
  if mode == "sequence_sum_norm":
    constant = x.shape[1] if max_tokens is None else max_tokens
    return float(sum(num for num, _ in per_sequence) / (len(per_sequence) * constant))
  raise ValueError(mode)


def clipped_pg(logp, old_logp, adv, eps_low, eps_high):
  """-min(rho A, clip(rho) A) per token."""
  rho = np.exp(np.asarray(logp, np.float64) - np.asarray(old_logp, np.float64))
  return -np.minimum(rho * adv, np.clip(rho, 1 - eps_low, 1 + eps_high) * adv)
