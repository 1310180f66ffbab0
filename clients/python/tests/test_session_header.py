"""Every call about a session names it in `x-spillway-session`, the metadata
deploy/nginx.conf hashes on, from the sync and the async client alike.

What the client sends is seen by a relay: a real gRPC server on a free
loopback port that records each call's method and metadata and passes the
call, bytes unchanged, to the real Spillway server, so every call also has
to work."""

from __future__ import annotations

import asyncio
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import descriptor_pb2

import spillway
from conftest import ALICE, Server
from spillway._requests import SESSION_HEADER
from spillway.v1 import audit_pb2, codemode_pb2, context_pb2, payloads_pb2, policies_pb2, sessions_pb2

OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def _kinds() -> dict[str, tuple[bool, bool]]:
    """Every spillway.v1 method path: (client streams, server streams)."""
    out = {}
    for module in (audit_pb2, codemode_pb2, context_pb2, payloads_pb2, policies_pb2, sessions_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                proto = descriptor_pb2.MethodDescriptorProto()
                method.CopyToProto(proto)
                out[f"/{service.full_name}/{method.name}"] = (proto.client_streaming, proto.server_streaming)
    return out


class Relay(grpc.GenericRpcHandler):
    """Records `(method, metadata)` of each call, and relays it upstream."""

    def __init__(self, upstream: str) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.kinds = _kinds()
        self.channel = grpc.insecure_channel(upstream, options=OPTIONS)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
        self.server.add_generic_rpc_handlers((self,))
        self.addr = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(None)
        self.channel.close()

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        method = str(details.method)
        kind = self.kinds.get(method)
        if kind is None:
            return None
        metadata = [(str(k), str(v)) for k, v in details.invocation_metadata]
        self.calls.append((method, dict(metadata)))
        forward = [(k, v) for k, v in metadata if k in ("authorization", SESSION_HEADER)]

        def relayed(context: grpc.ServicerContext, call: Any) -> Any:
            try:
                return call()
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")

        c = self.channel
        if kind == (False, False):
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: relayed(ctx, lambda: c.unary_unary(method)(req, metadata=forward))
            )
        if kind == (False, True):
            return grpc.unary_stream_rpc_method_handler(
                lambda req, ctx: relayed(ctx, lambda: iter(list(c.unary_stream(method)(req, metadata=forward))))
            )
        if kind == (True, False):
            return grpc.stream_unary_rpc_method_handler(
                lambda reqs, ctx: relayed(ctx, lambda: c.stream_unary(method)(reqs, metadata=forward))
            )
        return grpc.stream_stream_rpc_method_handler(
            lambda reqs, ctx: relayed(ctx, lambda: iter(list(c.stream_stream(method)(reqs, metadata=forward))))
        )

    def named(self) -> list[tuple[str, str | None]]:
        """Each call's method name and the session it named."""
        return [(m.rsplit("/", 1)[1], md.get(SESSION_HEADER)) for m, md in self.calls]


def test_the_sync_client_names_the_session_on_every_call_about_it(server: Server) -> None:
    with Relay(server.addr) as r:
        with spillway.Client(r.addr, token=ALICE) as c:
            s = c.session(label="routed")
            p = s.upload(b"alpha\nbeta\n", name="a.txt")
            s.offload([("c1", "tool", "small")])
            assert [x.id for x in s.payloads()] == [p.id]
            assert s.read(p.id, lines=(2, 2)).text == "beta\n"
            s.inspect(p.id)
            assert b"".join(s.download_chunks(p.id)) == b"alpha\nbeta\n"
            assert s.search("beta").matches
            s.refresh()
            c.policy.get(session_id=s.id)
            # A payload call outside the session names it only when told.
            c.stat(p.id)
            c.stat(p.id, session_id=s.id)
            s.close()
        sid = s.id
        assert r.named() == [
            ("CreateSession", None),
            ("Upload", sid),
            ("Offload", sid),
            ("ListPayloads", sid),
            ("Read", sid),
            ("Inspect", sid),
            ("Download", sid),
            ("Search", sid),
            ("GetSession", sid),
            ("GetPolicy", sid),
            ("Stat", None),
            ("Stat", sid),
            ("CloseSession", sid),
        ]
        # The header goes beside the token, never in its place.
        assert all(md["authorization"] == f"Bearer {ALICE}" for _, md in r.calls)


def test_the_async_client_names_the_session_on_every_call_about_it(server: Server) -> None:
    with Relay(server.addr) as r:

        async def main() -> str:
            async with spillway.AsyncClient(r.addr, token=ALICE) as c:
                s = await c.session(label="routed-async")
                p = await s.upload(b"gamma\n", name="g.txt")
                assert (await s.read(p.id)).text == "gamma\n"
                assert [chunk async for chunk in s.download_chunks(p.id)] == [b"gamma\n"]
                await s.payloads()
                await c.stat(p.id)
                await c.delete_payload(p.id, session_id=s.id)
                return s.id

        sid = asyncio.run(main())
        assert r.named() == [
            ("CreateSession", None),
            ("Upload", sid),
            ("Read", sid),
            ("Download", sid),
            ("ListPayloads", sid),
            ("Stat", None),
            ("DeletePayload", sid),
        ]
