"""Fixtures: the real `spillway` binary on a free loopback port, with a
temporary data directory and a cast of tokens (or in dev mode)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import spillway

REPO = Path(__file__).resolve().parents[3]

# (token, principal, tenant, roles), as in tests/all/common.rs.
CAST = [
    ("tok-alice", "alice", "acme", ["agent"]),
    ("tok-bob", "bob", "acme", ["agent"]),
    ("tok-admin", "ada", "acme", ["admin"]),
    ("tok-carol", "carol", "acme", ["compliance"]),
    ("tok-audrey", "audrey", "acme", ["auditor"]),
]
ALICE, BOB, ADMIN, CAROL, AUDREY = (c[0] for c in CAST)


def binary() -> Path:
    """The server binary: $SPILLWAY_TEST_BIN, else the debug build."""
    if os.environ.get("SPILLWAY_TEST_BIN"):
        return Path(os.environ["SPILLWAY_TEST_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / "spillway"
    if not path.exists():
        pytest.fail(f"{path} does not exist; build it with `cargo build --bin spillway` (make test-python does)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server."""

    addr: str
    data_dir: Path
    log: Path
    process: subprocess.Popen[bytes]

    def client(self, token: str = ALICE, **kwargs: object) -> spillway.Client:
        return spillway.Client(self.addr, token=token, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(tmp: Path, tokens: bool = True, extra_config: str = "") -> Server:
    data = tmp / "data"
    config = tmp / "spillway.toml"
    images = REPO / "sandbox-images"
    text = f"[sandbox]\nimages_dir = {str(images)!r}\ncache_dir = {str(images / 'build' / 'compile-cache')!r}\n\n"
    text += "[limits]\nmax_payload_bytes = 2147483648\n\n" + extra_config
    if tokens:
        for token, principal, tenant, roles in CAST:
            text += (
                f'[[auth.tokens]]\ntoken = "{token}"\nprincipal = "{principal}"\ntenant = "{tenant}"\n'
                f"roles = {roles!r}\n\n".replace("'", '"')
            )
    config.write_text(text)
    port = free_port()
    addr = f"127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
    env["RUST_LOG"] = "warn"
    log = tmp / "server.log"
    with log.open("ab") as err:
        process = subprocess.Popen(
            [str(binary()), "serve", "--listen", addr, "--data-dir", str(data), "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    server = Server(addr, data, log, process)
    token = ALICE if tokens else None
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()}")
        try:
            t = token or (data / "dev-token").read_text().strip()
            with spillway.Client(addr, token=t, timeout=2) as c:
                c.runtimes()
            return server
        except (spillway.SpillwayError, OSError):
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"server did not start: {log.read_text()}") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("server"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with no configured tokens: dev mode, with a dev token."""
    s = start_server(tmp_path_factory.mktemp("dev"), tokens=False)
    yield s
    s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[spillway.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def session(client: spillway.Client) -> Iterator[spillway.Session]:
    with client.session(label="pytest") as s:
        yield s


@pytest.fixture(autouse=True)
def _no_spillway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the SPILLWAY_* variables they need themselves."""
    for k in list(os.environ):
        if k.startswith("SPILLWAY_") and k != "SPILLWAY_TEST_BIN":
            monkeypatch.delenv(k)


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
