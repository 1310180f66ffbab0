"""The MCP Inspector CLI (`@modelcontextprotocol/inspector-cli`), a real
client nobody here wrote, lists and calls tools through the proxy."""

import json
import subprocess

from conftest import BIN, NODE_BIN, fake_upstream


def inspector(server, *method_args):
    cmd = [str(NODE_BIN / "mcp-inspector-cli"), "--cli", BIN, "--token", server.token, "mcp", "proxy",
           "--server", server.addr, "--", *fake_upstream(), *method_args]
    # The CLI looks for its package.json relative to the working directory.
    cwd = NODE_BIN.parent / "@modelcontextprotocol" / "inspector-cli" / "build"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_inspector_cli_lists_and_calls_tools_through_the_proxy(server):
    # inspector-cli takes the server command, then its own flags after it.
    listed = inspector(server, "--method", "tools/list")
    names = {t["name"] for t in listed["tools"]}
    assert {"small", "rows", "spillway_exec", "spillway_inspect"} <= names
    called = inspector(server, "--method", "tools/call", "--tool-name", "rows", "--tool-arg", "n=2000")
    assert called["structuredContent"]["spillway"]["offloaded"], called
    text = "".join(c.get("text", "") for c in called["content"])
    assert "spillway_inspect" in text
