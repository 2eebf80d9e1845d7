"""One client's huge prompt, or long answer with top log-probs, does not hold up another
client's requests: the inference server and the recording proxy render and tokenise a large
request, and build a large answer, off their event loop (`rollout.offload`), and
`data.Tokenizer.encode` releases the GIL on long texts.

Each test watches the real tokenizer (a subclass that flags when a multi-megabyte text's
encoding starts and ends; the encoding itself is the real one) and asserts an ordering, not a
speed: a small call sent once the huge prompt's encoding has started is answered before that
encoding ends. Before the fix the small call waited for the whole encoding (12-14 s for 5 MB).
"""
import threading
import time
from typing import Any, Callable

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


def _small_call_while(big_url: str, big_body: dict, begun: threading.Event,
                      progress: Callable[[], Any], small_url: str) -> tuple:
  """Sends `big_body` to `big_url` from a thread and, once `begun` is set (its heavy work has
  started), a small call to `small_url`: (small response, `progress()` when the small call was
  answered, the big call's response)."""
  big = {}

  def send_big():
    with httpx.Client(timeout=300) as http:
      big["response"] = http.post(big_url, json=big_body)

  sender = threading.Thread(target=send_big)
  sender.start()
  try:
    assert begun.wait(120), "the big call's heavy work never began"
    with httpx.Client(timeout=120) as http:
      small = http.post(small_url, json=SMALL)
    seen = progress()
  finally:
    sender.join(300)
  return small, seen, big["response"]


def _small_call_during_huge(watched: _WatchedTokenizer, huge_url: str, small_url: str):
  """(small response, whether the huge encoding had ended when it arrived, huge response)."""
  return _small_call_while(huge_url, _huge_call(), watched.started, watched.finished.is_set,
                           small_url)


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


class _SlowDetokenizer(Tokenizer):
  """The real tokenizer, counting the one-id decodes of an answer's log-probs, each 0.1 ms
  slower (as a large vocabulary's would be), so that building a long answer takes seconds."""

  def __init__(self, base: Tokenizer):
    super().__init__(base.hf, name=base.name)
    self.decodes, self.decoding = 0, threading.Event()

  def decode(self, ids, **kwargs):
    if len(ids) == 1:
      self.decodes += 1
      self.decoding.set()
      time.sleep(1e-4)
    return super().decode(ids, **kwargs)


_LONG = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 900, "ignore_eos": True,
         "logprobs": True, "top_logprobs": 20}


def _small_call_during_long_answer(slow: _SlowDetokenizer, long_url: str, small_url: str,
                                   body: dict = _LONG):
  """(small response, one-id decodes done when it was answered, decodes in all, long one)."""
  small, at_small, long = _small_call_while(long_url, body, slow.decoding, lambda: slow.decodes,
                                            small_url)
  return small, at_small, slow.decodes, long


def test_the_proxy_answers_a_small_call_while_a_long_answer_is_built(engine, tokenizer):
  slow = _SlowDetokenizer(tokenizer)
  with InferenceServer(engine) as server, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=slow) as proxy:
    small, at_small, total, long = _small_call_during_long_answer(
      slow, proxy.session_url("long") + "/chat/completions",
      proxy.session_url("small") + "/chat/completions")
  assert small.status_code == 200 and long.status_code == 200, (small.text, long.text[:300])
  content = long.json()["choices"][0]["logprobs"]["content"]
  assert len(content) == 900 and all(len(c["top_logprobs"]) == 20 for c in content)
  assert at_small < total, "the small call waited for the long answer to be built"


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", _LONG),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 900, "ignore_eos": True,
                         "logprobs": 20})])
def test_the_server_answers_a_small_call_while_a_long_answer_is_built(engine, tokenizer,
                                                                      monkeypatch, route, body):
  slow = _SlowDetokenizer(tokenizer)
  monkeypatch.setattr(engine, "tokenizer", slow)   # the routes' tokenizer; restored after
  with InferenceServer(engine) as server:
    small, at_small, total, long = _small_call_during_long_answer(
      slow, server.url + route, server.url + "/v1/chat/completions", body)
  assert small.status_code == 200 and long.status_code == 200, (small.text, long.text[:300])
  logprobs = long.json()["choices"][0]["logprobs"]
  assert len(logprobs.get("content") or logprobs.get("tokens")) == 900
  assert at_small < total, "the small call waited for the long answer to be built"
