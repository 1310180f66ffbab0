//! The `[store]` configuration section: which engine, its cache, and for
//! fleet mode the Postgres database the replicas share.

use serde::{Deserialize, Serialize};

/// Which engine holds the metadata.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// redb: ACID commits made durable with `fdatasync` (the default).
    #[default]
    Redb,
    /// sled 0.34: flushed, then its files fsynced before a commit returns.
    Sled,
    /// PostgreSQL at `store.postgres_url`, shared by every replica (fleet
    /// mode).
    Postgres,
}

impl EngineKind {
    /// The engine's name as used in config.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Redb => "redb",
            EngineKind::Sled => "sled",
            EngineKind::Postgres => "postgres",
        }
    }
}

/// The `[store]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `"redb"` (default), `"sled"` or `"postgres"`.
    pub engine: EngineKind,
    /// The metadata engine's page cache, in bytes (default 64 MiB; the
    /// embedded engines only).
    pub cache_bytes: usize,
    /// With `engine = "postgres"`: the database, as a libpq URL
    /// (`postgres://user:password@host:port/db`) or key=value string.
    pub postgres_url: String,
    /// With `engine = "postgres"`: connections for reads and commits
    /// (default 16), and as many again for cross-replica locks.
    pub postgres_pool_size: usize,
    /// Where payload bytes live: empty for the data directory (default),
    /// or `s3://bucket/prefix` for S3-compatible object storage, which
    /// fleet replicas share.
    pub blobs: String,
    /// With `blobs = "s3://…"`: the endpoint and credentials.
    pub s3: super::object_blobs::S3Config,
    /// With `blobs = "s3://…"`: how many bytes of local copies each
    /// replica keeps for execs, Search and Inspect (default 8 GiB).
    pub local_cache_bytes: u64,
    /// With `blobs = "s3://…"`: how often each replica removes its local
    /// copies of what any replica deleted (default 250 ms).
    #[serde(with = "humantime_serde")]
    pub purge_interval: std::time::Duration,
    /// With `blobs = "s3://…"`: how long DeletePayload and DeleteSession
    /// wait for every live replica to purge its local copies before they
    /// answer (default 5 s); the receipt then says when that was, and
    /// leaves it out when the wait ran out.
    #[serde(with = "humantime_serde")]
    pub purge_confirm_timeout: std::time::Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            engine: EngineKind::default(),
            cache_bytes: super::engine::DEFAULT_CACHE_BYTES,
            postgres_url: String::new(),
            postgres_pool_size: 16,
            blobs: String::new(),
            s3: super::object_blobs::S3Config::default(),
            local_cache_bytes: 8 << 30,
            purge_interval: std::time::Duration::from_millis(250),
            purge_confirm_timeout: std::time::Duration::from_secs(5),
        }
    }
}
