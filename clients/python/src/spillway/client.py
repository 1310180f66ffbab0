"""The synchronous client: `spillway.Client`, its sessions, and the
compliance APIs (`client.policy`, `client.audit`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import grpc

from . import _config, _requests
from ._stubs import Stubs
from .errors import FailedPrecondition, from_grpc
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
    from .agent import Kit

T = TypeVar("T")


class _Auth(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d: Any) -> Any:
        metadata = list(d.metadata or ())
        metadata.append(self._header)
        return d._replace(metadata=metadata) if hasattr(d, "_replace") else _Details(d, metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = tuple(metadata)
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def _call(f: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return f(*args, **kwargs)
    except grpc.RpcError as e:
        raise from_grpc(e) from None


def _stream(it: Iterable[T]) -> Iterator[T]:
    try:
        yield from it
    except grpc.RpcError as e:
        raise from_grpc(e) from None


class Client:
    """A connection to a Spillway server.

    Address, token and TLS files come from the arguments, then from
    SPILLWAY_ADDR, SPILLWAY_TOKEN, SPILLWAY_CA, SPILLWAY_CERT and
    SPILLWAY_KEY, then from the dev token of a local dev server, exactly as
    the CLI finds them. `timeout` (seconds) applies to every unary call.
    """

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
        options = _config.channel_options()
        if self.settings.tls:
            root, pkey, chain = _config.credentials(self.settings)
            creds = grpc.ssl_channel_credentials(root, pkey, chain)
            raw = grpc.secure_channel(self.settings.target, creds, options=options)
        else:
            raw = grpc.insecure_channel(self.settings.target, options=options)
        self._raw_channel = raw
        self.channel: grpc.Channel = grpc.intercept_channel(raw, _Auth(self.settings.token))
        self.stubs = Stubs(self.channel)
        """Every RPC, as the generated stubs, already authenticated."""
        self.timeout = timeout
        self.policy = PolicyAPI(self)
        """Policies and legal holds."""
        self.audit = AuditAPI(self)
        """The audit log and deletion receipts."""

    # Lifecycle.

    def close(self) -> None:
        """Closes the channel."""
        self._raw_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _unary(self, method: Any, request: Any, session_id: str | None = None) -> Any:
        # Names the session (the request's own, or `session_id`) for a balancer.
        metadata = _requests.session_metadata(request, session_id)
        return _call(method, request, timeout=self.timeout, metadata=metadata)

    # Sessions.

    def session(
        self,
        label: str = "",
        *,
        labels: dict[str, str] | None = None,
        policy: Policy | None = None,
        parent: str | None = None,
        share_with: Iterable[str] | None = None,
    ) -> Session:
        """Creates a session. Use it as a context manager to close it on exit."""
        request = _requests.create_session(label, labels, policy, parent, share_with)
        return Session(self, SessionInfo.from_proto(self._unary(self.stubs.sessions.CreateSession, request)))

    def get_session(self, session_id: str) -> Session:
        """An existing session, by ID."""
        reply = self._unary(self.stubs.sessions.GetSession, sessions_pb2.GetSessionRequest(session_id=session_id))
        return Session(self, SessionInfo.from_proto(reply))

    def sessions(self, state: str | None = None, page_size: int = 0) -> Iterator[SessionInfo]:
        """The caller's sessions (all pages), optionally only "open" or "closed" ones."""
        token = ""
        while True:
            reply = self._unary(
                self.stubs.sessions.ListSessions,
                sessions_pb2.ListSessionsRequest(
                    page_size=page_size, page_token=token, state=_requests.session_state(state)
                ),
            )
            yield from (SessionInfo.from_proto(s) for s in reply.sessions)
            token = reply.next_page_token
            if not token:
                return

    def close_session(self, session_id: str) -> SessionInfo:
        """Closes a session: read-only from then on."""
        reply = self._unary(self.stubs.sessions.CloseSession, sessions_pb2.CloseSessionRequest(session_id=session_id))
        return SessionInfo.from_proto(reply)

    def delete_session(self, session_id: str, reason: str = "") -> Receipt:
        """Deletes a session and everything in it; returns the signed receipt."""
        reply = self._unary(
            self.stubs.sessions.DeleteSession, sessions_pb2.DeleteSessionRequest(session_id=session_id, reason=reason)
        )
        return Receipt.from_proto(reply)

    # Payloads by ID.

    # `session_id`, where a call takes one, only names the payload's session
    # in x-spillway-session, for a balancer's cache locality.

    def stat(self, payload_id: str, *, session_id: str | None = None) -> PayloadInfo:
        """A payload's metadata."""
        request = payloads_pb2.PayloadRequest(payload_id=payload_id)
        return PayloadInfo.from_proto(self._unary(self.stubs.payloads.Stat, request, session_id))

    def inspect(self, payload_id: str, *, session_id: str | None = None) -> Structure:
        """A payload's structure, found by streaming it in bounded memory."""
        request = payloads_pb2.PayloadRequest(payload_id=payload_id)
        return Structure.from_proto(self._unary(self.stubs.payloads.Inspect, request, session_id))

    def read(
        self,
        payload_id: str,
        *,
        lines: tuple[int, int] | None = None,
        byte_range: tuple[int, int] | None = None,
        max_bytes: int = 0,
        session_id: str | None = None,
    ) -> ReadResult:
        """A line range (1-based, inclusive; end 0 = to the end) or a byte range
        (offset, length) of a payload, at most `max_bytes` (0: the server's default)."""
        request = _requests.read_request(payload_id, lines, byte_range, max_bytes)
        return ReadResult.from_proto(self._unary(self.stubs.payloads.Read, request, session_id))

    def download(self, payload_id: str, *, to: str | os.PathLike[str], session_id: str | None = None) -> int:
        """Streams a whole payload into the file `to`, chunk by chunk (at most
        1 MiB in memory); returns the bytes written. See download_chunks."""
        chunks = self.download_chunks(payload_id, session_id=session_id)
        written = 0
        with Path(to).open("wb") as f:
            for chunk in chunks:
                f.write(chunk)
                written += len(chunk)
        return written

    def download_chunks(self, payload_id: str, *, session_id: str | None = None) -> Iterator[bytes]:
        """The payload's bytes, chunk by chunk."""
        stream = _call(
            self.stubs.payloads.Download,
            payloads_pb2.PayloadRequest(payload_id=payload_id),
            metadata=_requests.session_metadata(session_id=session_id),
        )
        for chunk in _stream(stream):
            yield chunk.data

    def delete_payload(self, payload_id: str, reason: str = "", *, session_id: str | None = None) -> Receipt:
        """Deletes a payload (and what was derived from it); returns the receipt."""
        request = payloads_pb2.DeletePayloadRequest(payload_id=payload_id, reason=reason)
        reply = self._unary(self.stubs.payloads.DeletePayload, request, session_id)
        return Receipt.from_proto(reply)

    # Code mode, context.

    def runtimes(self) -> list[Runtime]:
        """The code-mode runtimes the server has."""
        reply = self._unary(self.stubs.codemode.ListRuntimes, codemode_pb2.ListRuntimesRequest())
        return [
            Runtime(r.name, r.language_version, r.description, ExecLimits.from_proto(r.default_limits), r.image_sha256)
            for r in reply.runtimes
        ]

    def repair(self, history: Any, format: str = "openai") -> HistoryResult:
        """Repairs tool call/result pairing of a provider history ("openai",
        "openai-chat", "openai-responses" or "anthropic"); the server converts."""
        reply = self._unary(self.stubs.context.RepairHistory, _requests.repair_request(history, format))
        return _requests.history_result(reply, compact=False)


class Session:
    """An open session: offload, upload, inspect, search, read, exec, recall.

    As a context manager, it closes the session on exit.
    """

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.id

    def __repr__(self) -> str:
        return f"Session({self.id!r}, label={self.info.label!r}, state={self.info.state!r})"

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except FailedPrecondition:
            pass  # Already closed, or deleted.

    def refresh(self) -> SessionInfo:
        """Fetches the session's record again."""
        reply = self.client._unary(
            self.client.stubs.sessions.GetSession, sessions_pb2.GetSessionRequest(session_id=self.id)
        )
        self.info = SessionInfo.from_proto(reply)
        return self.info

    def close(self) -> SessionInfo:
        """Closes the session: read-only from then on."""
        self.info = self.client.close_session(self.id)
        return self.info

    def delete(self, reason: str = "") -> Receipt:
        """Deletes the session and everything in it."""
        return self.client.delete_session(self.id, reason)

    def offload(
        self, results: Iterable[_requests.ResultLike], *, turn: int = 0, settings: dict[str, Any] | None = None
    ) -> list[Outcome]:
        """One turn's tool results, in order: each outcome's `.text` is what goes
        to the model (the original, or a notice with `.payload_id`)."""
        request = payloads_pb2.OffloadRequest(
            session_id=self.id,
            turn=turn,
            results=_requests.tool_results(results),
            settings=payloads_pb2.OffloadSettings(**settings) if settings else None,
        )
        reply = self.client._unary(self.client.stubs.payloads.Offload, request)
        return [Outcome.from_proto(o) for o in reply.outcomes]

    def upload(
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
        """Streams a path, bytes, or an iterable of byte chunks into the session,
        1 MiB at a time; `progress(sent, total)` is called after each chunk."""
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
        metadata = _requests.session_metadata(session_id=self.id)
        return PayloadInfo.from_proto(_call(self.client.stubs.payloads.Upload, chunks, metadata=metadata))

    def payloads(self) -> list[PayloadInfo]:
        """Every payload of the session."""
        out: list[PayloadInfo] = []
        token = ""
        while True:
            reply = self.client._unary(
                self.client.stubs.payloads.ListPayloads,
                payloads_pb2.ListPayloadsRequest(session_id=self.id, page_size=1000, page_token=token),
            )
            out.extend(PayloadInfo.from_proto(p) for p in reply.payloads)
            token = reply.next_page_token
            if not token:
                return out

    def inspect(self, payload_id: str) -> Structure:
        """A payload's structure."""
        return self.client.inspect(payload_id, session_id=self.id)

    def search(
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
        return SearchResult.from_proto(self.client._unary(self.client.stubs.payloads.Search, request))

    def read(
        self,
        payload_id: str,
        *,
        lines: tuple[int, int] | None = None,
        byte_range: tuple[int, int] | None = None,
        max_bytes: int = 0,
    ) -> ReadResult:
        """A line or byte range of a payload."""
        return self.client.read(
            payload_id, lines=lines, byte_range=byte_range, max_bytes=max_bytes, session_id=self.id
        )

    def download(self, payload_id: str, *, to: str | os.PathLike[str]) -> int:
        """Streams a whole payload into the file `to`; returns the bytes written."""
        return self.client.download(payload_id, to=to, session_id=self.id)

    def download_chunks(self, payload_id: str) -> Iterator[bytes]:
        """A whole payload, chunk by chunk."""
        return self.client.download_chunks(payload_id, session_id=self.id)

    def exec(
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
        """Runs a script (jq, javascript, python, or a wasm `module`) over payloads."""
        request = _requests.exec_request(self.id, runtime, source, inputs, args, limits, keep_outputs, module)
        return ExecResult.from_proto(self.client._unary(self.client.stubs.codemode.Exec, request))

    def recall(self, key: str) -> Recalled:
        """The archived original behind a <<ccr:KEY>> marker (or its 16 hex digits)."""
        reply = self.client._unary(
            self.client.stubs.context.Recall, context_pb2.RecallRequest(session_id=self.id, key=key)
        )
        return Recalled(reply.content, reply.payload_id)

    def compact(
        self,
        history: Any,
        format: str = "openai",
        *,
        current_turn: int = 0,
        settings: dict[str, Any] | None = None,
    ) -> HistoryResult:
        """Repairs, budgets and compacts a provider history; originals are archived
        in this session behind <<ccr:KEY>> markers. The server converts the format."""
        request = _requests.compact_request(self.id, history, format, current_turn, settings)
        return _requests.history_result(
            self.client._unary(self.client.stubs.context.CompactHistory, request), compact=True
        )

    def repair(self, history: Any, format: str = "openai") -> HistoryResult:
        """Repairs tool call/result pairing of a provider history."""
        return self.client.repair(history, format)

    def agent(self) -> Kit:
        """The agent kit: tool definitions, tool-call handling and offloading
        for a model's tool loop, on this session."""
        from .agent import Kit

        return Kit(self)


class PolicyAPI:
    """Policies (tenant and session) and legal holds."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def get(self, *, tenant: str | None = None, session_id: str | None = None) -> Policy:
        """A tenant's policy, or a session's effective policy."""
        if (tenant is None) == (session_id is None):
            from .errors import ConfigError

            raise ConfigError("policy.get takes tenant= or session_id=, exactly one")
        request = (
            policies_pb2.GetPolicyRequest(tenant=tenant)
            if tenant is not None
            else policies_pb2.GetPolicyRequest(session_id=session_id)
        )
        return Policy.from_proto(self._c._unary(self._c.stubs.policies.GetPolicy, request))

    def set(self, tenant: str, policy: Policy) -> Policy:
        """Sets a tenant's policy; returns it as stored."""
        request = policies_pb2.SetPolicyRequest(tenant=tenant, policy=policy.to_proto())
        return Policy.from_proto(self._c._unary(self._c.stubs.policies.SetPolicy, request))

    def hold(self, session_id: str, reason: str) -> SessionInfo:
        """Places a legal hold: nothing of the session can be deleted."""
        request = policies_pb2.SetLegalHoldRequest(session_id=session_id, hold=True, reason=reason)
        return SessionInfo.from_proto(self._c._unary(self._c.stubs.policies.SetLegalHold, request))

    def release(self, session_id: str, reason: str = "") -> SessionInfo:
        """Lifts a legal hold."""
        request = policies_pb2.SetLegalHoldRequest(session_id=session_id, hold=False, reason=reason)
        return SessionInfo.from_proto(self._c._unary(self._c.stubs.policies.SetLegalHold, request))


class AuditAPI:
    """The hash-chained audit log and deletion receipts."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def query(
        self,
        *,
        session_id: str = "",
        payload_id: str = "",
        principal: str = "",
        action: str = "",
        page_size: int = 0,
    ) -> Iterator[AuditEvent]:
        """Events matching every given filter, oldest first (all pages)."""
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
            reply = self._c._unary(self._c.stubs.audit.QueryAudit, request)
            yield from (AuditEvent.from_proto(e) for e in reply.events)
            token = reply.next_page_token
            if not token:
                return

    def verify(self) -> AuditVerification:
        """Checks the whole chain."""
        r = self._c._unary(self._c.stubs.audit.VerifyAudit, audit_pb2.VerifyAuditRequest())
        return AuditVerification(r.ok, r.events_checked, r.first_bad_seq, r.head_seq, r.head_hash)

    def export(self) -> Iterator[AuditEvent]:
        """Every event, streamed."""
        stream = _call(self._c.stubs.audit.ExportAudit, audit_pb2.ExportAuditRequest())
        for e in _stream(stream):
            yield AuditEvent.from_proto(e)

    def receipt(self, *, receipt_id: str = "", target_id: str = "") -> Receipt:
        """A deletion receipt, by its ID or by the deleted thing's ID."""
        request = audit_pb2.GetReceiptRequest(receipt_id=receipt_id, target_id=target_id)
        return Receipt.from_proto(self._c._unary(self._c.stubs.audit.GetReceipt, request))
