"""Spillway for Python: a client for the gRPC API and an agent-loop kit.

    import spillway

    with spillway.Client() as client, client.session(label="demo") as session:
        outcomes = session.offload([("call_1", "list_prs", big_json)])
        print(outcomes[0].text)        # what goes to the model
        kit = session.agent()          # tools, handle(call), offload_openai(...)

`Client()` finds the server as the CLI does: arguments, then SPILLWAY_ADDR,
SPILLWAY_TOKEN, SPILLWAY_CA (SPILLWAY_CERT, SPILLWAY_KEY), then the dev
token of a local dev server.
"""

from .aio import AsyncClient, AsyncSession
from .client import AuditAPI, Client, PolicyAPI, Session
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    ConfigError,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LegalHold,
    NotFound,
    OutOfRange,
    PermissionDenied,
    QuotaExceeded,
    ResourceExhausted,
    RpcError,
    SessionClosed,
    SpillwayError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from .types import (
    AuditEvent,
    AuditVerification,
    ExecLimits,
    ExecResult,
    FieldInfo,
    HistoryResult,
    Match,
    Outcome,
    PayloadInfo,
    Policy,
    ReadResult,
    Recalled,
    Receipt,
    RemovedItem,
    Runtime,
    SearchResult,
    SessionInfo,
    Structure,
    ToolResult,
)

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "AsyncSession",
    "AuditAPI",
    "AuditEvent",
    "AuditVerification",
    "Cancelled",
    "Client",
    "ConfigError",
    "DataLoss",
    "DeadlineExceeded",
    "ExecLimits",
    "ExecResult",
    "FailedPrecondition",
    "FieldInfo",
    "HistoryResult",
    "Internal",
    "InvalidArgument",
    "LegalHold",
    "Match",
    "NotFound",
    "OutOfRange",
    "Outcome",
    "PayloadInfo",
    "PermissionDenied",
    "Policy",
    "PolicyAPI",
    "QuotaExceeded",
    "ReadResult",
    "Recalled",
    "Receipt",
    "RemovedItem",
    "ResourceExhausted",
    "RpcError",
    "Runtime",
    "SearchResult",
    "Session",
    "SessionClosed",
    "SessionInfo",
    "SpillwayError",
    "Structure",
    "ToolResult",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
]
