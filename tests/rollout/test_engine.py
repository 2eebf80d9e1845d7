"""The engine: log-prob parity with the trainer's forward, greedy = argmax, seeds, stops,
scoring, buckets (no recompiles), weight updates in process and from disk."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard_jax.models import CausalLM, hf
from orchard_jax.rollout import (
  RequestError, SamplingParams, SingleGenerateRequest, WeightUpdateError, save_params)
from orchard_jax.train.logprobs import token_logprobs as trainer_token_logprobs


def _request(ids, **sampling):
  return SingleGenerateRequest(input_ids=list(ids), return_logprob=True, logprob_start_len=0,
                               sampling_params=SamplingParams(**sampling))


@nnx.jit
def _forward(model, ids, positions, segments):
  return model(ids, positions, segments)[0]


@nnx.jit
def _trainer_forward(model, ids, positions, segments, temperatures):
  return trainer_token_logprobs(model, ids, positions, segments, with_entropy=False,
                                temperatures=temperatures)[0]


def _pad(row: np.ndarray, size: int = 256) -> np.ndarray:
  """[1, size] int32 (one compiled shape for every reference call)."""
  out = np.zeros((1, size), np.int32)
  out[0, :row.shape[-1]] = row
  return out


def _reference_logprobs(model, ids, temperature=1.0):
  """log p_T(ids[t] | ids[:t]) for t >= 1 from one full forward pass (NumPy log-softmax of
  logits / temperature)."""
  n = len(ids)
  ids = np.asarray(ids)[None]
  logits = _forward(model, jnp.asarray(_pad(ids)), jnp.asarray(_pad(np.arange(n))),
                    jnp.asarray(_pad(np.ones(n))))
  logits = np.asarray(logits[0, :n], np.float64) / temperature
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return np.array([logits[t - 1, ids[0, t]] - logz[t - 1] for t in range(1, ids.shape[1])]), logits


def test_logprobs_match_trainer_forward_and_greedy_is_argmax(engine, small_model):
  prompts = [[5, 17, 300, 41], list(range(100, 160)), [9] * 9]
  requests = [_request(prompts[0], max_new_tokens=24, temperature=0.0, ignore_eos=True),
              _request(prompts[1], max_new_tokens=24, temperature=0.8, top_p=0.9,
                       sampling_seed=3, ignore_eos=True),
              _request(prompts[2], max_new_tokens=24, temperature=1.5, top_k=50,
                       sampling_seed=4, ignore_eos=True)]
  outs = engine.generate(requests)
  # Log-probs are of each request's sampling distribution, logits / T (raw when greedy), the
  # prompt's (scoring) as well as the output's; the trainer's forward on the same ids, packed
  # into one batch of three segments at those temperatures, gives the same values.
  temperatures = [1.0, 0.8, 1.5]
  seqs = [p + o.output_ids for p, o in zip(prompts, outs)]
  length = sum(map(len, seqs))
  packed = _pad(np.concatenate(seqs))
  positions = _pad(np.concatenate([np.arange(len(s)) for s in seqs]))
  segments = _pad(np.concatenate([np.full(len(s), i + 1) for i, s in enumerate(seqs)]))
  temps = np.ones((1, 256), np.float32)
  temps[0, :length] = np.concatenate([np.full(len(s), t) for s, t in zip(seqs, temperatures)])
  trainer = np.asarray(_trainer_forward(small_model, jnp.asarray(packed), jnp.asarray(positions),
                                        jnp.asarray(segments), jnp.asarray(temps))[0])
  offset = 0
  for prompt, out, seq, temperature in zip(prompts, outs, seqs, temperatures):
    assert out.meta_info.completion_tokens == 24 and len(out.output_logprobs) == 24
    recorded = np.concatenate([[e[0] for e in out.meta_info.input_token_logprobs[1:]],
                               out.output_logprobs])
    np.testing.assert_allclose(recorded, trainer[offset + 1:offset + len(seq)], atol=1e-4,
                               rtol=0)
    reference, logits = _reference_logprobs(small_model, seq, temperature)
    np.testing.assert_allclose(recorded, reference, atol=1e-4, rtol=0)
    offset += len(seq)
  assert length == offset
  # Greedy: every output token is the argmax of the full forward at the previous position.
  _, logits = _reference_logprobs(small_model, seqs[0])
  n = len(prompts[0])
  assert outs[0].output_ids == [int(np.argmax(logits[t])) for t in range(n - 1, len(seqs[0]) - 1)]
  assert outs[0].meta_info.input_token_logprobs[0][0] is None


def test_seeds_are_reproducible_whatever_the_batch(engine):
  prompt = [11, 12, 13, 14, 15]
  alone = engine.generate([_request(prompt, max_new_tokens=12, sampling_seed=7,
                                    ignore_eos=True)])[0]
  mixed = engine.generate([
    _request([1, 2, 3], max_new_tokens=5, ignore_eos=True),
    _request(prompt, max_new_tokens=12, sampling_seed=7, ignore_eos=True),
    _request(list(range(40, 90)), max_new_tokens=20, temperature=0.0, ignore_eos=True)])[1]
  other = engine.generate([_request(prompt, max_new_tokens=12, sampling_seed=8,
                                    ignore_eos=True)])[0]
  assert alone.output_ids == mixed.output_ids
  np.testing.assert_allclose(alone.output_logprobs, mixed.output_logprobs, atol=1e-5)
  assert alone.output_ids != other.output_ids


def test_stop_token_ids_stop_strings_and_length(engine, tokenizer):
  prompt = [21, 22, 23]
  base = engine.generate([_request(prompt, max_new_tokens=16, temperature=0.0,
                                   ignore_eos=True)])[0]
  assert base.meta_info.finish_reason.type == "length"
  assert base.meta_info.finish_reason.length == 16
  stop_id = base.output_ids[5]
  first = base.output_ids.index(stop_id)
  out = engine.generate([_request(prompt, max_new_tokens=16, temperature=0.0, ignore_eos=True,
                                  stop_token_ids=[stop_id])])[0]
  assert out.output_ids == base.output_ids[:first + 1]  # the stop id is kept in output_ids
  assert out.meta_info.finish_reason.model_dump(exclude_none=True) == {"type": "stop",
                                                                       "matched": stop_id}
  # A stop string: generation ends at the token completing it; the text is cut before it.
  full_text = tokenizer.decode(base.output_ids, skip_special_tokens=True)
  stop = full_text[len(full_text) // 2: len(full_text) // 2 + 3]
  out = engine.generate([_request(prompt, max_new_tokens=16, temperature=0.0, ignore_eos=True,
                                  stop=[stop])])[0]
  assert out.meta_info.finish_reason.matched == stop
  assert out.text == full_text[:full_text.index(stop)]
  n = len(out.output_ids)
  assert out.output_ids == base.output_ids[:n]
  assert stop in tokenizer.decode(out.output_ids) and stop not in tokenizer.decode(
    out.output_ids[:-1])


def test_scoring_with_max_new_tokens_zero(engine, small_model):
  ids = [7, 8, 9, 300, 301, 302, 5, 6]
  out = engine.generate([_request(ids, max_new_tokens=0)])[0]
  assert out.output_ids == [] and out.meta_info.finish_reason.type == "length"
  scores = [e[0] for e in out.meta_info.input_token_logprobs]
  assert scores[0] is None and [e[1] for e in out.meta_info.input_token_logprobs] == ids
  reference, _ = _reference_logprobs(small_model, ids)
  np.testing.assert_allclose(scores[1:], reference, atol=1e-4, rtol=0)
  # logprob_start_len skips the first positions.
  out = engine.generate([SingleGenerateRequest(
    input_ids=ids, return_logprob=True, logprob_start_len=3,
    sampling_params=SamplingParams(max_new_tokens=0))])[0]
  np.testing.assert_allclose([e[0] for e in out.meta_info.input_token_logprobs], reference[2:],
                             atol=1e-4, rtol=0)


def test_buckets_mean_no_recompilation(engine):
  engine.generate([_request([3] * 10, max_new_tokens=4, temperature=0.0, ignore_eos=True)])
  before = engine.compile_count
  rng = np.random.default_rng(0)
  requests = [_request(rng.integers(10, 8000, size=int(n)).tolist(), max_new_tokens=int(m),
                       temperature=0.0, ignore_eos=True)
              for n, m in zip(rng.integers(1, 120, size=7), rng.integers(1, 30, size=7))]
  outs = engine.generate(requests)
  assert [len(o.output_ids) for o in outs] == [r.sampling_params.max_new_tokens for r in requests]
  assert engine.compile_count == before
  assert engine.model_info()["compile_count"] == before


def test_cache_grows_during_a_request_with_unchanged_results(small_model, tokenizer):
  """A request starts in the smallest cache bucket holding its prompt plus one decode call and
  moves to larger buckets as it generates; its tokens and log-probs equal an engine whose one
  bucket fits it from the start, and its log-probs the trainer's forward pass."""
  import dataclasses

  from orchard_jax.rollout import Engine, EngineConfig

  growing = EngineConfig(max_batch_size=2, batch_buckets=(2,), max_seq_len=256,
                         cache_len_buckets=(64, 128, 256), prefill_chunk_buckets=(32,),
                         decode_steps=4, seed=0, prefix_cache=False)
  fixed = dataclasses.replace(growing, cache_len_buckets=(256,))
  rng = np.random.default_rng(4)
  requests = [_request(rng.integers(10, 8000, 40).tolist(), max_new_tokens=150, temperature=0.0,
                       ignore_eos=True),
              _request(rng.integers(10, 8000, 10).tolist(), max_new_tokens=30, temperature=1.0,
                       sampling_seed=1, ignore_eos=True)]
  with Engine(small_model, tokenizer, config=fixed) as engine:
    want = engine.generate(requests)
    fixed_programs = engine.compile_count
  with Engine(small_model, tokenizer, config=growing) as engine:
    got = engine.generate(requests)
    # Decode and re-layout programs for the 64 and 128 buckets on top of the 256 ones.
    assert engine.compile_count > fixed_programs
  for a, b in zip(got, want):
    assert a.output_ids == b.output_ids
    np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, atol=2e-5, rtol=0)
  ids = requests[0].input_ids + got[0].output_ids
  reference, _ = _reference_logprobs(small_model, ids)
  np.testing.assert_allclose(got[0].output_logprobs, reference[-150:], atol=1e-4, rtol=0)


def test_bad_requests_are_refused(engine):
  with pytest.raises(RequestError, match="max_seq_len"):
    engine.submit(_request([1] * 1024))
  with pytest.raises(RequestError, match="vocabulary"):
    engine.submit(_request([1, 99999]))
  with pytest.raises(RequestError, match="empty"):
    engine.submit(_request([]))


def test_weight_updates_in_process_and_from_orbax(engine, small_model, small_config, tmp_path):
  prompt = [31, 32, 33, 34]
  original = nnx.state(small_model, nnx.Param)
  other = CausalLM(small_config, rngs=nnx.Rngs(1))
  before = engine.generate([_request(prompt, max_new_tokens=8, temperature=0.0,
                                     ignore_eos=True)])[0]
  version = engine.weight_version
  compiles = engine.compile_count
  try:
    engine.update_params(nnx.to_pure_dict(nnx.state(other, nnx.Param)))
    swapped = engine.generate([_request(prompt, max_new_tokens=8, temperature=0.0,
                                        ignore_eos=True)])[0]
    assert engine.weight_version == str(int(version) + 1)
    assert swapped.meta_info.weight_version == engine.weight_version
    reference, _ = _reference_logprobs(other, prompt + swapped.output_ids)
    np.testing.assert_allclose(swapped.output_logprobs, reference[len(prompt) - 1:], atol=1e-4)
    assert swapped.output_logprobs != before.output_logprobs
    # Back to the original weights through an orbax folder, then `other` through a HF folder.
    save_params(str(tmp_path / "orbax"), original)
    engine.update_weights_from_disk(str(tmp_path / "orbax"), weight_version="from-orbax")
    again = engine.generate([_request(prompt, max_new_tokens=8, temperature=0.0,
                                      ignore_eos=True)])[0]
    assert again.output_ids == before.output_ids
    assert again.meta_info.weight_version == "from-orbax"
    assert engine.compile_count == compiles  # same shapes: nothing recompiled
    wrong = jax.tree.map(lambda x: np.zeros((3,) + x.shape[1:], x.dtype),
                         nnx.to_pure_dict(original))
    with pytest.raises(WeightUpdateError, match="shape"):
      engine.update_params(wrong)
    with pytest.raises(WeightUpdateError, match="does not exist"):
      engine.update_weights_from_disk(str(tmp_path / "missing"))
  finally:
    engine.update_params(original, weight_version=version)


def test_weight_update_from_hugging_face_folder(engine, small_model, small_config, tmp_path):
  prompt = [31, 32, 33, 34]
  original = nnx.state(small_model, nnx.Param)
  other = CausalLM(small_config, rngs=nnx.Rngs(2))
  version = engine.weight_version
  hf.save_pretrained(other, small_config, str(tmp_path / "hf"))
  try:
    engine.update_weights_from_disk(str(tmp_path / "hf"), load_format="auto")
    out = engine.generate([_request(prompt, max_new_tokens=8, temperature=0.0,
                                    ignore_eos=True)])[0]
    reference, _ = _reference_logprobs(other, prompt + out.output_ids)
    np.testing.assert_allclose(out.output_logprobs, reference[len(prompt) - 1:], atol=1e-4)
    assert engine.model_info()["model_path"] == str(tmp_path / "hf")
  finally:
    engine.update_params(original, weight_version=version)


def test_hybrid_deltanet_model_parity_and_row_reuse(tokenizer):
  """A Qwen3.5-style hybrid (Gated DeltaNet + attention): decode state per row, rows reused by
  later requests start clean (a stale recurrent state would change every log-prob)."""
  import dataclasses

  from orchard_jax.models import get_preset
  from orchard_jax.rollout import Engine, EngineConfig

  config = dataclasses.replace(
    get_preset("tiny_qwen3_5"), num_hidden_layers=2,
    layer_types=("linear_attention", "full_attention"), hidden_size=64, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, moe_intermediate_size=64,
    shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
    linear_value_head_dim=16, gdn_chunk_size=16)
  model = CausalLM(config, rngs=nnx.Rngs(3))
  engine_config = EngineConfig(max_batch_size=2, batch_buckets=(2,), max_seq_len=128,
                               cache_len_buckets=(128,), prefill_chunk_buckets=(16,),
                               decode_steps=4, seed=0)
  prompts = [list(range(50, 83)), [7, 8, 9], list(range(200, 219))]
  with Engine(model, tokenizer, config=engine_config) as engine:
    first = engine.generate([_request(p, max_new_tokens=10, temperature=1.0, sampling_seed=i,
                                      ignore_eos=True) for i, p in enumerate(prompts[:2])])
    # The third request lands in a row the first wave used.
    later = engine.generate([_request(prompts[2], max_new_tokens=6, temperature=0.0,
                                      ignore_eos=True),
                             _request(prompts[0], max_new_tokens=10, temperature=1.0,
                                      sampling_seed=0, ignore_eos=True)])
  for prompt, out in zip(prompts[:2] + prompts[2:], first + later[:1]):
    recorded = np.concatenate([[e[0] for e in out.meta_info.input_token_logprobs[1:]],
                               out.output_logprobs])
    reference, _ = _reference_logprobs(model, prompt + out.output_ids)
    np.testing.assert_allclose(recorded, reference, atol=1e-4, rtol=0)
  assert later[1].output_ids == first[0].output_ids  # same seed, reused row, same tokens


def test_weight_update_from_the_trainers_checkpoint_folder(engine, small_model, small_config,
                                                           tmp_path):
  """`/update_weights_from_disk` reads the trainer's Checkpointer layout (latest step, item
  "state" holding {"params": ...} next to optimiser state)."""
  from orchard_jax.train.checkpoint import Checkpointer

  prompt = [41, 42, 43]
  original = nnx.state(small_model, nnx.Param)
  other = CausalLM(small_config, rngs=nnx.Rngs(5))
  version = engine.weight_version
  with Checkpointer(str(tmp_path / "ckpt"), async_save=False) as checkpointer:
    checkpointer.save(3, {"params": nnx.to_pure_dict(original), "step": jnp.asarray(3)},
                      force=True)
    checkpointer.save(9, {"params": nnx.to_pure_dict(nnx.state(other, nnx.Param)),
                          "step": jnp.asarray(9)}, force=True)
  try:
    engine.update_weights_from_disk(str(tmp_path / "ckpt"), weight_version="9")
    out = engine.generate([_request(prompt, max_new_tokens=6, temperature=0.0,
                                    ignore_eos=True)])[0]
    reference, _ = _reference_logprobs(other, prompt + out.output_ids)  # the latest step
    np.testing.assert_allclose(out.output_logprobs, reference[len(prompt) - 1:], atol=1e-4)
    assert out.meta_info.weight_version == "9"
  finally:
    engine.update_params(original, weight_version=version)
