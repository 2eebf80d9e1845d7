"""A hosted teacher API for the distillation tests (tests/openai_stub.py underneath): text only
(no token ids, no log-probs), as hosted APIs answer, a bearer key check, and conversation
bookkeeping.

The replies come from a script: `script(conversation, turn, messages) -> str` (an int answers
that HTTP error status instead), where `conversation` counts conversations in the order their
first request arrived (a request with no assistant message starts one) and `turn` is the number
of assistant messages in the request. `on_request(conversation, turn)` runs before the reply is
sent (a test uses it to break a sandbox mid-run).
"""
from tests.openai_stub import ChatStub, act  # noqa: F401 - act is re-exported for the tests


class TextOnlyServer(ChatStub):
  """POST /v1/chat/completions -> the scripted reply; 401 without `Authorization: Bearer key`.

  Attributes (besides ChatStub's `requests`):
    replies: (conversation, turn, content) of every 200 answer, in order.
    total_tokens: the sum of usage.total_tokens it reported (ChatStub's len // 4 counts).
    conversations: conversations started so far.
  """

  def __init__(self, script, *, api_key: str, on_request=None):
    self.script = script
    self.api_key = api_key
    self.on_request = on_request
    self.replies = []
    self.total_tokens = 0
    self.conversations = 0
    super().__init__(self._answer)

  def _answer(self, request):
    if request.headers.get("Authorization") != f"Bearer {self.api_key}":
      return 401
    messages = request.body["messages"]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    with self.lock:
      if turn == 0:
        self.conversations += 1
      conversation = self.conversations - 1
    if self.on_request is not None:
      self.on_request(conversation, turn)
    content = self.script(conversation, turn, messages)
    if isinstance(content, int):
      return content
    with self.lock:
      self.replies.append((conversation, turn, content))
      self.total_tokens += (sum(len(m.get("content") or "") for m in messages) // 4
                            + len(content) // 4)
    return content

  @property
  def base_url(self) -> str:
    return self.root + "/v1"
