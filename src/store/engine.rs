//! The storage-engine interface: named trees of byte keys and values, with
//! point reads, ordered range scans, and atomic, durable batches that span
//! trees. Three implementations sit behind it: the embedded
//! [`super::RedbEngine`] and [`super::SledEngine`], and
//! [`super::PostgresEngine`] for fleet mode, where many replicas share one
//! engine. Everything above this file is engine-agnostic: what sharing
//! changes ([`Engine::shared`]) is said here, as cross-process locks
//! ([`Engine::lock`]) and leases ([`Engine::lease`]) that the embedded
//! engines grant trivially, since one process owns their file.

use std::ops::Bound;

/// The named trees. Their on-disk names carry the key-encoding version, so a
/// future encoding lives in new trees beside the old ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tree {
    /// Store-wide facts such as the schema version.
    Meta,
    /// `session_id` → session record.
    Sessions,
    /// `tenant \0 created_ms(be) session_id` → empty; lists a tenant's sessions in creation order.
    TenantSessions,
    /// `payload_id` → payload record.
    Payloads,
    /// `session_id created_ms(be) payload_id` → empty; lists a session's payloads in creation order.
    SessionPayloads,
    /// `session_id name` → payload id; keeps names unique within a session.
    PayloadNames,
    /// `payload_id` → sparse line index.
    LineIndex,
    /// `expires_ms(be) kind id` → empty; what expires next, for the reaper.
    Expiry,
    /// `receipt_id` → deletion receipt.
    Receipts,
    /// `session_id sha256(hex) payload_id` → empty; finds stored copies of
    /// the same bytes (deduplication), and counts their references.
    ContentIndex,
    /// `session_id` or `payload_id` → the receipt of its deletion.
    DeletedTargets,
    /// `tenant \0 seq(be u64)` → audit event; each tenant's hash chain in
    /// order. Its heads live in [`Tree::Meta`] (see `crate::audit::log`).
    Audit,
    /// `tenant` → the tenant's policy as set.
    TenantPolicies,
    /// `parent payload_id child payload_id` → empty; what was derived from
    /// a payload (script outputs, archived history), which its deletion
    /// takes along.
    Derived,
    /// `receipt_id` → a deletion intent: what a deletion in progress still
    /// has to remove. Written before any file goes; finished at startup
    /// after a crash.
    DeletionIntents,
    /// `position(be u64) receipt_id` → the local copies a deletion purges
    /// (fleet mode): every replica tails it and removes its copies. The
    /// position is the deletion's time in milliseconds, raised past the
    /// newest entry's when a clock is behind, so keys grow in commit order
    /// (see `store::delete`).
    Purges,
    /// `tenant \0 day(be u64)` → that day's usage sample (see
    /// `store::history`).
    UsageHistory,
    /// `replica` → how far it has applied [`Tree::Purges`] and when it last
    /// said so (fleet mode; see `store::delete`).
    PurgeProgress,
}

/// The metadata engine's page cache when the configuration names none:
/// enough for the B-tree's interior nodes and the hot leaves, and a bound
/// on the server's memory however large the metadata grows.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

impl Tree {
    /// Every tree, in a fixed order.
    pub const ALL: [Tree; 18] = [
        Tree::Meta,
        Tree::Sessions,
        Tree::TenantSessions,
        Tree::Payloads,
        Tree::SessionPayloads,
        Tree::PayloadNames,
        Tree::LineIndex,
        Tree::Expiry,
        Tree::Receipts,
        Tree::ContentIndex,
        Tree::DeletedTargets,
        Tree::Audit,
        Tree::TenantPolicies,
        Tree::Derived,
        Tree::DeletionIntents,
        Tree::Purges,
        Tree::UsageHistory,
        Tree::PurgeProgress,
    ];

    /// The tree's name inside the engine.
    pub fn name(self) -> &'static str {
        match self {
            Tree::Meta => "meta",
            Tree::Sessions => "sessions.v1",
            Tree::TenantSessions => "tenant_sessions.v1",
            Tree::Payloads => "payloads.v1",
            Tree::SessionPayloads => "session_payloads.v1",
            Tree::PayloadNames => "payload_names.v1",
            Tree::LineIndex => "line_index.v1",
            Tree::Expiry => "expiry.v1",
            Tree::Receipts => "receipts.v1",
            Tree::ContentIndex => "content_index.v1",
            Tree::DeletedTargets => "deleted_targets.v1",
            Tree::Audit => "audit.v1",
            Tree::TenantPolicies => "tenant_policies.v1",
            Tree::Derived => "derived.v1",
            Tree::DeletionIntents => "deletion_intents.v1",
            Tree::Purges => "purges.v1",
            Tree::UsageHistory => "usage_history.v1",
            Tree::PurgeProgress => "purge_progress.v1",
        }
    }

    /// Position in [`Tree::ALL`].
    pub fn index(self) -> usize {
        Tree::ALL
            .iter()
            .position(|t| *t == self)
            .expect("listed in ALL")
    }
}

/// One write in a batch: a put, or a delete when `value` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Target tree.
    pub tree: Tree,
    /// Key.
    pub key: Vec<u8>,
    /// New value, or `None` to delete.
    pub value: Option<Vec<u8>>,
}

/// Writes that commit together or not at all.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    ops: Vec<Op>,
    fence: Option<Lease>,
}

/// A lease on a named role (the reaper) as granted by [`Engine::lease`]:
/// its holder may act in the role until the lease expires. The token grows
/// each time the lease changes hands, so a batch fenced with an old token
/// ([`Batch::fence`]) is refused once another holder has taken over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The role.
    pub name: &'static str,
    /// The fencing token.
    pub token: u64,
}

/// The keys of cross-process locks ([`Engine::lock`]): 64-bit numbers
/// derived from what they protect, the same in every replica.
pub type LockKey = i64;

/// The lock key of `scope` (a room's name) and `id` within it: the first
/// eight bytes of their SHA-256, so every replica derives the same key.
pub fn lock_key(scope: &str, id: &[u8]) -> LockKey {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(scope.as_bytes());
    h.update([0]);
    h.update(id);
    let d = h.finalize();
    LockKey::from_be_bytes(d[..8].try_into().expect("a digest has 32 bytes"))
}

/// Cross-process locks held until this drops ([`Engine::lock`]).
#[must_use = "the locks are released when this is dropped"]
pub struct EngineLock(#[allow(dead_code)] Option<Box<dyn Send>>);

impl EngineLock {
    /// Holds nothing: an engine one process owns needs no more than the
    /// caller's in-process locks.
    pub fn local() -> Self {
        EngineLock(None)
    }

    /// Holds `guard` (which releases the locks when dropped).
    pub fn holding(guard: impl Send + 'static) -> Self {
        EngineLock(Some(Box::new(guard)))
    }
}

impl std::fmt::Debug for EngineLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "EngineLock(held)"
        } else {
            "EngineLock(local)"
        })
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put.
    pub fn put(
        &mut self,
        tree: Tree,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.ops.push(Op {
            tree,
            key: key.into(),
            value: Some(value.into()),
        });
        self
    }

    /// Adds a delete.
    pub fn delete(&mut self, tree: Tree, key: impl Into<Vec<u8>>) -> &mut Self {
        self.ops.push(Op {
            tree,
            key: key.into(),
            value: None,
        });
        self
    }

    /// The writes, in order; a later write to the same key wins.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commits the batch only while `lease` is still held with its token:
    /// a holder that lost its lease (paused, partitioned) cannot write
    /// after another holder took over.
    pub fn fence(&mut self, lease: &Lease) -> &mut Self {
        self.fence = Some(lease.clone());
        self
    }

    /// The lease the batch is fenced by, if any.
    pub fn fenced_by(&self) -> Option<&Lease> {
        self.fence.as_ref()
    }
}

/// A key-value pair returned by a scan.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Errors of an engine, with the engine's own message.
#[derive(Debug, thiserror::Error)]
#[error("{engine} storage engine: {message}")]
pub struct EngineError {
    /// Which engine.
    pub engine: &'static str,
    /// What it said.
    pub message: String,
    /// The engine could not be reached (a shared engine's database is down
    /// or unreachable): worth retrying, unlike a fault in the data.
    pub unavailable: bool,
}

impl EngineError {
    pub(crate) fn new(engine: &'static str, e: impl std::fmt::Display) -> Self {
        Self {
            engine,
            message: e.to_string(),
            unavailable: false,
        }
    }

    /// An engine that cannot be reached now.
    pub(crate) fn unavailable(engine: &'static str, e: impl std::fmt::Display) -> Self {
        Self {
            unavailable: true,
            ..Self::new(engine, e)
        }
    }
}

/// Up to `limit` keys within two bounds, in key order.
#[derive(Debug, Clone, Copy)]
pub struct KeyRange<'a> {
    /// Where the range starts.
    pub start: Bound<&'a [u8]>,
    /// Where it ends.
    pub end: Bound<&'a [u8]>,
    /// Most entries wanted.
    pub limit: usize,
}

impl KeyRange<'_> {
    /// True when no entry can be in the range: a zero limit, or bounds that
    /// cross (which some engines would panic on).
    pub fn is_empty(&self) -> bool {
        use Bound::{Excluded, Included};
        let crossed = match (self.start, self.end) {
            (Included(s), Included(e)) => s > e,
            (Included(s) | Excluded(s), Included(e) | Excluded(e)) => s >= e,
            _ => false,
        };
        self.limit == 0 || crossed
    }
}

/// A metadata engine. Every method blocks; async callers use
/// `spawn_blocking`.
pub trait Engine: Send + Sync + 'static {
    /// The engine's name, as in config.
    fn name(&self) -> &'static str;

    /// Reads one key.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError>;

    /// The entries of a range that is not empty ([`KeyRange::is_empty`]),
    /// in key order: what [`Engine::range`] asks each engine for.
    fn scan(&self, tree: Tree, keys: KeyRange<'_>) -> Result<Vec<Entry>, EngineError>;

    /// Up to `limit` entries with keys within the bounds, in key order; an
    /// empty answer, without asking the engine, for a zero limit or bounds
    /// that cross.
    fn range(
        &self,
        tree: Tree,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, EngineError> {
        let keys = KeyRange { start, end, limit };
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.scan(tree, keys)
    }

    /// Applies every write of the batch atomically, and returns only once the
    /// result is durable on disk.
    fn commit(&self, batch: &Batch) -> Result<(), EngineError>;

    /// Applies every write of the batch atomically, visible to reads at
    /// once, without waiting for it to reach the disk: a crash may lose it,
    /// and the next [`Engine::commit`] or [`Engine::flush`] makes it durable
    /// with everything before it. For a caller that keeps the batch durable
    /// elsewhere first (the audit journal). An engine without a cheaper
    /// path commits durably.
    fn commit_volatile(&self, batch: &Batch) -> Result<(), EngineError> {
        self.commit(batch)
    }

    /// Makes everything committed durable and releases what can be released;
    /// called at shutdown.
    fn flush(&self) -> Result<(), EngineError>;

    /// True when other processes (fleet replicas) share this engine: what a
    /// process caches from it may be stale, and read-modify-write must hold
    /// [`Engine::lock`]. False for an engine one process owns.
    fn shared(&self) -> bool {
        false
    }

    /// Takes cross-process locks on `keys` (in ascending order, so two
    /// callers never deadlock), blocking until all are held; they are
    /// released when the returned guard drops. An engine one process owns
    /// returns at once with nothing held: the caller's in-process locks
    /// already exclude every other writer.
    fn lock(&self, keys: &[LockKey]) -> Result<EngineLock, EngineError> {
        let _ = keys;
        Ok(EngineLock::local())
    }

    /// Takes or renews the lease on `name` for `holder` for `ttl`: the
    /// lease, when `holder` holds it now, or `None` while another holder's
    /// lease runs. An engine one process owns always grants it, with token
    /// 1 (there is no other holder).
    fn lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<Lease>, EngineError> {
        let _ = (holder, ttl);
        Ok(Some(Lease { name, token: 1 }))
    }

    /// Ends `holder`'s lease on `name` now, if it holds it (at shutdown).
    fn release_lease(&self, name: &'static str, holder: &str) -> Result<(), EngineError> {
        let _ = (name, holder);
        Ok(())
    }

    /// Writes one key durably.
    fn put(&self, tree: Tree, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        let mut b = Batch::new();
        b.put(tree, key, value);
        self.commit(&b)
    }

    /// Deletes one key durably.
    fn delete(&self, tree: Tree, key: &[u8]) -> Result<(), EngineError> {
        let mut b = Batch::new();
        b.delete(tree, key);
        self.commit(&b)
    }

    /// Up to `limit` entries whose keys start with `prefix` and sort after
    /// `after` (when given), in key order.
    fn scan_prefix(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, EngineError> {
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let end = prefix_end(prefix);
        let end = match &end {
            Some(e) => Bound::Excluded(e.as_slice()),
            None => Bound::Unbounded,
        };
        self.range(tree, start, end, limit)
    }
}

/// The smallest key greater than every key starting with `prefix`, or `None`
/// when no such key exists (the prefix is all 0xff).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A conformance suite every engine must pass; each engine's tests call it.
#[cfg(test)]
pub(crate) fn conformance(engine: &dyn Engine) {
    // Point writes and reads.
    engine.put(Tree::Sessions, b"a", b"1").unwrap();
    assert_eq!(
        engine.get(Tree::Sessions, b"a").unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(
        engine.get(Tree::Payloads, b"a").unwrap(),
        None,
        "trees are separate"
    );
    engine.delete(Tree::Sessions, b"a").unwrap();
    assert_eq!(engine.get(Tree::Sessions, b"a").unwrap(), None);
    // Every tree is there and holds its own keys.
    for tree in Tree::ALL {
        engine.put(tree, b"every", tree.name().as_bytes()).unwrap();
    }
    for tree in Tree::ALL {
        assert_eq!(
            engine.get(tree, b"every").unwrap().as_deref(),
            Some(tree.name().as_bytes()),
            "{}",
            tree.name()
        );
        engine.delete(tree, b"every").unwrap();
    }

    // A batch spans trees, and a later write to a key wins.
    let mut b = Batch::new();
    b.put(Tree::Payloads, b"p1", b"x")
        .put(Tree::SessionPayloads, b"s1/p1", b"")
        .put(Tree::SessionPayloads, b"s1/p2", b"")
        .put(Tree::SessionPayloads, b"s2/p3", b"")
        .put(Tree::Payloads, b"p1", b"y")
        .delete(Tree::Payloads, b"missing");
    engine.commit(&b).unwrap();
    assert_eq!(
        engine.get(Tree::Payloads, b"p1").unwrap(),
        Some(b"y".to_vec())
    );

    // Ranges and prefix scans are ordered, bounded and limited.
    let keys = |v: Vec<Entry>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    let s1 = engine
        .scan_prefix(Tree::SessionPayloads, b"s1/", None, 10)
        .unwrap();
    assert_eq!(keys(s1), vec![b"s1/p1".to_vec(), b"s1/p2".to_vec()]);
    let after = engine
        .scan_prefix(Tree::SessionPayloads, b"s1/", Some(b"s1/p1"), 10)
        .unwrap();
    assert_eq!(keys(after), vec![b"s1/p2".to_vec()]);
    let limited = engine
        .scan_prefix(Tree::SessionPayloads, b"s", None, 2)
        .unwrap();
    assert_eq!(limited.len(), 2);
    let count = |start: Bound<&[u8]>, end: Bound<&[u8]>| {
        let entries = engine.range(Tree::SessionPayloads, start, end, 100);
        entries.unwrap().len()
    };
    assert_eq!(count(Bound::Unbounded, Bound::Unbounded), 3);
    assert_eq!(count(Bound::Unbounded, Bound::Excluded(b"s2")), 2);
    // Bounds that cross, or meet with one excluded, hold nothing (no engine
    // panics on them).
    assert_eq!(count(Bound::Included(b"s2"), Bound::Included(b"s1")), 0);
    assert_eq!(count(Bound::Excluded(b"s2"), Bound::Excluded(b"s1")), 0);
    assert_eq!(
        count(Bound::Excluded(b"s1/p1"), Bound::Included(b"s1/p1")),
        0
    );
    assert_eq!(
        count(Bound::Included(b"s1/p1"), Bound::Included(b"s1/p1")),
        1
    );

    // The audit tree: big-endian sequence keys scan in numeric order, also
    // across a byte boundary, and other trees do not see them.
    let key = |seq: u64| [b"t\0".as_slice(), &seq.to_be_bytes()].concat();
    let mut b = Batch::new();
    for seq in [256u64, 1, 255, 2] {
        b.put(Tree::Audit, key(seq), seq.to_string());
    }
    b.put(Tree::Meta, b"audit_head\0t", b"256");
    engine.commit(&b).unwrap();
    let order: Vec<Vec<u8>> = engine
        .scan_prefix(Tree::Audit, b"t\0", None, 10)
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        order,
        [
            b"1".to_vec(),
            b"2".to_vec(),
            b"255".to_vec(),
            b"256".to_vec()
        ]
    );
    let from_255 = engine
        .range(
            Tree::Audit,
            Bound::Included(key(255).as_slice()),
            Bound::Included(key(256).as_slice()),
            10,
        )
        .unwrap();
    assert_eq!(keys(from_255), vec![key(255), key(256)]);
    assert_eq!(engine.get(Tree::Sessions, &key(1)).unwrap(), None);
    assert_eq!(
        engine.get(Tree::Meta, b"audit_head\0t").unwrap(),
        Some(b"256".to_vec())
    );

    // A volatile commit is read at once, like a durable one.
    let mut b = Batch::new();
    b.put(Tree::Audit, key(257), "257");
    b.delete(Tree::Audit, key(1));
    engine.commit_volatile(&b).unwrap();
    assert_eq!(
        engine.get(Tree::Audit, &key(257)).unwrap(),
        Some(b"257".to_vec())
    );
    assert_eq!(engine.get(Tree::Audit, &key(1)).unwrap(), None);
    engine.flush().unwrap();
}

/// The conformance suite on an engine that `open` makes (with the default
/// page cache) in a file named
/// `file` in a fresh directory; then what was committed must be there
/// again once the engine is dropped and the file opened anew.
#[cfg(test)]
pub(crate) fn file_conformance<E: Engine>(
    file: &str,
    open: fn(&std::path::Path, usize) -> Result<E, EngineError>,
) {
    let open = |path: &std::path::Path| open(path, DEFAULT_CACHE_BYTES).unwrap();
    let dir = tempfile::tempdir().unwrap();
    conformance(&open(&dir.path().join(file)));
    let path = dir.path().join(format!("again-{file}"));
    open(&path).put(Tree::Meta, b"k", b"v").unwrap();
    let again = open(&path);
    assert_eq!(again.get(Tree::Meta, b"k").unwrap(), Some(b"v".to_vec()));
    // A volatile commit that a flush followed is durable too.
    let mut b = Batch::new();
    b.put(Tree::Meta, b"volatile", b"then flushed");
    again.commit_volatile(&b).unwrap();
    again.flush().unwrap();
    drop(again);
    assert_eq!(
        open(&path).get(Tree::Meta, b"volatile").unwrap(),
        Some(b"then flushed".to_vec())
    );
}

/// What two handles on one shared engine (two replicas) must agree on:
/// writes, locks, leases and fences. Both start from an empty database.
#[cfg(test)]
pub(crate) fn shared_conformance(a: &dyn Engine, b: &dyn Engine) {
    use std::time::{Duration, Instant};
    assert!(a.shared() && b.shared());
    // A commit through one is read through the other.
    a.put(Tree::Sessions, b"s", b"1").unwrap();
    assert_eq!(b.get(Tree::Sessions, b"s").unwrap(), Some(b"1".to_vec()));

    // A lock held by one blocks the other until it is released; other
    // keys stay free.
    let k = lock_key("test", b"k");
    let held = a.lock(&[k]).unwrap();
    let free = b.lock(&[lock_key("test", b"other")]).unwrap();
    drop(free);
    let start = Instant::now();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let _g = b.lock(&[k, lock_key("test", b"other")]).unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(400));
        drop(held);
        let waited = waiter.join().unwrap();
        assert!(
            waited >= Duration::from_millis(400),
            "the second replica took the lock after {waited:?}, while the first held it"
        );
    });

    // One holder at a time; renewal keeps the token, a takeover after
    // expiry raises it.
    let ttl = Duration::from_millis(800);
    let first = a
        .lease("test-role", "A", ttl)
        .unwrap()
        .expect("a free lease is granted");
    assert_eq!(b.lease("test-role", "B", ttl).unwrap(), None, "held by A");
    assert_eq!(
        a.lease("test-role", "A", ttl).unwrap(),
        Some(first.clone()),
        "renewed"
    );
    std::thread::sleep(ttl + Duration::from_millis(300));
    let second = b
        .lease("test-role", "B", ttl)
        .unwrap()
        .expect("a lapsed lease is taken over");
    assert!(second.token > first.token, "{second:?} after {first:?}");
    assert_eq!(
        a.lease("test-role", "A", ttl).unwrap(),
        None,
        "now held by B"
    );

    // A batch fenced by the lost lease is refused and changes nothing; the
    // new holder's commits.
    let mut stale = Batch::new();
    stale.put(Tree::Expiry, b"e", b"old").fence(&first);
    let e = a.commit(&stale).unwrap_err();
    assert!(e.message.contains("lease"), "{e}");
    assert_eq!(b.get(Tree::Expiry, b"e").unwrap(), None);
    let mut current = Batch::new();
    current.put(Tree::Expiry, b"e", b"new").fence(&second);
    b.commit(&current).unwrap();
    assert_eq!(a.get(Tree::Expiry, b"e").unwrap(), Some(b"new".to_vec()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_that_can_grow() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }

    #[test]
    fn every_tree_has_a_distinct_name_and_index() {
        let mut names: Vec<_> = Tree::ALL.iter().map(|t| t.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Tree::ALL.len());
        for (i, t) in Tree::ALL.iter().enumerate() {
            assert_eq!(t.index(), i);
        }
    }
}
