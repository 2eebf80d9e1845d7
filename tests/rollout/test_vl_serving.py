"""A vision-language policy served and recorded: SGLang's /generate with image_data, the
OpenAI chat route with image_url parts (data URLs and file paths, through the real `openai`
client), batches mixing text and image requests, the prefix cache keyed by image content (a
cached screenshot is not encoded again, another one of the same size never matches), bad
images as 400s, and a chat with images through the recording proxy whose records train:
the trainer's log-probs of the recorded turns equal the engine's recorded ones within 1e-4.

References are the model's own full-sequence forward with the images (models' parity tests tie
it to transformers) and, for batching and caching, the same request served alone by a fresh
engine."""
import base64
import dataclasses
import io

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from flax import nnx
from PIL import Image

from orchard_jax import data, models, train
from orchard_jax.data.images import ImageProcessor, image_digest
from orchard_jax.rollout import (Engine, EngineConfig, InferenceServer, RecordingProxy,
                                 SGLangUpstream)
from orchard_jax.rollout.protocol import SamplingParams, SingleGenerateRequest
from tests.models.conftest import random_model

CONFIG = EngineConfig(max_batch_size=2, batch_buckets=(2,), max_seq_len=512,
                      cache_len_buckets=(512,), prefill_chunk_buckets=(32,), decode_steps=4,
                      seed=0)
PROCESSOR = dict(min_pixels=32 * 32, max_pixels=128 * 128)


def _config():
  """tiny_vl (the tiny_vl tokenizer's vocabulary and vision token ids) cut down to compile in
  seconds: 2 decoder layers of width 64, a 2-block vision encoder of width 32."""
  base = models.get_preset("tiny_vl")
  vision = dataclasses.replace(base.vision, depth=2, hidden_size=32, intermediate_size=64,
                               num_heads=2, out_hidden_size=64, num_position_embeddings=64,
                               deepstack_visual_indexes=(0, 1))
  return dataclasses.replace(base, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=32, intermediate_size=128,
                             mrope_section=(4, 6, 6), vision=vision)


def _png(width, height, seed) -> bytes:
  pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
  buf = io.BytesIO()
  Image.fromarray(pixels).save(buf, "PNG")
  return buf.getvalue()


def _url(raw: bytes) -> str:
  return "data:image/png;base64," + base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def vl():
  config = _config()
  return dict(config=config, model=random_model(config, seed=2),
              tokenizer=data.load_tokenizer("tiny_vl"), processor=ImageProcessor(**PROCESSOR))


def _engine(vl):
  return Engine(vl["model"], vl["tokenizer"], config=CONFIG, image_processor=vl["processor"])


@pytest.fixture(scope="module")
def engine(vl):
  with _engine(vl) as running:
    yield running


@nnx.jit
def _forward(model, ids, pos, seg, patches):
  return model(ids, pos, seg, images=patches)[0]


def _reference_logprobs(vl, prompt_ids, raws, output_ids):
  """log p(output_ids[j] | prompt + output[:j]) from the full-sequence forward with images."""
  proc, config = vl["processor"], vl["config"]
  processed = [proc(raw) for raw in raws]
  prompt = data.images.expand_image_tokens(prompt_ids, config.vision.image_token_id,
                                           [p.num_tokens for p in processed])
  ids = np.asarray(prompt + list(output_ids[:-1]))
  grids = [p.grid for p in processed]
  pos = models.mrope_positions(ids, grids, image_token_id=config.vision.image_token_id,
                               spatial_merge_size=2)[0]
  patches = models.image_patches([p.pixel_values for p in processed], grids, config.vision)
  logits = np.asarray(_forward(vl["model"], jnp.asarray(ids[None]), jnp.asarray(pos[None]),
                               jnp.ones((1, len(ids)), jnp.int32),
                               jax.tree.map(jnp.asarray, patches)), np.float64)[0]
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return [logp[len(prompt) - 1 + j, t] for j, t in enumerate(output_ids)], prompt


def _chat(text, *raws):
  content = [{"type": "text", "text": text}]
  content += [{"type": "image_url", "image_url": {"url": _url(raw)}} for raw in raws]
  return [{"role": "user", "content": content}]


def _request(vl, messages, raws, **sampling):
  ids = vl["tokenizer"].render_chat(messages)
  return SingleGenerateRequest(
      input_ids=ids, image_data=[_url(r) for r in raws], return_logprob=True,
      sampling_params=SamplingParams(**{"max_new_tokens": 6, "temperature": 0.0, **sampling}))


def test_generate_with_images_equals_the_full_forward(vl, engine, tmp_path):
  a, b = _png(100, 60, 0), _png(40, 90, 1)
  path = tmp_path / "b.png"
  path.write_bytes(b)
  messages = _chat("two pictures:", a, b)
  ids = vl["tokenizer"].render_chat(messages)
  with InferenceServer(engine) as server:
    body = {"input_ids": ids, "image_data": [_url(a), str(path)], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 3}}
    out = httpx.post(server.url + "/generate", json=body, timeout=120).json()
  expected, prompt = _reference_logprobs(vl, ids, [a, b], out["output_ids"])
  assert out["meta_info"]["prompt_tokens"] == len(prompt)
  got = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
  np.testing.assert_allclose(got, expected, atol=1e-4)
  assert engine.model_info()["has_image_understanding"]


def test_mixed_text_and_image_batch_equals_each_request_alone(vl, engine):
  shots = [_png(80, 64, 10), _png(64, 96, 11), _png(120, 40, 12)]
  requests = [_request(vl, _chat(f"shot {i}", s), [s]) for i, s in enumerate(shots)]
  requests.insert(1, SingleGenerateRequest(
      input_ids=vl["tokenizer"].encode("plain text"), return_logprob=True,
      sampling_params=SamplingParams(max_new_tokens=6, temperature=0.0)))
  together = engine.generate(requests, timeout_s=300)
  with _engine(vl) as fresh:
    alone = [fresh.generate([r], timeout_s=300)[0] for r in requests]
  for x, y in zip(together, alone):
    assert x.output_ids == y.output_ids
    np.testing.assert_allclose(x.output_logprobs, y.output_logprobs, atol=1e-4)


def test_prefix_cache_keys_hold_image_content(vl):
  shot, same_size = _png(96, 64, 20), _png(96, 64, 21)
  first = _request(vl, _chat("look", shot), [shot])
  with _engine(vl) as eng:
    [a] = eng.generate([first], timeout_s=300)
    encoded = eng.runner.vision.encoded
    [again] = eng.generate([first], timeout_s=300)
    # the screenshot's tokens come from the resident row: not encoded, not prefilled again
    assert eng.runner.vision.encoded == encoded
    assert again.meta_info.cached_tokens == a.meta_info.prompt_tokens - 1
    assert again.output_ids == a.output_ids
    other = _request(vl, _chat("look", same_size), [same_size])
    [b] = eng.generate([other], timeout_s=300)
    ids = np.asarray(vl["tokenizer"].render_chat(_chat("look", same_size)))
    first_image = int(np.argmax(ids == vl["config"].vision.image_token_id))
    assert b.meta_info.cached_tokens <= first_image
    assert eng.runner.vision.encoded == encoded + 1
  with _engine(vl) as fresh:
    [alone] = fresh.generate([other], timeout_s=300)
  assert b.output_ids == alone.output_ids
  np.testing.assert_allclose(b.output_logprobs, alone.output_logprobs, atol=1e-4)


def test_chat_completions_with_image_url_parts(vl, engine, tmp_path):
  shot = _png(72, 72, 30)
  path = tmp_path / "shot.png"
  path.write_bytes(shot)
  with InferenceServer(engine) as server:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    outs = []
    for url in (_url(shot), str(path)):
      response = client.chat.completions.create(
          model="orchard", messages=[{"role": "user", "content": [
              {"type": "text", "text": "what is it?"},
              {"type": "image_url", "image_url": {"url": url}}]}],
          max_tokens=6, temperature=0, logprobs=True)
      outs.append([t.logprob for t in response.choices[0].logprobs.content])
    [direct] = engine.generate([_request(vl, _chat("what is it?", shot), [shot])], timeout_s=300)
  np.testing.assert_allclose(outs[0], direct.output_logprobs[:len(outs[0])], atol=1e-4)
  np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)


@pytest.mark.parametrize("body, message", [
    ({"image_data": ["http://example.com/x.png"]}, "remote images are not fetched"),
    ({"image_data": ["data:image/png;base64,!!"]}, "not valid base64"),
    ({"image_data": [_url(b"not an image")]}, "cannot"),
    ({"image_data": []}, "image placeholders"),
    ({"image_data": [_url(_png(32, 32, 1)), _url(_png(32, 32, 2))]}, "2 image"),
])
def test_bad_images_are_400s_naming_the_fault(vl, engine, body, message):
  ids = vl["tokenizer"].render_chat(_chat("x", _png(32, 32, 0)))
  with InferenceServer(engine) as server:
    response = httpx.post(server.url + "/generate", json={"input_ids": ids, **body}, timeout=60)
  assert response.status_code == 400 and message in response.json()["message"]


def test_images_for_a_text_model_are_a_400(engine):
  from orchard_jax.rollout.errors import RequestError
  text_engine = Engine(models.CausalLM(dataclasses.replace(_config(), vision=None, mrope_section=()),
                                       rngs=nnx.Rngs(0)),
                       data.load_tokenizer("tiny_vl"), config=CONFIG)
  with text_engine, pytest.raises(RequestError, match="reads text only"):
    text_engine.submit(SingleGenerateRequest(input_ids=[1, 2], image_data=[_url(_png(32, 32, 0))]))


def test_chat_with_images_through_the_proxy_is_recorded_and_trains(vl, engine, tmp_path):
  tok, config = vl["tokenizer"], vl["config"]
  screens = [_png(96, 64, 40), _png(96, 64, 41)]          # same size, different content
  store = data.TrajectoryStore(tmp_path / "store")
  with InferenceServer(engine) as server, store, RecordingProxy(
      SGLangUpstream(server.url), tokenizer=tok, store=store,
      image_processor=vl["processor"]) as proxy:
    client = openai.OpenAI(base_url=proxy.session_url("gui-1"), api_key="none", max_retries=0)
    messages = _chat("click the button", screens[0])
    for turn in range(2):
      response = client.chat.completions.create(model="orchard", messages=messages,
                                                max_tokens=5, temperature=0.8, seed=turn)
      messages.append({"role": "assistant", "content": response.choices[0].message.content})
      messages += _chat("after the click:", screens[1], screens[0])
    proxy.end_session("gui-1")
    records = store.model_calls("gui-1")
  assert len(records) == 2
  digests = [image_digest(s) for s in screens]
  assert records[0].images == [digests[0]]
  assert records[1].images == [digests[0], digests[1], digests[0]]
  assert "base64" not in str(records[1].messages)             # images are blobs, by digest
  blobs = [p for p in (tmp_path / "store" / "images").rglob("*") if p.is_file()]
  assert len(blobs) == 2 and store.get_image(digests[1]) == screens[1]
  # the recorded ids are the expanded placeholders as prefilled: the second call extends
  # the first call's prompt + output exactly, and the images' runs have their token counts
  history = records[0].prompt_ids + records[0].output_ids
  assert records[1].prompt_ids[:len(history)] == history
  n = vl["processor"](screens[0]).num_tokens
  assert records[1].prompt_ids.count(config.vision.image_token_id) == 3 * n

  # Training: sequences from the records, packed with their images, log-probs by the train
  # step's own function equal what the engine recorded for tokens sampled at temperature 0.8
  # (not 1, so a trainer and an engine scoring different distributions would differ;
  # docs/algorithms.md section 3).
  [sequence] = data.sequences_from_model_calls(records, mode="rl")
  packed = data.pack_sequences([sequence], batch_size=2, seq_len=256, images_per_row=4,
                               image_token_id=config.vision.image_token_id)
  processed = {d: vl["processor"](store.get_image(d)) for d in digests}
  batch = train.add_images(packed.batches[0], packed.row_images[0], processed, config,
                           images_per_row=4, patches_per_image=128)
  batch["advantages"] = np.where(batch["loss_weights"] > 0, 1.0, 0.0).astype(np.float32)
  loss = train.PolicyLoss(chunk_size=64)
  trainer_config = train.TrainerConfig(
      workdir=str(tmp_path / "run"), total_steps=1, progress=False, tensorboard=False,
      optimizer=train.OptimizerConfig(learning_rate=1e-3, warmup_steps=0, frozen=("visual",)))
  with train.Trainer(vl["model"], loss, trainer_config, mesh=_one_device()) as trainer:
    logp = trainer.token_logprobs(batch)
    place = packed.placements[0]
    weights = batch["loss_weights"][place.row]
    recorded = batch["old_logprobs"][place.row]
    trained = weights > 0
    assert trained.sum() == len(records[0].output_ids) + len(records[1].output_ids)
    np.testing.assert_allclose(logp[place.row][trained], recorded[trained], atol=1e-4)
    metrics = trainer.train_step(batch)
  assert metrics["approx_kl"] < 1e-6 and metrics["clip_fraction"] == 0.0


def _one_device():
  return jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))


def test_hosted_upstream_chat_with_an_image_is_recorded_by_digest(vl, tmp_path):
  """A text-level upstream (a hosted teacher) sees the image as sent; the record names it by
  digest, the store keeps it once, and the record tokenises for SFT with the student's
  template and the image's token count."""
  from orchard_jax.rollout import OpenAIUpstream
  from tests.openai_stub import ChatStub

  shot = _png(64, 48, 50)
  with ChatStub(lambda request: "a button") as stub, \
      data.TrajectoryStore(tmp_path / "store") as store:
    with RecordingProxy(OpenAIUpstream(stub.root + "/v1", "teacher", api_key="k"),
                        tokenizer=vl["tokenizer"], store=store) as proxy:
      client = openai.OpenAI(base_url=proxy.session_url("t"), api_key="none", max_retries=0)
      client.chat.completions.create(model="x", messages=_chat("what is it?", shot))
      proxy.end_session("t")
    [record] = store.model_calls("t")
    assert _url(shot) in json_dumps(stub.requests[0].body)        # the teacher saw the image
    assert record.text_only and record.images == [image_digest(shot)]
    assert "base64" not in str(record.messages) and store.get_image(record.images[0]) == shot
    [sequence] = data.sequences_from_model_calls(
        [record], mode="sft", tokenizer=vl["tokenizer"],
        image_tokens=lambda d: vl["processor"](store.get_image(d)).num_tokens)
  assert sequence.images == (image_digest(shot),)
  assert int(np.sum(sequence.input_ids == vl["config"].vision.image_token_id)) == (
      vl["processor"](shot).num_tokens)


def json_dumps(value) -> str:
  import json
  return json.dumps(value)


def test_one_new_image_is_encoded_once_by_two_schedulers(vl):
  """Data parallelism: requests showing the same new screenshot land on both schedulers at
  once; the vision front still runs once for it."""
  shot = _png(88, 72, 60)
  config = dataclasses.replace(CONFIG, data_parallel=2)
  with Engine(vl["model"], vl["tokenizer"], config=config,
              image_processor=vl["processor"]) as eng:
    requests = [_request(vl, _chat(f"request {i}", shot), [shot]) for i in range(4)]
    outs = eng.generate(requests, timeout_s=300)
    assert eng.runner.vision.encoded == 1
  assert all(len(o.output_ids) == 6 for o in outs)
