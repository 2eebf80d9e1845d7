"""The tiny BPE and Hugging Face tokenizer folders."""
import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RawTokenizer

from orchard_jax.data import (
  QWEN_MARKUP_TOKENS, QWEN_SPECIAL_TOKENS, TokenizerError, load_tokenizer, stdlib_corpus,
  train_tiny_tokenizer)
from orchard_jax.data.tokenizer import GIL_FREE_CHARS

MARKUP = list(QWEN_SPECIAL_TOKENS) + list(QWEN_MARKUP_TOKENS)


def test_tiny_tokenizer_vocab_and_markup(tok):
  assert tok.vocab_size == 8192
  assert [tok.token_to_id(t) for t in MARKUP] == list(range(9))
  for token in MARKUP:
    assert tok.encode(f"a{token}b").count(tok.token_to_id(token)) == 1
  assert tok.eos_id == tok.token_to_id("<|im_end|>")
  assert tok.pad_id == tok.token_to_id("<|endoftext|>")
  assert set(tok.stop_ids) == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
  # Readable by transformers releases before 5 (SGLang's pin): a class they know, and the
  # chat template inside tokenizer_config.json.
  config = json.loads((Path(tok.hf.name_or_path) / "tokenizer_config.json").read_text())
  assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
  assert config["chat_template"] == tok.chat_template
  # Qwen keeps tool/think tags in decoded text; only the chat delimiters are special.
  ids = tok.encode(
    "<|im_start|>assistant\n<think>\nx\n</think>\n<tool_call>\n{}\n</tool_call><|im_end|>")
  assert tok.decode(ids, skip_special_tokens=True) == (
    "assistant\n<think>\nx\n</think>\n<tool_call>\n{}\n</tool_call>")


@pytest.mark.parametrize("text", [
  "def f(x):\n    return x  # comment\n", "  \t\n\n\r\n trailing   ",
  "naïve café ☃ 日本語 🚀",
  "x" * 1000, "", "\x00\x01 control bytes"])
def test_encode_decode_round_trip(tok, text):
  assert tok.decode(tok.encode(text)) == text


@settings(max_examples=60, deadline=None)
@given(piece=st.text(max_size=40), repeat=st.integers(1, 300), markup=st.sampled_from(MARKUP))
def test_a_long_text_encodes_to_the_same_ids_as_a_short_one_would(tok, piece, repeat, markup):
  """Texts of GIL_FREE_CHARS or more go through the batch call (GIL released): the same ids as
  the single-text call, on either side of the threshold, special tokens included."""
  text = (piece + markup) * repeat
  text += "x" * max(0, GIL_FREE_CHARS - len(text)) if repeat % 2 else ""
  assert tok.encode(text) == tok._backend.encode(text, add_special_tokens=False).ids


def test_encoding_a_long_text_lets_other_threads_run(tok):
  """Another thread keeps running while a ~2 MB text is encoded (the single-text call of the
  binding held the GIL throughout: the other thread got 2 turns in 7 s)."""
  text = "def f(x):\n    return x * 2  # some code\n" * 50_000
  done, turns = threading.Event(), 0
  worker = threading.Thread(target=lambda: (tok.encode(text), done.set()))
  worker.start()
  while not done.is_set():
    time.sleep(0.001)
    turns += 1
  worker.join()
  assert turns >= 20, turns


def test_bpe_compresses_python_source(tok):
  texts, _ = stdlib_corpus()
  sample = texts[len(texts) // 2]
  assert len(tok.encode(sample)) < len(sample.encode()) / 2.5


def test_decode_then_encode_is_not_the_identity(tok):
  """docs/cases.md 2: the reason sampled ids are recorded and never re-encoded."""
  word = "return"
  merged = tok.encode(word)
  assert len(merged) < len(word)  # "return" is a frequent token in Python source
  # A model may sample the same text one byte-level symbol at a time.
  spelled = [tok.token_to_id(ch) for ch in word]
  assert None not in spelled
  assert tok.decode(spelled) == word
  assert tok.encode(tok.decode(spelled)) != spelled


def test_training_is_deterministic(tmp_path):
  texts, _ = stdlib_corpus(max_chars_per_file=2000, min_chars=0)
  texts = texts[:200]
  a = train_tiny_tokenizer(texts, tmp_path / "a", vocab_size=1024)
  b = train_tiny_tokenizer(texts, tmp_path / "b", vocab_size=1024)
  assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
  raw = RawTokenizer.from_file(str(a / "tokenizer.json"))
  assert raw.get_vocab_size() == 1024
  assert [raw.token_to_id(t) for t in MARKUP] == list(range(9))


def test_training_rejects_a_corpus_too_small(tmp_path):
  with pytest.raises(TokenizerError, match="too small"):
    train_tiny_tokenizer(["tiny corpus"], tmp_path / "t", vocab_size=1024)


def test_saved_folder_loads_back_identically(tok, tmp_path):
  folder = tok.save(tmp_path / "tok")
  (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
  again = load_tokenizer(folder)
  text = "<|im_start|>user\nhello\n<|im_end|>\n<tool_call>x</tool_call>"
  assert again.encode(text) == tok.encode(text)
  assert again.chat_template == tok.chat_template
  assert again.vocab_size == tok.vocab_size
  assert again.eos_id == tok.eos_id
  assert set(again.stop_ids) == set(tok.stop_ids) | {5}
  assert load_tokenizer("tiny") is tok


def test_missing_folder_is_a_clear_error(tmp_path):
  with pytest.raises(TokenizerError, match="no such folder"):
    load_tokenizer(tmp_path / "nothing-here")
  (tmp_path / "empty").mkdir()
  with pytest.raises(TokenizerError, match="cannot load a tokenizer"):
    load_tokenizer(str(tmp_path / "empty"))
