"""The asynchronous client: `spillway.AsyncClient` (grpc.aio), with the
same methods as `spillway.Client`, awaited."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from . import _config, _requests
from ._stubs import Stubs
from .errors import ConfigError, FailedPrecondition, from_grpc
from .types import (
    AuditEvent,
    AuditVerification,
    ExecLimits,
    ExecResult,
    HistoryResult,
    Outcome,
    PayloadInfo,
    Policy,
    ReadResult,
    Recalled,
    Receipt,
    Runtime,
    SearchResult,
    SessionInfo,
    Structure,
)
from .v1 import audit_pb2, codemode_pb2, context_pb2, payloads_pb2, policies_pb2, sessions_pb2

if TYPE_CHECKING:
    from .agent import AsyncKit


def _with_auth(details: Any, header: tuple[str, str]) -> Any:
    metadata = list(details.metadata or ())
    metadata.append(header)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, grpc.aio.Metadata(*metadata), details.credentials, details.wait_for_ready
    )


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_auth(details, self.header), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_auth(details, self.header), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_auth(details, self.header), requests)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, header: tuple[str, str]) -> None:
        self.header = header

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_auth(details, self.header), requests)


class AsyncClient:
    """An asyncio connection to a Spillway server; settings as for Client."""

    def __init__(
        self,
        addr: str | None = None,
        *,
        token: str | None = None,
        ca: str | os.PathLike[str] | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.settings = _config.resolve(addr, token, ca, cert, key, data_dir)
        header = ("authorization", f"Bearer {self.settings.token}")
        interceptors = [_UnaryUnary(header), _UnaryStream(header), _StreamUnary(header), _StreamStream(header)]
        options = _config.channel_options()
        if self.settings.tls:
            root, pkey, chain = _config.credentials(self.settings)
            creds = grpc.ssl_channel_credentials(root, pkey, chain)
            self.channel = grpc.aio.secure_channel(self.settings.target, creds, options=options, interceptors=interceptors)
        else:
            self.channel = grpc.aio.insecure_channel(self.settings.target, options=options, interceptors=interceptors)
        self.stubs = Stubs(self.channel)
        """Every RPC, as the generated stubs (awaitable), already authenticated."""
        self.timeout = timeout
        self.policy = AsyncPolicyAPI(self)
        self.audit = AsyncAuditAPI(self)

    async def close(self) -> None:
        """Closes the channel."""
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, session_id: str | None = None) -> Any:
        # Names the session (the request's own, or `session_id`) for a balancer.
        metadata = _requests.session_metadata(request, session_id)
        try:
            return await method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise from_grpc(e) from None

    async def session(
        self,
        label: str = "",
        *,
        labels: dict[str, str] | None = None,
        policy: Policy | None = None,
        parent: str | None = None,
        share_with: Iterable[str] | None = None,
    ) -> AsyncSession:
        """Creates a session; `async with await client.session(...)` closes it on exit."""
        request = _requests.create_session(label, labels, policy, parent, share_with)
        return AsyncSession(self, SessionInfo.from_proto(await self._unary(self.stubs.sessions.CreateSession, request)))

    async def get_session(self, session_id: str) -> AsyncSession:
        """An existing session, by ID."""
        reply = await self._unary(self.stubs.sessions.GetSession, sessions_pb2.GetSessionRequest(session_id=session_id))
        return AsyncSession(self, SessionInfo.from_proto(reply))

    async def sessions(self, state: str | None = None, page_size: int = 0) -> AsyncIterator[SessionInfo]:
        """The caller's sessions (all pages)."""
        token = ""
        while True:
            reply = await self._unary(
                self.stubs.sessions.ListSessions,
                sessions_pb2.ListSessionsRequest(
                    page_size=page_size, page_token=token, state=_requests.session_state(state)
                ),
            )
            for s in reply.sessions:
                yield SessionInfo.from_proto(s)
            token = reply.next_page_token
            if not token:
                return

    async def close_session(self, session_id: str) -> SessionInfo:
        """Closes a session."""
        reply = await self._unary(
            self.stubs.sessions.CloseSession, sessions_pb2.CloseSessionRequest(session_id=session_id)
        )
        return SessionInfo.from_proto(reply)

    async def delete_session(self, session_id: str, reason: str = "") -> Receipt:
        """Deletes a session and everything in it."""
        reply = await self._unary(
            self.stubs.sessions.DeleteSession, sessions_pb2.DeleteSessionRequest(session_id=session_id, reason=reason)
        )
        return Receipt.from_proto(reply)

    # `session_id`, where a call takes one, only names the payload's session
    # in x-spillway-session, for a balancer's cache locality.

    async def stat(self, payload_id: str, *, session_id: str | None = None) -> PayloadInfo:
        """A payload's metadata."""
        request = payloads_pb2.PayloadRequest(payload_id=payload_id)
        return PayloadInfo.from_proto(await self._unary(self.stubs.payloads.Stat, request, session_id))

    async def inspect(self, payload_id: str, *, session_id: str | None = None) -> Structure:
        """A payload's structure."""
        request = payloads_pb2.PayloadRequest(payload_id=payload_id)
        return Structure.from_proto(await self._unary(self.stubs.payloads.Inspect, request, session_id))

    async def read(
        self,
        payload_id: str,
        *,
        lines: tuple[int, int] | None = None,
        byte_range: tuple[int, int] | None = None,
        max_bytes: int = 0,
        session_id: str | None = None,
    ) -> ReadResult:
        """A line or byte range of a payload."""
        request = _requests.read_request(payload_id, lines, byte_range, max_bytes)
        return ReadResult.from_proto(await self._unary(self.stubs.payloads.Read, request, session_id))

    async def download_chunks(self, payload_id: str, *, session_id: str | None = None) -> AsyncIterator[bytes]:
        """A whole payload, chunk by chunk."""
        call = self.stubs.payloads.Download(
            payloads_pb2.PayloadRequest(payload_id=payload_id),
            metadata=_requests.session_metadata(session_id=session_id),
        )
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.RpcError as e:
            raise from_grpc(e) from None

    async def download(self, payload_id: str, *, to: str | os.PathLike[str], session_id: str | None = None) -> int:
        """Streams a whole payload into the file `to`; returns the bytes written."""
        written = 0
        with Path(to).open("wb") as f:
            async for chunk in self.download_chunks(payload_id, session_id=session_id):
                f.write(chunk)
                written += len(chunk)
        return written

    async def delete_payload(self, payload_id: str, reason: str = "", *, session_id: str | None = None) -> Receipt:
        """Deletes a payload; returns the receipt."""
        request = payloads_pb2.DeletePayloadRequest(payload_id=payload_id, reason=reason)
        reply = await self._unary(self.stubs.payloads.DeletePayload, request, session_id)
        return Receipt.from_proto(reply)

    async def runtimes(self) -> list[Runtime]:
        """The code-mode runtimes."""
        reply = await self._unary(self.stubs.codemode.ListRuntimes, codemode_pb2.ListRuntimesRequest())
        return [
            Runtime(r.name, r.language_version, r.description, ExecLimits.from_proto(r.default_limits), r.image_sha256)
            for r in reply.runtimes
        ]

    async def repair(self, history: Any, format: str = "openai") -> HistoryResult:
        """Repairs tool call/result pairing of a provider history."""
        reply = await self._unary(self.stubs.context.RepairHistory, _requests.repair_request(history, format))
        return _requests.history_result(reply, compact=False)


class AsyncSession:
    """An open session of an AsyncClient; `async with` closes it on exit."""

    def __init__(self, client: AsyncClient, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.id

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r}, label={self.info.label!r}, state={self.info.state!r})"

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.close()
        except FailedPrecondition:
            pass

    async def refresh(self) -> SessionInfo:
        """Fetches the session's record again."""
        reply = await self.client._unary(
            self.client.stubs.sessions.GetSession, sessions_pb2.GetSessionRequest(session_id=self.id)
        )
        self.info = SessionInfo.from_proto(reply)
        return self.info

    async def close(self) -> SessionInfo:
        """Closes the session."""
        self.info = await self.client.close_session(self.id)
        return self.info

    async def delete(self, reason: str = "") -> Receipt:
        """Deletes the session."""
        return await self.client.delete_session(self.id, reason)

    async def offload(
        self, results: Iterable[_requests.ResultLike], *, turn: int = 0, settings: dict[str, Any] | None = None
    ) -> list[Outcome]:
        """One turn's tool results; outcomes in order."""
        request = payloads_pb2.OffloadRequest(
            session_id=self.id,
            turn=turn,
            results=_requests.tool_results(results),
            settings=payloads_pb2.OffloadSettings(**settings) if settings else None,
        )
        reply = await self.client._unary(self.client.stubs.payloads.Offload, request)
        return [Outcome.from_proto(o) for o in reply.outcomes]

    async def upload(
        self,
        source: _requests.Source,
        *,
        name: str = "",
        content_type: str = "",
        tool_name: str = "",
        tool_call_id: str = "",
        sha256: str | None = None,
        is_error: bool = False,
        progress: _requests.Progress | None = None,
    ) -> PayloadInfo:
        """Streams a path, bytes or an iterable of byte chunks into the session."""
        if not isinstance(source, (bytes, bytearray, memoryview, str, os.PathLike)) and hasattr(source, "__aiter__"):
            raise ConfigError("upload takes a path, bytes or a (sync) iterable of bytes")
        chunks = _requests.upload_chunks(
            self.id,
            source,
            name=name,
            content_type=content_type,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            sha256=sha256,
            is_error=is_error,
            progress=progress,
        )
        try:
            metadata = _requests.session_metadata(session_id=self.id)
            reply = await self.client.stubs.payloads.Upload(chunks, metadata=metadata)
        except grpc.RpcError as e:
            raise from_grpc(e) from None
        return PayloadInfo.from_proto(reply)

    async def payloads(self) -> list[PayloadInfo]:
        """Every payload of the session."""
        out: list[PayloadInfo] = []
        token = ""
        while True:
            reply = await self.client._unary(
                self.client.stubs.payloads.ListPayloads,
                payloads_pb2.ListPayloadsRequest(session_id=self.id, page_size=1000, page_token=token),
            )
            out.extend(PayloadInfo.from_proto(p) for p in reply.payloads)
            token = reply.next_page_token
            if not token:
                return out

    async def inspect(self, payload_id: str) -> Structure:
        """A payload's structure."""
        return await self.client.inspect(payload_id, session_id=self.id)

    async def search(
        self,
        pattern: str,
        *,
        payload_ids: Iterable[str] | None = None,
        fixed_string: bool = False,
        case_insensitive: bool = False,
        context_lines: int = 0,
        max_matches: int = 0,
    ) -> SearchResult:
        """Regex (or fixed-string) search over the session's payloads."""
        request = _requests.search_request(
            self.id, pattern, payload_ids, fixed_string, case_insensitive, context_lines, max_matches
        )
        return SearchResult.from_proto(await self.client._unary(self.client.stubs.payloads.Search, request))

    async def read(
        self,
        payload_id: str,
        *,
        lines: tuple[int, int] | None = None,
        byte_range: tuple[int, int] | None = None,
        max_bytes: int = 0,
    ) -> ReadResult:
        """A line or byte range of a payload."""
        return await self.client.read(
            payload_id, lines=lines, byte_range=byte_range, max_bytes=max_bytes, session_id=self.id
        )

    async def download(self, payload_id: str, *, to: str | os.PathLike[str]) -> int:
        """Streams a whole payload into the file `to`."""
        return await self.client.download(payload_id, to=to, session_id=self.id)

    def download_chunks(self, payload_id: str) -> AsyncIterator[bytes]:
        """A whole payload, chunk by chunk."""
        return self.client.download_chunks(payload_id, session_id=self.id)

    async def exec(
        self,
        runtime: str,
        source: str,
        *,
        inputs: Iterable[str] | None = None,
        args: Iterable[str] | None = None,
        limits: ExecLimits | None = None,
        keep_outputs: bool = False,
        module: bytes = b"",
    ) -> ExecResult:
        """Runs a script over payloads."""
        request = _requests.exec_request(self.id, runtime, source, inputs, args, limits, keep_outputs, module)
        return ExecResult.from_proto(await self.client._unary(self.client.stubs.codemode.Exec, request))

    async def recall(self, key: str) -> Recalled:
        """The archived original behind a <<ccr:KEY>> marker."""
        reply = await self.client._unary(
            self.client.stubs.context.Recall, context_pb2.RecallRequest(session_id=self.id, key=key)
        )
        return Recalled(reply.content, reply.payload_id)

    async def compact(
        self,
        history: Any,
        format: str = "openai",
        *,
        current_turn: int = 0,
        settings: dict[str, Any] | None = None,
    ) -> HistoryResult:
        """Repairs, budgets and compacts a provider history (server-side conversion)."""
        request = _requests.compact_request(self.id, history, format, current_turn, settings)
        return _requests.history_result(
            await self.client._unary(self.client.stubs.context.CompactHistory, request), compact=True
        )

    async def repair(self, history: Any, format: str = "openai") -> HistoryResult:
        """Repairs tool call/result pairing."""
        return await self.client.repair(history, format)

    def agent(self) -> AsyncKit:
        """The agent kit on this session."""
        from .agent import AsyncKit

        return AsyncKit(self)


class AsyncPolicyAPI:
    """Policies and legal holds, async."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def get(self, *, tenant: str | None = None, session_id: str | None = None) -> Policy:
        """A tenant's policy, or a session's effective policy."""
        if (tenant is None) == (session_id is None):
            raise ConfigError("policy.get takes tenant= or session_id=, exactly one")
        request = (
            policies_pb2.GetPolicyRequest(tenant=tenant)
            if tenant is not None
            else policies_pb2.GetPolicyRequest(session_id=session_id)
        )
        return Policy.from_proto(await self._c._unary(self._c.stubs.policies.GetPolicy, request))

    async def set(self, tenant: str, policy: Policy) -> Policy:
        """Sets a tenant's policy."""
        request = policies_pb2.SetPolicyRequest(tenant=tenant, policy=policy.to_proto())
        return Policy.from_proto(await self._c._unary(self._c.stubs.policies.SetPolicy, request))

    async def hold(self, session_id: str, reason: str) -> SessionInfo:
        """Places a legal hold."""
        request = policies_pb2.SetLegalHoldRequest(session_id=session_id, hold=True, reason=reason)
        return SessionInfo.from_proto(await self._c._unary(self._c.stubs.policies.SetLegalHold, request))

    async def release(self, session_id: str, reason: str = "") -> SessionInfo:
        """Lifts a legal hold."""
        request = policies_pb2.SetLegalHoldRequest(session_id=session_id, hold=False, reason=reason)
        return SessionInfo.from_proto(await self._c._unary(self._c.stubs.policies.SetLegalHold, request))


class AsyncAuditAPI:
    """The audit log and receipts, async."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def query(
        self, *, session_id: str = "", payload_id: str = "", principal: str = "", action: str = "", page_size: int = 0
    ) -> AsyncIterator[AuditEvent]:
        """Matching events, oldest first (all pages)."""
        token = ""
        while True:
            request = audit_pb2.AuditQuery(
                session_id=session_id,
                payload_id=payload_id,
                principal=principal,
                action=action,
                page_size=page_size,
                page_token=token,
            )
            reply = await self._c._unary(self._c.stubs.audit.QueryAudit, request)
            for e in reply.events:
                yield AuditEvent.from_proto(e)
            token = reply.next_page_token
            if not token:
                return

    async def verify(self) -> AuditVerification:
        """Checks the whole chain."""
        r = await self._c._unary(self._c.stubs.audit.VerifyAudit, audit_pb2.VerifyAuditRequest())
        return AuditVerification(r.ok, r.events_checked, r.first_bad_seq, r.head_seq, r.head_hash)

    async def export(self) -> AsyncIterator[AuditEvent]:
        """Every event, streamed."""
        call = self._c.stubs.audit.ExportAudit(audit_pb2.ExportAuditRequest())
        try:
            async for e in call:
                yield AuditEvent.from_proto(e)
        except grpc.RpcError as e:
            raise from_grpc(e) from None

    async def receipt(self, *, receipt_id: str = "", target_id: str = "") -> Receipt:
        """A deletion receipt."""
        request = audit_pb2.GetReceiptRequest(receipt_id=receipt_id, target_id=target_id)
        return Receipt.from_proto(await self._c._unary(self._c.stubs.audit.GetReceipt, request))
