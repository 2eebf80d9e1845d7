"""Parity with transformers' own modules: tiny random Qwen3MoeForCausalLM, Qwen3ForCausalLM
and Qwen3_5MoeForCausalLM (the qwen3_5_moe text model), saved with save_pretrained, loaded by
orchard_jax, logits compared on a batch mixing right- and left-padded rows; then orchard_jax's
export loaded back by transformers."""
import json
import os

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file as torch_save_file

from orchard_jax import models
from orchard_jax.models import hf
from tests.models.conftest import forward, tiny_config

ARCHS = ("qwen3_moe", "qwen3", "qwen3_5_moe")
TOL = 1e-4
LENGTHS = (40, 29, 17, 33)
LEFT = (False, False, True, True)   # rows 2 and 3 are left-padded
SEQ = 40


def _hf_model(arch: str, seed: int = 0):
  """transformers' model of `arch` at tiny_config's sizes, random weights with every norm
  perturbed (so w vs 1 + w conventions matter)."""
  torch.manual_seed(seed)
  hf_dict = hf.config_to_hf(tiny_config(arch))
  config = transformers.AutoConfig.for_model(**hf_dict)
  config._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(torch.randn_like(p) * 0.2)
  return model


def _batch(seed: int = 1):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, 256, (len(LENGTHS), SEQ)).astype(np.int32)
  seg = np.zeros_like(ids)
  pos = np.zeros_like(ids)
  for i, (n, left) in enumerate(zip(LENGTHS, LEFT)):
    cols = slice(SEQ - n, SEQ) if left else slice(0, n)
    seg[i, cols] = 1
    pos[i, cols] = np.arange(n)
  return ids, pos, seg


def _hf_logits(model, ids, pos, seg) -> np.ndarray:
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(seg, dtype=torch.long),
                position_ids=torch.tensor(pos, dtype=torch.long))
  return out.logits.float().numpy()


def _max_valid_diff(a: np.ndarray, b: np.ndarray, seg: np.ndarray) -> float:
  valid = seg != 0
  return float(np.abs(a[valid] - b[valid]).max())


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_and_export_round_trips(arch, tmp_path):
  reference = _hf_model(arch)
  reference.save_pretrained(tmp_path / "hf")
  config, model = hf.load_pretrained(str(tmp_path / "hf"))
  assert config.architecture == arch
  ids, pos, seg = _batch()
  expected = _hf_logits(reference, ids, pos, seg)
  logits, aux = forward(model, ids, pos, seg)
  assert logits.dtype == np.float32 and logits.shape == (len(LENGTHS), SEQ, 256)
  assert _max_valid_diff(logits, expected, seg) <= TOL

  # Export (sharded with an index) and let transformers load it.
  files = hf.save_pretrained(model, config, str(tmp_path / "ours"), max_shard_bytes=200_000)
  assert len(files) > 1 and os.path.exists(tmp_path / "ours" / "model.safetensors.index.json")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ours")).eval()
  reloaded.config._attn_implementation = "eager"
  assert type(reloaded) is type(reference)
  assert _max_valid_diff(_hf_logits(reloaded, ids, pos, seg), expected, seg) <= TOL
  # ... and orchard_jax reads its own sharded export.
  config2, model2 = hf.load_pretrained(str(tmp_path / "ours"))
  assert config2 == config
  assert _max_valid_diff(forward(model2, ids, pos, seg)[0], expected, seg) <= TOL


def test_load_balancing_loss_matches_transformers(tmp_path):
  """One MoE layer: our un-weighted aux loss equals transformers' aux_loss (with the padding
  mask), and expert_load is the fraction of top-k assignments per expert."""
  arch_config = tiny_config("qwen3_moe", num_hidden_layers=1, mlp_only_layers=())
  torch.manual_seed(3)
  hf_config = transformers.AutoConfig.for_model(**hf.config_to_hf(arch_config))
  hf_config._attn_implementation = "eager"
  reference = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
  reference.save_pretrained(tmp_path)
  _, model = hf.load_pretrained(str(tmp_path))
  ids, pos, seg = _batch(5)
  with torch.no_grad():
    out = reference(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(seg, dtype=torch.long),
                    position_ids=torch.tensor(pos, dtype=torch.long), output_router_logits=True)
  _, aux = forward(model, ids, pos, seg)
  np.testing.assert_allclose(aux["load_balancing_loss"], out.aux_loss.item(), rtol=1e-5)
  # expert_load from the router logits transformers returns: top-k of softmax on valid rows.
  router_logits = out.router_logits[0].numpy()
  top = np.argsort(-router_logits, axis=-1)[:, :arch_config.num_experts_per_tok]
  top = top[(seg != 0).reshape(-1)]
  counts = np.bincount(top.reshape(-1), minlength=arch_config.num_experts)
  np.testing.assert_allclose(aux["expert_load"][0], counts / counts.sum(), atol=1e-6)


def test_reads_fused_experts_and_composite_qwen3_5_checkpoints(tmp_path):
  """transformers' in-memory (fused gate_up_proj) tensors, and the published composite
  layout (model_type qwen3_5_moe, model.language_model.* weights, vision and MTP tensors that
  the text model skips) load to the same logits."""
  reference = _hf_model("qwen3_5_moe", seed=4)
  ids, pos, seg = _batch(2)
  expected = _hf_logits(reference, ids, pos, seg)
  state = {k: v.contiguous() for k, v in reference.state_dict().items()}
  assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
  text = hf.config_to_hf(reference_config := tiny_config("qwen3_5_moe"))

  fused = tmp_path / "fused"
  fused.mkdir()
  torch_save_file(state, str(fused / "model.safetensors"), metadata={"format": "pt"})
  (fused / "config.json").write_text(json.dumps(text))

  composite = tmp_path / "composite"
  composite.mkdir()
  renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
             for k, v in state.items()}
  renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
  renamed["mtp.fc.weight"] = torch.zeros(4, 4)
  torch_save_file(renamed, str(composite / "model.safetensors"), metadata={"format": "pt"})
  (composite / "config.json").write_text(json.dumps(
      {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
       "tie_word_embeddings": False, "text_config": text}))

  for folder in (fused, composite):
    config, model = hf.load_pretrained(str(folder))
    assert config == reference_config
    assert _max_valid_diff(forward(model, ids, pos, seg)[0], expected, seg) <= TOL


def test_checkpoint_mismatch_names_the_parameter(tmp_path):
  reference = _hf_model("qwen3")
  reference.save_pretrained(tmp_path)
  with open(tmp_path / "config.json") as f:
    cfg = json.load(f)
  cfg["intermediate_size"] = 128
  with open(tmp_path / "config.json", "w") as f:
    json.dump(cfg, f)
  with pytest.raises(models.CheckpointMismatch, match=r"mlp/gate_proj has shape .*96.* and \(64, 128\) in the model"):
    hf.load_pretrained(str(tmp_path))
  with pytest.raises(models.CheckpointError, match="no config.json"):
    hf.load_pretrained(str(tmp_path / "missing"))
  with pytest.raises(models.ModelConfigError, match="model_type 'llama'"):
    hf.config_from_hf({"model_type": "llama"})
