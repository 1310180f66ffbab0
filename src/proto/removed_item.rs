//! A receipt's removed item and its message carry the same six fields;
//! these are the one place that says so.

use crate::receipt;

impl From<&receipt::RemovedItem> for super::RemovedItem {
    fn from(i: &receipt::RemovedItem) -> Self {
        Self {
            kind: i.kind.clone(),
            id: i.id.clone(),
            session_id: i.session_id.clone(),
            content_sha256: i.content_sha256.clone(),
            bytes: i.bytes,
            because: i.because.clone(),
        }
    }
}

impl From<super::RemovedItem> for receipt::RemovedItem {
    fn from(i: super::RemovedItem) -> Self {
        Self {
            kind: i.kind,
            id: i.id,
            session_id: i.session_id,
            content_sha256: i.content_sha256,
            bytes: i.bytes,
            because: i.because,
        }
    }
}
