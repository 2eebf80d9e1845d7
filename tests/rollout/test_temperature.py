"""Log-probs at the sampling temperature, end to end (docs/algorithms.md section 3; docs/cases.md
9): at T = 0.7 the engine records log_softmax(logits / 0.7) of every sampled token, checked
against a NumPy log-softmax of the model's own logits; the proxy's record carries the
temperature; and the trainer's log-probs of the packed record at that temperature equal the
recorded ones, so the policy ratio is 1 at the weights that sampled."""
import jax.numpy as jnp
import numpy as np
import openai
import pytest

from orchard_jax import train
from orchard_jax.data import TrajectoryStore, pack_sequences, sequences_from_model_calls
from orchard_jax.rollout import (
  InferenceServer, RecordingProxy, SamplingParams, SGLangUpstream, SingleGenerateRequest)

T = 0.7
ATOL = 2e-4   # the engine's cached, chunked computation vs one full forward pass


def _numpy_logprobs(model, ids, temperature):
  """[len(ids) - 1] log p_T(ids[t] | ids[:t]) for t >= 1, from the model's logits in NumPy."""
  n = len(ids)
  logits, _ = model(jnp.asarray([ids], jnp.int32), jnp.arange(n, dtype=jnp.int32)[None],
                    jnp.ones((1, n), jnp.int32))
  z = np.asarray(logits[0], np.float64) / temperature
  z -= z.max(-1, keepdims=True)
  logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return logsm[np.arange(n - 1), np.asarray(ids[1:])], logsm


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_engine_records_logprobs_of_the_tempered_distribution(engine, small_model, top_p):
  prompt = [5, 17, 42, 8, 99, 3]
  [out] = engine.generate([SingleGenerateRequest(
    input_ids=prompt, return_logprob=True, top_logprobs_num=3,
    sampling_params=SamplingParams(temperature=T, top_p=top_p, max_new_tokens=24,
                                   ignore_eos=True, sampling_seed=11))])
  ids = prompt + out.output_ids
  expected, logsm = _numpy_logprobs(small_model, ids, T)
  recorded = np.asarray(out.output_logprobs)
  np.testing.assert_allclose(recorded, expected[len(prompt) - 1:], rtol=0, atol=ATOL)
  raw, _ = _numpy_logprobs(small_model, ids, 1.0)
  assert np.abs(recorded - raw[len(prompt) - 1:]).max() > 50 * ATOL   # not the T = 1 values
  # Top log-probs are of the same distribution.
  for j, top in enumerate(out.meta_info.output_top_logprobs):
    row = logsm[len(prompt) - 1 + j]
    assert [e[1] for e in top] == list(np.argsort(-row)[:3])
    np.testing.assert_allclose([e[0] for e in top], np.sort(row)[::-1][:3], rtol=0, atol=ATOL)
  # Scoring the same ids at T (OPD's teacher path) gives the same log-probs for the prompt.
  [scored] = engine.generate([SingleGenerateRequest(
    input_ids=ids, return_logprob=True, logprob_start_len=0,
    sampling_params=SamplingParams(temperature=T, max_new_tokens=0))])
  inputs = [e[0] for e in scored.meta_info.input_token_logprobs]
  assert inputs[0] is None
  np.testing.assert_allclose(inputs[1:], expected, rtol=0, atol=ATOL)


def test_greedy_call_records_the_raw_distribution(engine, small_model):
  prompt = [7, 7, 31, 2]
  [out] = engine.generate([SingleGenerateRequest(
    input_ids=prompt, return_logprob=True,
    sampling_params=SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))])
  expected, logsm = _numpy_logprobs(small_model, prompt + out.output_ids, 1.0)
  np.testing.assert_allclose(out.output_logprobs, expected[len(prompt) - 1:], rtol=0, atol=ATOL)
  start = len(prompt) - 1
  assert out.output_ids == np.argmax(logsm[start:start + len(out.output_ids)], -1).tolist()


def test_record_carries_the_temperature_and_the_trainer_agrees(engine, small_model, tokenizer,
                                                               tmp_path):
  with InferenceServer(engine) as server, TrajectoryStore(tmp_path / "store") as store, \
      RecordingProxy(SGLangUpstream(server.url), tokenizer=tokenizer, store=store,
                     freeze_gc=False) as proxy:
    client = openai.OpenAI(base_url=proxy.session_url("warm"), api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Say something.\n"}]
    for turn in range(2):
      reply = client.chat.completions.create(model="m", messages=messages, temperature=T,
                                             max_tokens=12, seed=turn)
      messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                   {"role": "user", "content": "More.\n"}]
    greedy = client.chat.completions.create(model="m", messages=messages, temperature=0,
                                            max_tokens=4)
    assert greedy.usage.completion_tokens >= 1
    proxy.end_session("warm")
    records = store.model_calls("warm")
  assert [r.temperature for r in records] == [T, T, 1.0]      # greedy: raw distribution
  [sequence] = sequences_from_model_calls(records, mode="rl")
  sampled = sequence.loss_weights > 0
  assert sequence.temperatures[~sampled].tolist() == [1.0] * int((~sampled).sum())
  np.testing.assert_allclose(sequence.temperatures[sampled],
                             [r.temperature for r in records for _ in r.output_ids])
  [batch] = pack_sequences([sequence.with_advantage(1.0)], batch_size=1, seq_len=len(sequence)
                           + 5).batches
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  logp, _, _ = train.token_logprobs(small_model, batch["input_ids"], batch["positions"],
                                    batch["segment_ids"], temperatures=batch["temperatures"])
  mask = np.asarray(batch["loss_weights"]) > 0
  np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(batch["old_logprobs"])[mask],
                             rtol=0, atol=ATOL)
  # The policy loss at the sampling weights: every ratio is 1, nothing is clipped.
  loss = train.PolicyLoss()
  _, metrics, _ = loss(small_model, batch, loss.normalizer(batch))
  assert float(metrics["clip_fraction"]) == 0.0
  assert abs(float(metrics["ratio_mean"]) - 1.0) < 1e-3 and float(metrics["approx_kl"]) < 1e-6
  # At temperature 1 the same tokens would give ratios far from 1 (the bug of docs/cases.md 9).
  untempered = {**batch, "temperatures": jnp.ones_like(batch["temperatures"])}
  _, metrics, _ = loss(small_model, untempered, loss.normalizer(untempered))
  assert float(metrics["approx_kl"]) > 1e-3
