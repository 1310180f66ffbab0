"""The MCP Inspector CLI (`@modelcontextprotocol/inspector-cli`), a real
client nobody here wrote, lists and calls tools through the proxy."""

import json
import shlex
import subprocess

from conftest import BIN, NODE_BIN, fake_upstream


def inspector(server, tmp_path, *method_args):
    # The Inspector parses every --flag of its command line as its own, so
    # the proxy's command line goes in a wrapper script.
    wrapper = tmp_path / "proxy.sh"
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in [
        BIN, "--addr", server.addr, "--token", server.token, "mcp", "proxy", "--", *fake_upstream()]) + "\n")
    wrapper.chmod(0o755)
    cmd = [str(NODE_BIN / "mcp-inspector-cli"), "--cli", str(wrapper), *method_args]
    # The CLI looks for its package.json relative to the working directory.
    cwd = NODE_BIN.parent / "@modelcontextprotocol" / "inspector-cli" / "build"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_inspector_cli_lists_and_calls_tools_through_the_proxy(server, tmp_path):
    # inspector-cli takes the server command, then its own flags after it.
    listed = inspector(server, tmp_path, "--method", "tools/list")
    names = {t["name"] for t in listed["tools"]}
    assert {"small", "rows", "spillway_exec", "spillway_inspect"} <= names
    called = inspector(server, tmp_path, "--method", "tools/call", "--tool-name", "rows", "--tool-arg", "n=2000")
    assert called["structuredContent"]["spillway"]["offloaded"], called
    text = "".join(c.get("text", "") for c in called["content"])
    assert "spillway_inspect" in text
