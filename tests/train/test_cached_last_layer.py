"""Last-layer fine-tuning on cached key/value states (train.cached_last_layer).

Reference: the full model's forward (CausalLM.__call__ over the whole sequence) and jax.grad
of its weighted token-mean NLL w.r.t. the same trained parameters, everything else frozen.
The cached step must give the same loss and gradients, and after training the full forward
must give the loss the cached step reported (the cached states are the model's own).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from orchard_jax import models, train
from orchard_jax.train import cached_last_layer as cll
from tests.train.conftest import small_config

# Two layers, blocked attention in 8-row blocks; the cache is written in 8-row chunks.
CONFIGS = {
    "qwen3_moe": small_config(num_hidden_layers=2, attention_block_size=8),
    "dense": small_config(num_hidden_layers=2, attention_block_size=8, num_experts=0),
    "qwen3_5_gated": dataclasses.replace(
        models.get_preset("tiny_qwen3_5"), vocab_size=512, hidden_size=64, num_hidden_layers=2,
        layer_types=("linear_attention", "full_attention"), num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, moe_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, attention_block_size=8,
        shared_expert_intermediate_size=64),
}


def _sequences(seed=0, lengths=(29, 29), vocab=512):
  rng = np.random.default_rng(seed)
  out = []
  for n in lengths:
    ids = rng.integers(0, vocab, n).astype(np.int32)
    weights = np.zeros(n, np.float32)
    weights[n // 2:] = rng.choice([0.0, 1.0, 0.5], n - n // 2)
    weights[-1] = 1.0
    out.append((ids, weights))
  return out


def _full_loss(model, sequences):
  """Weighted token-mean NLL over the sequences from the full forward pass."""
  total, weight = 0.0, 0.0
  for ids, w in sequences:
    n = len(ids)
    logits, _ = model(jnp.asarray(ids[None]), jnp.arange(n)[None], jnp.ones((1, n), jnp.int32))
    logp = jax.nn.log_softmax(logits[0, :-1], -1)
    nll = -jnp.take_along_axis(logp, jnp.asarray(ids[1:])[:, None], -1)[:, 0]
    total = total + jnp.sum(nll * w[1:])
    weight = weight + float(np.sum(w[1:]))
  return total / weight


def _leaves(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v)
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("kind", ["qwen3_moe", "dense",
                                  pytest.param("qwen3_5_gated", marks=pytest.mark.slow)])
def test_loss_and_gradients_equal_the_full_models(kind):
  model = models.CausalLM(CONFIGS[kind], rngs=nnx.Rngs(1))
  sequences = _sequences()
  parts = train.ModelParts.of(model)
  trained, frozen = train.partition_params(parts.pure_params(), cll.frozen_parameters(model))
  rows = cll.cache_rows(model, sequences, chunk_size=8)

  def cached(t):
    return cll.loss_and_nll(parts.merge(train.merge_params(t, frozen)), rows)[0]

  def full(t):
    return _full_loss(parts.merge(train.merge_params(t, frozen)), sequences)

  loss, grads = jax.jit(jax.value_and_grad(cached))(trained)
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(full))(trained)
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
  got, want = _leaves(grads), _leaves(ref_grads)
  assert got.keys() == want.keys()
  for name in want:
    scale = np.abs(want[name]).max() + 1e-12
    np.testing.assert_allclose(got[name] / scale, want[name] / scale, atol=2e-5, err_msg=name)
  # The trained set is the last layer's query side, its FFN, the final norm and the head.
  names = set(got)
  assert any(n.startswith("model/layers/1/mlp/") for n in names)
  assert "lm_head" in names and "model/norm/weight" in names
  assert not any(n.startswith(("model/layers/0", "model/embed_tokens",
                               "model/layers/1/self_attn/k_", "model/layers/1/self_attn/v_",
                               "model/layers/1/input_layernorm")) for n in names)
  if kind == "qwen3_5_gated":
    assert "model/layers/1/self_attn/gate_proj" in names


def test_fit_reaches_the_margin_and_the_full_model_agrees():
  model = models.CausalLM(CONFIGS["qwen3_moe"], rngs=nnx.Rngs(2))
  sequences = _sequences(seed=3)
  before = {k: v.copy() for k, v in _leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param))).items()}
  rows = cll.cache_rows(model, sequences, chunk_size=8)
  result = cll.fit(model, rows, optax.adam(3e-2), max_steps=400, min_target_prob=0.9)
  assert result.stopped_at is not None and result.min_target_prob >= 0.9
  # The full forward of the updated model gives the per-token margin the cached step saw.
  for ids, w in sequences:
    n = len(ids)
    logits, _ = model(jnp.asarray(ids[None]), jnp.arange(n)[None], jnp.ones((1, n), jnp.int32))
    p = np.asarray(jax.nn.softmax(logits[0, :-1], -1))[np.arange(n - 1), ids[1:]]
    assert p[w[1:] > 0].min() >= 0.9 - 1e-4
  np.testing.assert_allclose(float(_full_loss(model, sequences)), result.loss, rtol=1e-4)
  after = _leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  trained = cll.trained_parameters(model)
  for name, value in after.items():
    if not any(cll._under(name, t) for t in trained):
      np.testing.assert_array_equal(value, before[name], err_msg=f"frozen {name} changed")


@pytest.mark.parametrize("cfg, match", [
    (dataclasses.replace(CONFIGS["qwen3_5_gated"],
                         layer_types=("full_attention", "linear_attention")),
     "last decoder layer to be full attention; layer 1 is 'linear_attention'"),
    (dataclasses.replace(CONFIGS["qwen3_moe"], moe_capacity_factor=1.25),
     "moe_capacity_factor=1.25"),
])
def test_unsupported_models_are_named(cfg, match):
  model = nnx.eval_shape(lambda: models.CausalLM(cfg, rngs=nnx.Rngs(0)))   # shapes only
  with pytest.raises(cll.CachedLastLayerError, match=match):
    cll.trained_parameters(model)


def test_vision_language_policy_is_refused():
  model = nnx.eval_shape(lambda: models.CausalLM(models.get_preset("tiny_vl"),
                                                  rngs=nnx.Rngs(0)))      # shapes only
  with pytest.raises(cll.CachedLastLayerError, match="vision-language"):
    cll.trained_parameters(model)


def test_bad_rows_and_threshold():
  model = models.CausalLM(CONFIGS["dense"], rngs=nnx.Rngs(0))
  with pytest.raises(cll.CachedLastLayerError, match="no sequence has a loss token"):
    cll.cache_rows(model, [(np.arange(5), np.zeros(5, np.float32))])
  with pytest.raises(cll.CachedLastLayerError, match="one shape"):
    cll.cache_rows(model, [(np.arange(5), np.ones(4, np.float32))])
  rows = cll.cache_rows(model, _sequences(lengths=(9,)))
  with pytest.raises(cll.CachedLastLayerError, match="min_target_prob"):
    cll.fit(model, rows, optax.adam(1e-2), max_steps=1, min_target_prob=1.5)
