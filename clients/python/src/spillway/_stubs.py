"""The generated gRPC stubs of every service, on one channel."""

from __future__ import annotations

from typing import Any

from .v1 import (
    audit_pb2_grpc,
    codemode_pb2_grpc,
    context_pb2_grpc,
    payloads_pb2_grpc,
    policies_pb2_grpc,
    sessions_pb2_grpc,
)


class Stubs:
    """Every RPC of spillway.v1, as the generated stubs, authenticated.

    `client.stubs.payloads.Offload(request)` and the like take and return
    the generated messages of `spillway.v1.*_pb2`. Works on a sync or an
    async (grpc.aio) channel alike.
    """

    def __init__(self, channel: Any) -> None:
        self.sessions: Any = sessions_pb2_grpc.SessionsStub(channel)
        self.payloads: Any = payloads_pb2_grpc.PayloadsStub(channel)
        self.context: Any = context_pb2_grpc.ContextStub(channel)
        self.codemode: Any = codemode_pb2_grpc.CodeModeStub(channel)
        self.audit: Any = audit_pb2_grpc.AuditStub(channel)
        self.policies: Any = policies_pb2_grpc.PoliciesStub(channel)
