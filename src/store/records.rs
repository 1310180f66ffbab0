//! What the metadata trees hold: the record types, their versioned value
//! envelope, and the key encodings.
//!
//! Every value starts with one format byte. Format 1 is JSON, with
//! `#[serde(default)]` on every field, so a newer server can add fields and
//! still read old records, and an unknown format byte is reported instead of
//! misread. Keys embed big-endian times so that scans come out in time order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::clock::Millis;
use crate::ids::{PayloadId, ReceiptId, SessionId};
use crate::policy::PolicyOverrides;
pub use crate::receipt::RemovedItem;
use crate::redact::RedactCounts;

/// The value format this server writes.
pub const VALUE_FORMAT: u8 = 1;
/// The schema version stored under [`SCHEMA_KEY`] in the meta tree.
pub const SCHEMA_VERSION: u32 = 1;
/// Key of the schema version in the meta tree.
pub const SCHEMA_KEY: &[u8] = b"schema_version";

/// A value that could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The value is empty or has a format byte this server does not know.
    #[error("stored value has unknown format {0:?}")]
    UnknownFormat(Option<u8>),
    /// The value does not match the record type.
    #[error("stored value is not a valid record: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// Encodes a record in the current value format.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    let mut out = vec![VALUE_FORMAT];
    serde_json::to_writer(&mut out, record).expect("records serialize infallibly");
    out
}

/// Decodes a record of any supported value format.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, RecordError> {
    match bytes.split_first() {
        Some((&VALUE_FORMAT, rest)) => Ok(serde_json::from_slice(rest)?),
        other => Err(RecordError::UnknownFormat(other.map(|(b, _)| *b))),
    }
}

/// Lifecycle state of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Accepts writes.
    #[default]
    Open,
    /// Read-only.
    Closed,
}

/// A tenant's policy, as SetPolicy stored it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPolicyRecord {
    /// The tenant.
    pub tenant: String,
    /// The policy as set.
    #[serde(default)]
    pub policy: PolicyOverrides,
    /// When it was last set.
    #[serde(default)]
    pub updated_ms: Millis,
    /// Who last set it.
    #[serde(default)]
    pub updated_by: String,
}

/// A legal hold on a session: while it stands, nothing of the session is
/// deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegalHold {
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// Who placed it.
    #[serde(default)]
    pub by: String,
    /// When.
    #[serde(default)]
    pub since_ms: Millis,
}

/// A session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// ID.
    pub id: SessionId,
    /// Tenant.
    pub tenant: String,
    /// Owning principal.
    pub owner: String,
    /// Free-form label.
    #[serde(default)]
    pub label: String,
    /// Free-form labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Open or closed.
    #[serde(default)]
    pub state: SessionState,
    /// Creation time.
    pub created_ms: Millis,
    /// Close time.
    #[serde(default)]
    pub closed_ms: Option<Millis>,
    /// When the session expires (its TTL).
    pub expires_ms: Millis,
    /// Policy overrides.
    #[serde(default)]
    pub policy: PolicyOverrides,
    /// Legal hold.
    #[serde(default)]
    pub legal_hold: bool,
    /// Who placed the hold, when and why; set while `legal_hold` is.
    #[serde(default)]
    pub hold: Option<LegalHold>,
    /// Parent session of a sub-agent session.
    #[serde(default)]
    pub parent: Option<SessionId>,
    /// Principals the session is shared with.
    #[serde(default)]
    pub share_with: Vec<String>,
    /// Bytes stored.
    #[serde(default)]
    pub usage_bytes: u64,
    /// Payloads stored.
    #[serde(default)]
    pub usage_payloads: u64,
}

/// A stored payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadRecord {
    /// ID.
    pub id: PayloadId,
    /// Session.
    pub session_id: SessionId,
    /// File name within the session directory; unique in the session.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Lines, counted as in the contract.
    pub line_count: u64,
    /// Unicode scalar values when the content is UTF-8, bytes otherwise.
    pub chars: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
    /// Content type.
    #[serde(default)]
    pub content_type: String,
    /// Tool that produced it.
    #[serde(default)]
    pub tool_name: String,
    /// Tool call that produced it.
    #[serde(default)]
    pub tool_call_id: String,
    /// Whether it is an error result.
    #[serde(default)]
    pub is_error: bool,
    /// Creation time.
    pub created_ms: Millis,
    /// Expiry time.
    pub expires_ms: Millis,
    /// Payloads it was derived from.
    #[serde(default)]
    pub derived_from: Vec<PayloadId>,
    /// Whether the content is valid UTF-8.
    #[serde(default)]
    pub utf8: bool,
    /// Set by startup reconciliation when the file was found missing.
    #[serde(default)]
    pub missing: bool,
    /// The recall key, when the payload is an archived history result.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub archive_key: String,
    /// How many matches of the session's redaction rules were replaced
    /// before the bytes were stored, per rule name; never the values.
    /// Absent in records written before redaction (they decode as none).
    #[serde(default, skip_serializing_if = "RedactCounts::is_empty")]
    pub redactions: RedactCounts,
}

impl PayloadRecord {
    /// Estimated tokens by the default `chars / 4` estimator, rounded up.
    pub fn estimated_tokens(&self) -> u64 {
        self.chars.div_ceil(4)
    }

    /// Where scripts see the payload.
    pub fn sandbox_path(&self) -> String {
        crate::guest::guest_path(&self.name)
    }
}

/// A deletion receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptRecord {
    /// ID.
    pub id: ReceiptId,
    /// What was deleted: a session or payload ID.
    pub target_id: String,
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// Who asked.
    pub requested_by: String,
    /// Tenant of the deleted data.
    pub tenant: String,
    /// Owner of the deleted data's session (decides who may see the receipt).
    #[serde(default)]
    pub owner: String,
    /// Principals the session was shared with.
    #[serde(default)]
    pub share_with: Vec<String>,
    /// When.
    pub deleted_ms: Millis,
    /// Every payload removed.
    #[serde(default)]
    pub deleted_payload_ids: Vec<PayloadId>,
    /// Bytes removed.
    #[serde(default)]
    pub bytes_deleted: u64,
    /// Hashes of the removed payloads, in the order of `deleted_payload_ids`.
    #[serde(default)]
    pub content_sha256: Vec<String>,
    /// Everything the deletion removed, item by item.
    #[serde(default)]
    pub removed: Vec<RemovedItem>,
    /// Signature, once receipts are signed.
    #[serde(default)]
    pub signature: String,
    /// Fleet mode: when every live replica had purged its local copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_confirmed: Option<crate::receipt::PurgeConfirmation>,
}

/// The kinds of [`RemovedItem`].
pub mod removed {
    /// A session record and its directory.
    pub const SESSION: &str = "session";
    /// A payload asked for by name, or one of a deleted session.
    pub const PAYLOAD: &str = "payload";
    /// A payload derived from a deleted one (a script output).
    pub const DERIVED_PAYLOAD: &str = "derived_payload";
    /// An archived history result (a recall key's content).
    pub const ARCHIVE_ENTRY: &str = "archive_entry";
    /// A payload's line index.
    pub const LINE_INDEX: &str = "line_index";
    /// A cached Inspect result.
    pub const INSPECT_CACHE: &str = "inspect_cache";
    /// Stored bytes whose last reference went (deduplicated content).
    pub const CONTENT_BLOB: &str = "content_blob";
    /// A payload's object in the bucket (fleet mode), with every
    /// replica's local copy.
    pub const OBJECT: &str = "object";
}

/// A deletion in progress, written before anything is removed so that a
/// crash midway is finished at the next start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionIntent {
    /// The receipt, already signed; stored with the intent.
    pub receipt_id: ReceiptId,
    /// The payloads to remove, with what their metadata keys need.
    #[serde(default)]
    pub payloads: Vec<PayloadRecord>,
    /// Sessions whose records and directories go.
    #[serde(default)]
    pub sessions: Vec<SessionRecord>,
    /// Usage to take off surviving sessions: (session, bytes, payloads).
    #[serde(default)]
    pub usage: Vec<(SessionId, u64, u64)>,
    /// Expiry-tree entries that go with the deletion.
    #[serde(default)]
    pub expiry_keys: Vec<Vec<u8>>,
}

/// Key encodings, one function per tree.
pub mod keys {
    use super::*;

    /// Kind byte of an expiry entry for a session.
    pub const EXPIRY_SESSION: u8 = b'S';
    /// Kind byte of an expiry entry for a payload.
    pub const EXPIRY_PAYLOAD: u8 = b'P';

    fn be(ms: Millis) -> [u8; 8] {
        u64::try_from(ms.max(0)).unwrap_or(0).to_be_bytes()
    }

    /// Prefix of a tenant's entries in the tenant-sessions tree.
    pub fn tenant_prefix(tenant: &str) -> Vec<u8> {
        let mut k = tenant.as_bytes().to_vec();
        k.push(0);
        k
    }

    /// Tenant-sessions key.
    pub fn tenant_session(tenant: &str, created_ms: Millis, id: &SessionId) -> Vec<u8> {
        let mut k = tenant_prefix(tenant);
        k.extend_from_slice(&be(created_ms));
        k.extend_from_slice(id.as_str().as_bytes());
        k
    }

    /// Session-payloads key.
    pub fn session_payload(session: &SessionId, created_ms: Millis, id: &PayloadId) -> Vec<u8> {
        let mut k = session.as_str().as_bytes().to_vec();
        k.extend_from_slice(&be(created_ms));
        k.extend_from_slice(id.as_str().as_bytes());
        k
    }

    /// Payload-names key.
    pub fn payload_name(session: &SessionId, name: &str) -> Vec<u8> {
        let mut k = session.as_str().as_bytes().to_vec();
        k.extend_from_slice(name.as_bytes());
        k
    }

    /// Prefix of the content-index entries of one content in one session.
    pub fn content_prefix(session: &SessionId, sha256: &str) -> Vec<u8> {
        let mut k = session.as_str().as_bytes().to_vec();
        k.extend_from_slice(sha256.as_bytes());
        k
    }

    /// Content-index key.
    pub fn content(session: &SessionId, sha256: &str, id: &PayloadId) -> Vec<u8> {
        let mut k = content_prefix(session, sha256);
        k.extend_from_slice(id.as_str().as_bytes());
        k
    }

    /// Derived-index key: `child` was derived from `parent`.
    pub fn derived(parent: &PayloadId, child: &PayloadId) -> Vec<u8> {
        let mut k = parent.as_str().as_bytes().to_vec();
        k.extend_from_slice(child.as_str().as_bytes());
        k
    }

    /// Expiry key.
    pub fn expiry(expires_ms: Millis, kind: u8, id: &str) -> Vec<u8> {
        let mut k = be(expires_ms).to_vec();
        k.push(kind);
        k.extend_from_slice(id.as_bytes());
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_unknown_formats_are_refused() {
        let r = ReceiptRecord {
            id: ReceiptId::generate(),
            target_id: "x".into(),
            reason: String::new(),
            requested_by: "p".into(),
            tenant: "t".into(),
            owner: "o".into(),
            share_with: vec![],
            deleted_ms: 5,
            deleted_payload_ids: vec![],
            bytes_deleted: 0,
            content_sha256: vec![],
            removed: vec![],
            signature: String::new(),
            purge_confirmed: None,
        };
        let bytes = encode(&r);
        assert_eq!(bytes[0], VALUE_FORMAT);
        assert_eq!(decode::<ReceiptRecord>(&bytes).unwrap(), r);
        let mut future = bytes.clone();
        future[0] = 9;
        assert!(matches!(
            decode::<ReceiptRecord>(&future),
            Err(RecordError::UnknownFormat(Some(9)))
        ));
        assert!(matches!(
            decode::<ReceiptRecord>(&[]),
            Err(RecordError::UnknownFormat(None))
        ));
    }

    #[test]
    fn payload_records_from_before_redaction_decode_with_no_redactions() {
        let old = br#"{"id":"pl_0123456789abcdef0123456789abcdef","session_id":"ses_0123456789abcdef0123456789abcdef","name":"a.txt","size":1,"line_count":1,"chars":1,"sha256":"00","created_ms":1,"expires_ms":2}"#;
        let mut bytes = vec![VALUE_FORMAT];
        bytes.extend_from_slice(old);
        let mut p: PayloadRecord = decode(&bytes).unwrap();
        assert!(p.redactions.is_empty());
        // Empty counts are not written; others round-trip.
        assert!(!String::from_utf8_lossy(&encode(&p)).contains("redactions"));
        p.redactions.total = 2;
        p.redactions.by_rule.insert("email".into(), 2);
        assert_eq!(decode::<PayloadRecord>(&encode(&p)).unwrap(), p);
    }

    #[test]
    fn time_keyed_entries_sort_by_time() {
        let s = SessionId::generate();
        let a = PayloadId::generate();
        let b = PayloadId::generate();
        assert!(keys::session_payload(&s, 1, &a) < keys::session_payload(&s, 2, &b));
        assert!(
            keys::expiry(1, keys::EXPIRY_PAYLOAD, "z")
                < keys::expiry(256, keys::EXPIRY_PAYLOAD, "a")
        );
    }
}
