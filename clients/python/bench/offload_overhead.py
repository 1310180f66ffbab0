"""Two figures for the report:

1. Client-side overhead of an Offload call through `spillway.Client`
   (interceptor, request building, dataclass outcomes) against the raw
   generated stub on a plain channel, on the same server: the ratio of
   median wall times, for an inline result and an offloaded one.
2. The lines a user writes for the example's agent loop with the kit
   (examples/python/agent_loop.py: agent_loop) and without it
   (bench/agent_loop_without_kit.py), after checking that both answer alike.
"""

from __future__ import annotations

import importlib.util
import inspect
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import spillway  # noqa: E402
from conftest import ALICE, REPO, start_server  # noqa: E402
from spillway.v1 import payloads_pb2, payloads_pb2_grpc  # noqa: E402

ROUNDS, CALLS = 5, 200


def timed(f) -> float:  # type: ignore[no-untyped-def]
    """Median seconds per call over ROUNDS rounds of CALLS calls."""
    rounds = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(CALLS):
            f()
        rounds.append((time.perf_counter() - t) / CALLS)
    return statistics.median(rounds)


def code_lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith(("#", '"""')))


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    server = start_server(tmp)
    try:
        client = spillway.Client(server.addr, token=ALICE)
        session = client.session(label="bench")
        raw = payloads_pb2_grpc.PayloadsStub(grpc.insecure_channel(server.addr))
        md = [("authorization", f"Bearer {ALICE}")]
        print("| result | spillway.Client | raw stub | ratio |\n| --- | --- | --- | --- |")
        for label, content in (("inline, 2 KB", "x" * 2000), ("offloaded, 200 KB", "line of text\n" * 16000)):
            kit_call = lambda: session.offload([("c1", "tool", content)])  # noqa: E731
            request = payloads_pb2.OffloadRequest(
                session_id=session.id, results=[payloads_pb2.ToolResult(tool_call_id="c1", tool_name="tool", content=content.encode())]
            )
            raw_call = lambda: raw.Offload(request, metadata=md)  # noqa: E731
            kit_call(), raw_call()
            a, b = timed(kit_call), timed(raw_call)
            print(f"| {label} | {a * 1e6:.0f} µs | {b * 1e6:.0f} µs | {a / b:.2f} |")
            # The client's own work, without the network: building the request
            # from a tuple and turning the reply into Outcome dataclasses.
            reply = raw.Offload(request, metadata=md)
            own = timed(lambda: ([spillway.Outcome.from_proto(o) for o in reply.outcomes],
                                 payloads_pb2.OffloadRequest(session_id=session.id, results=spillway._requests.tool_results([("c1", "tool", content)]))))
            print(f"|   the client's own work in that call | {own * 1e6:.0f} µs | | {own / b:.3f} of the raw call |")

        spec = importlib.util.spec_from_file_location("agent_loop", REPO / "examples" / "python" / "agent_loop.py")
        assert spec and spec.loader
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        from agent_loop_without_kit import agent_loop_without_kit

        events = example.make_events(3_000_000)
        with_kit = example.agent_loop(client.session(label="with"), example.ScriptedModel(), events)
        s = client.session(label="without")
        without = agent_loop_without_kit(server.addr, ALICE, s.id, example.ScriptedModel(), events, example.run_tool, example.QUESTION, example.FETCH_EVENTS)
        assert with_kit == without, (with_kit, without)
        text = (HERE / "agent_loop_without_kit.py").read_text()
        body = text.split("# --- the loop a user writes without the kit ---")[1].split("# --- end ---")[0]
        print(f"\nagent loop (same answer: {with_kit!r}):")
        print(f"- with the kit: {code_lines(inspect.getsource(example.agent_loop))} lines (examples/python/agent_loop.py, agent_loop)")
        print(f"- without it:   {code_lines(body)} lines (bench/agent_loop_without_kit.py; 2 of the 4 tools, no SDK objects, no Anthropic)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
