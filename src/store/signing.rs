//! The store's side of receipt signing ([`crate::receipt`]): the key file
//! in the data directory, made at first start (or, in fleet mode, one key
//! in the shared engine, so a receipt signed by any replica verifies on
//! every one), and a stored receipt's signed fields.

use std::path::Path;

use super::StoreError;
use super::engine::{Engine, Tree, lock_key};
use super::records::ReceiptRecord;
use crate::receipt::{KEY_FILE, ReceiptKey, Signed};

impl<'a> From<&'a ReceiptRecord> for Signed<'a> {
    fn from(r: &'a ReceiptRecord) -> Self {
        Signed {
            id: r.id.as_str(),
            target_id: &r.target_id,
            reason: &r.reason,
            requested_by: &r.requested_by,
            deleted_ms: r.deleted_ms,
            deleted_payload_ids: r.deleted_payload_ids.iter().map(|p| p.as_str()).collect(),
            bytes_deleted: r.bytes_deleted,
            content_sha256: r.content_sha256.iter().map(String::as_str).collect(),
            removed: &r.removed,
            purge_confirmed: r.purge_confirmed,
        }
    }
}

/// Loads `<data_dir>/receipt-key`, making it (mode 0600) on first start.
pub fn load_or_create_key(data_dir: &Path) -> std::io::Result<ReceiptKey> {
    let path = data_dir.join(KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => ReceiptKey::from_hex(text.trim())
            .ok_or_else(|| std::io::Error::other("the receipt key file is not 64 hex digits")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).map_err(std::io::Error::other)?;
            let key = ReceiptKey::from_bytes(key);
            crate::fsutil::write_private(&path, key.to_hex().as_bytes())?;
            Ok(key)
        }
        Err(e) => Err(e),
    }
}

/// The receipt key's entry in [`Tree::Meta`] on a shared engine.
const SHARED_KEY: &[u8] = b"receipt_key";

/// Loads the fleet's receipt key from the shared engine, making it once
/// (under a lock across replicas, so two first starts agree on one key),
/// and keeps a copy in `<data_dir>/receipt-key`, so `spillway receipt
/// verify` on any replica's host checks receipts from every replica.
pub fn load_or_create_shared_key(
    engine: &dyn Engine,
    data_dir: &Path,
) -> Result<ReceiptKey, StoreError> {
    let key = shared_key(engine)?;
    let path = data_dir.join(KEY_FILE);
    if std::fs::read_to_string(&path)
        .ok()
        .as_deref()
        .map(str::trim)
        != Some(key.to_hex().as_str())
    {
        crate::fsutil::write_private(&path, key.to_hex().as_bytes())?;
    }
    Ok(key)
}

fn shared_key(engine: &dyn Engine) -> Result<ReceiptKey, StoreError> {
    let parse = |raw: Vec<u8>| {
        std::str::from_utf8(&raw)
            .ok()
            .and_then(ReceiptKey::from_hex)
            .ok_or_else(|| {
                StoreError::Invalid("the stored receipt key is not 64 hex digits".into())
            })
    };
    if let Some(raw) = engine.get(Tree::Meta, SHARED_KEY)? {
        return parse(raw);
    }
    let _one = engine.lock(&[lock_key("store", SHARED_KEY)])?;
    if let Some(raw) = engine.get(Tree::Meta, SHARED_KEY)? {
        return parse(raw);
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| StoreError::Io(std::io::Error::other(e)))?;
    let key = ReceiptKey::from_bytes(key);
    engine.put(Tree::Meta, SHARED_KEY, key.to_hex().as_bytes())?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_private_and_reloaded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create_key(dir.path()).unwrap();
        let b = load_or_create_key(dir.path()).unwrap();
        assert_eq!(a.to_hex(), b.to_hex());
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
