"""The example agent loop with the scripted model, on a 30 MB tool result."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import spillway
from conftest import ALICE, REPO, Server

EXAMPLE = REPO / "examples" / "python" / "agent_loop.py"


def load_example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scripted_agent_loop_answers_correctly_from_a_30_mb_tool_result(session: spillway.Session) -> None:
    example = load_example()
    events = example.make_events(30_000_000)
    assert len(events) >= 30_000_000
    truth = sum(1 for e in json.loads(events) if e["service"] == "billing" and e["level"] == "error")
    seen: list[list[dict[str, object]]] = []
    model = example.ScriptedModel()

    def recording(messages, tools):  # type: ignore[no-untyped-def]
        seen.append(list(messages))
        return model(messages, tools)

    answer = example.agent_loop(session, recording, events)
    assert answer == f"The billing service logged {truth} error events."
    # The model never saw the 30 MB: every message it was given stayed small.
    assert max(len(json.dumps(m)) for m in seen) < 64_000
    # It went inspect, then exec, then answered.
    names = [c["function"]["name"] for msgs in seen[-1:] for m in msgs if m.get("tool_calls") for c in m["tool_calls"]]  # type: ignore[union-attr]
    assert names == ["fetch_events", "spillway_inspect", "spillway_exec"]


def test_the_example_runs_as_a_script_against_a_server(server: Server) -> None:
    env = {"SPILLWAY_ADDR": server.addr, "SPILLWAY_TOKEN": ALICE, "EVENTS_BYTES": "2000000", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    truth = re.search(r"\(truth: (\d+)\)", r.stderr)
    assert truth and r.stdout.strip() == f"The billing service logged {truth.group(1)} error events."
