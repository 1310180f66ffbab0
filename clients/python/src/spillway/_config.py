"""Where the client connects and who it says it is.

Mirrors the CLI (src/cli/client.rs) exactly: arguments first, then
SPILLWAY_ADDR, SPILLWAY_TOKEN, SPILLWAY_CA, SPILLWAY_CERT and SPILLWAY_KEY,
then the dev token that a local dev server writes to its data directory
(SPILLWAY_DATA_DIR, or ./spillway-data).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

DEFAULT_ADDR = "127.0.0.1:50051"
"""The CLI's default server address."""

DEV_TOKEN_FILE = "dev-token"
"""The file `spillway serve` writes the dev token to, in its data directory."""

# Replies can be larger than grpcio's default 4 MiB receive limit (a Read
# of the documented 4 MiB maximum is 4 194 325 bytes with its framing, a
# compacted history can be tens of MiB); this bounds them all.
MAX_MESSAGE_BYTES = 128 << 20


@dataclass(frozen=True)
class Settings:
    """Resolved connection settings."""

    endpoint: str
    """`http://host:port`, or `https://host:port` with TLS."""
    token: str
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @property
    def target(self) -> str:
        """The `host:port` gRPC dials."""
        return self.endpoint.split("://", 1)[1].rstrip("/")

    @property
    def tls(self) -> bool:
        """Whether the connection uses TLS."""
        return self.endpoint.startswith("https://")


def _path(arg: str | os.PathLike[str] | None, env: str) -> Path | None:
    if arg is not None and str(arg) != "":
        return Path(arg)
    value = os.environ.get(env)
    return Path(value) if value else None


def resolve(
    addr: str | None = None,
    token: str | None = None,
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> Settings:
    """Resolves settings from arguments, the environment and the dev token."""
    addr = addr or os.environ.get("SPILLWAY_ADDR") or DEFAULT_ADDR
    ca_path = _path(ca, "SPILLWAY_CA")
    cert_path = _path(cert, "SPILLWAY_CERT")
    key_path = _path(key, "SPILLWAY_KEY")
    if addr.startswith("http://") or addr.startswith("https://"):
        endpoint = addr
    elif ca_path is not None:
        endpoint = f"https://{addr}"
    else:
        endpoint = f"http://{addr}"
    https = endpoint.startswith("https://")
    if https and ca_path is None:
        raise ConfigError(
            f"{endpoint} is a TLS address: pass ca= (or set SPILLWAY_CA) with the PEM certificate "
            "of the CA that signed the server's certificate"
        )
    if not https and ca_path is not None:
        raise ConfigError(
            f"ca was given but {endpoint} is plaintext; use https://, or a bare host:port"
        )
    if (cert_path is None) != (key_path is None):
        raise ConfigError(
            "cert and key go together: the client certificate and its private key "
            "(SPILLWAY_CERT and SPILLWAY_KEY)"
        )
    if cert_path is not None and ca_path is None:
        raise ConfigError("cert needs ca: client certificates are sent only over TLS")
    if not token:
        token = os.environ.get("SPILLWAY_TOKEN") or ""
    if not token:
        env_dir = os.environ.get("SPILLWAY_DATA_DIR")
        directory = Path(data_dir) if data_dir else Path(env_dir) if env_dir else Path("./spillway-data")
        file = directory / DEV_TOKEN_FILE
        try:
            token = file.read_text(encoding="utf-8").strip()
        except OSError:
            raise ConfigError(
                f"no token: pass token= or set SPILLWAY_TOKEN (a local dev server writes one to {file}; "
                "set SPILLWAY_DATA_DIR if its data dir is elsewhere)"
            ) from None
    return Settings(endpoint=endpoint, token=token, ca=ca_path, cert=cert_path, key=key_path)


def channel_options() -> list[tuple[str, int]]:
    """Channel options shared by the sync and async clients."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Without BDP probing the HTTP/2 window stays small, so a fast server
        # streaming a large download cannot fill the client's memory.
        ("grpc.http2.bdp_probe", 0),
    ]


def credentials(settings: Settings) -> tuple[bytes, bytes | None, bytes | None]:
    """The CA, key and certificate PEM bytes of a TLS connection."""
    assert settings.ca is not None
    try:
        root = settings.ca.read_bytes()
        key = settings.key.read_bytes() if settings.key else None
        chain = settings.cert.read_bytes() if settings.cert else None
    except OSError as e:
        raise ConfigError(f"cannot read a TLS file: {e}") from None
    return root, key, chain
