"""One client's huge prompt does not hold up another client's requests: the inference server
and the recording proxy render and tokenise a large request off their event loop
(`rollout.offload`), and `data.Tokenizer.encode` releases the GIL on long texts.

Each test watches the real tokenizer (a subclass that flags when a multi-megabyte text's
encoding starts and ends; the encoding itself is the real one) and asserts an ordering, not a
speed: a small call sent once the huge prompt's encoding has started is answered before that
encoding ends. Before the fix the small call waited for the whole encoding (12-14 s for 5 MB).
"""
import threading

import httpx
import pytest

from orchard_jax.data import Tokenizer
from orchard_jax.rollout import InferenceServer, RecordingProxy, SGLangUpstream

HUGE_CHARS = 3_000_000   # ~4 s of encoding with the tiny tokenizer on an idle core
SMALL = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class _WatchedTokenizer(Tokenizer):
  """The real tokenizer, flagging when the encoding of a text over 1 MB starts and ends."""

  def __init__(self, base: Tokenizer):
    super().__init__(base.hf, name=base.name)
    self.started, self.finished = threading.Event(), threading.Event()

  def encode(self, text):
    if len(text) < 1_000_000:
      return super().encode(text)
    self.started.set()
    try:
      return super().encode(text)
    finally:
      self.finished.set()


def _huge_call() -> dict:
  text = ("def f(x):\n    return x * 2  # some code here\n" * (HUGE_CHARS // 44 + 1))
  return {"messages": [{"role": "user", "content": text[:HUGE_CHARS]}], "max_tokens": 2}


def _small_call_during_huge(watched: _WatchedTokenizer, huge_url: str, small_url: str):
  """(small response, whether the huge encoding had ended when it arrived, huge response)."""
  huge = {}

  def send_huge():
    with httpx.Client(timeout=300) as http:
      huge["response"] = http.post(huge_url, json=_huge_call())

  sender = threading.Thread(target=send_huge)
  sender.start()
  try:
    assert watched.started.wait(120), "the huge prompt was never tokenised"
    with httpx.Client(timeout=120) as http:
      small = http.post(small_url, json=SMALL)
    ended_first = watched.finished.is_set()
  finally:
    sender.join(300)
  return small, ended_first, huge["response"]


def test_the_proxy_answers_a_small_call_while_a_huge_prompt_is_tokenised(engine, tokenizer):
  watched = _WatchedTokenizer(tokenizer)
  with InferenceServer(engine) as server, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=watched) as proxy:
    small, ended_first, huge = _small_call_during_huge(
      watched, proxy.session_url("huge") + "/chat/completions",
      proxy.session_url("small") + "/chat/completions")
  assert small.status_code == 200, small.text
  assert small.json()["choices"][0]["message"]["role"] == "assistant"
  assert not ended_first, "the small call waited for the huge prompt's tokenisation"
  # The engine's context is 1024 tokens: the huge prompt is refused, naming its length.
  assert huge.status_code == 400 and "tokens" in huge.text, huge.text


def test_the_server_answers_a_small_call_while_a_huge_prompt_is_tokenised(engine, tokenizer,
                                                                          monkeypatch):
  watched = _WatchedTokenizer(tokenizer)
  monkeypatch.setattr(engine, "tokenizer", watched)   # the shared engine, restored after
  with InferenceServer(engine) as server:
    small, ended_first, huge = _small_call_during_huge(
      watched, server.url + "/v1/chat/completions", server.url + "/v1/chat/completions")
  assert small.status_code == 200, small.text
  assert not ended_first, "the small call waited for the huge prompt's tokenisation"
  assert huge.status_code == 400 and "tokens" in huge.text, huge.text
