"""Generates the protobuf and gRPC stubs of spillway.v1 from ../../proto.

Run by the build (hatch_build.py) and by `make python-stubs`. The output,
src/spillway/v1/, is generated, gitignored and never edited by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
OUT = HERE / "src"
PACKAGE = OUT / "spillway" / "v1"


def generate() -> list[Path]:
    """Writes the stubs; returns the files written."""
    protos = sorted((PROTO_ROOT / "spillway" / "v1").glob("*.proto"))
    if not protos:
        if any(PACKAGE.glob("*_pb2.py")):
            # A source distribution: the stubs came with it.
            return sorted(PACKAGE.glob("*_pb2*.py*"))
        raise SystemExit(
            f"no .proto files under {PROTO_ROOT}/spillway/v1 and no generated stubs in {PACKAGE}; "
            "build the package from a checkout of the Spillway repository"
        )
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as e:
        raise SystemExit(
            "grpcio-tools is needed to generate the stubs: pip install grpcio-tools"
        ) from e
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    PACKAGE.mkdir(parents=True, exist_ok=True)
    for old in PACKAGE.glob("*_pb2*.py*"):
        old.unlink()
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={OUT}",
        f"--pyi_out={OUT}",
        f"--grpc_python_out={OUT}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("grpc_tools.protoc failed; see its message above")
    (PACKAGE / "__init__.py").write_text(
        '"""Generated from proto/spillway/v1 by gen_stubs.py; do not edit."""\n'
    )
    return sorted(PACKAGE.glob("*"))


if __name__ == "__main__":
    files = generate()
    print(f"generated {len(files)} files in {PACKAGE}", file=sys.stderr)
