//! The Inspect cache: inferred structures by content, so the same bytes
//! are inferred once however many payloads (or sessions) hold them.
//!
//! Entries are keyed by the bytes' SHA-256 and the content type (detection
//! takes the type into account). The cache is bounded; when full it starts
//! over. A deletion that frees the last copy of some bytes in a session
//! forgets their entry through [`crate::store::ContentCache`], and its
//! receipt lists the entry.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::{Arc, Mutex, MutexGuard};

use super::structure::{self, Structure};

/// Cached structures kept at most.
pub const CAPACITY: usize = 1024;

/// Inferred structures by (SHA-256, content type).
#[derive(Debug, Default)]
pub struct StructureCache {
    entries: Mutex<HashMap<(String, String), Arc<Structure>>>,
}

/// What the cache needs to know of the bytes it infers.
#[derive(Debug, Clone, Copy)]
pub struct Content<'a> {
    /// Hex SHA-256 of the bytes.
    pub sha256: &'a str,
    /// Their content type, as stored.
    pub content_type: &'a str,
    /// Their size in bytes.
    pub size: u64,
    /// Their line count.
    pub line_count: u64,
}

impl StructureCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Arc<Structure>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The structure of `content`: cached, or inferred from the reader
    /// `open` gives (and then cached). The lock is not held while inferring.
    pub fn get_or_infer<R: Read, E: From<io::Error>>(
        &self,
        content: Content<'_>,
        open: impl FnOnce() -> Result<R, E>,
    ) -> Result<Arc<Structure>, E> {
        let key = (content.sha256.to_owned(), content.content_type.to_owned());
        if let Some(s) = self.lock().get(&key) {
            return Ok(s.clone());
        }
        let reader = io::BufReader::with_capacity(256 * 1024, open()?);
        let inferred = Arc::new(structure::infer(
            reader,
            content.size,
            content.line_count,
            content.content_type,
        )?);
        let mut entries = self.lock();
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(key, inferred.clone());
        Ok(inferred)
    }

    /// Whether a structure of these bytes is cached (under any type).
    pub fn holds(&self, sha256: &str) -> bool {
        self.lock().keys().any(|(sha, _)| sha == sha256)
    }

    /// Drops every cached structure of these bytes.
    pub fn forget(&self, sha256: &str) {
        self.lock().retain(|(sha, _), _| sha != sha256);
    }
}

impl crate::store::ContentCache for StructureCache {
    fn holds(&self, sha256: &str) -> bool {
        StructureCache::holds(self, sha256)
    }

    fn forget(&self, sha256: &str) {
        StructureCache::forget(self, sha256);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content<'a>(sha256: &'a str, bytes: &[u8]) -> Content<'a> {
        Content {
            sha256,
            content_type: "application/json",
            size: bytes.len() as u64,
            line_count: 1,
        }
    }

    #[test]
    fn the_same_bytes_are_inferred_once_and_forgotten_on_request() {
        let cache = StructureCache::new();
        let bytes = br#"{"a":[1,2,3]}"#;
        let opened = std::cell::Cell::new(0);
        let inspect = || {
            cache
                .get_or_infer(content("aa", bytes), || {
                    opened.set(opened.get() + 1);
                    Ok::<_, io::Error>(&bytes[..])
                })
                .unwrap();
        };
        for _ in 0..3 {
            inspect();
        }
        assert_eq!(opened.get(), 1, "inferred once, then served from the cache");
        assert!(cache.holds("aa") && !cache.holds("bb"));
        cache.forget("aa");
        assert!(!cache.holds("aa"));
        inspect();
        assert_eq!(opened.get(), 2, "inferred again after being forgotten");
    }

    #[test]
    fn a_failed_open_caches_nothing() {
        let cache = StructureCache::new();
        let err = cache
            .get_or_infer(content("cc", b""), || {
                Err::<&[u8], _>(io::Error::other("gone"))
            })
            .unwrap_err();
        assert_eq!(err.to_string(), "gone");
        assert!(!cache.holds("cc"));
    }
}
