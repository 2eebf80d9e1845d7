"""The train step on a real (small) CausalLM: its loss against a NumPy computation from the
model's full logits, and the same update on 8 devices, 1 device, and with gradient accumulation."""
import jax
import numpy as np
import pytest
from flax import nnx

from orchard_jax import models, train
from tests.rl import reference
from tests.train.conftest import mesh_of, packed_batch, small_config


def _numpy_logp(logits, batch):
  logits = np.asarray(logits, np.float64)
  logsm = logits - logits.max(-1, keepdims=True)
  logsm -= np.log(np.exp(logsm).sum(-1, keepdims=True))
  ids, seg = batch["input_ids"], batch["segment_ids"]
  logp = np.zeros(ids.shape)
  for b in range(ids.shape[0]):
    for t in range(1, ids.shape[1]):
      if seg[b, t] > 0 and seg[b, t] == seg[b, t - 1]:
        logp[b, t] = logsm[b, t - 1, ids[b, t]]
  return logp


def _setup(cfg, loss, mesh, microbatches=1, coef=0.01, lr=1e-2):
  model = models.CausalLM(cfg, rngs=nnx.Rngs(0))
  parts = train.ModelParts.of(model)
  # eps = 1 makes Adam's first update ~ lr * g instead of lr * sign(g), so float noise in
  # near-zero gradients cannot flip whole updates between device layouts.
  opt_config = train.OptimizerConfig(learning_rate=lr, warmup_steps=0, total_steps=10,
                                     schedule="constant", eps=1.0)
  optimizer = train.make_optimizer(opt_config)
  params = parts.pure_params()
  shardings = train.state_shardings(optimizer, params, mesh, parts.param_shardings(mesh))
  state = train.init_train_state(optimizer, params, seed=0, shardings=shardings)
  step = train.build_train_step(parts, loss, optimizer, train.learning_rate_schedule(opt_config),
                                mesh=mesh, shardings=shardings, microbatches=microbatches,
                                load_balancing_coef=coef, donate=False)
  return model, state, step


def _forward(model, batch):
  """The model's own full-logits forward (jitted: eager would compile op by op)."""
  return nnx.jit(lambda m, *a: m(*a))(model, batch["input_ids"], batch["positions"],
                                       batch["segment_ids"])


@pytest.fixture(scope="module")
def sft_on_8_devices(small_cfg):
  batch = packed_batch(0)
  model, state, step = _setup(small_cfg, train.SFTLoss(chunk_size=8), mesh_of(8))
  new_state, metrics = step(state, batch)
  return dict(batch=batch, model=model, state=state, step=step, new_state=new_state,
              metrics=metrics)


def test_sft_loss_and_metrics_match_full_logits(sft_on_8_devices):
  run = sft_on_8_devices
  batch, model, step, new_state, metrics = (run[k] for k in ("batch", "model", "step",
                                                              "new_state", "metrics"))
  logits, aux = _forward(model, batch)
  logp = _numpy_logp(logits, batch)
  w = batch["loss_weights"]
  expected = -(logp * w).sum() / w.sum()
  assert float(metrics["loss"]) == pytest.approx(expected, rel=1e-4)
  assert float(metrics["total_loss"]) == pytest.approx(
      expected + 0.01 * float(aux["load_balancing_loss"]), rel=1e-4)
  assert float(metrics["tokens"]) == w.sum()
  np.testing.assert_allclose(metrics["moe/expert_load"], aux["expert_load"], rtol=1e-5)
  assert int(new_state["step"]) == 1 and float(metrics["learning_rate"]) == pytest.approx(1e-2)
  # the step really trained: the same batch's loss went down
  _, again = step(new_state, batch)
  assert float(again["loss"]) < float(metrics["loss"])


def test_same_update_on_one_device_with_accumulation(small_cfg, sft_on_8_devices):
  # 8-way data parallel in one microbatch vs one device in two microbatches: the global
  # normaliser makes the accumulated gradient the full-batch gradient.
  run = sft_on_8_devices
  _, state, step = _setup(small_cfg, train.SFTLoss(chunk_size=8), mesh_of(1), microbatches=2)
  new_state, metrics = step(state, run["batch"])
  assert float(metrics["loss"]) == pytest.approx(float(run["metrics"]["loss"]), rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(float(run["metrics"]["grad_norm"]),
                                                      rel=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(new_state["params"]), jax.device_get(run["new_state"]["params"]))


def test_policy_loss_step_matches_numpy(small_cfg):
  batch = packed_batch(2, extra=True)
  loss = train.PolicyLoss(eps_low=0.2, eps_high=0.28, chunk_size=8)
  model, state, step = _setup(small_cfg, loss, mesh_of(8))
  logits, _ = _forward(model, batch)
  logp = _numpy_logp(logits, batch)
  per_token = reference.clipped_pg(logp, batch["old_logprobs"], batch["advantages"], 0.2, 0.28)
  expected = reference.aggregate(per_token, batch["loss_weights"], batch["segment_ids"],
                                 "token_mean")
  _, metrics = step(state, batch)
  assert float(metrics["loss"]) == pytest.approx(expected, rel=1e-4)
  assert 0.0 <= float(metrics["clip_fraction"]) <= 1.0 and "entropy" in metrics


def test_missing_batch_key_is_a_clear_error(small_cfg):
  batch = packed_batch(3)
  _, state, step = _setup(small_cfg, train.PolicyLoss(), mesh_of(1))
  with pytest.raises(train.TrainError, match="old_logprobs"):
    step(state, batch)


def test_value_loss_step_matches_numpy_bce(small_cfg):
  batch = packed_batch(4)
  batch["value_labels"] = (np.arange(8)[:, None] % 2 == 0).repeat(32, 1).astype(np.float32)
  from orchard_jax.models.value import ValueModel
  model = ValueModel(small_cfg, rngs=nnx.Rngs(0))
  parts = train.ModelParts.of(model)
  opt_config = train.OptimizerConfig(learning_rate=1e-3, warmup_steps=0, total_steps=10)
  optimizer = train.make_optimizer(opt_config)
  mesh = mesh_of(8)
  params = parts.pure_params()
  shardings = train.state_shardings(optimizer, params, mesh, parts.param_shardings(mesh))
  state = train.init_train_state(optimizer, params, seed=0, shardings=shardings)
  step = train.build_train_step(parts, train.ValueLoss(), optimizer,
                                train.learning_rate_schedule(opt_config), mesh=mesh,
                                shardings=shardings, donate=False)
  values = np.asarray(nnx.jit(lambda m, *a: m(*a))(
      model, batch["input_ids"], batch["positions"], batch["segment_ids"]), np.float64)
  seg = batch["segment_ids"]
  losses = []
  for b in range(8):
    for s in (1, 2):
      last = np.nonzero(seg[b] == s)[0][-1]          # each trajectory's final token
      y, p = batch["value_labels"][b, last], 1 / (1 + np.exp(-values[b, last]))
      losses.append(-(y * np.log(p) + (1 - y) * np.log(1 - p)))
  _, metrics = step(state, batch)
  assert float(metrics["loss"]) == pytest.approx(np.mean(losses), rel=1e-4)


def test_bfloat16_compute_keeps_float32_master_weights():
  cfg = small_config(dtype="bfloat16", param_dtype="float32")
  batch = packed_batch(5)
  _, state, step = _setup(cfg, train.SFTLoss(chunk_size=16), mesh_of(1))
  new_state, metrics = step(state, batch)
  assert np.isfinite(float(metrics["loss"]))
  dtypes = {x.dtype for x in jax.tree.leaves(new_state["params"])}
  moments = {x.dtype for x in jax.tree.leaves(new_state["opt_state"]) if x.ndim > 0}
  assert dtypes == {np.dtype("float32")} and moments == {np.dtype("float32")}
  _, again = step(new_state, batch)
  assert float(again["loss"]) < float(metrics["loss"])


def test_logprob_step_matches_full_logits(sft_on_8_devices):
  run = sft_on_8_devices
  mesh = mesh_of(8)
  parts = train.ModelParts.of(run["model"])
  fn = train.build_logprob_step(parts, mesh=mesh, param_shardings=parts.param_shardings(mesh),
                                chunk_size=8)
  logits, _ = _forward(run["model"], run["batch"])
  np.testing.assert_allclose(np.asarray(fn(parts.pure_params(), run["batch"])),
                             _numpy_logp(logits, run["batch"]), rtol=1e-4, atol=1e-4)
