"""Build hook: generates the stubs from ../../proto before every build.

The generated gRPC stubs refuse to import under a grpcio older than the
grpcio-tools that generated them, so the wheel requires at least that
grpcio: an install then upgrades an older one instead of failing at import.
"""

from __future__ import annotations

import sys
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class StubsHook(BuildHookInterface):  # type: ignore[type-arg]
    """Runs gen_stubs.generate() and pins grpcio to the generator's version."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        sys.path.insert(0, str(Path(self.root)))
        try:
            import gen_stubs
        finally:
            sys.path.pop(0)
        gen_stubs.generate()
        if "dependencies" in build_data:  # the wheel target; an sdist has none
            build_data["dependencies"].append(f"grpcio>={installed_version('grpcio-tools')}")
