"""Partial fine-tuning (layer freezing, OptimizerConfig.train_last_layers) through the Trainer.

References: the full-parameter gradient of the same SFT loss taken by nnx.grad on the model,
masked to the trained parameters, then AdamW's first step written out in NumPy (bias-corrected
moments m = g, v = g^2; update = g / (|g| + eps) + weight_decay * p on matrices), with the
global-norm clip over the trained gradients. Frozen parameters must stay bit-identical, the
optimiser state must hold moments for the trained parameters only, and a checkpoint must hold
(and give back) every parameter.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models, train
from tests.train.conftest import mesh_of, packed_batch, small_config

LR, EPS, WD, CLIP = 1e-2, 1.0, 0.1, 0.5


def _names(tree) -> dict:
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _trainer(cfg, workdir, train_last_layers):
  model = models.CausalLM(cfg, rngs=nnx.Rngs(0))
  opt = train.OptimizerConfig(learning_rate=LR, warmup_steps=0, schedule="constant", eps=EPS,
                              weight_decay=WD, max_grad_norm=CLIP,
                              train_last_layers=train_last_layers)
  config = train.TrainerConfig(workdir=str(workdir), total_steps=4, optimizer=opt,
                               async_checkpoints=False, tensorboard=False, progress=False)
  return model, train.Trainer(model, train.SFTLoss(chunk_size=8), config, mesh=mesh_of(1))


@pytest.fixture(scope="module")
def cfg():
  return small_config(num_hidden_layers=3)


def test_last_layers_frozen_names_everything_below_the_top(cfg):
  params = train.ModelParts.of(models.CausalLM(cfg, rngs=nnx.Rngs(0))).pure_params()
  assert train.last_layers_frozen(params, 0) == ()
  assert train.last_layers_frozen(params, 1) == ("model/layers/0", "model/layers/1",
                                                 "model/embed_tokens")
  assert train.last_layers_frozen(params, 3) == ("model/embed_tokens",)
  with pytest.raises(train.TrainError, match="has 3 decoder layers"):
    train.last_layers_frozen(params, 4)
  tied = train.ModelParts.of(models.CausalLM(small_config(tie_word_embeddings=True),
                                             rngs=nnx.Rngs(0))).pure_params()
  with pytest.raises(train.TrainError, match="lm_head"):
    train.last_layers_frozen(tied, 1)
  with pytest.raises(train.TrainError, match="train_last_layers must be >= 0"):
    train.OptimizerConfig(train_last_layers=-1)


def test_partition_and_merge_are_inverse(cfg):
  params = train.ModelParts.of(models.CausalLM(cfg, rngs=nnx.Rngs(0))).pure_params()
  frozen = train.last_layers_frozen(params, 2)
  trained, held = train.partition_params(params, frozen)
  assert set(_names(trained)).isdisjoint(_names(held))
  assert sorted(_names(trained)) == sorted(n for n in _names(params)
                                           if not n.startswith(frozen))
  merged = train.merge_params(trained, held)
  assert jax.tree.structure(merged) == jax.tree.structure(params)
  for name, value in _names(merged).items():
    assert value is _names(params)[name] or np.array_equal(value, _names(params)[name])
  with pytest.raises(train.TrainError, match="covers every parameter"):
    train.partition_params(params, ("model", "lm_head"))


def test_trained_top_matches_masked_full_gradient_step_and_frozen_stay_put(cfg, tmp_path):
  batch = packed_batch(3, rows=2)
  model, trainer = _trainer(cfg, tmp_path, train_last_layers=1)
  with trainer:
    before = _names(jax.device_get(trainer.params))
    # the independent reference: the full gradient of the same loss, by nnx.grad on the model
    jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
    loss = train.SFTLoss(chunk_size=8)
    grads = nnx.jit(nnx.grad(lambda m, b: loss(m, b, loss.normalizer(b))[0]))(model, jbatch)
    grads = _names(nnx.to_pure_dict(grads))
    frozen = trainer.frozen
    assert frozen == ("model/layers/0", "model/layers/1", "model/embed_tokens")
    trained = {n: g for n, g in grads.items() if not n.startswith(frozen)}
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in trained.values()))
    scale = min(1.0, CLIP / norm)

    metrics = trainer.train_step(batch)
    after = _names(jax.device_get(trainer.params))
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-4)
    for name, p in before.items():
      if name.startswith(frozen):
        assert np.array_equal(after[name], p), name
        continue
      g = trained[name] * scale
      decay = WD * p if p.ndim >= 2 else 0.0
      expected = p - LR * (g / (np.abs(g) + EPS) + decay)
      np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
    # the optimiser's moments cover the trained parameters and nothing else
    mu = next(s.mu for s in jax.tree.leaves(trainer.state["opt_state"],
                                            is_leaf=lambda s: hasattr(s, "mu")))
    assert sorted(_names(mu)) == sorted(trained)

    trainer.train_step(batch)
    state = jax.device_get(trainer.state)
    trainer.save()
  for name, p in _names(state["params"]).items():
    if name.startswith(frozen):
      assert np.array_equal(p, before[name]), name
  # the checkpoint gives back every parameter and the trained-only optimiser state
  _, again = _trainer(cfg, tmp_path, train_last_layers=1)
  with again:
    assert again.restored_step == 2
    restored = jax.device_get(again.state)
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for (name, a), b in zip(_names(state).items(), _names(restored).values()):
    assert np.array_equal(a, b), name


def test_no_backward_pass_below_the_trained_top(cfg, tmp_path):
  """The compiled step of a partial fine-tune does the forward pass everywhere but the
  backward pass only through the trained top: its floating-point work is well under the full
  step's (XLA's own cost analysis of the two compiled steps)."""
  batch = packed_batch(3, rows=2)
  flops = {}
  for n in (0, 1):
    _, trainer = _trainer(cfg, tmp_path / str(n), train_last_layers=n)
    with trainer:
      compiled = trainer._step_fn.jitted.lower(trainer.state, trainer._put(batch)).compile()
      analysis = compiled.cost_analysis()
      analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
      flops[n] = float(analysis["flops"])
  # three layers: the full step is ~3x one layer's forward cost per layer, the partial one
  # adds backward work for one layer of three (and the shared LM head)
  assert flops[1] < 0.8 * flops[0], flops
