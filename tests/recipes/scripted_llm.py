"""A scripted OpenAI-compatible chat endpoint for grader tests.

No judge or annotator LLM can run in CI, so the grader's endpoint is a real HTTP server
(tests/openai_stub.py) that answers /v1/chat/completions with replies from a function of the
call number and the request; the recipe's client code runs unchanged against it.
"""
from typing import Callable

from tests.openai_stub import ChatStub


class ScriptedLLM(ChatStub):
  """Context manager serving `reply(call_index, request_body) -> str` at `url` (ends in /v1).

  Attributes:
    requests: every request received, in order (ChatRequest; `.body` is the JSON body).
  """

  def __init__(self, reply: Callable[[int, dict], str]):
    super().__init__(lambda request: reply(request.index, request.body))

  @property
  def url(self) -> str:
    return self.root + "/v1"
