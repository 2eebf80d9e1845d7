"""A scripted OpenAI-compatible chat endpoint for grader tests.

No judge or annotator LLM can run in CI, so the grader's endpoint is this real HTTP server
(http.server in a thread) that answers /v1/chat/completions with replies from a function of the
call number and the request; the recipe's client code runs unchanged against it.
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class ScriptedLLM:
  """Context manager serving `reply(call_index, request_body) -> str` at `url` (ends in /v1).

  Attributes:
    requests: every request body received, in order.
  """

  def __init__(self, reply: Callable[[int, dict], str]):
    self.reply = reply
    self.requests: list[dict] = []
    self._lock = threading.Lock()
    outer = self

    class Handler(BaseHTTPRequestHandler):
      def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with outer._lock:
          index = len(outer.requests)
          outer.requests.append(body)
        text = outer.reply(index, body)
        data = json.dumps({"id": f"c{index}", "object": "chat.completion", "model": "judge",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": text}}],
                           "usage": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

  def __enter__(self) -> "ScriptedLLM":
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()
