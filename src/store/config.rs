//! The `[store]` configuration section: which engine, and its cache.

use serde::{Deserialize, Serialize};

/// Which embedded engine holds the metadata.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// redb: ACID commits made durable with `fdatasync` (the default).
    #[default]
    Redb,
    /// sled 0.34: flushed, then its files fsynced before a commit returns.
    Sled,
}

impl EngineKind {
    /// The engine's name as used in config.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Redb => "redb",
            EngineKind::Sled => "sled",
        }
    }
}

/// The `[store]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `"redb"` (default) or `"sled"`.
    pub engine: EngineKind,
    /// The metadata engine's page cache, in bytes (default 64 MiB).
    pub cache_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            engine: EngineKind::default(),
            cache_bytes: super::engine::DEFAULT_CACHE_BYTES,
        }
    }
}
