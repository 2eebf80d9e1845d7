"""Fused LM-head cross-entropy against autodiff through materialised logits."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models
from orchard_jax.models import losses


def _reference(hidden, head, targets, weights):
  logits = jnp.einsum("...d,dv->...v", hidden, head, precision="highest")
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * weights)


@pytest.mark.parametrize("chunk", [7, 16, 1000])
def test_fused_cross_entropy_matches_autodiff(chunk):
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(3, 11, 8)), jnp.float32)
  head = jnp.asarray(rng.normal(size=(8, 37)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 37, (3, 11)), jnp.int32)
  weights = jnp.asarray(rng.uniform(size=(3, 11)) * (rng.uniform(size=(3, 11)) > 0.3),
                        jnp.float32)

  def ours(h, w, wt):
    return losses.fused_cross_entropy(h, w, targets, wt, chunk_size=chunk)

  def ref(h, w, wt):
    return _reference(h, w, targets, wt)

  v1, g1 = jax.value_and_grad(ours, argnums=(0, 1, 2))(hidden, head, weights)
  v2, g2 = jax.value_and_grad(ref, argnums=(0, 1, 2))(hidden, head, weights)
  np.testing.assert_allclose(v1, v2, rtol=1e-5)
  for a, b in zip(g1, g2):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
  # A scaled cotangent scales every gradient.
  g3 = jax.grad(lambda h: 3.0 * ours(h, head, weights))(hidden)
  np.testing.assert_allclose(g3, 3.0 * g2[0], atol=1e-5, rtol=1e-4)


def test_fused_cross_entropy_rejects_bad_shapes():
  with pytest.raises(models.ModelError, match="targets"):
    losses.fused_cross_entropy(jnp.zeros((2, 3, 4)), jnp.zeros((4, 5)),
                               jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 4)))
  with pytest.raises(models.ModelError, match="head"):
    losses.fused_cross_entropy(jnp.zeros((2, 3, 4)), jnp.zeros((5, 4)),
                               jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3)))


def test_next_token_loss_matches_logits_on_packed_batch():
  config = dataclasses.replace(models.get_preset("tiny"), num_hidden_layers=1, vocab_size=512)
  model = models.CausalLM(config, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, config.vocab_size, (2, 12)), jnp.int32)
  segments = np.array([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3], np.int32)
  positions = np.zeros_like(segments)
  for row in range(2):
    for t in range(1, 12):
      same = segments[row, t] == segments[row, t - 1]
      positions[row, t] = positions[row, t - 1] + 1 if same else 0
  segments, positions = jnp.asarray(segments), jnp.asarray(positions)
  graphdef, params = nnx.split(model)

  def ours(p):
    return models.next_token_loss(nnx.merge(graphdef, p), ids, positions, segments,
                                  chunk_size=5)[0]

  def ref(p):
    logits, _ = nnx.merge(graphdef, p)(ids, positions, segments)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    # position t predicts t + 1 inside one non-padding segment
    mask = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
    return jnp.sum(nll * mask) / jnp.sum(mask)

  v1, g1 = jax.value_and_grad(ours)(params)
  v2, g2 = jax.value_and_grad(ref)(params)
  np.testing.assert_allclose(v1, v2, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-3)
