"""Fused LM-head cross-entropy: the next-token loss without [tokens, vocab] logits in memory.

For hidden states h [N, hidden], head W [hidden, vocab], targets y and per-token weights w:
  loss = sum_i w_i * (logsumexp(h_i W) - (h_i W)[y_i])
and its gradients
  dlogits_i = w_i * (softmax(h_i W) - onehot(y_i)),   dh_i = dlogits_i W^T,   dW = sum_i h_i^T dlogits_i
are computed together, chunk by chunk of `chunk_size` tokens, in the forward pass (the fused
linear cross-entropy of Liger-Kernel, Hsu et al. 2024, arXiv 2410.10989). The backward pass
only scales the stored dh and dW by the incoming cotangent. Compared with autodiff through
materialised logits this needs three matmuls instead of four (no recomputation) and holds at
most one [chunk_size, vocab] block of logits; on CPU it also keeps that block in cache.
"""
import functools

import jax
import jax.numpy as jnp

from orchard_jax.models.errors import ModelError


def fused_cross_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                        weights: jax.Array, *, chunk_size: int = 1024) -> jax.Array:
  """Weighted sum of token cross-entropies of the LM head, fused with its gradient.

  Args:
    hidden: [..., hidden] final hidden states (after the final norm).
    head: [hidden, vocab] LM head matrix (the transposed embedding when tied).
    targets: [...] int32 target token ids (any value where the weight is 0).
    weights: [...] float32 per-token weights (e.g. 1 / number of loss tokens, 0 to skip).
    chunk_size: tokens per block of logits.
  Returns:
    scalar float32 sum_i weights_i * nll_i; differentiable in hidden, head and weights.
  Raises:
    ModelError: shapes disagree or chunk_size < 1.
  """
  if hidden.shape[:-1] != targets.shape or targets.shape != weights.shape:
    raise ModelError(f"fused_cross_entropy: expected hidden [..., d] with targets and weights "
                     f"[...]; got {hidden.shape}, {targets.shape}, {weights.shape}")
  if head.ndim != 2 or head.shape[0] != hidden.shape[-1]:
    raise ModelError(f"fused_cross_entropy: expected head [{hidden.shape[-1]}, vocab]; "
                     f"got {head.shape}")
  if chunk_size < 1:
    raise ModelError(f"fused_cross_entropy: chunk_size must be >= 1; got {chunk_size}")
  d = hidden.shape[-1]
  n = targets.size
  chunk = min(chunk_size, n)
  pad = (-n) % chunk
  h = hidden.reshape(n, d)
  t = targets.reshape(n).astype(jnp.int32)
  w = weights.reshape(n).astype(jnp.float32)
  if pad:
    h = jnp.pad(h, ((0, pad), (0, 0)))
    t = jnp.pad(t, (0, pad))
    w = jnp.pad(w, (0, pad))
  loss = _fused(h.reshape(-1, chunk, d), head, t.reshape(-1, chunk), w.reshape(-1, chunk))
  return loss


@jax.custom_vjp
def _fused(h, head, t, w):
  return _fused_fwd(h, head, t, w)[0]


def _fused_fwd(h, head, t, w):
  vocab = head.shape[1]

  def step(dhead, xs):
    hc, tc, wc = xs
    logits = jnp.dot(hc, head, preferred_element_type=jnp.float32)          # [chunk, vocab]
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    onehot = jax.nn.one_hot(tc, vocab, dtype=jnp.float32)
    nll = lse[:, 0] - jnp.sum(logits * onehot, axis=-1)
    dlogits = ((jnp.exp(logits - lse) - onehot) * wc[:, None]).astype(head.dtype)
    dh = jnp.dot(dlogits, head.T, preferred_element_type=jnp.float32).astype(hc.dtype)
    dhead = dhead + jnp.dot(hc.T, dlogits, preferred_element_type=jnp.float32)
    return dhead, (jnp.sum(nll * wc), nll, dh)

  dhead, (losses, nll, dh) = jax.lax.scan(step, jnp.zeros(head.shape, jnp.float32), (h, t, w))
  return jnp.sum(losses), (dh, dhead.astype(head.dtype), nll, t)


def _fused_bwd(res, g):
  dh, dhead, nll, t = res
  return ((dh * g).astype(dh.dtype), (dhead * g).astype(dhead.dtype),
          jnp.zeros(t.shape, jax.dtypes.float0), nll * g)


_fused.defvjp(_fused_fwd, _fused_bwd)


def next_token_targets(input_ids: jax.Array, segment_ids: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
  """Targets and mask of next-token prediction on a packed batch.

  Position t predicts input_ids[t + 1] when both tokens belong to the same non-zero segment
  (docs/contracts.md alignment, seen from the predicting position).

  Args:
    input_ids, segment_ids: [batch, seq] int32.
  Returns:
    targets [batch, seq] int32 (0 where there is none) and mask [batch, seq] bool.
  """
  targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
  nxt = jnp.concatenate([segment_ids[:, 1:], jnp.zeros_like(segment_ids[:, :1])], axis=1)
  mask = (segment_ids != 0) & (nxt == segment_ids)
  return jnp.where(mask, targets, 0).astype(jnp.int32), mask


def next_token_loss(model, input_ids: jax.Array, positions: jax.Array,
                    segment_ids: jax.Array, *, chunk_size: int = 1024
                    ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean next-token cross-entropy of a CausalLM on a packed batch, with the fused LM head.

  Args:
    model: an orchard_jax.models.CausalLM.
    input_ids, positions, segment_ids: [batch, seq] int32 (CausalLM.__call__).
    chunk_size: tokens per block of logits (fused_cross_entropy).
  Returns:
    (scalar float32 mean NLL over predicted tokens, the model's aux dict). The router's
    load-balancing loss is not added (aux["load_balancing_loss"], weight in the config).
  """
  hidden, aux = model.hidden_states(input_ids, positions, segment_ids, return_aux=True)
  targets, mask = next_token_targets(input_ids, segment_ids)
  weights = mask.astype(jnp.float32) / jnp.maximum(jnp.sum(mask), 1)
  loss = fused_cross_entropy(hidden, model.head_matrix(), targets, weights,
                             chunk_size=chunk_size)
  return loss, aux
