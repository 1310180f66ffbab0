//! The one place where errors become gRPC statuses.
//!
//! Every layer has its own error enum; [`ApiError`] gathers them, and its
//! `From<ApiError> for Status` picks the code and the words. Messages are
//! written for the LLM or operator reading them: what happened, which limit
//! or ID was involved, and what to do next. Internal failures are logged in
//! full and reported with a generic message, so no host path or engine detail
//! reaches a client.

use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::ids::IdError;
use crate::offload::OffloadError;
use crate::policy::PolicyError;
use crate::sandbox::SandboxError;
use crate::store::{ObjectError, StoreError};

/// An error on its way to a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Authentication or role failure.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A malformed ID.
    #[error(transparent)]
    Id(#[from] IdError),
    /// A storage failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An offload failure.
    #[error(transparent)]
    Offload(#[from] OffloadError),
    /// A code-mode failure that is not the script's own.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A policy that may not be set: invalid, or looser than allowed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// A known principal acting outside its session's sharing.
    #[error("{0}")]
    Denied(String),
    /// The target exists but the caller may not know it: reported as not found.
    #[error("{kind} {id} not found{}", crate::ids::not_found_next(kind))]
    Hidden {
        /// "session" or "payload".
        kind: &'static str,
        /// The ID.
        id: String,
    },
    /// Something addressed by content, not ID, does not exist (for example a
    /// recall key); the message says why it may be gone.
    #[error("{0}")]
    Missing(String),
    /// A server-side limit was hit.
    #[error("{0}")]
    Limit(String),
    /// The client sent nothing for longer than a limit allows.
    #[error("{0}")]
    Timeout(String),
    /// The client's stream ended before the operation was complete.
    #[error("{0}")]
    Cancelled(String),
    /// A background task failed in a way the client cannot act on.
    #[error("{0}")]
    Internal(String),
}

/// Result alias for handlers.
pub type ApiResult<T> = Result<T, ApiError>;

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let code = code_of(&e);
        if code == Code::Internal {
            tracing::error!(error = %e, "internal error");
            return Status::internal(
                "internal error; the server log has the details. Retry later; if it persists, tell the operator",
            );
        }
        Status::new(code, e.to_string())
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        ApiError::from(e).into()
    }
}

impl From<PolicyError> for Status {
    fn from(e: PolicyError) -> Status {
        ApiError::from(e).into()
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        ApiError::from(e).into()
    }
}

fn code_of(e: &ApiError) -> Code {
    match e {
        ApiError::Auth(AuthError::MissingToken | AuthError::UnknownToken) => Code::Unauthenticated,
        ApiError::Auth(AuthError::RoleDenied { .. }) | ApiError::Denied(_) => {
            Code::PermissionDenied
        }
        ApiError::Id(_) | ApiError::BadRequest(_) | ApiError::Policy(_) => Code::InvalidArgument,
        ApiError::Hidden { .. } | ApiError::Missing(_) => Code::NotFound,
        ApiError::Limit(_) => Code::ResourceExhausted,
        ApiError::Timeout(_) => Code::DeadlineExceeded,
        ApiError::Cancelled(_) => Code::Cancelled,
        ApiError::Internal(_) => Code::Internal,
        ApiError::Offload(OffloadError::Invalid(_)) => Code::InvalidArgument,
        ApiError::Offload(OffloadError::TooManyResults { .. }) => Code::ResourceExhausted,
        ApiError::Offload(OffloadError::Store(s)) => store_code(s),
        ApiError::Store(s) => store_code(s),
        ApiError::Sandbox(s) => sandbox_code(s),
    }
}

fn sandbox_code(s: &SandboxError) -> Code {
    match s {
        SandboxError::UnknownRuntime(..) | SandboxError::BadRequest(_) => Code::InvalidArgument,
        SandboxError::Image { .. } => Code::FailedPrecondition,
        SandboxError::InputGone(_) => Code::NotFound,
        SandboxError::Busy { .. } | SandboxError::TooLarge { .. } => Code::ResourceExhausted,
        SandboxError::Setup(_) | SandboxError::Io(_) => Code::Internal,
    }
}

fn store_code(s: &StoreError) -> Code {
    match s {
        StoreError::NotFound { .. } => Code::NotFound,
        StoreError::SessionClosed(_) | StoreError::LegalHold { .. } => Code::FailedPrecondition,
        StoreError::Invalid(_) | StoreError::ChecksumMismatch { .. } => Code::InvalidArgument,
        StoreError::OutOfRange(_) => Code::OutOfRange,
        StoreError::TooLarge { .. } | StoreError::QuotaExceeded { .. } | StoreError::DiskFull => {
            Code::ResourceExhausted
        }
        StoreError::DataLoss(_) => Code::DataLoss,
        StoreError::Engine(e) if e.unavailable => Code::Unavailable,
        StoreError::Objects(ObjectError::Unavailable(_)) => Code::Unavailable,
        StoreError::Objects(ObjectError::Corrupt { .. }) => Code::DataLoss,
        StoreError::Objects(_) => Code::Internal,
        StoreError::Engine(_) | StoreError::Corrupt(_) | StoreError::Io(_) => Code::Internal,
    }
}

/// Prefix tonic gives a request message over the decoding limit.
pub const TONIC_DECODE_LIMIT_PREFIX: &str = "Error, decoded message length too large";

/// The message for a request over a message-size limit.
pub fn oversize_message(key: &str, limit: usize) -> String {
    format!(
        "request message exceeds {key} ({limit} bytes); send large content through Upload in chunks smaller than limits.max_request_message_bytes, split the turn into several Offload calls, or ask the operator to raise the limit"
    )
}

/// The error for a request stream that broke off: a message over a size
/// limit (named, as [`map_decode_status`] does), or a client that went away.
pub fn stream_error(status: Status, limits: &crate::config::Limits) -> ApiError {
    let mapped = map_decode_status(status, limits);
    match mapped.code() {
        Code::ResourceExhausted => ApiError::Limit(mapped.message().to_owned()),
        Code::InvalidArgument => ApiError::BadRequest(mapped.message().to_owned()),
        _ => ApiError::Cancelled(format!(
            "the request stream broke off ({}); nothing was stored. Retry",
            mapped.message()
        )),
    }
}

/// Prefix prost gives a message it cannot decode (tonic reports it as
/// INTERNAL).
pub const PROST_DECODE_PREFIX: &str = "failed to decode Protobuf message: ";

/// Rewrites tonic's own statuses for requests it could not take into the
/// contract's codes: "message too large" (OUT_OF_RANGE) becomes
/// RESOURCE_EXHAUSTED, naming the config key of the limit, and a message
/// that does not decode (INTERNAL) becomes INVALID_ARGUMENT, naming the
/// field prost stopped at.
pub fn map_decode_status(status: Status, limits: &crate::config::Limits) -> Status {
    if status.code() == Code::Internal
        && let Some(what) = status.message().strip_prefix(PROST_DECODE_PREFIX)
    {
        return Status::invalid_argument(format!(
            "the request message could not be decoded, so nothing was done: {what}. Send a well-formed spillway.v1 message (string fields must be valid UTF-8; bytes fields take anything)"
        ));
    }
    if status.code() != Code::OutOfRange || !status.message().starts_with(TONIC_DECODE_LIMIT_PREFIX)
    {
        return status;
    }
    let limit: Option<usize> = status
        .message()
        .rsplit("the limit is: ")
        .next()
        .and_then(|s| s.trim_end_matches(" bytes").parse().ok());
    let (key, value) = match limit {
        Some(l)
            if l == limits.max_offload_request_bytes && l != limits.max_request_message_bytes =>
        {
            ("limits.max_offload_request_bytes", l)
        }
        // The only other limit a service is given: CodeMode's, which
        // carries a module and a script.
        Some(l) if l != limits.max_request_message_bytes => (
            "the CodeMode request limit (sandbox.max_module_bytes + sandbox.max_source_bytes + 1 MiB)",
            l,
        ),
        _ => (
            "limits.max_request_message_bytes",
            limits.max_request_message_bytes,
        ),
    };
    Status::resource_exhausted(oversize_message(key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_hide_their_details() {
        let e = ApiError::Store(StoreError::Io(std::io::Error::other("/secret/host/path")));
        let s = Status::from(e);
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("/secret"));
    }

    #[test]
    fn limits_map_to_resource_exhausted_with_the_limit_named() {
        let s = Status::from(ApiError::Store(StoreError::TooLarge {
            limit: "limits.max_payload_bytes",
            value: 10,
            hint: "split it",
        }));
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("limits.max_payload_bytes is 10 bytes"));
        let limits = crate::config::Limits {
            max_request_message_bytes: 4,
            max_offload_request_bytes: 64,
            ..Default::default()
        };
        let tonic = |found: u32, limit: u32| {
            Status::out_of_range(format!(
                "{TONIC_DECODE_LIMIT_PREFIX}: found {found} bytes, the limit is: {limit} bytes"
            ))
        };
        let s = map_decode_status(tonic(9, 4), &limits);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(
            s.message()
                .contains("limits.max_request_message_bytes (4 bytes)"),
            "{}",
            s.message()
        );
        let bad = Status::internal(format!(
            "{PROST_DECODE_PREFIX}SearchRequest.pattern: invalid string value: data is not UTF-8 encoded"
        ));
        let s = map_decode_status(bad, &limits);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().contains("SearchRequest.pattern"),
            "{}",
            s.message()
        );
        let s = map_decode_status(tonic(99, 64), &limits);
        assert!(
            s.message()
                .contains("limits.max_offload_request_bytes (64 bytes)"),
            "{}",
            s.message()
        );
        let s = map_decode_status(tonic(99, 17), &limits);
        assert!(
            s.message().contains("sandbox.max_module_bytes") && s.message().contains("(17 bytes)"),
            "{}",
            s.message()
        );
    }
}
