"""A scripted policy endpoint for the harness tests (tests/openai_stub.py underneath): each
request gets the next scripted (content, finish_reason) reply, "(no more)" once they run out.
Entering the context gives a per-session base URL, as the recording proxy hands out."""
from tests.openai_stub import ChatStub
from tests.openai_stub import act as _act


class ScriptedServer(ChatStub):
  """Answers POST /sessions/s1/v1/chat/completions with the next scripted reply."""

  def __init__(self, replies):
    self.replies = list(replies)
    super().__init__(lambda _: self.replies.pop(0) if self.replies else ("(no more)", "stop"))

  def __enter__(self) -> str:
    super().__enter__()
    return self.root + "/sessions/s1/v1"


def act(thought, command):
  """A bash-agent reply and finish_reason "stop"."""
  return (_act(thought, command), "stop")
