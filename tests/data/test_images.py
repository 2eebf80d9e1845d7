"""Images in the data room: sources (data URLs, paths, base64, bytes) and hostile ones, content
digests, transformers' own processor through ImageProcessor, placeholder expansion, the
vision-language chat template, image blobs in the trajectory store, and sequences that join a
session's calls only when their images agree."""
import base64
import hashlib
import io

import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from orchard_jax import data
from orchard_jax.data import images as im

IMAGE = 8195


def _png(width=40, height=30, seed=0) -> bytes:
  rng = np.random.default_rng(seed)
  buf = io.BytesIO()
  Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
  return buf.getvalue()


def test_sources_all_give_the_same_bytes_and_digest(tmp_path):
  raw = _png()
  path = tmp_path / "shot.png"
  path.write_bytes(raw)
  b64 = base64.b64encode(raw).decode()
  sources = [raw, f"data:image/png;base64,{b64}", str(path), f"file://{path}", b64,
             "data:image/png;charset=utf-8;base64," + b64]
  for source in sources:
    assert im.image_bytes(source) == raw
  assert im.image_digest(raw) == "sha256:" + hashlib.sha256(raw).hexdigest()
  assert im.is_digest(im.image_digest(raw)) and not im.is_digest("sha256:xyz")


@pytest.mark.parametrize("source, message", [
    ("http://example.com/a.png", "remote images are not fetched"),
    ("https://10.0.0.1/x.png", "remote images are not fetched"),
    ("data:image/png,rawtext", "must be base64-encoded"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("/no/such/file.png", "cannot read image file"),
    ("not an image at all!", "not valid base64"),
    (b"", "empty"),
    (3, "expected an image"),
])
def test_bad_sources_are_one_line_errors(source, message):
  with pytest.raises(im.ImageError, match=message):
    im.image_bytes(source)


def test_files_can_be_refused(tmp_path):
  path = tmp_path / "a.png"
  path.write_bytes(_png())
  with pytest.raises(im.ImageError, match="file paths are not accepted"):
    im.image_bytes(str(path), allow_files=False)


def test_undecodable_and_oversized_images(monkeypatch):
  with pytest.raises(im.ImageError, match="cannot decode"):
    im.open_image(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
  with pytest.raises(im.ImageError, match="cannot decode"):
    im.open_image(_png()[:50])          # truncated
  monkeypatch.setattr(im, "MAX_DECODED_PIXELS", 100)
  with pytest.raises(im.ImageError, match="40x30 pixels; at most 100"):
    im.open_image(_png())


def test_processor_is_transformers_qwen_processor():
  """Same pixel values and grid as transformers' Qwen2VLImageProcessor (PIL backend) with
  Qwen3-VL's published settings; a 1280 x 1000 screenshot is 62 x 80 patches."""
  processor = im.ImageProcessor()
  reference = transformers.Qwen2VLImageProcessorPil(
      patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
      image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 16777216})
  raw = _png(1280, 1000)
  out = processor(raw)
  expected = reference(images=[Image.open(io.BytesIO(raw)).convert("RGB")], return_tensors="np")
  np.testing.assert_array_equal(out.pixel_values, expected["pixel_values"])
  assert out.grid == (1, 62, 80) and out.num_tokens == 1240
  assert out.digest == im.image_digest(raw)
  small = processor(_png(40, 30))      # below min_pixels: scaled up to >= 65,536 pixels
  t, h, w = small.grid
  assert h * w * 256 >= 65536 and h % 2 == 0 and w % 2 == 0


def test_processor_settings_from_a_checkpoint_folder(tmp_path):
  config = im.ImageProcessor(min_pixels=1024, max_pixels=4096).config()
  (tmp_path / "preprocessor_config.json").write_text(__import__("json").dumps(config))
  loaded = im.ImageProcessor.from_pretrained(tmp_path)
  assert loaded.config() == config
  assert loaded(_png(400, 300)).num_tokens <= 4096 // (32 * 32)
  with pytest.raises(im.ImageError, match="cannot read"):
    im.ImageProcessor.from_pretrained(tmp_path / "missing")


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(1, 9), max_size=4), texts=st.lists(
    st.lists(st.integers(0, 100), max_size=4), min_size=5, max_size=5),
    expanded=st.lists(st.booleans(), min_size=4, max_size=4))
def test_expand_image_tokens(counts, texts, expanded):
  ids, full = list(texts[0]), list(texts[0])
  for k, n in enumerate(counts):       # <|vision_start|> run <|vision_end|> text
    ids += [8192] + [IMAGE] * (n if expanded[k] else 1) + [8193] + texts[k + 1]
    full += [8192] + [IMAGE] * n + [8193] + texts[k + 1]
  assert im.expand_image_tokens(ids, IMAGE, counts) == full
  if counts:
    with pytest.raises(im.ImageError, match="image"):
      im.expand_image_tokens(ids, IMAGE, counts[:-1])


def test_expand_refuses_a_run_of_the_wrong_length():
  with pytest.raises(im.ImageError, match="image 0: its placeholder run has 3 tokens; expected 1 "
                                          "\\(to be expanded\\) or its 4 tokens"):
    im.expand_image_tokens([1, IMAGE, IMAGE, IMAGE, 2], IMAGE, [4])


def test_vl_chat_template_and_digest_messages():
  tok = data.load_tokenizer("tiny_vl")
  assert tok.image_token_id == IMAGE and tok.vocab_size == 8197
  assert [tok.token_to_id(t) for t in im.VISION_TOKENS] == list(range(8192, 8197))
  assert data.load_tokenizer("tiny").image_token_id is None
  raw = _png()
  url = "data:image/png;base64," + base64.b64encode(raw).decode()
  messages = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": [{"type": "text", "text": "What is on"},
                                           {"type": "image_url", "image_url": {"url": url}},
                                           {"type": "text", "text": "?"}]},
              {"role": "tool", "tool_call_id": "c", "content": [{"type": "image", "image": url}]}]
  text = tok.render_chat_text(messages)
  assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
  assert "What is on<|vision_start|><|image_pad|><|vision_end|>?" in text
  assert im.image_parts(messages) == [url, url]
  digest = im.image_digest(raw)
  recorded = im.with_image_digests(messages, [digest, digest])
  assert im.image_parts(recorded) == [digest, digest]
  assert tok.render_chat_text(recorded) == text            # same rendering, no image data
  assert url not in str(recorded)


def test_store_keeps_each_image_once(tmp_path):
  raw = _png()
  with data.TrajectoryStore(tmp_path) as store:
    digest = store.put_image(raw)
    assert store.put_image(raw) == digest == im.image_digest(raw)
    assert store.get_image(digest) == raw and store.has_image(digest)
    blobs = [p for p in (tmp_path / "images").rglob("*") if p.is_file()]
    assert len(blobs) == 1
    blobs[0].write_bytes(raw[:-1])
    with pytest.raises(data.StoreError, match="does not match its digest"):
      store.get_image(digest)
    with pytest.raises(data.StoreError, match="not in the store"):
      store.get_image(im.image_digest(b"other"))
    with pytest.raises(data.StoreError, match="expected an image digest"):
      store.get_image("../../etc/passwd")
    call = data.ModelCall(session_id="s", call_index=0, prompt_ids=[1, IMAGE, 2],
                          output_ids=[3], output_logprobs=[-0.5], images=[digest])
    store.append_model_call(call)
    assert store.model_calls("s")[0].images == [digest]
  with pytest.raises(data.StoreError, match="image digests"):
    data.ModelCall(session_id="s", call_index=0, images=["not-a-digest"])


def test_sequences_join_calls_only_when_their_images_agree():
  a, b = im.image_digest(b"a"), im.image_digest(b"b")
  def call(i, prompt, images):
    return data.ModelCall(session_id="s", call_index=i, prompt_ids=prompt, output_ids=[9, 2],
                          output_logprobs=[-1.0, -0.5], images=images)
  first = call(0, [1, IMAGE, IMAGE, 3], [a])
  # same ids and a second image: extends; then the harness swaps the first screenshot for
  # another of the same size (same ids, other digest): a new sequence.
  second = call(1, [1, IMAGE, IMAGE, 3, 9, 2, 4, IMAGE, IMAGE, 5], [a, b])
  third = call(2, [1, IMAGE, IMAGE, 3, 9, 2, 4, IMAGE, IMAGE, 5, 9, 2, 6], [b, b])
  seqs = data.sequences_from_model_calls([first, second, third], mode="rl")
  assert [s.call_indices for s in seqs] == [(0, 1), (2,)]
  assert seqs[0].images == (a, b) and seqs[1].images == (b, b)


def test_text_only_call_with_images_is_tokenised_with_expanded_placeholders():
  tok = data.load_tokenizer("tiny_vl")
  digest = im.image_digest(b"x")
  messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": digest}},
                                           {"type": "text", "text": "hi"}]}]
  call = data.ModelCall(session_id="t", call_index=0, messages=messages, text_only=True,
                        response={"role": "assistant", "content": "ok"})
  [seq] = data.sequences_from_model_calls([call], mode="sft", tokenizer=tok,
                                          image_tokens=lambda d: 6)
  assert seq.images == (digest,) and int(np.sum(seq.input_ids == IMAGE)) == 6
  with pytest.raises(data.DataError, match="image_tokens="):
    data.sequences_from_model_calls([call], mode="sft", tokenizer=tok)
