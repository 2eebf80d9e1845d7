"""One OpenAI-style chat-completions stub over real HTTP, shared by the tests that need a model
endpoint no CI machine can run (a hosted teacher, a judge LLM, a scripted policy).

The stub is a real server (http.server in a thread, 127.0.0.1, a free port), so the project's
client code runs unchanged against it. What it answers is the test's business: `answer(request)`
returns the assistant's content (finish_reason "stop"), a (content, finish_reason) pair, an
assistant message dict (e.g. with "tool_calls"; finish_reason "tool_calls" when it has some), or
an int, which is sent as that HTTP error status. Every request is recorded before it is answered.
Usage counts are len(text) // 4 per side, a stand-in that is enough for the budget tests.
"""
import dataclasses
import http.server
import json
import threading
import time
from typing import Callable, Union

Answer = Union[str, tuple[str, str], dict, int]


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """One request as received: `index` counts requests from 0 in arrival order."""
  index: int
  path: str
  headers: dict
  body: dict


class ChatStub:
  """Context manager serving POST .../chat/completions with `answer(ChatRequest) -> Answer`.

  Attributes:
    requests: every ChatRequest received, in arrival order.
    root: "http://127.0.0.1:PORT" (callers add "/v1" or a per-session prefix).
  """

  def __init__(self, answer: Callable[[ChatRequest], Answer]):
    self.answer = answer
    self.requests: list[ChatRequest] = []
    self.lock = threading.Lock()
    stub = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with stub.lock:
          request = ChatRequest(len(stub.requests), self.path, dict(self.headers), body)
          stub.requests.append(request)
        if not self.path.endswith("/chat/completions"):
          return self._send(404, {"error": {"message": f"no route {self.path}"}})
        answer = stub.answer(request)
        if isinstance(answer, int):
          return self._send(answer, {"error": {"message": f"scripted HTTP {answer}"}})
        if isinstance(answer, dict):
          message = {"role": "assistant", "content": None, **answer}
          finish = "tool_calls" if message.get("tool_calls") else "stop"
          content = json.dumps(message)
        else:
          content, finish = (answer, "stop") if isinstance(answer, str) else answer
          message = {"role": "assistant", "content": content}
        prompt = sum(len(m.get("content") or "") for m in body.get("messages", [])) // 4
        completion = len(content) // 4
        self._send(200, {
            "id": f"chatcmpl-{request.index}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "stub"),
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": message}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}})

      def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  @property
  def root(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}"

  def __enter__(self) -> "ChatStub":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._server.shutdown()
    self._server.server_close()


def act(thought: str, command: str) -> str:
  """A reply in the bash agent's protocol: a THOUGHT and one bash block."""
  return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"
