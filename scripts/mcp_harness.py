"""Shared by the MCP conformance run and benches: a real Spillway server on a
free loopback port with a temporary data directory."""

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = os.environ.get("MCP_SPILLWAY_BIN", str(ROOT / "target" / "debug" / "spillway"))
DEPS = Path(os.environ.get("MCP_DEPS_DIR", Path.home() / ".cache" / "spillway-mcp"))
NODE_BIN = DEPS / "node" / "node_modules" / ".bin"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, secs=60):
    deadline = time.time() + secs
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited at startup")
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


class Server:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.data = Path(self.tmp.name) / "data"
        self.data.mkdir()
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        env = dict(os.environ, SPILLWAY_SANDBOX__IMAGES_DIR=str(ROOT / "sandbox-images"), RUST_LOG="warn")
        self.proc = subprocess.Popen([BIN, "serve", "--data-dir", str(self.data), "--listen", self.addr],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_port(self.port, self.proc, "spillway serve")
        while not (self.data / "dev-token").exists():
            time.sleep(0.05)
        self.token = (self.data / "dev-token").read_text().strip()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.tmp.cleanup()
