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
use crate::store::StoreError;

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
    /// A malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// A known principal acting outside its session's sharing.
    #[error("{0}")]
    Denied(String),
    /// The target exists but the caller may not know it: reported as not found.
    #[error("{kind} {id} not found")]
    Hidden {
        /// "session" or "payload".
        kind: &'static str,
        /// The ID.
        id: String,
    },
    /// A server-side limit was hit.
    #[error("{0}")]
    Limit(String),
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
        ApiError::Id(_) | ApiError::BadRequest(_) => Code::InvalidArgument,
        ApiError::Hidden { .. } => Code::NotFound,
        ApiError::Limit(_) => Code::ResourceExhausted,
        ApiError::Internal(_) => Code::Internal,
        ApiError::Store(s) => match s {
            StoreError::NotFound { .. } => Code::NotFound,
            StoreError::SessionClosed(_) => Code::FailedPrecondition,
            StoreError::Invalid(_) | StoreError::ChecksumMismatch { .. } => Code::InvalidArgument,
            StoreError::OutOfRange(_) => Code::OutOfRange,
            StoreError::TooLarge { .. } | StoreError::DiskFull => Code::ResourceExhausted,
            StoreError::DataLoss(_) => Code::DataLoss,
            StoreError::Engine(_) | StoreError::Corrupt(_) | StoreError::Io(_) => Code::Internal,
        },
    }
}

/// Prefix tonic gives a request message over the decoding limit.
pub const TONIC_DECODE_LIMIT_PREFIX: &str = "Error, decoded message length too large";

/// Rewrites tonic's own "message too large" status (OUT_OF_RANGE) into the
/// contract's RESOURCE_EXHAUSTED, naming the limit and what to do.
pub fn oversize_message(limit: usize) -> String {
    format!(
        "request message exceeds limits.max_request_message_bytes ({limit} bytes); send large content through Upload in chunks smaller than that, or ask the operator to raise the limit"
    )
}

/// Maps a status produced by tonic while decoding a request.
pub fn map_decode_status(status: Status, limit: usize) -> Status {
    if status.code() == Code::OutOfRange && status.message().starts_with(TONIC_DECODE_LIMIT_PREFIX)
    {
        Status::resource_exhausted(oversize_message(limit))
    } else {
        status
    }
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
        let s = map_decode_status(
            Status::out_of_range(format!("{TONIC_DECODE_LIMIT_PREFIX}: found 9 bytes")),
            4,
        );
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("(4 bytes)"));
    }
}
