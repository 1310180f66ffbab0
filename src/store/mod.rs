//! Durable session storage: metadata in typed trees over one
//! [`engine::Engine`] (redb or sled, or Postgres shared by fleet replicas), payload bytes in per-session
//! directories reached through cap-std. The store only stores: it audits
//! nothing (a deletion returns its receipt, and the caller audits it; the
//! [`crate::audit`] log is a separate room over the same engine, see
//! [`open_engine`]), caches no Inspect results (it tells a
//! [`ContentCache`] which bytes a deletion freed), and holds no policy
//! logic beyond the quotas it is handed.
//!
//! The door: [`Store`] and its inputs and outputs ([`StoreSettings`],
//! [`NewSession`], [`UploadMeta`], [`Quota`], [`ReadSpec`], [`Page`]), the
//! stored records ([`SessionRecord`], [`PayloadRecord`], [`ReceiptRecord`]
//! and the rest) with their value codec ([`encode_record`],
//! [`decode_record`]), the engine interface ([`engine`], the one module
//! left public, because the audit room and the conformance suites build on
//! it) with its engines, and [`StoreError`]. Everything else is private to
//! the room.
//!
//! The write path: bytes stream into a temporary file (scanned on the way
//! for hash, lines and the line index), the file is fsynced and renamed into
//! place, the directory is fsynced, the metadata commits durably, and only
//! then is the write acknowledged. A crash anywhere before the commit leaves
//! at most a temporary or orphaned file, which reconciliation removes at
//! the next start ([`ReconcileReport`]).
//!
//! Every method blocks; the API layer calls them from `spawn_blocking`.

mod blobs;
mod bridge;
mod config;
mod content;
mod delete;
pub use delete::PurgeStep;
pub mod engine;
mod expiry;
mod history;
mod lines;
mod names;
mod object_blobs;
mod postgres_engine;
mod read;
mod reconcile;
mod records;
mod redb_engine;
mod signing;
mod sled_engine;

use std::collections::BTreeMap;
use std::io;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use cap_std::fs::File;

use crate::clock::{self, Clock, Millis};
use crate::ids::{PayloadId, ReceiptId, SessionId};
use crate::policy::PolicyOverrides;
use crate::receipt::{ReceiptKey, Signed};
use blobs::{BlobStore, TempFile};
use content::Scan;
use engine::{Batch, Engine, EngineError, Tree};
use read::{Extent, ReadError};
use records::keys;

pub use config::{EngineKind, StoreConfig};
pub use expiry::{REAPER, ReapStep};
pub use history::{HISTORY_DAYS, UsageSample};
pub use lines::{LineIndex, LineIndexBuilder, STRIDE as LINE_INDEX_STRIDE};
pub use names::base_name;
pub use object_blobs::{ObjectBlobs, ObjectError, S3Config};
pub use postgres_engine::{PostgresEngine, PostgresSettings};
pub use read::{ReadOut, ReadSpec};
pub use reconcile::ReconcileReport;
pub use records::{
    LegalHold, PayloadRecord, ReceiptRecord, RecordError, RemovedItem, SessionRecord, SessionState,
    TenantPolicyRecord, VALUE_FORMAT, decode as decode_record, encode as encode_record,
};
pub use redb_engine::RedbEngine;
pub use sled_engine::SledEngine;

/// Errors of the storage layer. `crate::error` maps each to a gRPC status.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such session, or no such payload.
    #[error("{kind} {id} not found{}", crate::ids::not_found_next(kind))]
    NotFound {
        /// "session" or "payload".
        kind: &'static str,
        /// The ID asked for.
        id: String,
    },
    /// The session no longer accepts writes.
    #[error("session {0} is closed and read-only; create a new session to store more payloads")]
    SessionClosed(SessionId),
    /// A legal hold forbids deleting the session's data.
    #[error(
        "session {session} is under legal hold (placed by {by}: {reason:?}); nothing of it can be deleted until compliance or an admin lifts the hold (SetLegalHold hold=false)"
    )]
    LegalHold {
        /// The held session.
        session: SessionId,
        /// Who placed the hold.
        by: String,
        /// Why.
        reason: String,
    },
    /// A malformed request.
    #[error("{0}")]
    Invalid(String),
    /// A range past the end of a payload.
    #[error("{0}")]
    OutOfRange(String),
    /// A configured limit was hit.
    #[error("{limit} is {value} bytes and this upload exceeds it; {hint}")]
    TooLarge {
        /// The limit's config key.
        limit: &'static str,
        /// Its value.
        value: u64,
        /// What to do.
        hint: &'static str,
    },
    /// A policy quota would be exceeded; nothing was stored.
    #[error(
        "policy quota {quota} is {limit} {unit} for session {session}, which already uses {usage}; this payload would make it {would_be}. Nothing was stored. Delete payloads the session no longer needs (DeletePayload), or ask an admin or compliance officer to raise {quota}"
    )]
    QuotaExceeded {
        /// The policy field.
        quota: &'static str,
        /// Its value.
        limit: u64,
        /// "bytes" or "payloads".
        unit: &'static str,
        /// The session.
        session: SessionId,
        /// Usage before this payload.
        usage: u64,
        /// Usage with it.
        would_be: u64,
    },
    /// `expected_sha256` did not match; nothing was stored.
    #[error(
        "sha256 mismatch: expected {expected}, received bytes hash to {actual}; nothing was stored"
    )]
    ChecksumMismatch {
        /// What the client said.
        expected: String,
        /// What arrived.
        actual: String,
    },
    /// The payload's file is gone (found missing at startup).
    #[error(
        "payload {0}'s bytes are missing from disk; its metadata remains, but its content cannot be served"
    )]
    DataLoss(PayloadId),
    /// The disk is full.
    #[error("the server's disk is full; delete payloads or sessions, or retry later")]
    DiskFull,
    /// Object storage (fleet mode) failed or is unreachable.
    #[error(transparent)]
    Objects(#[from] ObjectError),
    /// The metadata engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A stored record could not be decoded.
    #[error("corrupt metadata record: {0}")]
    Corrupt(#[from] RecordError),
    /// File I/O failed.
    #[error("payload file I/O failed: {0}")]
    Io(io::Error),
}

impl From<io::Error> for StoreError {
    fn from(e: io::Error) -> Self {
        // ENOSPC and EDQUOT: the caller can act on those.
        if matches!(e.raw_os_error(), Some(28) | Some(122))
            || e.kind() == io::ErrorKind::StorageFull
        {
            StoreError::DiskFull
        } else {
            StoreError::Io(e)
        }
    }
}

impl From<ReadError> for StoreError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Invalid(m) => StoreError::Invalid(m),
            ReadError::OutOfRange(m) => StoreError::OutOfRange(m),
            ReadError::Io(e) => e.into(),
        }
    }
}

/// Result alias of this layer.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What the store needs from the configuration.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// Engine to use.
    pub engine: EngineKind,
    /// Largest payload.
    pub max_payload_bytes: u64,
    /// Payload retention.
    pub retention: Duration,
    /// Session TTL.
    pub session_ttl: Duration,
    /// The metadata engine's page cache, in bytes.
    pub cache_bytes: usize,
    /// The Postgres database and pool, with `engine = postgres`.
    pub postgres: Option<PostgresSettings>,
    /// Payload bytes in a bucket (`s3://bucket/prefix`), with the local
    /// copies bounded by `local_cache_bytes`; `None` keeps them on the
    /// local disk only.
    pub objects: Option<ObjectSettings>,
}

/// Where payload bytes go in fleet mode.
#[derive(Debug, Clone)]
pub struct ObjectSettings {
    /// `s3://bucket/prefix`.
    pub url: String,
    /// Endpoint and credentials.
    pub s3: S3Config,
    /// Bytes of local copies each replica keeps at most.
    pub local_cache_bytes: u64,
    /// How long a deletion waits for every live replica's purge.
    pub purge_confirm_timeout: std::time::Duration,
}

/// What a new session is made of.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// Tenant.
    pub tenant: String,
    /// Owner.
    pub owner: String,
    /// Label.
    pub label: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Parent session.
    pub parent: Option<SessionId>,
    /// Principals to share with.
    pub share_with: Vec<String>,
    /// The session's policy overrides.
    pub policy: PolicyOverrides,
    /// Its TTL, when shorter than the store's default.
    pub ttl: Option<Duration>,
}

/// What an upload says about itself.
#[derive(Debug, Clone, Default)]
pub struct UploadMeta {
    /// Preferred name.
    pub name: String,
    /// Content type.
    pub content_type: String,
    /// Tool.
    pub tool_name: String,
    /// Tool call.
    pub tool_call_id: String,
    /// Error result?
    pub is_error: bool,
    /// Hex SHA-256 the bytes must have.
    pub expected_sha256: Option<String>,
    /// Payloads this one derives from.
    pub derived_from: Vec<PayloadId>,
    /// Redactions made before the bytes reached the store (counts only);
    /// [`PendingUpload::set_redactions`] sets them once a stream is done.
    pub redactions: crate::redact::RedactCounts,
    /// The recall key, when this is an archived history result.
    pub archive_key: String,
    /// The session's quotas, from its effective policy.
    pub quota: Quota,
}

/// A session's quotas from its effective policy; zero means no quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Bytes the session may store (deduplicated bytes count once).
    pub max_session_bytes: u64,
    /// Largest payload, in bytes.
    pub max_payload_bytes: u64,
    /// Payloads the session may hold.
    pub max_payloads: u64,
}

/// A page of results and the token for the next one.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Empty when this was the last page.
    pub next_token: String,
}

const LOCK_STRIPES: usize = 64;

/// Locks held in this process and, on a shared engine, across replicas;
/// the replicas' locks go first when this drops.
struct Held<'a> {
    _engine: engine::EngineLock,
    _local: Vec<MutexGuard<'a, ()>>,
}

/// The store.
pub struct Store {
    engine: Arc<dyn Engine>,
    blobs: BlobStore,
    clock: Arc<dyn Clock>,
    settings: StoreSettings,
    /// Serializes metadata read-modify-write per session (striped).
    stripes: Vec<Mutex<()>>,
    /// Signs deletion receipts.
    receipt_key: ReceiptKey,
    /// Serializes tenant-policy updates.
    policy_lock: Mutex<()>,
    /// Serializes deletions, which lock several sessions at once.
    delete_lock: Mutex<()>,
    /// Results derived from stored bytes and cached outside the store
    /// (the Inspect cache); a deletion that frees bytes forgets theirs.
    content_cache: Arc<dyn ContentCache>,
    /// The bucket that holds every payload's bytes (fleet mode); the local
    /// directories are then a bounded cache of it.
    objects: Option<ObjectBlobs>,
}

/// What is derived from stored bytes and cached by their SHA-256 outside
/// the store (the Inspect cache). A deletion that frees the last copy of
/// some bytes in a session lists the cached entry in its receipt, when
/// there is one, and forgets it.
pub trait ContentCache: Send + Sync {
    /// Whether anything is cached for these bytes.
    fn holds(&self, sha256: &str) -> bool;
    /// Drops what is cached for these bytes.
    fn forget(&self, sha256: &str);
}

/// A [`ContentCache`] that caches nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoContentCache;

impl ContentCache for NoContentCache {
    fn holds(&self, _sha256: &str) -> bool {
        false
    }

    fn forget(&self, _sha256: &str) {}
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("engine", &self.engine.name())
            .finish_non_exhaustive()
    }
}

/// Opens (creating if needed) the metadata engine of `data_dir` and checks
/// its schema: the handle [`Store::open`] and the audit log share.
pub fn open_engine(data_dir: &Path, settings: &StoreSettings) -> Result<Arc<dyn Engine>> {
    crate::fsutil::create_private_dir_all(data_dir)?;
    let engine: Arc<dyn Engine> = match settings.engine {
        EngineKind::Redb => {
            let path = data_dir.join("meta.redb");
            let engine = redb_engine::RedbEngine::open(&path, settings.cache_bytes)?;
            // Names, labels and the audit log are tenants' data too.
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(crate::fsutil::PRIVATE_FILE_MODE),
            )?;
            Arc::new(engine)
        }
        EngineKind::Sled => {
            let path = data_dir.join("meta.sled");
            let engine = sled_engine::SledEngine::open(&path, settings.cache_bytes)?;
            crate::fsutil::make_private(&path)?;
            Arc::new(engine)
        }
        EngineKind::Postgres => {
            let pg = settings.postgres.as_ref().ok_or_else(|| {
                StoreError::Invalid("store.engine = \"postgres\" needs store.postgres_url".into())
            })?;
            Arc::new(postgres_engine::PostgresEngine::open(pg)?)
        }
    };
    check_schema(engine.as_ref())?;
    Ok(engine)
}

impl Store {
    /// Opens the store in `data_dir` over `engine` (from [`open_engine`]),
    /// finishes the deletions a crash interrupted and reconciles disk with
    /// metadata. Deletions forget what `content_cache` holds of the bytes
    /// they free.
    ///
    /// `finished` is called with the receipt of each interrupted deletion
    /// once its files are gone and before its intent is removed, so the
    /// caller can audit it durably: a crash in between finishes (and
    /// reports) it again at the next start, never silently. An error from
    /// `finished` stops the opening.
    pub fn open(
        engine: Arc<dyn Engine>,
        data_dir: &Path,
        settings: StoreSettings,
        clock: Arc<dyn Clock>,
        content_cache: Arc<dyn ContentCache>,
        finished: &mut dyn FnMut(&ReceiptRecord) -> Result<()>,
    ) -> Result<(Self, ReconcileReport)> {
        let shared = engine.shared();
        let objects = match &settings.objects {
            Some(o) => Some(ObjectBlobs::open(&o.url, &o.s3, o.local_cache_bytes)?),
            None => None,
        };
        let receipt_key = if shared {
            signing::load_or_create_shared_key(engine.as_ref(), data_dir)?
        } else {
            signing::load_or_create_key(data_dir)?
        };
        let store = Self {
            engine,
            blobs: BlobStore::open(data_dir, shared)?,
            clock,
            settings,
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            content_cache,
            receipt_key,
            objects,
            policy_lock: Mutex::new(()),
            delete_lock: Mutex::new(()),
        };
        let count = store.finish_interrupted(finished)?;
        let mut report = reconcile::reconcile(&store)?;
        report.deletions_finished = count as u64;
        Ok((store, report))
    }

    /// The engine's name.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// Current time.
    pub fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    /// Takes or renews the reaper's lease for `holder` (this replica) for
    /// `ttl`: `None` while another replica holds it. An embedded engine
    /// always grants it.
    pub fn reaper_lease(&self, holder: &str, ttl: Duration) -> Result<Option<engine::Lease>> {
        Ok(self.engine.lease(REAPER, holder, ttl)?)
    }

    /// Gives up the reaper's lease if `holder` has it (at shutdown), so
    /// another replica takes over at once.
    pub fn release_reaper_lease(&self, holder: &str) -> Result<()> {
        Ok(self.engine.release_lease(REAPER, holder)?)
    }

    /// Whether replicas share the metadata (fleet mode).
    pub fn is_shared(&self) -> bool {
        self.engine.shared()
    }

    /// Flushes the engine; called at shutdown.
    pub fn flush(&self) -> Result<()> {
        Ok(self.engine.flush()?)
    }

    fn stripe_of(&self, session: &SessionId) -> usize {
        // The same stripe in every replica: the stripe names the lock that
        // a shared engine holds across them.
        let key = engine::lock_key("session", session.as_str().as_bytes());
        (key.unsigned_abs() % self.stripes.len() as u64) as usize
    }

    /// The lock key, across replicas, of stripe `i`.
    fn stripe_key(i: usize) -> engine::LockKey {
        engine::lock_key("session-stripe", &i.to_be_bytes())
    }

    /// Locks a session's metadata for a read-modify-write: its stripe in
    /// this process and, on a shared engine, in every replica.
    fn lock(&self, session: &SessionId) -> Result<Held<'_>> {
        let i = self.stripe_of(session);
        let local = self.stripes[i].lock().unwrap_or_else(|p| p.into_inner());
        Ok(Held {
            _engine: self.engine.lock(&[Self::stripe_key(i)])?,
            _local: vec![local],
        })
    }

    /// Takes `local` (in this process) and the lock `key` across replicas.
    fn lock_named<'a>(&self, local: &'a Mutex<()>, key: &str) -> Result<Held<'a>> {
        let local = local.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Held {
            _engine: self
                .engine
                .lock(&[engine::lock_key("store", key.as_bytes())])?,
            _local: vec![local],
        })
    }

    // ---- sessions -------------------------------------------------------

    /// Creates a session and its directory.
    pub fn create_session(&self, new: NewSession) -> Result<SessionRecord> {
        let now = self.now_ms();
        let record = SessionRecord {
            id: SessionId::generate(),
            tenant: new.tenant,
            owner: new.owner,
            label: new.label,
            labels: new.labels,
            state: SessionState::Open,
            created_ms: now,
            closed_ms: None,
            expires_ms: clock::add(
                now,
                new.ttl.map_or(self.settings.session_ttl, |t| {
                    t.min(self.settings.session_ttl)
                }),
            ),
            policy: new.policy,
            legal_hold: false,
            hold: None,
            parent: new.parent,
            share_with: new.share_with,
            usage_bytes: 0,
            usage_payloads: 0,
        };
        // Directory first: a crash before the commit leaves an empty
        // directory with no record, which reconciliation removes.
        self.blobs.create_session_dir(&record.id)?;
        let mut b = Batch::new();
        b.put(Tree::Sessions, record.id.as_str(), records::encode(&record))
            .put(
                Tree::TenantSessions,
                keys::tenant_session(&record.tenant, now, &record.id),
                [],
            )
            .put(
                Tree::Expiry,
                keys::expiry(record.expires_ms, keys::EXPIRY_SESSION, record.id.as_str()),
                [],
            );
        self.engine.commit(&b)?;
        Ok(record)
    }

    /// Reads a session.
    pub fn session(&self, id: &SessionId) -> Result<SessionRecord> {
        self.session_opt(id)?.ok_or_else(|| StoreError::NotFound {
            kind: "session",
            id: id.to_string(),
        })
    }

    fn session_opt(&self, id: &SessionId) -> Result<Option<SessionRecord>> {
        match self.engine.get(Tree::Sessions, id.as_str().as_bytes())? {
            Some(raw) => Ok(Some(records::decode(&raw)?)),
            None => Ok(None),
        }
    }

    /// Lists a tenant's sessions in creation order, keeping those `keep`
    /// accepts. Scans in bounded batches.
    pub fn list_sessions(
        &self,
        tenant: &str,
        page_token: &str,
        page_size: usize,
        keep: &dyn Fn(&SessionRecord) -> bool,
    ) -> Result<Page<SessionRecord>> {
        let prefix = keys::tenant_prefix(tenant);
        let after = decode_token(page_token, &prefix)?;
        let mut items = Vec::new();
        let next_token = self.each_tenant_session(&prefix, after, |key, id| {
            match self.session(&id) {
                Ok(s) if keep(&s) => items.push(s),
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            if items.len() < page_size {
                return Ok(ControlFlow::Continue(()));
            }
            let more = !self
                .engine
                .scan_prefix(Tree::TenantSessions, &prefix, Some(key), 1)?
                .is_empty();
            Ok(ControlFlow::Break(if more {
                hex::encode(&key[prefix.len()..])
            } else {
                String::new()
            }))
        })?;
        Ok(Page {
            items,
            next_token: next_token.unwrap_or_default(),
        })
    }

    /// Visits the sessions of a tenant (`prefix`, its
    /// [`keys::tenant_prefix`]) in creation order, from after the key
    /// `after`, in bounded batches: `visit` gets each entry's key and
    /// session ID, until it breaks with a value (returned) or the sessions
    /// run out (`None`).
    fn each_tenant_session<T>(
        &self,
        prefix: &[u8],
        mut after: Option<Vec<u8>>,
        mut visit: impl FnMut(&[u8], SessionId) -> Result<ControlFlow<T>>,
    ) -> Result<Option<T>> {
        loop {
            let batch =
                self.engine
                    .scan_prefix(Tree::TenantSessions, prefix, after.as_deref(), 256)?;
            let exhausted = batch.len() < 256;
            for (key, _) in batch {
                let id = SessionId::parse(&String::from_utf8_lossy(&key[prefix.len() + 8..]))
                    .map_err(|e| StoreError::Invalid(e.to_string()))?;
                if let ControlFlow::Break(t) = visit(&key, id)? {
                    return Ok(Some(t));
                }
                after = Some(key);
            }
            if exhausted {
                return Ok(None);
            }
        }
    }

    /// Makes a session read-only. Closing a closed session changes nothing.
    ///
    /// With `delete_on_close`, the session's payloads (and what derives
    /// from them) are deleted too, and the receipt returned. The close
    /// records the pending deletion in the expiry index in the same commit,
    /// so a crash or a legal hold only defers it: the reaper finishes it
    /// once nothing holds it back.
    pub fn close_session(
        &self,
        id: &SessionId,
        delete_on_close: bool,
    ) -> Result<(SessionRecord, Option<ReceiptRecord>)> {
        let s = {
            let _guard = self.lock(id)?;
            let mut s = self.session(id)?;
            if s.state == SessionState::Closed {
                return Ok((s, None));
            }
            s.state = SessionState::Closed;
            let now = self.now_ms();
            s.closed_ms = Some(now);
            let mut b = Batch::new();
            b.put(Tree::Sessions, id.as_str(), records::encode(&s));
            if delete_on_close {
                b.put(
                    Tree::Expiry,
                    keys::expiry(now, delete::EXPIRY_CLOSE, id.as_str()),
                    [],
                );
            }
            self.engine.commit(&b)?;
            s
        };
        if !delete_on_close || s.legal_hold {
            return Ok((s, None));
        }
        match self.delete(&delete::Request {
            target: delete::Target::SessionContents(id.clone()),
            requested_by: &s.owner,
            reason: "session closed with delete_on_close",
            fence: None,
        }) {
            Ok(receipt) => Ok((self.session(id)?, Some(receipt))),
            // The reaper got to it first.
            Err(StoreError::NotFound { .. }) => {
                Ok((self.session(id)?, self.deletion_receipt(id.as_str())?))
            }
            // A hold placed meanwhile, or a derived payload in a held
            // session: the reaper finishes it after the release.
            Err(StoreError::LegalHold { .. }) => Ok((s, None)),
            Err(e) => Err(e),
        }
    }

    /// Deletes a session: every payload, what derives from them, its
    /// metadata and its directory.
    pub fn delete_session(
        &self,
        id: &SessionId,
        requested_by: &str,
        reason: &str,
    ) -> Result<ReceiptRecord> {
        let (receipt, purge) = self.delete_logged(&delete::Request {
            target: delete::Target::Session(id.clone()),
            requested_by,
            reason,
            fence: None,
        })?;
        Ok(self.confirm_purge(receipt, purge))
    }

    /// Places (`Some`) or lifts (`None`) a legal hold on a session.
    pub fn set_legal_hold(&self, id: &SessionId, hold: Option<LegalHold>) -> Result<SessionRecord> {
        let _guard = self.lock(id)?;
        let mut s = self.session(id)?;
        s.legal_hold = hold.is_some();
        s.hold = hold;
        self.engine
            .put(Tree::Sessions, id.as_str().as_bytes(), &records::encode(&s))?;
        Ok(s)
    }

    // ---- tenant policies ------------------------------------------------

    /// A tenant's policy as set, if one was.
    pub fn tenant_policy(&self, tenant: &str) -> Result<Option<TenantPolicyRecord>> {
        match self.engine.get(Tree::TenantPolicies, tenant.as_bytes())? {
            Some(raw) => Ok(Some(records::decode(&raw)?)),
            None => Ok(None),
        }
    }

    /// Replaces a tenant's policy with what `update` makes of the current
    /// one. Updates of policies are serialized, so a check in `update` (a
    /// locked policy may only tighten) holds against the stored policy.
    pub fn update_tenant_policy<E: From<StoreError>>(
        &self,
        tenant: &str,
        update: impl FnOnce(Option<&TenantPolicyRecord>) -> Result<TenantPolicyRecord, E>,
    ) -> Result<TenantPolicyRecord, E> {
        let _guard = self.lock_named(&self.policy_lock, "tenant-policies")?;
        let current = self.tenant_policy(tenant)?;
        let record = update(current.as_ref())?;
        debug_assert_eq!(record.tenant, tenant);
        self.engine
            .put(
                Tree::TenantPolicies,
                tenant.as_bytes(),
                &records::encode(&record),
            )
            .map_err(StoreError::from)?;
        Ok(record)
    }

    /// The payload retention of a session: the shortest of the server
    /// default, the tenant's current policy and the session's overrides
    /// (the retention field of [`crate::policy::effective`]).
    fn retention_of(&self, s: &SessionRecord) -> Result<Duration> {
        let tenant = self.tenant_policy(&s.tenant)?;
        Ok([
            tenant.and_then(|t| t.policy.retention_ms),
            s.policy.retention_ms,
        ]
        .into_iter()
        .flatten()
        .map(Duration::from_millis)
        .fold(self.settings.retention, Duration::min))
    }

    // ---- payloads -------------------------------------------------------

    /// Starts an upload into an open session.
    pub fn begin_upload(&self, session: &SessionId, meta: UploadMeta) -> Result<PendingUpload<'_>> {
        let s = self.session(session)?;
        if s.state != SessionState::Open {
            return Err(StoreError::SessionClosed(session.clone()));
        }
        if let Some(h) = &meta.expected_sha256
            && !(h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(StoreError::Invalid(
                "expected_sha256 must be 64 hex digits".into(),
            ));
        }
        let q = meta.quota;
        check_count_quota(&q, &s)?;
        let dir = self.blobs.session_dir(session)?;
        Ok(PendingUpload {
            store: self,
            session: session.clone(),
            temp: TempFile::create(dir)?,
            scanner: Scan::new(),
            policy_limit: (q.max_payload_bytes > 0
                && q.max_payload_bytes < self.settings.max_payload_bytes)
                .then_some(q.max_payload_bytes),
            usage_at_start: s.usage_bytes,
            record_at_start: s,
            meta,
        })
    }

    /// Reads a payload's metadata.
    pub fn payload(&self, id: &PayloadId) -> Result<PayloadRecord> {
        self.payload_opt(id)?.ok_or_else(|| StoreError::NotFound {
            kind: "payload",
            id: id.to_string(),
        })
    }

    /// Finds a session's payload by name.
    pub fn payload_by_name(
        &self,
        session: &SessionId,
        name: &str,
    ) -> Result<Option<PayloadRecord>> {
        match self
            .engine
            .get(Tree::PayloadNames, &keys::payload_name(session, name))?
        {
            Some(raw) => {
                let id = std::str::from_utf8(&raw)
                    .ok()
                    .and_then(|s| PayloadId::parse(s).ok())
                    .ok_or(StoreError::Corrupt(RecordError::UnknownFormat(
                        raw.first().copied(),
                    )))?;
                self.payload_opt(&id)
            }
            None => Ok(None),
        }
    }

    /// The directory holding a payload's bytes, and the file's name in it:
    /// what a sandbox links from.
    pub fn payload_dir(&self, p: &PayloadRecord) -> Result<Arc<cap_std::fs::Dir>> {
        if p.missing {
            return Err(StoreError::DataLoss(p.id.clone()));
        }
        let dir = self.blobs.session_dir(&p.session_id)?;
        self.ensure_local(&dir, p)?;
        Ok(dir)
    }

    /// With object storage, makes sure this replica has the payload's
    /// bytes in `dir` (its session directory): a copy already here is
    /// used, else one fetch fills it (verified, then renamed into place)
    /// while concurrent readers of the same payload wait for it.
    fn ensure_local(&self, dir: &Arc<cap_std::fs::Dir>, p: &PayloadRecord) -> Result<()> {
        let Some(objects) = &self.objects else {
            return Ok(());
        };
        if self.local_copy_holds(objects, dir, p) {
            return Ok(());
        }
        let lock = objects.fetch_lock(&p.id);
        let _one_fetch = lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.local_copy_holds(objects, dir, p) {
            return Ok(());
        }
        let temp = TempFile::create(dir.clone())?;
        objects.get_into(&p.session_id, &p.id, temp.std_file()?, p.size, &p.sha256)?;
        // Replaces a stale copy under the same name, if there was one.
        temp.persist(&p.name)?;
        blobs::fsync_dir(dir)?;
        tracing::info!(payload_id = %p.id, bytes = p.size, "fetched a payload from object storage");
        let evict = objects
            .cache
            .added(&p.session_id, &p.name, &p.id, p.size, true);
        self.evict(evict);
        Ok(())
    }

    /// Whether the local file of `p`'s name holds `p`'s bytes: known to
    /// the cache as `p`'s, or (a copy from before a restart) of `p`'s size
    /// and SHA-256. A copy of another payload under the name is not used.
    fn local_copy_holds(
        &self,
        objects: &ObjectBlobs,
        dir: &cap_std::fs::Dir,
        p: &PayloadRecord,
    ) -> bool {
        use object_blobs::Known;
        match objects.cache.lookup(&p.session_id, &p.name, &p.id) {
            Known::This => dir.metadata(&p.name).is_ok(),
            Known::Other => false,
            Known::Unknown => {
                let Ok(file) = dir.open(&p.name) else {
                    return false;
                };
                let same = file.metadata().is_ok_and(|m| m.len() == p.size)
                    && content::sha256_of(file.into_std()).is_ok_and(|h| h == p.sha256);
                if same {
                    let evict = objects
                        .cache
                        .added(&p.session_id, &p.name, &p.id, p.size, false);
                    self.evict(evict);
                }
                same
            }
        }
    }

    /// Removes local copies the cache gave up (their objects stay).
    fn evict(&self, copies: Vec<(SessionId, String)>) {
        for (session, name) in copies {
            if let Ok(dir) = self.blobs.session_dir(&session) {
                let _ = dir.remove_file(&name);
            }
        }
    }

    fn payload_opt(&self, id: &PayloadId) -> Result<Option<PayloadRecord>> {
        match self.engine.get(Tree::Payloads, id.as_str().as_bytes())? {
            Some(raw) => Ok(Some(records::decode(&raw)?)),
            None => Ok(None),
        }
    }

    /// Lists a session's payloads in creation order.
    pub fn list_payloads(
        &self,
        session: &SessionId,
        page_token: &str,
        page_size: usize,
    ) -> Result<Page<PayloadRecord>> {
        let prefix = session.as_str().as_bytes();
        let after = decode_token(page_token, prefix)?;
        let page = self.engine.scan_prefix(
            Tree::SessionPayloads,
            prefix,
            after.as_deref(),
            page_size + 1,
        )?;
        let more = page.len() > page_size;
        let mut items = Vec::with_capacity(page.len().min(page_size));
        let mut last = None;
        for (key, _) in page.into_iter().take(page_size) {
            let pid = payload_id_from_listing_key(&key)?;
            if let Some(p) = self.payload_opt(&pid)? {
                items.push(p);
            }
            last = Some(key);
        }
        let next_token = match (more, last) {
            (true, Some(k)) => hex::encode(&k[prefix.len()..]),
            _ => String::new(),
        };
        Ok(Page { items, next_token })
    }

    /// Opens a payload's bytes for reading.
    pub fn open_payload(&self, p: &PayloadRecord) -> Result<File> {
        if p.missing {
            return Err(StoreError::DataLoss(p.id.clone()));
        }
        let dir = self.blobs.session_dir(&p.session_id)?;
        self.ensure_local(&dir, p)?;
        dir.open(&p.name).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => StoreError::DataLoss(p.id.clone()),
            _ => e.into(),
        })
    }

    /// Serves a ranged read. `max_bytes` has been defaulted and clamped.
    pub fn read(&self, p: &PayloadRecord, spec: ReadSpec, max_bytes: u64) -> Result<ReadOut> {
        let index = match self.engine.get(Tree::LineIndex, p.id.as_str().as_bytes())? {
            Some(raw) => LineIndex::decode(&raw).ok_or_else(|| {
                StoreError::Corrupt(RecordError::UnknownFormat(raw.first().copied()))
            })?,
            None => LineIndex::default(),
        };
        let mut file = io::BufReader::with_capacity(64 * 1024, self.open_payload(p)?);
        let extent = Extent {
            size: p.size,
            lines: p.line_count,
            utf8: p.utf8,
            index: &index,
        };
        Ok(read::read_range(&mut file, extent, spec, max_bytes)?)
    }

    /// Deletes one payload and what derives from it; in fleet mode, waits
    /// for every live replica's purge and says so in the receipt.
    pub fn delete_payload(
        &self,
        id: &PayloadId,
        requested_by: &str,
        reason: &str,
    ) -> Result<ReceiptRecord> {
        let (receipt, purge) = self.delete_logged(&delete::Request {
            target: delete::Target::Payload(id.clone()),
            requested_by,
            reason,
            fence: None,
        })?;
        Ok(self.confirm_purge(receipt, purge))
    }

    /// [`Store::delete_payload`] without the wait for the replicas' purge
    /// (which still happens): for taking back what a failed call stored,
    /// whose receipt nobody is handed.
    pub fn roll_back_payload(
        &self,
        id: &PayloadId,
        requested_by: &str,
        reason: &str,
    ) -> Result<ReceiptRecord> {
        self.delete(&delete::Request {
            target: delete::Target::Payload(id.clone()),
            requested_by,
            reason,
            fence: None,
        })
    }

    /// Whether a receipt's signature is this server's.
    pub fn verify_receipt(&self, r: &Signed<'_>, signature: &str) -> bool {
        self.receipt_key.verify(r, signature)
    }

    /// The receipt of a deleted session or payload, if it was deleted.
    pub fn deletion_receipt(&self, target: &str) -> Result<Option<ReceiptRecord>> {
        match self.engine.get(Tree::DeletedTargets, target.as_bytes())? {
            Some(raw) => {
                let id = ReceiptId::parse(&String::from_utf8_lossy(&raw))
                    .map_err(|e| StoreError::Invalid(e.to_string()))?;
                Ok(Some(self.receipt(&id)?))
            }
            None => Ok(None),
        }
    }

    /// Reads a receipt.
    pub fn receipt(&self, id: &ReceiptId) -> Result<ReceiptRecord> {
        let raw = self
            .engine
            .get(Tree::Receipts, id.as_str().as_bytes())?
            .ok_or_else(|| StoreError::NotFound {
                kind: "receipt",
                id: id.to_string(),
            })?;
        Ok(records::decode(&raw)?)
    }

    fn forget_payload(&self, b: &mut Batch, p: &PayloadRecord) {
        b.delete(Tree::Payloads, p.id.as_str())
            .delete(
                Tree::SessionPayloads,
                keys::session_payload(&p.session_id, p.created_ms, &p.id),
            )
            .delete(
                Tree::PayloadNames,
                keys::payload_name(&p.session_id, &p.name),
            )
            .delete(Tree::LineIndex, p.id.as_str())
            .delete(
                Tree::ContentIndex,
                keys::content(&p.session_id, &p.sha256, &p.id),
            )
            .delete(
                Tree::Expiry,
                keys::expiry(p.expires_ms, keys::EXPIRY_PAYLOAD, p.id.as_str()),
            );
        for parent in &p.derived_from {
            b.delete(Tree::Derived, keys::derived(parent, &p.id));
        }
    }

    /// A live payload of the session whose SHA-256 (hex) starts with
    /// `sha_prefix`: how a recall key finds its archive.
    pub fn find_content(
        &self,
        session: &SessionId,
        sha_prefix: &str,
    ) -> Result<Option<PayloadRecord>> {
        self.stored_copy(session, sha_prefix)
    }

    /// A live payload of the session holding exactly these bytes.
    fn stored_copy(&self, session: &SessionId, sha256: &str) -> Result<Option<PayloadRecord>> {
        let prefix = keys::content_prefix(session, sha256);
        for (key, _) in self
            .engine
            .scan_prefix(Tree::ContentIndex, &prefix, None, 8)?
        {
            // The key ends with the payload ID; the prefix may be a partial hash.
            let tail = &key[key.len().saturating_sub(PayloadId::PREFIX.len() + 32)..];
            let id = PayloadId::parse(&String::from_utf8_lossy(tail))
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            if let Some(p) = self.payload_opt(&id)?
                && !p.missing
            {
                return Ok(Some(p));
            }
        }
        Ok(None)
    }

    /// Picks a name not yet used in the session. Called under the session lock.
    fn unique_name(&self, session: &SessionId, base: &str) -> Result<String> {
        // A name of the ID shape would shadow that payload's `/payloads/<id>`.
        let prefixed;
        let base = if crate::guest::looks_like_id(base) {
            prefixed = format!("_{base}");
            &prefixed
        } else {
            base
        };
        let taken = |n: &str| -> Result<bool> {
            Ok(self
                .engine
                .get(Tree::PayloadNames, &keys::payload_name(session, n))?
                .is_some())
        };
        if !taken(base)? {
            return Ok(base.to_owned());
        }
        for n in 2..10_000 {
            let candidate = names::numbered(base, n);
            if !taken(&candidate)? {
                return Ok(candidate);
            }
        }
        let mut raw = [0u8; 8];
        getrandom::fill(&mut raw).map_err(io::Error::other)?;
        Ok(names::numbered(
            base,
            u32::from_le_bytes(raw[..4].try_into().expect("4 bytes")),
        ))
    }
}

/// The most an upload hands its content pass and its file in one go.
const WRITE_PIECE: usize = 1 << 20;

/// An upload in progress. Dropping it unfinished removes its temporary file.
pub struct PendingUpload<'a> {
    store: &'a Store,
    session: SessionId,
    meta: UploadMeta,
    temp: TempFile,
    scanner: Scan,
    /// The policy's `max_payload_bytes`, when below the server's limit.
    policy_limit: Option<u64>,
    /// The session's stored bytes when the upload began, for an early
    /// quota check; the binding check is in `finish`, under the lock.
    usage_at_start: u64,
    record_at_start: SessionRecord,
}

impl PendingUpload<'_> {
    /// Appends bytes, enforcing the payload size limit and quotas.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.admit(data.len())?;
        // Piece by piece, so that once the content pass has a thread of its
        // own, what it copies stays small and it scans one piece while the
        // next is written.
        for piece in data.chunks(WRITE_PIECE) {
            self.scanner.update(piece);
            self.temp.write_all(piece)?;
        }
        Ok(())
    }

    /// [`PendingUpload::write`] of bytes the caller already shares: a large
    /// upload's content pass reads them on its own thread without a copy.
    pub fn write_shared(&mut self, data: Bytes) -> Result<()> {
        self.admit(data.len())?;
        let mut at = 0;
        while at < data.len() {
            let piece = data.slice(at..data.len().min(at + WRITE_PIECE));
            at += piece.len();
            self.scanner.update_shared(piece.clone());
            self.temp.write_all(&piece)?;
        }
        Ok(())
    }

    /// Checks that `len` more bytes stay within the size limits and quotas.
    fn admit(&self, len: usize) -> Result<()> {
        let size = self.scanner.size() + len as u64;
        if let Some(limit) = self.policy_limit
            && size > limit
        {
            return Err(StoreError::QuotaExceeded {
                quota: "max_payload_bytes",
                limit,
                unit: "bytes",
                session: self.session.clone(),
                usage: 0,
                would_be: size,
            });
        }
        let server_limit = self.store.settings.max_payload_bytes;
        if size > server_limit {
            return Err(StoreError::TooLarge {
                limit: "limits.max_payload_bytes",
                value: server_limit,
                hint: "nothing was stored; narrow the tool's output, or split it into several payloads",
            });
        }
        // Early: an upload that cannot fit stops streaming now. Bytes the
        // session already holds count once (they are linked, not stored
        // again), and any stored copy is at most the session's usage; so
        // only an upload larger than that usage is known not to be one.
        // Smaller ones are decided by `finish`, once the hash is known.
        if size > self.usage_at_start {
            check_quota(
                "max_session_bytes",
                self.meta.quota.max_session_bytes,
                "bytes",
                &self.record_at_start,
                self.usage_at_start,
                size,
            )?;
        }
        Ok(())
    }

    /// Records the redactions made to the bytes written (counts only), for
    /// uploads whose counts are known only at the end of the stream.
    pub fn set_redactions(&mut self, counts: crate::redact::RedactCounts) {
        self.meta.redactions = counts;
    }

    /// Verifies, persists and commits the payload; returns its record once
    /// durable.
    pub fn finish(mut self) -> Result<PayloadRecord> {
        let scanner = std::mem::take(&mut self.scanner);
        let facts = scanner.finish()?;
        if let Some(expected) = &self.meta.expected_sha256
            && !expected.eq_ignore_ascii_case(&facts.sha256)
        {
            return Err(StoreError::ChecksumMismatch {
                expected: expected.to_ascii_lowercase(),
                actual: facts.sha256,
            });
        }
        self.temp.sync()?;
        let store = self.store;
        let id = PayloadId::generate();
        let Some(objects) = &store.objects else {
            return self.commit(id, facts);
        };
        // With a bucket, the object is complete before anything commits
        // (an acknowledged payload is whole there), and it is put before
        // the session's lock is taken, so uploads into one session do not
        // wait for each other's transfers. Refused after all (a quota, a
        // closed session), the object goes again.
        let session = self.session.clone();
        objects.put_file(&session, &id, self.temp.reader()?, facts.size)?;
        let committed = self.commit(id.clone(), facts);
        if committed.is_err()
            && let Err(e) = objects.delete_all(vec![(session, id)])
        {
            tracing::warn!(error = %e, "could not remove the object of a refused upload; no payload refers to it, and it stays in the bucket until removed there");
        }
        committed
    }

    /// Names, checks and commits a finished upload under the session's
    /// lock.
    fn commit(mut self, id: PayloadId, facts: content::ContentFacts) -> Result<PayloadRecord> {
        let store = self.store;
        let _guard = store.lock(&self.session)?;
        let mut s = store.session(&self.session)?;
        if s.state != SessionState::Open {
            return Err(StoreError::SessionClosed(self.session.clone()));
        }
        let (sniffed_type, sniffed_ext) = names::sniff(&facts.head, facts.utf8);
        let content_type = if self.meta.content_type.is_empty() {
            sniffed_type.to_owned()
        } else {
            self.meta.content_type.clone()
        };
        let ext = names::extension_for(&content_type).unwrap_or(sniffed_ext);
        let base = names::base_name(
            &self.meta.name,
            &self.meta.tool_name,
            &self.meta.tool_call_id,
            ext,
        );
        let name = store.unique_name(&self.session, &base)?;
        let now = store.now_ms();
        let record = PayloadRecord {
            id,
            session_id: self.session.clone(),
            name,
            size: facts.size,
            line_count: facts.line_count,
            chars: facts.chars,
            sha256: facts.sha256,
            content_type,
            tool_name: std::mem::take(&mut self.meta.tool_name),
            tool_call_id: std::mem::take(&mut self.meta.tool_call_id),
            is_error: self.meta.is_error,
            created_ms: now,
            expires_ms: clock::add(now, store.retention_of(&s)?).min(s.expires_ms),
            derived_from: std::mem::take(&mut self.meta.derived_from),
            utf8: facts.utf8,
            missing: false,
            archive_key: std::mem::take(&mut self.meta.archive_key),
            redactions: std::mem::take(&mut self.meta.redactions),
        };
        // The same bytes already stored in this session are linked, not
        // stored again; quotas count stored bytes once.
        let duplicate = store.stored_copy(&s.id, &record.sha256)?;
        // Quotas are checked here, under the session's lock, against the
        // usage as committed: concurrent uploads cannot overshoot.
        let q = self.meta.quota;
        check_count_quota(&q, &s)?;
        let new_bytes = if duplicate.is_some() { 0 } else { record.size };
        check_quota(
            "max_session_bytes",
            q.max_session_bytes,
            "bytes",
            &s,
            s.usage_bytes,
            new_bytes,
        )?;
        let dir = store.blobs.session_dir(&s.id)?;
        let linked = match &duplicate {
            Some(existing) => match dir.hard_link(&existing.name, &dir, &record.name) {
                Ok(()) => {
                    blobs::fsync_dir(&dir)?;
                    true
                }
                Err(e) => {
                    tracing::warn!(payload_id = %existing.id, error = %e, "could not link a duplicate; storing a copy");
                    false
                }
            },
            None => false,
        };
        if linked {
            drop(self.temp);
        } else {
            self.temp.persist(&record.name)?;
            s.usage_bytes += record.size;
        }
        s.usage_payloads += 1;
        if let Some(objects) = &store.objects {
            let evict = objects
                .cache
                .added(&s.id, &record.name, &record.id, record.size, false);
            store.evict(evict);
        }
        let mut b = Batch::new();
        b.put(Tree::Payloads, record.id.as_str(), records::encode(&record))
            .put(
                Tree::SessionPayloads,
                keys::session_payload(&s.id, now, &record.id),
                [],
            )
            .put(
                Tree::PayloadNames,
                keys::payload_name(&s.id, &record.name),
                record.id.as_str(),
            )
            .put(Tree::LineIndex, record.id.as_str(), facts.line_index)
            .put(
                Tree::ContentIndex,
                keys::content(&s.id, &record.sha256, &record.id),
                [],
            )
            .put(
                Tree::Expiry,
                keys::expiry(record.expires_ms, keys::EXPIRY_PAYLOAD, record.id.as_str()),
                [],
            )
            .put(Tree::Sessions, s.id.as_str(), records::encode(&s));
        for parent in &record.derived_from {
            b.put(Tree::Derived, keys::derived(parent, &record.id), []);
        }
        if let Err(e) = store.engine.commit(&b) {
            // Not acknowledged: take the file back out so no orphan remains.
            if let Ok(dir) = store.blobs.session_dir(&s.id) {
                let _ = dir.remove_file(&record.name);
            }
            if let Some(objects) = &store.objects {
                objects.cache.removed(&s.id, &record.name);
            }
            return Err(e.into());
        }
        if !linked {
            crate::metrics::stored(&s.tenant, record.size);
        }
        Ok(record)
    }
}

/// Refuses one more payload in a session at its `max_payloads`.
fn check_count_quota(q: &Quota, s: &SessionRecord) -> Result<()> {
    check_quota(
        "max_payloads",
        q.max_payloads,
        "payloads",
        s,
        s.usage_payloads,
        1,
    )
}

/// Refuses a write that would take `usage` past a nonzero quota.
fn check_quota(
    quota: &'static str,
    limit: u64,
    unit: &'static str,
    s: &SessionRecord,
    usage: u64,
    adding: u64,
) -> Result<()> {
    let would_be = usage.saturating_add(adding);
    if limit == 0 || would_be <= limit {
        return Ok(());
    }
    Err(StoreError::QuotaExceeded {
        quota,
        limit,
        unit,
        session: s.id.clone(),
        usage,
        would_be,
    })
}

/// Refuses to delete anything of a held session.
fn check_hold(s: &SessionRecord) -> Result<()> {
    if !s.legal_hold {
        return Ok(());
    }
    let (by, reason) = s
        .hold
        .as_ref()
        .map(|h| (h.by.clone(), h.reason.clone()))
        .unwrap_or_default();
    Err(StoreError::LegalHold {
        session: s.id.clone(),
        by,
        reason,
    })
}

fn check_schema(engine: &dyn Engine) -> Result<()> {
    match engine.get(Tree::Meta, records::SCHEMA_KEY)? {
        None => Ok(engine.put(
            Tree::Meta,
            records::SCHEMA_KEY,
            &records::SCHEMA_VERSION.to_le_bytes(),
        )?),
        Some(v) if v.as_slice() == records::SCHEMA_VERSION.to_le_bytes() => Ok(()),
        Some(v) => Err(StoreError::Corrupt(RecordError::UnknownFormat(
            v.first().copied(),
        ))),
    }
}

fn payload_id_from_listing_key(key: &[u8]) -> Result<PayloadId> {
    // session id (36 bytes) + created (8 bytes) + payload id.
    let id = key
        .get(SessionId::PREFIX.len() + 32 + 8..)
        .unwrap_or_default();
    PayloadId::parse(&String::from_utf8_lossy(id)).map_err(|e| StoreError::Invalid(e.to_string()))
}

/// Page tokens are the hex of the last key's suffix after the listing prefix.
fn decode_token(token: &str, prefix: &[u8]) -> Result<Option<Vec<u8>>> {
    if token.is_empty() {
        return Ok(None);
    }
    let suffix = hex::decode(token)
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .ok_or_else(|| {
            StoreError::Invalid(
                "page_token is not one this server issued; start again with an empty page_token"
                    .into(),
            )
        })?;
    let mut key = prefix.to_vec();
    key.extend_from_slice(&suffix);
    Ok(Some(key))
}

#[cfg(test)]
mod lifecycle_tests;
