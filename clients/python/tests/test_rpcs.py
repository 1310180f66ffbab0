"""Every RPC of spillway.v1 is reachable, and the async kit works like the sync one."""

from __future__ import annotations

import asyncio
import json

import spillway
from conftest import ALICE, Server
from spillway.v1 import audit_pb2, codemode_pb2, context_pb2, payloads_pb2, policies_pb2, sessions_pb2


def test_every_rpc_is_reachable_through_the_stubs(client: spillway.Client) -> None:
    services = {
        "sessions": sessions_pb2,
        "payloads": payloads_pb2,
        "context": context_pb2,
        "codemode": codemode_pb2,
        "audit": audit_pb2,
        "policies": policies_pb2,
    }
    count = 0
    for attr, module in services.items():
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                assert callable(getattr(getattr(client.stubs, attr), method.name)), f"{service.name}.{method.name}"
                count += 1
    assert count == 26
    # A raw call, authenticated by the client's channel.
    reply = client.stubs.codemode.ListRuntimes(codemode_pb2.ListRuntimesRequest())
    assert {r.name for r in reply.runtimes} >= {"jq", "python"}


def test_the_async_kit_offloads_and_handles_like_the_sync_one(server: Server) -> None:
    big = "\n".join(f"row {i}" for i in range(60_000))

    async def main() -> None:
        async with spillway.AsyncClient(server.addr, token=ALICE) as client:
            async with await client.session() as s:
                kit = s.agent()
                history = [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "rows", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": big}]},
                ]
                out = await kit.offload_anthropic(history)
                notice = out[2]["content"][0]["content"]
                assert notice != big and "pl_" in notice
                pid = notice.split("Handle ")[1].split()[0]
                r = json.loads(await kit.handle({"type": "tool_use", "id": "t2", "name": "spillway_read", "input": {"payload_id": pid, "start_line": 2, "end_line": 3}}))
                assert r["text"] == "row 1\nrow 2\n"
                compacted = await kit.compact(out + [{"role": "assistant", "content": "ok"}], format="anthropic")
                assert compacted[0] == {"role": "user", "content": "go"}

    asyncio.run(main())
