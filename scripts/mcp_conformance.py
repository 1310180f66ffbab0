"""Runs the official MCP conformance suite (@modelcontextprotocol/conformance,
server scenarios) against `spillway mcp serve --listen`, and prints the pass
and fail counts with each failure's reason, as Markdown."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_harness import BIN, Server, free_port, wait_port  # noqa: E402

NODE = os.environ["MCP_NODE"]
SUITE = os.environ["MCP_CONFORMANCE"]


def main():
    server = Server()
    port = free_port()
    front = subprocess.Popen(
        [BIN, "--token", server.token, "mcp", "serve", "--server", server.addr, "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
    try:
        wait_port(port, front, "spillway mcp serve")
        out = Path(tempfile.mkdtemp())
        run = subprocess.run([NODE, SUITE, "server", "--url", f"http://127.0.0.1:{port}/mcp", "-o", str(out), "--suite", "active"],
                             capture_output=True, text=True, timeout=900)
        checks = []
        for f in sorted(out.rglob("checks.json")):
            scenario = f.parent.name
            for c in json.loads(f.read_text()):
                checks.append((scenario, c))
        counted = [(s, c) for s, c in checks if c.get("status") in ("SUCCESS", "FAILURE", "WARNING")]
        passed = [x for x in counted if x[1]["status"] == "SUCCESS"]
        failed = [x for x in counted if x[1]["status"] == "FAILURE"]
        warned = [x for x in counted if x[1]["status"] == "WARNING"]
        print(f"# MCP conformance: `spillway mcp serve`\n")
        print(f"Suite `@modelcontextprotocol/conformance` (server scenarios, active suite) against `spillway mcp serve --listen`.\n")
        print(f"- checks passed: {len(passed)}\n- checks failed: {len(failed)}\n- warnings: {len(warned)}\n")
        if not checks:
            print("No results were written; the suite's output:\n\n```\n" + run.stdout[-4000:] + run.stderr[-2000:] + "\n```")
        print("| scenario | check | status | reason |\n|---|---|---|---|")
        for s, c in counted:
            reason = (c.get("errorMessage") or "").replace("|", "\\|").replace("\n", " ")[:300]
            print(f"| {s} | {c.get('id')} | {c['status']} | {reason} |")
    finally:
        front.terminate()
        front.wait(10)
        server.stop()


if __name__ == "__main__":
    main()
