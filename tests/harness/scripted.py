"""A tiny OpenAI-style chat-completions server for tests: it answers each request with the next
scripted reply, over real HTTP on 127.0.0.1, and records the requests."""
import http.server
import json
import threading


class ScriptedServer:
  """Answers POST /v1/chat/completions with the next scripted reply; records each request."""

  def __init__(self, replies):
    self.replies = list(replies)
    self.requests = []
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        outer.requests.append((self.path, body))
        content, finish = outer.replies.pop(0) if outer.replies else ("(no more)", "stop")
        data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": finish,
                                        "message": {"role": "assistant", "content": content}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

  def __enter__(self):
    self.thread.start()
    return f"http://127.0.0.1:{self.server.server_address[1]}/sessions/s1/v1"

  def __exit__(self, *exc):
    self.server.shutdown()
    self.server.server_close()


def act(thought, command):
  return (f"THOUGHT: {thought}\n\n```bash\n{command}\n```", "stop")
