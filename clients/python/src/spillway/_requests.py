"""Request building and reply conversion shared by the sync and async clients."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, Union

from . import _history
from .errors import ConfigError
from .types import HistoryResult, Policy, ToolResult
from .v1 import codemode_pb2, context_pb2, payloads_pb2, sessions_pb2

CHUNK_BYTES = 1 << 20
"""Upload chunk size: 1 MiB, well under the server's 4 MiB request limit."""

Source = Union[str, os.PathLike[str], bytes, bytearray, memoryview, Iterable[bytes]]
"""What upload takes: a path, bytes, or an iterable of byte chunks."""

Progress = Callable[[int, Union[int, None]], None]
"""A progress callback: bytes sent so far, and the total when known."""

ResultLike = Union[ToolResult, tuple[str, str, Union[str, bytes]]]
"""A tool result: a ToolResult, or (call_id, tool_name, content)."""

SESSION_HEADER = "x-spillway-session"
"""The metadata key naming the session a call concerns. Replicas ignore it;
a balancer hashes on it (deploy/nginx.conf), so a session's calls land on the
replica whose local cache holds its payloads."""


def session_metadata(request: Any = None, session_id: str | None = None) -> tuple[tuple[str, str], ...] | None:
    """The call's `x-spillway-session` metadata: `session_id`, else the
    request's own `session_id` field; None when the call names no session."""
    sid = session_id or getattr(request, "session_id", "") or ""
    return ((SESSION_HEADER, sid),) if sid else None


def tool_results(results: Iterable[ResultLike]) -> list[payloads_pb2.ToolResult]:
    out = []
    for i, r in enumerate(results):
        if isinstance(r, ToolResult):
            out.append(r.to_proto())
        elif isinstance(r, tuple) and len(r) == 3:
            out.append(ToolResult(str(r[0]), str(r[1]), r[2]).to_proto())
        else:
            raise ConfigError(
                f"results[{i}] is a {type(r).__name__}; pass ToolResult or (call_id, tool_name, content) items"
            )
    return out


def create_session(
    label: str,
    labels: dict[str, str] | None,
    policy: Policy | None,
    parent: str | None,
    share_with: Iterable[str] | None,
) -> sessions_pb2.CreateSessionRequest:
    return sessions_pb2.CreateSessionRequest(
        label=label,
        labels=labels or {},
        policy=policy.to_proto() if policy is not None else None,
        parent_session_id=parent or "",
        share_with=list(share_with or ()),
    )


def session_state(state: str | None) -> str:
    """The SessionState enum name of "open" or "closed" (None: any)."""
    if state is None:
        return "SESSION_STATE_UNSPECIFIED"
    name = f"SESSION_STATE_{state.upper()}"
    if name not in sessions_pb2.SessionState.keys():
        raise ConfigError(f"state {state!r} is not known; use 'open' or 'closed'")
    return name


def upload_chunks(
    session_id: str,
    source: Source,
    *,
    name: str,
    content_type: str,
    tool_name: str,
    tool_call_id: str,
    sha256: str | None,
    is_error: bool,
    progress: Progress | None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[payloads_pb2.UploadChunk]:
    """The header, then the data in chunks of at most `chunk_bytes`, read lazily."""
    total: int | None = None
    chunks: Iterable[bytes]
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = memoryview(source)
        total = len(data)
        chunks = (bytes(data[i : i + chunk_bytes]) for i in range(0, len(data), chunk_bytes))
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        total = path.stat().st_size
        name = name or path.name
        chunks = _file_chunks(path, chunk_bytes)
    else:
        chunks = _rechunk(source, chunk_bytes)
    yield payloads_pb2.UploadChunk(
        header=payloads_pb2.UploadHeader(
            session_id=session_id,
            name=name,
            content_type=content_type,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            expected_sha256=sha256 or "",
            is_error=is_error,
        )
    )
    sent = 0
    for chunk in chunks:
        if not chunk:
            continue
        sent += len(chunk)
        yield payloads_pb2.UploadChunk(data=chunk)
        if progress is not None:
            progress(sent, total)


def _file_chunks(path: Path, size: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(size):
            yield chunk


def _rechunk(source: Iterable[bytes], size: int) -> Iterator[bytes]:
    """Chunks of at most `size` bytes from any iterable of bytes."""
    for piece in source:
        if not isinstance(piece, (bytes, bytearray, memoryview)):
            raise ConfigError(f"upload got a {type(piece).__name__} chunk; an iterable source yields bytes")
        view = memoryview(piece)
        for i in range(0, len(view), size):
            yield bytes(view[i : i + size])


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    for chunk in _file_chunks(Path(path), CHUNK_BYTES):
        h.update(chunk)
    return h.hexdigest()


def read_request(
    payload_id: str,
    lines: tuple[int, int] | None,
    byte_range: tuple[int, int] | None,
    max_bytes: int,
) -> payloads_pb2.ReadRequest:
    if lines is not None and byte_range is not None:
        raise ConfigError("read takes lines=(start, end) or byte_range=(offset, length), not both")
    r = payloads_pb2.ReadRequest(payload_id=payload_id, max_bytes=max_bytes)
    if lines is not None:
        r.line_range.CopyFrom(payloads_pb2.LineRange(start_line=lines[0], end_line=lines[1]))
    elif byte_range is not None:
        r.byte_range.CopyFrom(payloads_pb2.ByteRange(offset=byte_range[0], length=byte_range[1]))
    return r


def search_request(
    session_id: str,
    pattern: str,
    payload_ids: Iterable[str] | None,
    fixed_string: bool,
    case_insensitive: bool,
    context_lines: int,
    max_matches: int,
) -> payloads_pb2.SearchRequest:
    return payloads_pb2.SearchRequest(
        session_id=session_id,
        payload_ids=list(payload_ids or ()),
        pattern=pattern,
        fixed_string=fixed_string,
        case_insensitive=case_insensitive,
        context_lines=context_lines,
        max_matches=max_matches,
    )


def exec_request(
    session_id: str,
    runtime: str,
    source: str,
    inputs: Iterable[str] | None,
    args: Iterable[str] | None,
    limits: Any,
    keep_outputs: bool,
    module: bytes,
) -> codemode_pb2.ExecRequest:
    return codemode_pb2.ExecRequest(
        session_id=session_id,
        runtime=runtime,
        source=source,
        module=module,
        inputs=list(inputs or ()),
        args=list(args or ()),
        limits=limits.to_proto() if limits is not None else None,
        keep_outputs=keep_outputs,
    )


def repair_request(history: Any, format: str) -> context_pb2.RepairHistoryRequest:
    return context_pb2.RepairHistoryRequest(
        format=_history.format_value(format, history), history_json=_history.dumps(history)
    )


def compact_request(
    session_id: str, history: Any, format: str, current_turn: int, settings: dict[str, Any] | None
) -> context_pb2.CompactHistoryRequest:
    return context_pb2.CompactHistoryRequest(
        session_id=session_id,
        format=_history.format_value(format, history),
        history_json=_history.dumps(history),
        current_turn=current_turn,
        settings=context_pb2.CompactSettings(**settings) if settings else None,
    )


def history_result(reply: Any, compact: bool) -> HistoryResult:
    import json

    history = json.loads(reply.history_json)
    if compact:
        return HistoryResult(history, _history.report(reply.repair), _history.report(reply.report))
    return HistoryResult(history, _history.report(reply.report))
