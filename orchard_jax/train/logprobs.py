"""Per-token log-probs and entropies from a causal LM, computed in chunks over the sequence.

The LM head is applied to `chunk_size` positions at a time inside a rematerialised scan, so
neither the forward nor the backward pass ever holds [batch, seq, vocab] float32 logits: peak
logits memory is [batch, chunk_size, vocab] (a 151k vocabulary at seq 64k would otherwise need
tens of GiB per row).

Alignment follows docs/contracts.md: logp[b, t] = log_softmax(logits[b, t - 1])[input_ids[b, t]], the
log-prob of token t given the tokens before it in its segment; it is 0 at the first token of
every segment and on padding (those positions never carry loss).

With `temperatures` (the packed batch's [batch, seq] array, temperatures[b, t] the softmax
temperature token t was sampled at) the log-probs and entropies are of the distribution the
tokens were sampled from, log_softmax(logits[b, t - 1] / temperatures[b, t]): the quantity the
engine recorded as old_logprobs (rollout/sampling.py), so the policy ratio compares like with
like (docs/algorithms.md section 3). SFT passes none (temperature 1, the raw policy).
"""
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from orchard_jax.train.errors import TrainError


def segment_starts(segment_ids: jax.Array) -> jax.Array:
  """[batch, seq] bool: True where a new segment begins (and at t = 0 of non-padding rows)."""
  previous = jnp.concatenate([jnp.zeros_like(segment_ids[:, :1]), segment_ids[:, :-1]], axis=1)
  return (segment_ids > 0) & (segment_ids != previous)


def chunked_token_logprobs(logits_fn: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                           input_ids: jax.Array, segment_ids: jax.Array, *,
                           chunk_size: int = 512, with_entropy: bool = True,
                           temperatures: Optional[jax.Array] = None
                           ) -> tuple[jax.Array, Optional[jax.Array]]:
  """log pi(input_ids[t] | prefix) and the entropy of that distribution, chunk by chunk.

  Args:
    logits_fn: hidden [batch, chunk, hidden] -> logits [batch, chunk, vocab] (the LM head).
    hidden: [batch, seq, hidden] final hidden states (after the final norm).
    input_ids: [batch, seq] int32.
    segment_ids: [batch, seq] int32, 0 = padding.
    chunk_size: positions per LM-head call; seq - 1 is padded up to a multiple of it.
    with_entropy: also return the per-position entropy (nats).
    temperatures: [batch, seq] float32 softmax temperature of each token's distribution
      (module docstring), or None for 1 everywhere; must be > 0.
  Returns:
    (logp [batch, seq] float32, entropy [batch, seq] float32 or None), aligned as the module
    docstring says; both 0 at segment starts and padding.
  Raises:
    TrainError: chunk_size < 1 or mismatched shapes.
  """
  batch, seq = input_ids.shape
  if hidden.shape[:2] != (batch, seq) or segment_ids.shape != (batch, seq):
    raise TrainError(f"hidden {hidden.shape[:2]}, input_ids {input_ids.shape} and segment_ids "
                     f"{segment_ids.shape} must share [batch, seq]")
  if temperatures is not None and temperatures.shape != (batch, seq):
    raise TrainError(f"temperatures {temperatures.shape} must be [batch, seq] like input_ids "
                     f"{input_ids.shape}")
  if chunk_size < 1:
    raise TrainError(f"chunk_size must be >= 1; saw {chunk_size}")
  if seq < 2:
    zeros = jnp.zeros((batch, seq), jnp.float32)
    return zeros, (zeros if with_entropy else None)
  # Position t - 1 predicts token t: pair hidden[:, :-1] with input_ids[:, 1:].
  h = hidden[:, :-1]
  targets = input_ids[:, 1:]
  # Token t's temperature scales the logits at t - 1, which predict it.
  temps = (jnp.ones(targets.shape, jnp.float32) if temperatures is None
           else temperatures[:, 1:].astype(jnp.float32))
  length = seq - 1
  chunk = min(chunk_size, length)
  num_chunks = -(-length // chunk)
  pad = num_chunks * chunk - length
  if pad:
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    temps = jnp.pad(temps, ((0, 0), (0, pad)), constant_values=1.0)
  h = h.reshape(batch, num_chunks, chunk, h.shape[-1]).swapaxes(0, 1)
  targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)
  temps = temps.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

  def one_chunk(h_chunk, t_chunk, temp_chunk):
    logits = logits_fn(h_chunk).astype(jnp.float32)
    if temperatures is not None:
      logits = logits / temp_chunk[..., None]
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, t_chunk[..., None], axis=-1)[..., 0]
    logp = picked - lse
    if not with_entropy:
      return logp, jnp.zeros_like(logp)
    probs = jnp.exp(logits - lse[..., None])
    entropy = lse - jnp.sum(probs * logits, axis=-1)
    return logp, entropy

  if num_chunks == 1:
    logp, entropy = one_chunk(h[0], targets[0], temps[0])
    logp, entropy = logp[None], entropy[None]
  else:
    # Rematerialised: the backward pass recomputes each chunk's logits instead of keeping
    # every chunk's [batch, chunk, vocab] residuals alive at once.
    logp, entropy = jax.lax.map(lambda xs: jax.checkpoint(one_chunk)(*xs), (h, targets, temps))
  valid = (segment_ids > 0) & ~segment_starts(segment_ids)

  def unchunk(x):
    x = x.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]
    x = jnp.concatenate([jnp.zeros((batch, 1), jnp.float32), x], axis=1)
    return jnp.where(valid, x, 0.0)

  return unchunk(logp), (unchunk(entropy) if with_entropy else None)


def model_hidden_states(model: Any, input_ids: jax.Array, positions: jax.Array,
                        segment_ids: jax.Array, images: Any = None) -> tuple[jax.Array, dict]:
  """Runs the policy's backbone: (hidden [batch, seq, hidden], aux dict). `images` (an
  ImagePatches batch) goes to a vision-language model."""
  kwargs = {} if images is None else {"images": images}
  out = model.hidden_states(input_ids, positions, segment_ids, return_aux=True, **kwargs)
  if isinstance(out, tuple):
    hidden, aux = out
  else:
    hidden, aux = out, {}
  return hidden, dict(aux or {})


def token_logprobs(model: Any, input_ids: jax.Array, positions: jax.Array,
                   segment_ids: jax.Array, *, chunk_size: int = 512, with_entropy: bool = True,
                   images: Any = None, temperatures: Optional[jax.Array] = None
                   ) -> tuple[jax.Array, Optional[jax.Array], dict]:
  """Per-token log-probs (and entropies) of a CausalLM on a packed batch.

  Args:
    model: an orchard_jax.models.CausalLM (anything with hidden_states(...) and logits(hidden)).
    input_ids, positions, segment_ids: [batch, seq] int32 (docs/contracts.md packed batch);
      positions [batch, seq, 3] for a vision-language batch (train.multimodal).
    chunk_size: sequence positions per LM-head call.
    with_entropy: also compute entropies.
    images: the batch's images (models.ImagePatches, train.multimodal.batch_images), or None.
    temperatures: [batch, seq] sampling temperature of each token (the packed batch's
      "temperatures"), or None for the raw distribution (module docstring).
  Returns:
    (logp [batch, seq], entropy [batch, seq] or None, aux) with aux the model's
    {"load_balancing_loss", "expert_load"} when it is a MoE.
  """
  hidden, aux = model_hidden_states(model, input_ids, positions, segment_ids, images)
  logp, entropy = chunked_token_logprobs(model.logits, hidden, input_ids, segment_ids,
                                         chunk_size=chunk_size, with_entropy=with_entropy,
                                         temperatures=temperatures)
  return logp, entropy, aux
