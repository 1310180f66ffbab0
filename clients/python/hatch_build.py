"""Build hook: generates the stubs from ../../proto before every build."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class StubsHook(BuildHookInterface):  # type: ignore[type-arg]
    """Runs gen_stubs.generate()."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        sys.path.insert(0, str(Path(self.root)))
        try:
            import gen_stubs
        finally:
            sys.path.pop(0)
        gen_stubs.generate()
