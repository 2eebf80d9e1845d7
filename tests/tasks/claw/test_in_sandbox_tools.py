"""The tools from inside the sandbox, where external harnesses run: the `claw` command and the MCP
server, over the same services and audit log. The MCP server is also driven by the official MCP
Python SDK's stdio client (a real third-party client) against services started on this machine
by the same zip application's `start`."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from orchard_jax.tasks.claw import bundle
from orchard_jax.tasks.claw.tools import select_tools
from orchard_jax.tasks.claw.world import ClawWorld

RESETS = {"notes": {"fixtures": {"notes": [{"id": "n1", "title": "Cabin", "body": "pw: fjord"}]}}}


def test_claw_command_and_mcp_inside_the_sandbox(env_client):
  tools = select_tools(["notes"], ["notes_get", "notes_create"])
  with ClawWorld(env_client, RESETS) as world:
    command = world.install_tools(tools)
    listing = world.box.exec([command, "tools"], timeout=30)
    assert listing.exit_code == 0 and "notes_get:" in listing.stdout
    assert "notes_delete" not in listing.stdout
    got = world.box.exec([command, "call", "notes_get", '{"note_id": "n1"}'], timeout=30)
    assert got.exit_code == 0
    assert got.stdout.strip() == world.call("notes_get", {"note_id": "n1"}).content
    bad = world.box.exec([command, "call", "notes_create", "{}"], timeout=30)
    assert bad.exit_code == 1 and bad.stdout.startswith("Error 400 (invalid_arguments)")
    refused = world.box.exec([command, "call", "notes_delete", '{"note_id": "n1"}'], timeout=30)
    assert refused.exit_code == 1 and "no tool named 'notes_delete'" in refused.stdout
    piped = world.box.exec([command, "call", "notes_create"], stdin='{"title": "T", "body": "b"}',
                           timeout=30)
    assert piped.exit_code == 0 and '"title": "T"' in piped.stdout
    session = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "notes_get", "arguments": {"note_id": "n1"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "resources/list"}]
    mcp = world.box.exec([command, "mcp"], stdin="\n".join(json.dumps(m) for m in session) + "\n",
                         timeout=30)
    answers = [json.loads(line) for line in mcp.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2, 3, 4]
    assert answers[0]["result"]["capabilities"] == {"tools": {"listChanged": False}}
    assert [t["name"] for t in answers[1]["result"]["tools"]] == ["notes_get", "notes_create"]
    assert answers[1]["result"]["tools"][0]["inputSchema"] == tools[0].parameters
    assert answers[2]["result"]["isError"] is False and "fjord" in answers[2]["result"][
        "content"][0]["text"]
    assert answers[3]["error"]["code"] == -32601
    ops = [e["operation"] for e in world.audit("notes")]
    assert ops == ["notes_get", "notes_get", "notes_create", "notes_create", "notes_get"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture
def host_services(tmp_path):
  """The notes service started on this machine by the zip application, its tool list written."""
  app = tmp_path / "services.pyz"
  app.write_bytes(bundle.services_zipapp())
  port = _free_port()
  config = {"services": {"notes": {"port": port, "reset": RESETS["notes"]}},
            "control_token": "c" * 32, "log": str(tmp_path / "log")}
  started = subprocess.run([sys.executable, "-S", str(app), "start"], input=json.dumps(config),
                           capture_output=True, text=True, timeout=60)
  answer = json.loads(started.stdout)
  assert answer["ready"], started
  catalogue = {"tools": [{"name": t.name, "service": t.service, "path": t.path,
                          "description": t.description, "parameters": t.parameters}
                         for t in select_tools(["notes"])], "ports": {"notes": port}}
  (tmp_path / "tools.json").write_text(json.dumps(catalogue))
  yield app, tmp_path / "tools.json"
  for pid in [answer["supervisor"], *answer["pids"].values()]:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def test_the_official_mcp_client_lists_and_calls_the_tools(host_services):
  from mcp import ClientSession, StdioServerParameters
  from mcp.client.stdio import stdio_client
  app, tools_file = host_services

  async def session():
    params = StdioServerParameters(command=sys.executable, args=["-S", str(app), "mcp"],
                                   env={"CLAW_TOOLS_FILE": str(tools_file)})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
      await client.initialize()
      listed = await client.list_tools()
      ok = await client.call_tool("notes_get", {"note_id": "n1"})
      bad = await client.call_tool("notes_get", {"note_id": 7})
      return listed, ok, bad

  listed, ok, bad = asyncio.run(session())
  assert {t.name for t in listed.tools} == {t.name for t in select_tools(["notes"])}
  assert ok.is_error is False and "fjord" in ok.content[0].text
  assert bad.is_error is True and bad.content[0].text.startswith("Error 400 (invalid_arguments)")
