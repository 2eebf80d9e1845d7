"""A small OpenAI-style chat-completions server for the distillation tests: a stand-in for a
hosted teacher API. It answers over real HTTP on 127.0.0.1 with text only (no token ids, no
log-probs), as hosted APIs do, checks the bearer key, and records every request.

The replies come from a script: `script(conversation, turn, messages) -> str` (an int answers
that HTTP error status instead), where
`conversation` counts conversations in the order their first request arrived (a request with no
assistant message starts one) and `turn` is the number of assistant messages in the request.
`on_request(conversation, turn)` runs before the reply is sent (a test uses it to break a
sandbox mid-run).
"""
import http.server
import json
import threading
import time


class TextOnlyServer:
  """POST /v1/chat/completions -> the scripted reply; 401 without `Authorization: Bearer key`."""

  def __init__(self, script, *, api_key: str, on_request=None):
    self.script = script
    self.api_key = api_key
    self.on_request = on_request
    self.requests = []          # (headers dict, body) of every request, in arrival order
    self.replies = []           # (conversation, turn, content) in order
    self.total_tokens = 0       # sum of the usage.total_tokens it reported
    self.conversations = 0
    self._lock = threading.Lock()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
          return self._send(404, {"error": {"message": f"no route {self.path}"}})
        if self.headers.get("Authorization") != f"Bearer {outer.api_key}":
          return self._send(401, {"error": {"message": "invalid api key"}})
        messages = body["messages"]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        with outer._lock:
          outer.requests.append((dict(self.headers), body))
          if turn == 0:
            outer.conversations += 1
          conversation = outer.conversations - 1
        if outer.on_request is not None:
          outer.on_request(conversation, turn)
        content = outer.script(conversation, turn, messages)
        if isinstance(content, int):   # the script asks for an HTTP error
          return self._send(content, {"error": {"message": f"scripted HTTP {content}"}})
        with outer._lock:
          outer.replies.append((conversation, turn, content))
        prompt_tokens = sum(len(m.get("content") or "") for m in messages) // 4
        completion_tokens = len(content) // 4
        with outer._lock:
          outer.total_tokens += prompt_tokens + completion_tokens
        self._send(200, {
            "id": f"chatcmpl-{len(outer.requests)}", "object": "chat.completion",
            "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}})

      def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

  @property
  def base_url(self) -> str:
    return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

  def __enter__(self) -> "TextOnlyServer":
    self.thread.start()
    return self

  def __exit__(self, *exc):
    self.server.shutdown()
    self.server.server_close()


def act(thought: str, command: str) -> str:
  """A reply in the bash agent's protocol: a THOUGHT and one bash block."""
  return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"
