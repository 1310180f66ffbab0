//! The audit log: every governed action becomes an [`AuditEvent`] in a
//! tamper-evident hash chain (api.md, "Audit").
//!
//! - `chain`: the event ([`AuditEvent`]), its canonical bytes, sealing
//!   ([`seal`]), streaming verification ([`Verifier`], [`verify_export`])
//!   and the export line format. Pure logic, no storage.
//! - `log`: the stored log ([`AuditLog`]), one chain per tenant: durable, serialized
//!   (group-committed) appends, queries with filters and paging, and
//!   verification against the stored head.
//! - `journal`: on a local engine, what makes an append durable with one
//!   small write instead of a B-tree commit; replayed after a crash.
//! - [`AuditWriter`]: the async door to the log, a writer thread that
//!   group-commits what async callers send.
//! - [`action`] and [`outcome`]: the names events use.
//!
//! `scripts/verify_audit.py` verifies an export with nothing but Python's
//! standard library; a unit test keeps it and `chain` in agreement.
//!
//! The door is the names re-exported here; the modules are private.

mod chain;
mod journal;
mod log;
mod writer;

pub use chain::{
    AuditEvent, ChainBuilder, GENESIS_HASH, Verifier, VerifyOutcome, event_time, seal, verify,
    verify_export,
};
pub use log::{AuditLog, Filter, NewEvent, Verified, event_key};
pub use writer::AuditWriter;

use crate::ids::SessionId;
use crate::store::ReceiptRecord;

/// What went wrong reading audit events.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A line of an export that is not one audit event.
    #[error(
        "not an audit event: {message}. Each line of an export is one JSON event with exactly the fields of AuditEvent"
    )]
    Malformed {
        /// The parser's message.
        message: String,
    },
    /// Reading the export failed.
    #[error("reading the audit export failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Action names, `<noun>.<verb>`.
pub mod action {
    /// A session was created.
    pub const SESSION_CREATE: &str = "session.create";
    /// A session was closed (made read-only).
    pub const SESSION_CLOSE: &str = "session.close";
    /// A session was deleted.
    pub const SESSION_DELETE: &str = "session.delete";
    /// A turn of tool results went through Offload.
    pub const PAYLOAD_OFFLOAD: &str = "payload.offload";
    /// A payload was uploaded.
    pub const PAYLOAD_UPLOAD: &str = "payload.upload";
    /// A range of a payload was read.
    pub const PAYLOAD_READ: &str = "payload.read";
    /// A payload was downloaded.
    pub const PAYLOAD_DOWNLOAD: &str = "payload.download";
    /// A payload's structure was inspected.
    pub const PAYLOAD_INSPECT: &str = "payload.inspect";
    /// Payloads were searched.
    pub const PAYLOAD_SEARCH: &str = "payload.search";
    /// A payload was deleted.
    pub const PAYLOAD_DELETE: &str = "payload.delete";
    /// A script ran in the sandbox.
    pub const EXEC_RUN: &str = "exec.run";
    /// A policy was set.
    pub const POLICY_SET: &str = "policy.set";
    /// A legal hold was set or lifted.
    pub const HOLD_SET: &str = "hold.set";
    /// A call was refused for lack of rights.
    pub const ACCESS_DENIED: &str = "access.denied";
    /// A deletion receipt was fetched.
    pub const RECEIPT_GET: &str = "receipt.get";
    /// The audit log was queried.
    pub const AUDIT_QUERY: &str = "audit.query";
    /// The audit chain was verified.
    pub const AUDIT_VERIFY: &str = "audit.verify";
    /// A history was compacted (originals archived).
    pub const HISTORY_COMPACT: &str = "history.compact";
    /// An archived original was recalled.
    pub const HISTORY_RECALL: &str = "history.recall";

    /// Every action name.
    pub const ALL: [&str; 19] = [
        SESSION_CREATE,
        SESSION_CLOSE,
        SESSION_DELETE,
        PAYLOAD_OFFLOAD,
        PAYLOAD_UPLOAD,
        PAYLOAD_READ,
        PAYLOAD_DOWNLOAD,
        PAYLOAD_INSPECT,
        PAYLOAD_SEARCH,
        PAYLOAD_DELETE,
        EXEC_RUN,
        POLICY_SET,
        HOLD_SET,
        ACCESS_DENIED,
        RECEIPT_GET,
        AUDIT_QUERY,
        AUDIT_VERIFY,
        HISTORY_COMPACT,
        HISTORY_RECALL,
    ];
}

/// The audit event of a deletion the server carries out on its own (the
/// reaper, or one finished after a crash), under `principal`. Deletions
/// return their receipt; whoever asked for one audits it with this.
pub fn deletion_event(r: &ReceiptRecord, principal: &str) -> NewEvent {
    let is_session = r.target_id.starts_with(SessionId::PREFIX);
    let event = NewEvent::new(if is_session {
        action::SESSION_DELETE
    } else {
        action::PAYLOAD_DELETE
    })
    .by(principal, &r.tenant);
    let event = if is_session {
        event.session(&r.target_id)
    } else {
        event.payload(&r.target_id)
    };
    event.detail(deletion_summary(r))
}

/// The audit event of a deletion a crash interrupted and the store finished
/// at startup, under the principal that asked for it.
pub fn deletion_finished_after_crash(r: &ReceiptRecord) -> NewEvent {
    deletion_event(r, &r.requested_by)
        .detail(format!("finished after a crash: {}", deletion_summary(r)))
}

/// A receipt in one line, for audit details: IDs and counts only.
pub fn deletion_summary(r: &ReceiptRecord) -> String {
    format!(
        "receipt={} reason={:?} payloads={} bytes={} items={}",
        r.id,
        r.reason,
        r.deleted_payload_ids.len(),
        r.bytes_deleted,
        r.removed.len()
    )
}

/// Outcome names.
pub mod outcome {
    /// The action succeeded.
    pub const OK: &str = "ok";
    /// The action was refused (authentication, role, sharing, legal hold).
    pub const DENIED: &str = "denied";
    /// The action failed.
    pub const ERROR: &str = "error";

    /// Every outcome name.
    pub const ALL: [&str; 3] = [OK, DENIED, ERROR];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_lowercase_and_actions_are_noun_dot_verb() {
        let mut seen = std::collections::HashSet::new();
        for name in action::ALL.iter().chain(&outcome::ALL) {
            assert!(seen.insert(name), "duplicate {name}");
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'.'),
                "{name}"
            );
        }
        for name in action::ALL {
            let parts: Vec<_> = name.split('.').collect();
            assert!(
                parts.len() == 2 && parts.iter().all(|p| !p.is_empty()),
                "{name}"
            );
        }
    }
}
