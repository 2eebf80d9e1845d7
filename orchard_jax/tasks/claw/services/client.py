"""The tools as seen from inside the sandbox: a command line and an MCP server for external
harnesses (Codex CLI, Claude Code, any agent with a shell), over the same HTTP services.

An external harness runs inside the rollout's sandbox, beside the services. The world writes
`/tmp/claw/tools.json` ({"tools": [{name, service, path, description, parameters}], "ports":
{service: port}}: the task's offered tools only) and a `claw` command, and the harness reaches
the tools either way:

  claw tools                       the offered tools: name, description, arguments schema
  claw call NAME '{"a": 1}'        one call (arguments as JSON text, or on standard input);
                                   prints what the built-in harness would show the model and
                                   exits 0 on success, 1 on an error answer, 2 on misuse
  claw mcp                         a Model Context Protocol server on standard input/output
                                   (JSON-RPC 2.0, one message per line; initialize,
                                   tools/list, tools/call, ping), so MCP-capable harnesses show
                                   the tools to the model as native function tools

Calls go to the services like any other and land in the same audit log, so graders cannot tell
which harness made them. `result_text` and `error_text` are the one formatting of tool results,
shared with the trainer-side world. Standard library only.
"""
from __future__ import annotations

import http.client
import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

TOOLS_FILE = "/tmp/claw/tools.json"
MAX_RESULT_CHARS = 8000
MCP_PROTOCOL_VERSION = "2025-06-18"


def result_text(body: Any, limit: int = MAX_RESULT_CHARS) -> str:
  """A 2xx answer as compact JSON text, cut at `limit` characters with a note saying so."""
  text = json.dumps(body, ensure_ascii=False, separators=(", ", ": "))
  if len(text) > limit:
    text = (text[:limit] + f"... [{len(text) - limit} more characters cut; ask for fewer "
            "results]")
  return text


def error_text(status: int, body: Any) -> str:
  """`Error 400 (invalid_arguments): arguments.to[0]: expected an email address, got ...`."""
  error = body.get("error") if isinstance(body, dict) else None
  if isinstance(error, dict):
    return f"Error {status} ({error.get('type', 'error')}): {error.get('message', '')}"
  return f"Error {status}: {str(body)[:500]}"


def load_catalogue(path: str = TOOLS_FILE) -> Dict[str, Any]:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def call(catalogue: Dict[str, Any], name: str, arguments: str,
         timeout_s: float = 60.0) -> Tuple[bool, str]:
  """(ok, text) of one tool call through the services' HTTP ports."""
  tools = {t["name"]: t for t in catalogue["tools"]}
  tool = tools.get(name)
  if tool is None:
    return False, (f"Error: there is no tool named {name!r}; use one of "
                   f"{', '.join(sorted(tools))}")
  port = catalogue["ports"][tool["service"]]
  connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
  try:
    connection.request("POST", tool["path"], body=arguments.encode("utf-8"),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    raw = response.read()
  except OSError as e:
    return False, f"Error: the {tool['service']} service did not answer: {e}"
  finally:
    connection.close()
  try:
    body = json.loads(raw)
  except ValueError:
    body = raw.decode("utf-8", errors="replace")
  if 200 <= response.status < 300:
    return True, result_text(body)
  return False, error_text(response.status, body)


def _tools_listing(catalogue: Dict[str, Any]) -> str:
  lines = []
  for t in catalogue["tools"]:
    lines.append(f"{t['name']}: {t['description']}\n  arguments: "
                 f"{json.dumps(t['parameters'], separators=(',', ':'))}")
  return "\n".join(lines)


# ----------------------------------------------------------------------------- MCP
def _mcp_answer(catalogue: Dict[str, Any], message: Dict[str, Any]) -> Optional[Dict[str, Any]]:
  """The JSON-RPC response to one message (None for a notification)."""
  method, request_id = message.get("method"), message.get("id")
  if request_id is None:            # notifications (initialized, cancelled, ...) need no answer
    return None
  params = message.get("params") or {}
  if method == "initialize":
    result: Any = {"protocolVersion": params.get("protocolVersion") or MCP_PROTOCOL_VERSION,
                   "capabilities": {"tools": {"listChanged": False}},
                   "serverInfo": {"name": "claw", "version": "1"}}
  elif method == "ping":
    result = {}
  elif method == "tools/list":
    result = {"tools": [{"name": t["name"], "description": t["description"],
                         "inputSchema": t["parameters"]} for t in catalogue["tools"]]}
  elif method == "tools/call":
    name = params.get("name")
    arguments = params.get("arguments")
    if not isinstance(name, str):
      return _rpc_error(request_id, -32602, "tools/call needs params.name (a tool name)")
    ok, text = call(catalogue, name, json.dumps(arguments if arguments is not None else {}))
    result = {"content": [{"type": "text", "text": text}], "isError": not ok}
  else:
    return _rpc_error(request_id, -32601, f"method {method!r} is not served (initialize, ping, "
                      "tools/list, tools/call)")
  return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _rpc_error(request_id: Any, code: int, message: str) -> Dict[str, Any]:
  return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def serve_mcp(catalogue: Dict[str, Any], stdin=None, stdout=None) -> None:
  """Answers MCP messages (one JSON object per line) until standard input closes."""
  stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
  for line in stdin:
    if not line.strip():
      continue
    try:
      message = json.loads(line)
    except ValueError as e:
      answer: Optional[Dict[str, Any]] = _rpc_error(None, -32700, f"not JSON: {e}")
    else:
      if isinstance(message, list):
        answers = [a for a in (_mcp_answer(catalogue, m) for m in message
                               if isinstance(m, dict)) if a is not None]
        answer = answers or None   # type: ignore[assignment]
      elif isinstance(message, dict):
        answer = _mcp_answer(catalogue, message)
      else:
        answer = _rpc_error(None, -32600, "expected a JSON-RPC request object")
    if answer is not None:
      stdout.write(json.dumps(answer, ensure_ascii=False) + "\n")
      stdout.flush()


def main(argv) -> int:
  """The `claw` command (module docstring). Returns the exit status."""
  usage = "usage: claw tools | claw call NAME [JSON] | claw mcp"
  path = os.environ.get("CLAW_TOOLS_FILE", TOOLS_FILE)
  try:
    catalogue = load_catalogue(path)
  except (OSError, ValueError) as e:
    sys.stderr.write(f"claw: cannot read the tool list {path}: {e}\n")
    return 2
  if len(argv) >= 1 and argv[0] == "tools":
    print(_tools_listing(catalogue))
    return 0
  if len(argv) >= 2 and argv[0] == "call":
    arguments = argv[2] if len(argv) > 2 else (sys.stdin.read() if not sys.stdin.isatty() else "{}")
    ok, text = call(catalogue, argv[1], arguments or "{}")
    print(text)
    return 0 if ok else 1
  if argv[:1] == ["mcp"]:
    serve_mcp(catalogue)
    return 0
  sys.stderr.write(usage + "\n")
  return 2
