//! The store's side of receipt signing ([`crate::receipt`]): the key file
//! in the data directory, made at first start, and a stored receipt's
//! signed fields.

use std::path::Path;

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
