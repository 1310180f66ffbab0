"""Plain dataclasses for what the API returns, and their conversions from
the generated protobuf messages (spillway.v1)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from .v1 import audit_pb2, codemode_pb2, common_pb2, payloads_pb2, sessions_pb2


def _time(ts: timestamp_pb2.Timestamp, present: bool) -> _dt.datetime | None:
    if not present:
        return None
    return ts.ToDatetime(tzinfo=_dt.timezone.utc)


def _duration(d: duration_pb2.Duration, present: bool) -> _dt.timedelta | None:
    return d.ToTimedelta() if present else None


@dataclass(frozen=True)
class ExecLimits:
    """Limits of one script run; 0 means the runtime's default."""

    timeout_ms: int = 0
    memory_bytes: int = 0
    max_stdout_bytes: int = 0
    fuel: int = 0

    @classmethod
    def from_proto(cls, m: common_pb2.ExecLimits) -> ExecLimits:
        return cls(m.timeout_ms, m.memory_bytes, m.max_stdout_bytes, m.fuel)

    def to_proto(self) -> common_pb2.ExecLimits:
        return common_pb2.ExecLimits(
            timeout_ms=self.timeout_ms,
            memory_bytes=self.memory_bytes,
            max_stdout_bytes=self.max_stdout_bytes,
            fuel=self.fuel,
        )


@dataclass(frozen=True)
class Policy:
    """A retention and governance policy; None or 0 means "inherit"."""

    retention: _dt.timedelta | None = None
    session_ttl: _dt.timedelta | None = None
    max_session_bytes: int = 0
    max_payload_bytes: int = 0
    max_payloads: int = 0
    delete_on_close: bool | None = None
    allow_download: bool | None = None
    allow_exec: bool | None = None
    compliance_can_read: bool | None = None
    exec_ceiling: ExecLimits | None = None
    redact: tuple[str, ...] = ()
    locked: bool = False

    @classmethod
    def from_proto(cls, m: common_pb2.Policy) -> Policy:
        def opt(name: str) -> bool | None:
            return bool(getattr(m, name)) if m.HasField(name) else None

        return cls(
            retention=_duration(m.retention, m.HasField("retention")),
            session_ttl=_duration(m.session_ttl, m.HasField("session_ttl")),
            max_session_bytes=m.max_session_bytes,
            max_payload_bytes=m.max_payload_bytes,
            max_payloads=m.max_payloads,
            delete_on_close=opt("delete_on_close"),
            allow_download=opt("allow_download"),
            allow_exec=opt("allow_exec"),
            compliance_can_read=opt("compliance_can_read"),
            exec_ceiling=ExecLimits.from_proto(m.exec_ceiling) if m.HasField("exec_ceiling") else None,
            redact=tuple(m.redact),
            locked=m.locked,
        )

    def to_proto(self) -> common_pb2.Policy:
        m = common_pb2.Policy(
            max_session_bytes=self.max_session_bytes,
            max_payload_bytes=self.max_payload_bytes,
            max_payloads=self.max_payloads,
            redact=list(self.redact),
            locked=self.locked,
        )
        if self.retention is not None:
            m.retention.FromTimedelta(self.retention)
        if self.session_ttl is not None:
            m.session_ttl.FromTimedelta(self.session_ttl)
        for name in ("delete_on_close", "allow_download", "allow_exec", "compliance_can_read"):
            value = getattr(self, name)
            if value is not None:
                setattr(m, name, value)
        if self.exec_ceiling is not None:
            m.exec_ceiling.CopyFrom(self.exec_ceiling.to_proto())
        return m


@dataclass(frozen=True)
class SessionInfo:
    """A session's record."""

    id: str
    tenant: str
    owner: str
    label: str
    labels: dict[str, str]
    state: str
    """"open", "closed" or "deleted"."""
    created_at: _dt.datetime | None
    closed_at: _dt.datetime | None
    expires_at: _dt.datetime | None
    policy: Policy
    usage_bytes: int
    usage_payloads: int
    legal_hold: bool
    legal_hold_reason: str
    legal_hold_by: str
    parent_session_id: str
    share_with: tuple[str, ...]

    @classmethod
    def from_proto(cls, m: sessions_pb2.Session) -> SessionInfo:
        state = sessions_pb2.SessionState.Name(m.state).removeprefix("SESSION_STATE_").lower()
        return cls(
            id=m.id,
            tenant=m.tenant,
            owner=m.owner,
            label=m.label,
            labels=dict(m.labels),
            state=state,
            created_at=_time(m.created_at, m.HasField("created_at")),
            closed_at=_time(m.closed_at, m.HasField("closed_at")),
            expires_at=_time(m.expires_at, m.HasField("expires_at")),
            policy=Policy.from_proto(m.policy),
            usage_bytes=m.usage.bytes,
            usage_payloads=m.usage.payloads,
            legal_hold=m.legal_hold,
            legal_hold_reason=m.legal_hold_reason,
            legal_hold_by=m.legal_hold_by,
            parent_session_id=m.parent_session_id,
            share_with=tuple(m.share_with),
        )


@dataclass(frozen=True)
class PayloadInfo:
    """A stored payload's metadata."""

    id: str
    session_id: str
    name: str
    path: str
    """Where scripts find it, e.g. /payloads/NAME."""
    size_bytes: int
    line_count: int
    estimated_tokens: int
    sha256: str
    content_type: str
    tool_name: str
    tool_call_id: str
    is_error: bool
    created_at: _dt.datetime | None
    expires_at: _dt.datetime | None
    derived_from: tuple[str, ...]
    redactions: dict[str, int]

    @classmethod
    def from_proto(cls, m: payloads_pb2.Payload) -> PayloadInfo:
        return cls(
            id=m.id,
            session_id=m.session_id,
            name=m.name,
            path=m.path,
            size_bytes=m.size_bytes,
            line_count=m.line_count,
            estimated_tokens=m.estimated_tokens,
            sha256=m.sha256,
            content_type=m.content_type,
            tool_name=m.tool_name,
            tool_call_id=m.tool_call_id,
            is_error=m.is_error,
            created_at=_time(m.created_at, m.HasField("created_at")),
            expires_at=_time(m.expires_at, m.HasField("expires_at")),
            derived_from=tuple(m.derived_from),
            redactions=dict(m.redactions),
        )


@dataclass(frozen=True)
class ToolResult:
    """One tool result to offload."""

    call_id: str
    tool_name: str
    content: str | bytes
    content_type: str = ""
    is_error: bool = False

    def to_proto(self) -> payloads_pb2.ToolResult:
        content = self.content.encode("utf-8") if isinstance(self.content, str) else self.content
        return payloads_pb2.ToolResult(
            tool_call_id=self.call_id,
            tool_name=self.tool_name,
            content=content,
            content_type=self.content_type,
            is_error=self.is_error,
        )


@dataclass(frozen=True)
class Outcome:
    """What became of one tool result."""

    call_id: str
    offloaded: bool
    text: str
    """Exactly what goes to the model: the original, or the notice."""
    payload_id: str | None
    reason: str
    """"none", "per_call" or "aggregate"."""
    estimated_tokens: int
    content_tokens: int
    estimate_is_lower_bound: bool
    preview: str
    payload: PayloadInfo | None
    redactions: dict[str, int]

    @classmethod
    def from_proto(cls, m: payloads_pb2.OffloadOutcome) -> Outcome:
        offloaded = m.disposition == payloads_pb2.DISPOSITION_OFFLOADED
        payload = PayloadInfo.from_proto(m.payload) if m.HasField("payload") else None
        return cls(
            call_id=m.tool_call_id,
            offloaded=offloaded,
            text=m.content,
            payload_id=payload.id if payload is not None and payload.id else None,
            reason=payloads_pb2.OffloadReason.Name(m.reason).removeprefix("OFFLOAD_REASON_").lower(),
            estimated_tokens=m.estimated_tokens,
            content_tokens=m.content_tokens,
            estimate_is_lower_bound=m.estimate_is_lower_bound,
            preview=m.preview,
            payload=payload,
            redactions=dict(m.redactions),
        )


@dataclass(frozen=True)
class FieldInfo:
    """One JSON field path of a payload."""

    path: str
    types: tuple[str, ...]
    present_count: int
    example: str


@dataclass(frozen=True)
class Structure:
    """What Inspect found: the type, the counts, the fields or columns."""

    payload_id: str
    detected_type: str
    size_bytes: int
    line_count: int
    summary: str
    """A short paragraph an LLM can act on."""
    top_level: str | None = None
    record_count: int | None = None
    fields: tuple[FieldInfo, ...] = ()
    columns: tuple[str, ...] = ()
    row_count: int | None = None
    longest_line: int | None = None
    sample_lines: tuple[str, ...] = ()
    invalid_json_at: int | None = None

    @classmethod
    def from_proto(cls, m: payloads_pb2.Structure) -> Structure:
        extra: dict[str, Any] = {}
        if m.HasField("json"):
            extra.update(
                top_level=m.json.top_level,
                record_count=m.json.record_count,
                fields=tuple(
                    FieldInfo(f.path, tuple(f.types), f.present_count, f.example) for f in m.json.fields
                ),
            )
        if m.HasField("csv"):
            extra.update(columns=tuple(m.csv.columns), row_count=m.csv.row_count)
        if m.HasField("text"):
            extra.update(longest_line=m.text.longest_line, sample_lines=tuple(m.text.sample_lines))
        if m.HasField("invalid_json_at"):
            extra["invalid_json_at"] = m.invalid_json_at
        return cls(
            payload_id=m.payload_id,
            detected_type=m.detected_type,
            size_bytes=m.size_bytes,
            line_count=m.line_count,
            summary=m.summary,
            **extra,
        )


@dataclass(frozen=True)
class Match:
    """One search hit."""

    payload_id: str
    line_number: int
    byte_offset: int
    line: str
    before: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(frozen=True)
class SearchResult:
    """Search hits, and whether any were left out."""

    matches: tuple[Match, ...]
    truncated: bool
    total_matches_seen: int
    note: str

    @classmethod
    def from_proto(cls, m: payloads_pb2.SearchResponse) -> SearchResult:
        return cls(
            matches=tuple(
                Match(x.payload_id, x.line_number, x.byte_offset, x.line, tuple(x.before), tuple(x.after))
                for x in m.matches
            ),
            truncated=m.truncated,
            total_matches_seen=m.total_matches_seen,
            note=m.note,
        )


@dataclass(frozen=True)
class ReadResult:
    """A range of a payload."""

    data: bytes
    start_offset: int
    end_offset: int
    first_line: int
    last_line: int
    total_bytes: int
    total_lines: int
    eof: bool

    @property
    def text(self) -> str:
        """The data as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")

    @classmethod
    def from_proto(cls, m: payloads_pb2.ReadResponse) -> ReadResult:
        return cls(
            m.data, m.start_offset, m.end_offset, m.first_line, m.last_line, m.total_bytes, m.total_lines, m.eof
        )


@dataclass(frozen=True)
class ExecResult:
    """What a script run produced."""

    status: str
    """"ok", "exit_nonzero", "timeout", "memory_limit", "output_limit", "trap" or "invalid_script"."""
    exit_code: int
    stdout: str
    """The text to put in the model's context (a notice when stdout was offloaded)."""
    stderr: str
    message: str
    """What happened and what to do next, when it did not simply succeed."""
    stdout_payload: PayloadInfo | None
    outputs: tuple[PayloadInfo, ...]
    usage: dict[str, int]
    clamped: tuple[str, ...]
    redactions: dict[str, int]

    @property
    def ok(self) -> bool:
        """Whether the script ran to completion with exit code 0."""
        return self.status == "ok"

    @classmethod
    def from_proto(cls, m: codemode_pb2.ExecResult) -> ExecResult:
        usage = {f.name: int(v) for f, v in m.usage.ListFields()}
        return cls(
            status=codemode_pb2.ExecStatus.Name(m.status).removeprefix("EXEC_STATUS_").lower(),
            exit_code=m.exit_code,
            stdout=m.stdout,
            stderr=m.stderr,
            message=m.message,
            stdout_payload=PayloadInfo.from_proto(m.stdout_payload) if m.HasField("stdout_payload") else None,
            outputs=tuple(PayloadInfo.from_proto(p) for p in m.outputs),
            usage=usage,
            clamped=tuple(m.clamped),
            redactions=dict(m.redactions),
        )


@dataclass(frozen=True)
class Runtime:
    """A code-mode runtime."""

    name: str
    language_version: str
    description: str
    default_limits: ExecLimits
    image_sha256: str


@dataclass(frozen=True)
class Recalled:
    """An archived original, by its recall key."""

    content: str
    payload_id: str


@dataclass(frozen=True)
class RemovedItem:
    """One thing a deletion removed."""

    kind: str
    id: str
    session_id: str
    content_sha256: str
    bytes: int
    because: str


@dataclass(frozen=True)
class Receipt:
    """A signed deletion receipt."""

    id: str
    target_id: str
    reason: str
    requested_by: str
    deleted_at: _dt.datetime | None
    deleted_payload_ids: tuple[str, ...]
    bytes_deleted: int
    content_sha256: tuple[str, ...]
    signature: str
    removed: tuple[RemovedItem, ...]
    #: Fleet mode: when every live replica had purged its local copies
    #: (signed with the rest); None in embedded mode, or when the deleting
    #: replica did not see it within ``store.purge_confirm_timeout``.
    purge_confirmed_at: _dt.datetime | None = None
    #: How many live replicas confirmed the purge (0 without a confirmation).
    purge_replicas: int = 0

    @classmethod
    def from_proto(cls, m: common_pb2.DeletionReceipt) -> Receipt:
        return cls(
            id=m.id,
            target_id=m.target_id,
            reason=m.reason,
            requested_by=m.requested_by,
            deleted_at=_time(m.deleted_at, m.HasField("deleted_at")),
            deleted_payload_ids=tuple(m.deleted_payload_ids),
            bytes_deleted=m.bytes_deleted,
            content_sha256=tuple(m.content_sha256),
            signature=m.signature,
            removed=tuple(
                RemovedItem(r.kind, r.id, r.session_id, r.content_sha256, r.bytes, r.because) for r in m.removed
            ),
            purge_confirmed_at=_time(m.purge_confirmed_at, m.HasField("purge_confirmed_at")),
            purge_replicas=m.purge_replicas,
        )


@dataclass(frozen=True)
class AuditEvent:
    """One event of the hash-chained audit log."""

    seq: int
    time: str
    principal: str
    tenant: str
    action: str
    session_id: str
    payload_id: str
    outcome: str
    detail: str
    content_sha256: str
    prev_hash: str
    hash: str

    @classmethod
    def from_proto(cls, m: audit_pb2.AuditEvent) -> AuditEvent:
        return cls(
            m.seq, m.time, m.principal, m.tenant, m.action, m.session_id, m.payload_id,
            m.outcome, m.detail, m.content_sha256, m.prev_hash, m.hash,
        )


@dataclass(frozen=True)
class AuditVerification:
    """Whether the audit chain verifies, and how far."""

    ok: bool
    events_checked: int
    first_bad_seq: int
    head_seq: int
    head_hash: str


@dataclass(frozen=True)
class HistoryResult:
    """A repaired or compacted history, in the format it was sent in."""

    history: Any
    """The provider JSON (a list, or the object that was sent)."""
    repair: dict[str, Any] = field(default_factory=dict)
    """What repair fixed (counts and IDs)."""
    compact: dict[str, Any] = field(default_factory=dict)
    """What compaction did (counts, chars saved, archived recall keys); empty for a repair."""
