//! Deletion receipts and their signatures, shared by the server (which
//! signs) and the CLI (which verifies): pure, no storage, no I/O.
//!
//! A receipt is signed with HMAC-SHA256, under a server key made at first
//! start and kept mode 0600 in the data directory ([`KEY_FILE`]), over the
//! receipt's canonical bytes. Those are the receipt as a JSON object without its
//! `signature`: keys sorted, no insignificant whitespace, `deleted_at` as an
//! RFC 3339 UTC string with milliseconds, integers as numbers, lists as
//! arrays, and each `removed` item as an object with sorted keys
//! (serde_json's compact output of a sorted map).
//!
//! In fleet mode a receipt may also say when every live replica had purged
//! its local copies (`purge_confirmed_at`, same form as `deleted_at`) and
//! how many replicas that was (`purge_replicas`). Both keys are in the
//! canonical bytes only when the confirmation is there, so receipts without
//! it (embedded mode, and every receipt made before) keep their bytes and
//! their signatures.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;

use crate::clock::Millis;

/// One thing a deletion removed, as its receipt lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct RemovedItem {
    /// What it was: a session, payload, derived payload, archive entry,
    /// line index, Inspect cache entry or content blob.
    pub kind: String,
    /// Its ID: a session or payload ID, or for a content blob its SHA-256.
    pub id: String,
    /// The session it belonged to.
    pub session_id: String,
    /// SHA-256 of its content, for payloads and blobs.
    pub content_sha256: String,
    /// Bytes it freed (payloads count their size; a blob shared by
    /// deduplication is freed with its last reference).
    pub bytes: u64,
    /// Why it went, when not asked for by name: "derived from pl_…".
    pub because: String,
}

/// File name of the key inside the data directory.
pub const KEY_FILE: &str = "receipt-key";

/// The fields of a receipt that its signature covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed<'a> {
    /// Receipt ID.
    pub id: &'a str,
    /// Deleted session or payload.
    pub target_id: &'a str,
    /// Why.
    pub reason: &'a str,
    /// Who asked.
    pub requested_by: &'a str,
    /// When, in milliseconds since the epoch.
    pub deleted_ms: Millis,
    /// Removed payloads.
    pub deleted_payload_ids: Vec<&'a str>,
    /// Bytes removed.
    pub bytes_deleted: u64,
    /// Hashes of the removed payloads.
    pub content_sha256: Vec<&'a str>,
    /// Everything removed, item by item.
    pub removed: &'a [RemovedItem],
    /// When every live replica had purged its local copies (fleet mode),
    /// with how many replicas that was; `None` leaves both out.
    pub purge_confirmed: Option<PurgeConfirmation>,
}

/// When the purge of a deletion was confirmed across replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeConfirmation {
    /// When the last live replica had passed the deletion's purge entry, in
    /// milliseconds since the epoch.
    pub at_ms: Millis,
    /// How many live replicas confirmed it (the deleting one included).
    pub replicas: u32,
}

impl PurgeConfirmation {
    /// A receipt message's confirmation as its signature covers it, from
    /// `purge_confirmed_at` (a protobuf timestamp's seconds and nanos) and
    /// `purge_replicas`: present exactly when the time is.
    pub fn from_message(at: Option<(i64, i32)>, replicas: u32) -> Option<Self> {
        at.map(|(seconds, nanos)| PurgeConfirmation {
            at_ms: timestamp_millis(seconds, nanos),
            replicas,
        })
    }
}

/// Milliseconds since the epoch of a protobuf timestamp's seconds and
/// nanos (sub-millisecond digits dropped, as the canonical form has none).
pub fn timestamp_millis(seconds: i64, nanos: i32) -> Millis {
    seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(nanos) / 1_000_000)
}

/// RFC 3339 UTC with milliseconds, as the canonical form uses.
pub fn rfc3339_millis(ms: Millis) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// The canonical bytes.
pub fn canonical(r: &Signed<'_>) -> Vec<u8> {
    let strings =
        |v: &[&str]| Value::Array(v.iter().map(|s| Value::String((*s).to_owned())).collect());
    let mut m: BTreeMap<&str, Value> = BTreeMap::new();
    m.insert("bytes_deleted", Value::from(r.bytes_deleted));
    m.insert("content_sha256", strings(&r.content_sha256));
    m.insert("deleted_at", Value::String(rfc3339_millis(r.deleted_ms)));
    m.insert("deleted_payload_ids", strings(&r.deleted_payload_ids));
    m.insert("id", Value::String(r.id.to_owned()));
    m.insert("reason", Value::String(r.reason.to_owned()));
    m.insert(
        "removed",
        Value::Array(r.removed.iter().map(removed_item).collect()),
    );
    m.insert("requested_by", Value::String(r.requested_by.to_owned()));
    m.insert("target_id", Value::String(r.target_id.to_owned()));
    if let Some(p) = r.purge_confirmed {
        m.insert("purge_confirmed_at", Value::String(rfc3339_millis(p.at_ms)));
        m.insert("purge_replicas", Value::from(p.replicas));
    }
    serde_json::to_vec(&m).expect("a map of JSON values serializes")
}

/// One removed item as a JSON object with sorted keys (the crate's maps
/// keep insertion order, so the order is spelled out here).
fn removed_item(i: &RemovedItem) -> Value {
    let mut m: BTreeMap<&str, Value> = BTreeMap::new();
    m.insert("because", Value::String(i.because.clone()));
    m.insert("bytes", Value::from(i.bytes));
    m.insert("content_sha256", Value::String(i.content_sha256.clone()));
    m.insert("id", Value::String(i.id.clone()));
    m.insert("kind", Value::String(i.kind.clone()));
    m.insert("session_id", Value::String(i.session_id.clone()));
    serde_json::to_value(m).expect("a map of JSON values serializes")
}

/// The server's receipt key.
#[derive(Clone)]
pub struct ReceiptKey([u8; 32]);

impl std::fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReceiptKey(..)")
    }
}

impl ReceiptKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Self(key)
    }

    /// The key in hex, as [`KEY_FILE`] holds it.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// A key from its hex form.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut key = [0u8; 32];
        hex::decode_to_slice(text, &mut key).ok()?;
        Some(Self(key))
    }

    fn mac(&self, r: &Signed<'_>) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(&canonical(r));
        mac
    }

    /// The hex signature of a receipt.
    pub fn sign(&self, r: &Signed<'_>) -> String {
        hex::encode(self.mac(r).finalize().into_bytes())
    }

    /// Whether `signature` is this key's signature of the receipt (constant time).
    pub fn verify(&self, r: &Signed<'_>, signature: &str) -> bool {
        let Ok(sig) = hex::decode(signature) else {
            return false;
        };
        self.mac(r).verify_slice(&sig).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> Signed<'static> {
        Signed {
            id: "rcpt_00000000000000000000000000000001",
            target_id: "ses_00000000000000000000000000000002",
            reason: "done \"now\"",
            requested_by: "alice",
            deleted_ms: 1_796_031_106_334,
            deleted_payload_ids: vec!["pl_00000000000000000000000000000003"],
            bytes_deleted: 42,
            content_sha256: vec!["ab"],
            removed: &[],
            purge_confirmed: None,
        }
    }

    #[test]
    fn canonical_bytes_are_sorted_compact_json() {
        let c = String::from_utf8(canonical(&receipt())).unwrap();
        assert_eq!(
            c,
            r#"{"bytes_deleted":42,"content_sha256":["ab"],"deleted_at":"2026-11-30T09:31:46.334Z","deleted_payload_ids":["pl_00000000000000000000000000000003"],"id":"rcpt_00000000000000000000000000000001","reason":"done \"now\"","removed":[],"requested_by":"alice","target_id":"ses_00000000000000000000000000000002"}"#
        );
    }

    #[test]
    fn signatures_verify_and_any_change_breaks_them() {
        let key = ReceiptKey::from_hex(&"11".repeat(32)).unwrap();
        let r = receipt();
        let sig = key.sign(&r);
        assert!(key.verify(&r, &sig));
        let mut tampered = r.clone();
        tampered.bytes_deleted = 43;
        assert!(!key.verify(&tampered, &sig));
        let other = ReceiptKey::from_hex(&"22".repeat(32)).unwrap();
        assert!(!other.verify(&r, &sig));
        assert!(!key.verify(&r, "zz"));
    }

    #[test]
    fn a_receipt_without_a_purge_confirmation_keeps_its_bytes_and_signature() {
        // The signature of this receipt as every version before the field
        // made it (the canonical bytes above, under key 11…11).
        let key = ReceiptKey::from_hex(&"11".repeat(32)).unwrap();
        let r = receipt();
        assert!(!String::from_utf8(canonical(&r)).unwrap().contains("purge"));
        assert_eq!(
            key.sign(&r),
            hex::encode(
                Hmac::<Sha256>::new_from_slice(&[0x11; 32])
                    .unwrap()
                    .chain_update(br#"{"bytes_deleted":42,"content_sha256":["ab"],"deleted_at":"2026-11-30T09:31:46.334Z","deleted_payload_ids":["pl_00000000000000000000000000000003"],"id":"rcpt_00000000000000000000000000000001","reason":"done \"now\"","removed":[],"requested_by":"alice","target_id":"ses_00000000000000000000000000000002"}"#)
                    .finalize()
                    .into_bytes()
            )
        );
    }

    #[test]
    fn a_purge_confirmation_is_signed_and_cannot_be_added_changed_or_dropped() {
        let key = ReceiptKey::from_hex(&"11".repeat(32)).unwrap();
        let plain = receipt();
        let confirmed = Signed {
            purge_confirmed: Some(PurgeConfirmation {
                at_ms: 1_796_031_106_900,
                replicas: 3,
            }),
            ..receipt()
        };
        let c = String::from_utf8(canonical(&confirmed)).unwrap();
        assert!(
            c.contains(r#""id":"rcpt_00000000000000000000000000000001","purge_confirmed_at":"2026-11-30T09:31:46.900Z","purge_replicas":3,"reason""#),
            "{c}"
        );
        let sig = key.sign(&confirmed);
        assert!(key.verify(&confirmed, &sig));
        // Dropped, or added to a receipt signed without it.
        assert!(!key.verify(&plain, &sig));
        assert!(!key.verify(&confirmed, &key.sign(&plain)));
        // Changed.
        for changed in [
            PurgeConfirmation {
                at_ms: 1_796_031_106_901,
                replicas: 3,
            },
            PurgeConfirmation {
                at_ms: 1_796_031_106_900,
                replicas: 2,
            },
        ] {
            let mut t = confirmed.clone();
            t.purge_confirmed = Some(changed);
            assert!(!key.verify(&t, &sig));
        }
    }
}
