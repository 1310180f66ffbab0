"""Fixtures for the MCP tests: a real Spillway server (the debug binary) on
a free loopback port with a temporary data directory, and MCP clients (the
official Python SDK) connected to `spillway mcp serve` or `spillway mcp proxy`.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("MCP_SPILLWAY_BIN", str(ROOT / "target" / "debug" / "spillway"))
DEPS = Path(os.environ.get("MCP_DEPS_DIR", Path.home() / ".cache" / "spillway-mcp"))
NODE_BIN = DEPS / "node" / "node_modules" / ".bin"
VENV_BIN = DEPS / "venv" / "bin"
HERE = Path(__file__).resolve().parent


@pytest.fixture
def anyio_backend():
    return "asyncio"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        env = dict(os.environ)
        env["SPILLWAY_SANDBOX__IMAGES_DIR"] = str(ROOT / "sandbox-images")
        env.setdefault("RUST_LOG", "warn")
        self.log = open(data_dir.parent / "server.log", "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--data-dir", str(data_dir), "--listen", self.addr],
            stdout=self.log, stderr=self.log, env=env,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            if (data_dir / "dev-token").exists():
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                    break
            assert self.proc.poll() is None, "spillway serve exited at startup"
            time.sleep(0.05)
        else:
            raise RuntimeError("spillway serve did not start")
        self.token = (data_dir / "dev-token").read_text().strip()

    def cli(self, *args):
        out = subprocess.run(
            [BIN, "--addr", self.addr, "--token", self.token, "--json", *args],
            check=True, capture_output=True, text=True,
        )
        return json.loads(out.stdout) if out.stdout.strip() else None

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("spillway") / "data"
    d.mkdir()
    s = Server(d)
    yield s
    s.stop()


def mcp_args(server, *args):
    return ["mcp", *args, "--server", server.addr]


@contextlib.asynccontextmanager
async def connect(command, args, env=None, **callbacks):
    """An initialized ClientSession to a stdio MCP server."""
    full_env = dict(os.environ)
    full_env.setdefault("RUST_LOG", "warn")
    full_env.update(env or {})
    params = StdioServerParameters(command=command, args=list(args), env=full_env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=sys.stderr if os.environ.get("MCP_TEST_VERBOSE") else errlog) as (read, write):
            async with ClientSession(read, write, **callbacks) as session:
                await session.initialize()
                yield session


def proxy(server, upstream, *extra, env=None, **callbacks):
    """A ClientSession through `spillway mcp proxy` to `upstream` (a command list)."""
    args = ["--token", server.token, "mcp", "proxy", "--server", server.addr, *extra, "--", *upstream]
    return connect(BIN, args, env=env, **callbacks)


def serve(server, *extra, **callbacks):
    args = ["--token", server.token, "mcp", "serve", "--server", server.addr, *extra]
    return connect(BIN, args, **callbacks)


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def handles(result):
    sc = result.structured_content or {}
    return [h["payload_id"] for h in sc.get("spillway", {}).get("offloaded", [])]


def fake_upstream():
    return [sys.executable, str(HERE / "fake_upstream.py")]
