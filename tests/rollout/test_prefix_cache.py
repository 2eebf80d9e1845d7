"""The engine's prefix cache: multi-turn agent sessions give the same tokens and log-probs as the
cache-off engine while prefilling only the new suffix; partial-prefix reuse (attention models),
whole-row reuse only (Gated DeltaNet hybrids), diverged history, weight updates, LRU eviction,
cache growth into a larger length bucket, meta_info.cached_tokens.

Every case runs on an attention-only model (Qwen3-MoE, the conftest's small policy) and on a
Qwen3.5-style hybrid; the reference is a second engine with `prefix_cache=False` serving the
same weights (test_engine.py checks that engine against the trainer's forward pass).
"""
import concurrent.futures
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from orchard_jax.models import CausalLM, get_preset
from orchard_jax.rollout import Engine, EngineConfig, SamplingParams, SingleGenerateRequest

DECODE_STEPS = 4
CONFIG = EngineConfig(max_batch_size=2, batch_buckets=(2,), max_seq_len=256,
                      cache_len_buckets=(256,), prefill_chunk_buckets=(32,),
                      decode_steps=DECODE_STEPS, seed=0)
# The attention model's engines have two cache-length buckets: sessions start in the short one
# and grow into the long one (a re-layout that must keep resident rows). The hybrid's compile
# slowly, so they have one (the re-layout moves every cache leaf alike).
GROWING = dataclasses.replace(CONFIG, cache_len_buckets=(128, 256))
HYBRID = dict(num_hidden_layers=2, layer_types=("linear_attention", "full_attention"),
              hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4,
              num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=2,
              linear_key_head_dim=16, linear_value_head_dim=16, gdn_chunk_size=16)


@dataclasses.dataclass
class Pair:
  """Engines with the prefix cache on and off, serving the same model."""
  on: Engine
  off: Engine
  model: CausalLM
  recurrent: bool


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])
def pair(request, small_model, tokenizer):
  if request.param == "qwen3_moe":
    model, recurrent, config = small_model, False, GROWING
  else:
    model = CausalLM(dataclasses.replace(get_preset("tiny_qwen3_5"), **HYBRID),
                     rngs=nnx.Rngs(3))
    recurrent, config = True, CONFIG
  with Engine(model, tokenizer, config=config) as on, Engine(
      model, tokenizer, config=dataclasses.replace(config, prefix_cache=False)) as off:
    yield Pair(on, off, model, recurrent)


def _request(ids, seed, greedy, max_new=10, stop=None, ignore_eos=True):
  return SingleGenerateRequest(
    input_ids=[int(i) for i in ids], return_logprob=True,
    sampling_params=SamplingParams(max_new_tokens=max_new, temperature=0.0 if greedy else 1.0,
                                   sampling_seed=seed, ignore_eos=ignore_eos,
                                   stop_token_ids=stop))


def _mid_call_stop(off: Engine, ids, seed, greedy) -> list[int]:
  """A stop id that ends this request in the middle of a decode call.

  The cache-off engine generates freely first; the first output token after index 1 that is
  new and not the last of a decode call becomes the stop id, so the real request stops there
  while the compiled call runs on (the row must freeze for its state to stay reusable).
  Output index 0 comes from the prefill, 1..DECODE_STEPS from the first decode call.
  """
  [free] = off.generate([_request(ids, seed, greedy)])
  out = free.output_ids
  for k in range(2, len(out)):
    if out[k] not in out[:k] and k % DECODE_STEPS != 0:
      return [out[k]]
  return []


def _assert_same(on_out, off_out):
  assert on_out.output_ids == off_out.output_ids
  np.testing.assert_allclose(on_out.output_logprobs, off_out.output_logprobs, atol=2e-5, rtol=0)
  assert off_out.meta_info.cached_tokens == 0


def _suffix(rng, n=9):
  return rng.integers(10, 8000, n)


def test_multi_turn_sessions_match_the_cache_off_engine(pair):
  """Two concurrent sessions (one greedy, one sampled), four turns each: every turn's prompt is
  the previous prompt + output + a new suffix, so from turn 2 on the whole previous sequence
  but its last output token comes from the cache. With the attention model's engines the
  sessions grow from the 128-token cache bucket into the 256 one."""
  rng = np.random.default_rng(0)
  prompts = {0: _suffix(rng, 70), 1: _suffix(rng, 25)}
  fed = {0: 0, 1: 0}
  longest = 0
  hits_before = pair.on.prefix_cache_stats["hits"]
  for turn in range(4):
    requests = {}
    for s in (0, 1):
      greedy, seed = s == 0, 100 * turn + s
      stop = _mid_call_stop(pair.off, prompts[s], seed, greedy)
      requests[s] = _request(prompts[s], seed, greedy, stop=stop)
      longest = max(longest, len(prompts[s]))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      on = dict(zip(requests, pool.map(lambda r: pair.on.generate([r])[0], requests.values())))
    off = {s: pair.off.generate([r])[0] for s, r in requests.items()}
    for s in (0, 1):
      _assert_same(on[s], off[s])
      assert on[s].meta_info.cached_tokens == fed[s]
      fed[s] = len(prompts[s]) + len(on[s].output_ids) - 1
      prompts[s] = np.concatenate([prompts[s], on[s].output_ids, _suffix(rng, 20)])
  assert longest + 10 > 128        # the last turns needed the second cache bucket (GROWING)
  assert pair.on.prefix_cache_stats["hits"] - hits_before == 6


def test_partial_prefix_and_edited_history(pair):
  """A prompt that shares only part of a resident row (history edited at token 30): an
  attention model reuses the 30 shared tokens, a hybrid cannot roll its recurrent state back
  and prefills everything; either way the result equals the cache-off engine's."""
  rng = np.random.default_rng(1)
  pair.on.flush_cache()
  first = _suffix(rng, 50)
  [out] = pair.on.generate([_request(first, 7, greedy=True)])
  edited = np.concatenate([first[:30], [first[30] + 1], first[31:], out.output_ids,
                           _suffix(rng)])
  shorter = first[:20]      # a strict prefix of the resident row
  for prompt, shared in ((edited, 30), (shorter, 19)):
    [on] = pair.on.generate([_request(prompt, 8, greedy=False)])
    [off] = pair.off.generate([_request(prompt, 8, greedy=False)])
    _assert_same(on, off)
    assert on.meta_info.cached_tokens == (0 if pair.recurrent else shared)


def test_weight_update_and_flush_invalidate(pair):
  """Resident rows hold states computed with the old weights: after update_params nothing is
  reused, and the outputs equal the cache-off engine's under the new weights."""
  rng = np.random.default_rng(2)
  original = nnx.to_pure_dict(nnx.state(pair.model, nnx.Param))
  other = jax.tree.map(lambda x: np.asarray(x) * 1.25, original)   # new weights, same shapes
  prompt = _suffix(rng, 30)
  [out] = pair.on.generate([_request(prompt, 1, greedy=True)])
  follow = np.concatenate([prompt, out.output_ids, _suffix(rng)])
  stats = pair.on.prefix_cache_stats
  try:
    for engine in (pair.on, pair.off):
      engine.update_params(other)
    assert pair.on.prefix_cache_stats["resident_rows"] == 0
    assert pair.on.prefix_cache_stats["invalidations"] > stats["invalidations"]
    [on] = pair.on.generate([_request(follow, 2, greedy=True)])
    [off] = pair.off.generate([_request(follow, 2, greedy=True)])
    _assert_same(on, off)
    assert on.meta_info.cached_tokens == 0
  finally:
    for engine in (pair.on, pair.off):
      engine.update_params(original)
  # The same session again under the original weights: cached, then flushed.
  [again] = pair.on.generate([_request(prompt, 1, greedy=True)])
  assert again.output_ids == out.output_ids
  assert pair.on.flush_cache() >= 1
  [after] = pair.on.generate([_request(follow, 2, greedy=True)])
  assert after.meta_info.cached_tokens == 0


def test_eviction_under_more_sessions_than_rows(pair):
  """Three sessions on two rows: the least recently used resident row goes to the session that
  needs a row; the two most recent sessions still hit, the evicted one prefills again."""
  rng = np.random.default_rng(3)
  pair.on.flush_cache()
  prompts = [_suffix(rng, 20 + 5 * i) for i in range(3)]
  outs = [pair.on.generate([_request(p, i, greedy=True)])[0] for i, p in enumerate(prompts)]
  evictions = pair.on.prefix_cache_stats["evictions"]
  assert pair.on.prefix_cache_stats["resident_rows"] == 2
  follows = [np.concatenate([p, o.output_ids, _suffix(rng, 4)]) for p, o in zip(prompts, outs)]
  # Sessions 2 and 1 (most recent first) hit; session 0 was evicted when session 2 arrived.
  for i in (2, 1):
    [hit] = pair.on.generate([_request(follows[i], 10 + i, greedy=True)])
    assert hit.meta_info.cached_tokens == len(prompts[i]) + len(outs[i].output_ids) - 1
  [miss] = pair.on.generate([_request(follows[0], 10, greedy=True)])
  [ref] = pair.off.generate([_request(follows[0], 10, greedy=True)])
  _assert_same(miss, ref)
  assert miss.meta_info.cached_tokens == 0
  # Session 0 took the least recently used row then: session 2's (it finished before 1's).
  assert pair.on.prefix_cache_stats["evictions"] == evictions + 1
