"""Typed errors: one exception class per gRPC status code.

Each carries the server's message unchanged (`str(e)` and `e.message`),
which says what happened and what to do next.
"""

from __future__ import annotations

import re

import grpc


class SpillwayError(Exception):
    """Base of every error this package raises."""

    code: grpc.StatusCode | None = None
    """The gRPC status code, or None for errors raised before any call."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        """The server's message, unchanged."""


class ConfigError(SpillwayError):
    """The client's settings are incomplete or contradictory."""


class RpcError(SpillwayError):
    """A call failed with a gRPC status."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


class Cancelled(RpcError):
    """CANCELLED: the call was cancelled."""


class Unknown(RpcError):
    """UNKNOWN."""


class InvalidArgument(RpcError):
    """INVALID_ARGUMENT: a malformed request or bad settings."""


class DeadlineExceeded(RpcError):
    """DEADLINE_EXCEEDED: the client's deadline passed."""


class NotFound(RpcError):
    """NOT_FOUND: an unknown ID, one of another tenant, or a missing archive."""


class AlreadyExists(RpcError):
    """ALREADY_EXISTS."""


class PermissionDenied(RpcError):
    """PERMISSION_DENIED: the caller's role or the session's sharing forbids it."""


class QuotaExceeded(RpcError):
    """RESOURCE_EXHAUSTED: a quota, a message size or a concurrency limit.

    `limit` names the limit the server's message names (a policy quota such
    as `max_session_bytes`, or a config key such as
    `limits.max_request_message_bytes`), or is None if it names none.
    """

    _QUOTA = re.compile(r"policy quota ([a-z_]+)")
    _KEY = re.compile(r"\b((?:limits|sandbox|offload|policy|store)\.[a-z_]+)\b")
    _FIELD = re.compile(r"\b(max_[a-z_]+|exec_ceiling)\b")

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message, code)
        self.limit: str | None = None
        for pattern in (self._QUOTA, self._KEY, self._FIELD):
            m = pattern.search(message)
            if m:
                self.limit = m.group(1)
                break


ResourceExhausted = QuotaExceeded
"""The status's own name for QuotaExceeded."""


class FailedPrecondition(RpcError):
    """FAILED_PRECONDITION: the session is closed, or a legal hold blocks a deletion."""


class SessionClosed(FailedPrecondition):
    """FAILED_PRECONDITION because the session is closed and read-only."""


class LegalHold(FailedPrecondition):
    """FAILED_PRECONDITION because a legal hold forbids the deletion."""


class Aborted(RpcError):
    """ABORTED."""


class OutOfRange(RpcError):
    """OUT_OF_RANGE: a range past the end of a payload."""


class Unimplemented(RpcError):
    """UNIMPLEMENTED: the server does not have this RPC."""


class Internal(RpcError):
    """INTERNAL: details are in the server log only."""


class Unavailable(RpcError):
    """UNAVAILABLE: the server is draining or cannot be reached."""


class DataLoss(RpcError):
    """DATA_LOSS: a payload's bytes are gone."""


class Unauthenticated(RpcError):
    """UNAUTHENTICATED: a missing or unknown token."""


_BY_CODE: dict[grpc.StatusCode, type[RpcError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def from_status(code: grpc.StatusCode, message: str) -> RpcError:
    """The exception for a status and its message."""
    cls = _BY_CODE.get(code, Unknown)
    if code == grpc.StatusCode.CANCELLED and message == "Timeout expired":
        # The server (tonic) saw the client's grpc-timeout pass first and
        # cancelled the call: the client's deadline, reported by the server.
        return DeadlineExceeded(message, grpc.StatusCode.DEADLINE_EXCEEDED)
    if cls is FailedPrecondition:
        if "is closed and read-only" in message:
            cls = SessionClosed
        elif "legal hold" in message:
            cls = LegalHold
    return cls(message, code)


def from_grpc(e: grpc.RpcError) -> RpcError:
    """The exception for a failed grpc call (sync or async)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return from_status(code, details or "")
