//! The stored audit log: one hash chain per tenant in [`Tree::Audit`], each
//! with its head (last `seq` and `hash`) in [`Tree::Meta`].
//!
//! **Why one chain per tenant.** A principal sees only its own tenant's
//! events, and an export must verify on its own with
//! `scripts/verify_audit.py`. A single chain across tenants could do only
//! one of the two: a tenant's events alone would have gaps and links to
//! events it may not see. So each tenant's events are numbered from 1 and
//! linked from [`GENESIS_HASH`] on their own.
//!
//! **Appends** are serialized and durable: [`AuditLog::append`] returns only
//! once the commit is durable: through the journal on a local engine
//! ([`AuditLog::with_journal`], see `super::journal`: one record written
//! and `fdatasync`ed; the engine is given the batch, in a volatile commit,
//! before the log next reads it), or the engine's own
//! durable commit (redb: `fdatasync`; sled: flush and `fsync`; Postgres).
//! Concurrent appends are committed together (group commit): the first
//! caller to find no commit in progress seals every event waiting at
//! that moment, in arrival order, and commits them, with the heads of the
//! chains they extend, in one batch; the others wait for that commit, and
//! the next one starts the next group. Each event and its chain's head
//! commit atomically, so a crash leaves whole events and a matching head.
//!
//! **Replicas.** On a shared engine (fleet mode), other replicas append to
//! the same chains. A group commit then holds each touched tenant's lock
//! across replicas ([`Engine::lock`]) and resumes the chain from its stored
//! head under it, so appends from every replica form one unbroken chain;
//! heads are read from the engine, never from this process's memory.
//!
//! **Keys.** `tenant \0 seq` with `seq` as a big-endian `u64`, so a range
//! scan returns a chain in order. Values are the event's JSON (with `hash`)
//! in the store's versioned value envelope ([`encode_record`]).
//!
//! **Verification** streams a chain through [`Verifier`] in pages and then
//! compares where it ended with the head: events cut off the end leave a
//! chain that verifies but stops short of the head. The head is read from
//! the store when a chain is first used after startup; if events exist past
//! the stored head (the head record was lost or removed), appends resume
//! after the last stored event, so nothing is ever overwritten, and the
//! server logs it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ops::Bound;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::chain::{AuditEvent, ChainBuilder, GENESIS_HASH, Verifier, VerifyOutcome, event_time};
use super::journal::Journal;
use super::outcome;
use crate::clock::{Clock, Millis};
use crate::store::engine::{Batch, Engine, EngineError, Tree, prefix_end};
use crate::store::{Page, Result, StoreError, decode_record, encode_record};

/// Prefix of the chain heads' keys in [`Tree::Meta`].
const HEAD_PREFIX: &[u8] = b"audit_head\0";
/// Events read from the engine per scan.
const SCAN_BATCH: usize = 256;
/// Most events one query looks at. A query whose filters match little
/// returns a short (even empty) page with a `next_token` once it has looked
/// at this many, so no single call walks a whole large log.
pub const QUERY_SCAN_BUDGET: u64 = 50_000;

/// The key of event `seq` of `tenant`'s chain in [`Tree::Audit`].
pub fn event_key(tenant: &str, seq: u64) -> Vec<u8> {
    let mut k = chain_prefix(tenant);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The key of `tenant`'s chain head in [`Tree::Meta`].
pub fn head_key(tenant: &str) -> Vec<u8> {
    let mut k = HEAD_PREFIX.to_vec();
    k.extend_from_slice(tenant.as_bytes());
    k
}

fn chain_prefix(tenant: &str) -> Vec<u8> {
    debug_assert!(!tenant.contains('\0'), "tenant names hold no NUL");
    let mut k = tenant.as_bytes().to_vec();
    k.push(0);
    k
}

/// The seq a key of `tenant`'s chain holds.
fn seq_of(key: &[u8], prefix_len: usize) -> Option<u64> {
    let raw: [u8; 8] = key.get(prefix_len..)?.try_into().ok()?;
    Some(u64::from_be_bytes(raw))
}

/// A chain's head as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct HeadRecord {
    seq: u64,
    hash: String,
}

/// What an event says besides its place in the chain and its time, which
/// the log fills in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewEvent {
    /// Who acted.
    pub principal: String,
    /// The principal's tenant: the chain the event joins.
    pub tenant: String,
    /// One of [`super::action`].
    pub action: &'static str,
    /// One of [`super::outcome`].
    pub outcome: &'static str,
    /// The session involved, if any.
    pub session_id: String,
    /// The payload involved, if any.
    pub payload_id: String,
    /// IDs, sizes, counts, names of runtimes and statuses. Never content,
    /// tokens or host paths.
    pub detail: String,
    /// SHA-256 (hex) of the content involved, if any.
    pub content_sha256: String,
}

impl NewEvent {
    /// A successful `action`, by nobody yet.
    pub fn new(action: &'static str) -> Self {
        NewEvent {
            action,
            outcome: outcome::OK,
            ..NewEvent::default()
        }
    }

    /// Sets who acted, and so the chain.
    pub fn by(mut self, principal: &str, tenant: &str) -> Self {
        principal.clone_into(&mut self.principal);
        tenant.clone_into(&mut self.tenant);
        self
    }

    /// Sets the outcome.
    pub fn outcome(mut self, outcome: &'static str) -> Self {
        self.outcome = outcome;
        self
    }

    /// Sets the session.
    pub fn session(mut self, id: impl std::fmt::Display) -> Self {
        self.session_id = id.to_string();
        self
    }

    /// Sets the payload.
    pub fn payload(mut self, id: impl std::fmt::Display) -> Self {
        self.payload_id = id.to_string();
        self
    }

    /// Sets the content hash.
    pub fn sha256(mut self, hex: impl Into<String>) -> Self {
        self.content_sha256 = hex.into();
        self
    }

    /// Sets the detail.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    fn into_event(self, time: &str) -> AuditEvent {
        AuditEvent {
            action: self.action.to_owned(),
            content_sha256: self.content_sha256,
            detail: self.detail,
            outcome: self.outcome.to_owned(),
            payload_id: self.payload_id,
            principal: self.principal,
            session_id: self.session_id,
            tenant: self.tenant,
            time: time.to_owned(),
            ..AuditEvent::default()
        }
    }
}

/// Which events a query wants; every set field must match. The tenant is
/// not here: [`AuditLog::query`] takes it separately, from the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only events of this session.
    pub session_id: Option<String>,
    /// Only events of this payload.
    pub payload_id: Option<String>,
    /// Only events by this principal.
    pub principal: Option<String>,
    /// Only events of this action.
    pub action: Option<String>,
    /// Only events with this outcome.
    pub outcome: Option<String>,
    /// Only events at or after this time.
    pub since: Option<Millis>,
    /// Only events before this time.
    pub until: Option<Millis>,
}

impl Filter {
    /// Whether `e` passes. Times compare as strings: every event time has
    /// the fixed-width form of [`event_time`], whose text order is time order.
    fn matches(&self, e: &AuditEvent, since: Option<&str>, until: Option<&str>) -> bool {
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        eq(&self.session_id, &e.session_id)
            && eq(&self.payload_id, &e.payload_id)
            && eq(&self.principal, &e.principal)
            && eq(&self.action, &e.action)
            && eq(&self.outcome, &e.outcome)
            && since.is_none_or(|s| e.time.as_str() >= s)
            && until.is_none_or(|u| e.time.as_str() < u)
    }
}

/// A verification's result, and the head it verified against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// What [`Verifier`] found, with a head mismatch counted as bad.
    pub outcome: VerifyOutcome,
    /// The head's `seq`: how many events the chain should have.
    pub head_seq: u64,
    /// The head's `hash` ([`GENESIS_HASH`] for an empty chain): worth
    /// recording elsewhere, so that a later verification can show that
    /// nothing before it was rewritten.
    pub head_hash: String,
}

/// Appends waiting for the commit in progress, and the results of finished
/// commits not yet picked up.
#[derive(Default)]
struct Queue {
    next_ticket: u64,
    waiting: Vec<(u64, Vec<NewEvent>)>,
    committing: bool,
    done: HashMap<u64, Result<Vec<AuditEvent>>>,
}

/// The audit log of one store. Every method blocks; async callers use
/// `spawn_blocking`.
pub struct AuditLog {
    engine: Arc<dyn Engine>,
    clock: Arc<dyn Clock>,
    /// Each used chain's builder; loaded from its stored head on first use.
    /// Held by the committing caller while it seals and commits.
    chains: Mutex<HashMap<String, ChainBuilder>>,
    queue: Mutex<Queue>,
    committed: Condvar,
    /// The journal that makes appends durable on a local engine; `None`
    /// commits each append durably in the engine.
    journal: Option<Mutex<Journal>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("engine", &self.engine.name())
            .finish_non_exhaustive()
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        // What is left unapplied is replayed from the journal by the next
        // open; applying it here spares that replay its durable commit.
        if let Err(e) = self.settle() {
            tracing::warn!(error = %e, "audit events journaled but not yet in the engine are replayed at the next start");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A copy of an error for each caller of a failed group commit.
fn share(e: &StoreError, engine: &'static str) -> StoreError {
    match e {
        StoreError::Engine(e) => StoreError::Engine(EngineError {
            engine: e.engine,
            message: e.message.clone(),
            unavailable: e.unavailable,
        }),
        other => StoreError::Engine(EngineError {
            engine,
            message: format!("audit append failed: {other}"),
            unavailable: false,
        }),
    }
}

impl AuditLog {
    /// The log over `engine`, stamping events with `clock`. Chains are
    /// resumed from their stored heads when first used.
    pub fn new(engine: Arc<dyn Engine>, clock: Arc<dyn Clock>) -> Self {
        AuditLog {
            engine,
            clock,
            chains: Mutex::new(HashMap::new()),
            queue: Mutex::new(Queue::default()),
            committed: Condvar::new(),
            journal: None,
        }
    }

    /// The log over a local `engine` with its journal at `path` (see
    /// `audit::journal`): replays what a crash took from the engine, then
    /// makes each append durable with one small write there. On a shared
    /// engine (fleet mode) this is [`AuditLog::new`]: every replica's
    /// appends commit durably in the shared engine. Returns the log and how
    /// many journal records it replayed.
    pub fn with_journal(
        engine: Arc<dyn Engine>,
        clock: Arc<dyn Clock>,
        path: &std::path::Path,
    ) -> Result<(Self, usize)> {
        let mut log = AuditLog::new(engine, clock);
        if log.engine.shared() {
            return Ok((log, 0));
        }
        let (journal, replayed) = Journal::open(path, &*log.engine, |b| log.lacks(b))?;
        log.journal = Some(Mutex::new(journal));
        Ok((log, replayed))
    }

    /// Whether the engine lacks a journaled batch: whether a chain head in
    /// it is past the head stored for that chain. Heads only move forward
    /// and commit with their events, so a batch whose heads are all stored
    /// (or passed) is in the engine already; replaying it again would undo
    /// nothing but could hide a change made to the store since.
    fn lacks(&self, batch: &Batch) -> Result<bool> {
        for op in batch.ops() {
            let (Tree::Meta, Some(value)) = (op.tree, &op.value) else {
                continue;
            };
            if !op.key.starts_with(HEAD_PREFIX) {
                continue;
            }
            let journaled: HeadRecord = decode_record(value)?;
            let stored = match self.engine.get(Tree::Meta, &op.key)? {
                Some(raw) => decode_record::<HeadRecord>(&raw)?.seq,
                None => 0,
            };
            if journaled.seq > stored {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The name of the engine the log is stored in.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// Appends one event; returns it sealed, once durable.
    pub fn append(&self, event: NewEvent) -> Result<AuditEvent> {
        let mut sealed = self.append_all(vec![event])?;
        Ok(sealed.pop().expect("one event in, one out"))
    }

    /// Appends events in order, in one commit; returns them sealed, once
    /// durable. Each joins its tenant's chain.
    pub fn append_all(&self, events: Vec<NewEvent>) -> Result<Vec<AuditEvent>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut sealed = self.append_groups(vec![events]);
        sealed.pop().expect("one group in, one result out")
    }

    /// Appends several callers' events, each group in order, and returns
    /// each group's sealed events (or the error of its commit) once
    /// durable, in the order given. Groups join the same queue as
    /// [`AuditLog::append_all`], so concurrent appends of either kind are
    /// committed together (see [`super::AuditWriter`]).
    pub fn append_groups(&self, groups: Vec<Vec<NewEvent>>) -> Vec<Result<Vec<AuditEvent>>> {
        let start = std::time::Instant::now();
        let out = self.append_queued(groups);
        crate::metrics::audit_append(start.elapsed());
        out
    }

    /// Joins the queue of appends and waits for the commits that seal these.
    fn append_queued(&self, groups: Vec<Vec<NewEvent>>) -> Vec<Result<Vec<AuditEvent>>> {
        let mut q = lock(&self.queue);
        let first = q.next_ticket;
        q.next_ticket += groups.len() as u64;
        // An empty group is done already; the rest wait for their commit.
        let mut out: Vec<Option<Result<Vec<AuditEvent>>>> = groups
            .iter()
            .map(|events| events.is_empty().then(|| Ok(Vec::new())))
            .collect();
        q.waiting.extend(
            (first..)
                .zip(groups)
                .filter(|(_, events)| !events.is_empty()),
        );
        loop {
            for (slot, ticket) in out.iter_mut().zip(first..) {
                if slot.is_none() {
                    *slot = q.done.remove(&ticket);
                }
            }
            if out.iter().all(Option::is_some) {
                return out.into_iter().flatten().collect();
            }
            if !q.committing {
                // Lead: commit everything waiting now, these included.
                q.committing = true;
                let group = std::mem::take(&mut q.waiting);
                drop(q);
                let tickets: Vec<u64> = group.iter().map(|(t, _)| *t).collect();
                // A panic here must not leave the queue committing forever.
                let committed = std::panic::AssertUnwindSafe(|| self.commit_group(group));
                let result = std::panic::catch_unwind(committed).unwrap_or_else(|_| {
                    Err(StoreError::Engine(EngineError::new(
                        self.engine.name(),
                        "the audit commit failed unexpectedly and nothing was appended; retry the call",
                    )))
                });
                q = lock(&self.queue);
                match result {
                    Ok(sealed) => q
                        .done
                        .extend(tickets.into_iter().zip(sealed.into_iter().map(Ok))),
                    Err(e) => {
                        let name = self.engine.name();
                        q.done
                            .extend(tickets.into_iter().map(|t| (t, Err(share(&e, name)))));
                    }
                }
                q.committing = false;
                self.committed.notify_all();
                continue;
            }
            q = self.committed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Seals a group of appends in order and commits them, with the new
    /// heads of their chains, in one durable batch. The builders advance
    /// only when the commit succeeds.
    fn commit_group(&self, group: Vec<(u64, Vec<NewEvent>)>) -> Result<Vec<Vec<AuditEvent>>> {
        let mut chains = lock(&self.chains);
        let _replicas = if self.engine.shared() {
            // Other replicas extend these chains too: hold each one's lock
            // and resume it from what is stored.
            let tenants: std::collections::BTreeSet<&str> = group
                .iter()
                .flat_map(|(_, events)| events.iter().map(|e| e.tenant.as_str()))
                .collect();
            let keys: Vec<_> = tenants
                .iter()
                .map(|t| crate::store::engine::lock_key("audit-chain", t.as_bytes()))
                .collect();
            let held = self.engine.lock(&keys)?;
            for t in tenants {
                chains.remove(t);
            }
            held
        } else {
            crate::store::engine::EngineLock::local()
        };
        let time = event_time(self.clock.now_ms());
        let mut touched: HashMap<String, ChainBuilder> = HashMap::new();
        let mut batch = Batch::new();
        let mut out = Vec::with_capacity(group.len());
        for (_, events) in group {
            let mut sealed = Vec::with_capacity(events.len());
            for e in events {
                debug_assert!(!e.tenant.is_empty(), "every event has a tenant");
                let builder = match touched.entry(e.tenant.clone()) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(v) => v.insert(self.builder(&mut chains, &e.tenant)?.clone()),
                };
                let event = builder.append(e.into_event(&time));
                batch.put(
                    Tree::Audit,
                    event_key(&event.tenant, event.seq),
                    encode_record(&event),
                );
                sealed.push(event);
            }
            out.push(sealed);
        }
        for (tenant, builder) in &touched {
            let head = HeadRecord {
                seq: builder.next_seq() - 1,
                hash: builder.last_hash().to_owned(),
            };
            batch.put(Tree::Meta, head_key(tenant), encode_record(&head));
        }
        match &self.journal {
            Some(journal) => lock(journal).commit(&*self.engine, batch)?,
            None => self.engine.commit(&batch)?,
        }
        chains.extend(touched);
        Ok(out)
    }

    /// The builder of `tenant`'s chain, loaded on first use.
    fn builder<'a>(
        &self,
        chains: &'a mut HashMap<String, ChainBuilder>,
        tenant: &str,
    ) -> Result<&'a ChainBuilder> {
        if !chains.contains_key(tenant) {
            let b = self.load(tenant)?;
            chains.insert(tenant.to_owned(), b);
        }
        Ok(&chains[tenant])
    }

    /// Gives the engine what the journal holds and the engine was not given
    /// yet (see `super::journal`), so that a read of the engine finds every
    /// acknowledged event. Every read of the audit trees calls it first.
    fn settle(&self) -> Result<()> {
        match &self.journal {
            Some(journal) => lock(journal).settle(&*self.engine),
            None => Ok(()),
        }
    }

    /// Resumes `tenant`'s chain from its stored head, or after the last
    /// stored event when events exist past the head.
    fn load(&self, tenant: &str) -> Result<ChainBuilder> {
        self.settle()?;
        let (seq, hash) = match self.engine.get(Tree::Meta, &head_key(tenant))? {
            Some(raw) => {
                let h: HeadRecord = decode_record(&raw)?;
                (h.seq, h.hash)
            }
            None => (0, GENESIS_HASH.to_owned()),
        };
        let prefix = chain_prefix(tenant);
        let end = prefix_end(&prefix).expect("the prefix ends in a NUL, so it can grow");
        let mut after = event_key(tenant, seq);
        let mut last = None;
        loop {
            let page = self.engine.range(
                Tree::Audit,
                Bound::Excluded(after.as_slice()),
                Bound::Excluded(end.as_slice()),
                SCAN_BATCH,
            )?;
            let done = page.len() < SCAN_BATCH;
            if let Some((key, value)) = page.into_iter().last() {
                after = key;
                last = Some(value);
            }
            if done {
                break;
            }
        }
        let Some(value) = last else {
            return Ok(ChainBuilder::resume(seq, hash));
        };
        let last_seq = seq_of(&after, prefix.len()).unwrap_or(seq);
        // Link to the last stored event's hash when it can be read; if not,
        // the chain breaks there, and verification names that event.
        let last_hash = decode_record::<AuditEvent>(&value)
            .map(|e| e.hash)
            .unwrap_or_else(|_| GENESIS_HASH.to_owned());
        tracing::error!(
            tenant,
            head_seq = seq,
            last_seq,
            "audit events exist past the stored chain head; appending after the last stored event. The head record was lost or altered: verify the chain"
        );
        Ok(ChainBuilder::resume(last_seq, last_hash))
    }

    /// `tenant`'s chain head: its last `seq` (0 when empty) and `hash`.
    pub fn head(&self, tenant: &str) -> Result<(u64, String)> {
        if self.engine.shared() {
            // Another replica may have moved it: the stored head is the head.
            return Ok(match self.engine.get(Tree::Meta, &head_key(tenant))? {
                Some(raw) => {
                    let h: HeadRecord = decode_record(&raw)?;
                    (h.seq, h.hash)
                }
                None => (0, GENESIS_HASH.to_owned()),
            });
        }
        let mut chains = lock(&self.chains);
        let b = self.builder(&mut chains, tenant)?;
        Ok((b.next_seq() - 1, b.last_hash().to_owned()))
    }

    /// Up to `limit` stored events of `tenant`'s chain with `seq` in
    /// `from..=upto`, in order, each with its key's `seq`; `None` for one
    /// that cannot be decoded.
    fn scan(
        &self,
        tenant: &str,
        from: u64,
        upto: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Option<AuditEvent>)>> {
        if from > upto {
            return Ok(Vec::new());
        }
        self.settle()?;
        let (start, end) = (event_key(tenant, from), event_key(tenant, upto));
        let prefix_len = start.len() - 8;
        let page = self.engine.range(
            Tree::Audit,
            Bound::Included(start.as_slice()),
            Bound::Included(end.as_slice()),
            limit,
        )?;
        Ok(page
            .into_iter()
            .filter_map(|(k, v)| {
                let seq = seq_of(&k, prefix_len)?;
                Some((seq, decode_record::<AuditEvent>(&v).ok()))
            })
            .collect())
    }

    /// The newest event of `tenant`'s chain with action `action`, looking
    /// back at most `look_back` events from the head (`None` when none is
    /// found within them).
    pub fn last_of(
        &self,
        tenant: &str,
        action: &str,
        look_back: u64,
    ) -> Result<Option<AuditEvent>> {
        let (head, _) = self.head(tenant)?;
        let floor = head.saturating_sub(look_back).max(1);
        let mut upto = head;
        while upto >= floor && upto > 0 {
            let from = upto.saturating_sub(SCAN_BATCH as u64 - 1).max(floor);
            let page = self.scan(tenant, from, upto, SCAN_BATCH)?;
            let found = page
                .into_iter()
                .rev()
                .find_map(|(_, e)| e.filter(|e| e.tenant == tenant && e.action == action));
            if found.is_some() {
                return Ok(found);
            }
            upto = from - 1;
        }
        Ok(None)
    }

    /// Events of `tenant`'s chain that pass `filter`, in `seq` order, at
    /// most `page_size` of them, from where `page_token` says (empty: from
    /// the start). The page's `next_token` is empty when nothing follows.
    /// A page may be short, even empty, while more follow: see
    /// `QUERY_SCAN_BUDGET`.
    pub fn query(
        &self,
        tenant: &str,
        filter: &Filter,
        page_token: &str,
        page_size: usize,
    ) -> Result<Page<AuditEvent>> {
        let (head, _) = self.head(tenant)?;
        let mut next = decode_token(page_token, head)?;
        let since = filter.since.map(event_time);
        let until = filter.until.map(event_time);
        let mut items = Vec::new();
        let mut budget = QUERY_SCAN_BUDGET;
        while next <= head && items.len() < page_size && budget > 0 {
            let limit = SCAN_BATCH.min(usize::try_from(budget).unwrap_or(SCAN_BATCH));
            let page = self.scan(tenant, next, head, limit)?;
            if page.is_empty() {
                next = head + 1;
                break;
            }
            for (seq, event) in page {
                next = seq + 1;
                budget -= 1;
                match event {
                    // The tenant check repeats the key's: a principal never
                    // sees another tenant's event, whatever the store holds.
                    Some(e)
                        if e.tenant == tenant
                            && filter.matches(&e, since.as_deref(), until.as_deref()) =>
                    {
                        items.push(e);
                        if items.len() == page_size {
                            break;
                        }
                    }
                    Some(_) => {}
                    None => {
                        tracing::warn!(
                            tenant,
                            seq,
                            "an audit event cannot be decoded; skipped in a query (VerifyAudit names it)"
                        );
                    }
                }
            }
        }
        let next_token = if next <= head {
            next.to_string()
        } else {
            String::new()
        };
        Ok(Page { items, next_token })
    }

    /// Up to `limit` events of `tenant`'s chain from `seq` `from` to `upto`,
    /// in order, as stored (tampered or not); undecodable ones are left out.
    /// Also returns the `seq` to continue from.
    pub fn export_page(
        &self,
        tenant: &str,
        from: u64,
        upto: u64,
        limit: usize,
    ) -> Result<(Vec<AuditEvent>, u64)> {
        let page = self.scan(tenant, from, upto, limit)?;
        let next = page.last().map_or(upto + 1, |(seq, _)| seq + 1);
        let events = page
            .into_iter()
            .filter_map(|(seq, e)| {
                if e.is_none() {
                    tracing::warn!(tenant, seq, "an audit event cannot be decoded; left out of the export, which then fails verification there");
                }
                e
            })
            .collect();
        Ok((events, next))
    }

    /// Verifies `tenant`'s whole chain, streaming, in pages, then checks
    /// that it ends at the head.
    pub fn verify(&self, tenant: &str) -> Result<Verified> {
        let (head_seq, head_hash) = self.head(tenant)?;
        let mut v = Verifier::new();
        let mut next = 1;
        'scan: while next <= head_seq {
            let page = self.scan(tenant, next, head_seq, SCAN_BATCH)?;
            if page.is_empty() {
                break;
            }
            for (seq, event) in page {
                next = seq + 1;
                let good = match event {
                    Some(e) => v.check(&e),
                    None => {
                        v.fail();
                        false
                    }
                };
                if !good {
                    break 'scan;
                }
            }
        }
        let mut outcome = v.outcome();
        if outcome.ok {
            let (seq, hash) = v.head();
            if seq < head_seq {
                // The tail was cut off.
                outcome.ok = false;
                outcome.first_bad_seq = seq + 1;
            } else if hash != head_hash {
                // The last event was rewritten and resealed.
                outcome.ok = false;
                outcome.first_bad_seq = seq;
                outcome.events_checked = seq.saturating_sub(1);
            }
        }
        Ok(Verified {
            outcome,
            head_seq,
            head_hash,
        })
    }
}

/// Page tokens are the decimal `seq` to continue from.
fn decode_token(token: &str, head: u64) -> Result<u64> {
    if token.is_empty() {
        return Ok(1);
    }
    token
        .parse::<u64>()
        .ok()
        .filter(|seq| (1..=head.saturating_add(1)).contains(seq))
        .ok_or_else(|| {
            StoreError::Invalid(
                "page_token is not one this server issued; start again with an empty page_token"
                    .into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditWriter, action, verify};
    use crate::clock::ManualClock;
    use crate::store::engine::{Entry, KeyRange};
    use crate::store::{RedbEngine, SledEngine};

    const START: Millis = 1_796_031_106_334;

    struct Fixture {
        _dir: tempfile::TempDir,
        engine: Arc<dyn Engine>,
        clock: ManualClock,
        log: AuditLog,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let engine: Arc<dyn Engine> = Arc::new(
            RedbEngine::open(
                &dir.path().join("meta.redb"),
                crate::store::engine::DEFAULT_CACHE_BYTES,
            )
            .unwrap(),
        );
        let clock = ManualClock::new(START);
        let log = AuditLog::new(engine.clone(), Arc::new(clock.clone()));
        Fixture {
            _dir: dir,
            engine,
            clock,
            log,
        }
    }

    impl Fixture {
        /// A log over this fixture's engine seen through a [`Wrapped`] one.
        fn wrapped(&self, delay: std::time::Duration) -> (Arc<Wrapped>, Arc<AuditLog>) {
            let wrapped = Wrapped::new(self.engine.clone(), delay);
            let log = AuditLog::new(wrapped.clone(), Arc::new(self.clock.clone()));
            (wrapped, Arc::new(log))
        }

        /// A fresh log over the same engine, as after a restart.
        fn reopen(&mut self) {
            self.log = AuditLog::new(self.engine.clone(), Arc::new(self.clock.clone()));
        }

        fn all(&self, tenant: &str) -> Vec<AuditEvent> {
            self.log
                .query(tenant, &Filter::default(), "", usize::MAX)
                .unwrap()
                .items
        }
    }

    fn ev(n: u64, tenant: &str) -> NewEvent {
        NewEvent::new(action::PAYLOAD_READ)
            .by(&format!("agent-{}", n % 2), tenant)
            .session(format!("ses_{}", n % 3))
            .payload(format!("pl_{n}"))
            .detail(format!("bytes 0-{n}"))
    }

    #[test]
    fn appends_number_from_one_link_from_zeros_and_store_the_head() {
        let f = fixture();
        let a = f.log.append(ev(1, "acme")).unwrap();
        let b = f.log.append(ev(2, "acme")).unwrap();
        assert_eq!((a.seq, a.prev_hash.as_str()), (1, GENESIS_HASH));
        assert_eq!((b.seq, &b.prev_hash), (2, &a.hash));
        assert_eq!(a.time, "2026-11-30T09:31:46.334Z");
        assert_eq!(
            (a.principal.as_str(), a.tenant.as_str()),
            ("agent-1", "acme")
        );
        assert_eq!(a.outcome, "ok");
        assert_eq!(f.all("acme"), vec![a, b.clone()]);
        let stored: HeadRecord = decode_record(
            &f.engine
                .get(Tree::Meta, &head_key("acme"))
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            stored,
            HeadRecord {
                seq: 2,
                hash: b.hash.clone()
            }
        );
        let raw = f
            .engine
            .get(Tree::Audit, &event_key("acme", 2))
            .unwrap()
            .unwrap();
        assert_eq!(raw[0], crate::store::VALUE_FORMAT);
        assert_eq!(&raw[1..], b.to_export_line().as_bytes());
    }

    #[test]
    fn last_of_finds_the_newest_event_of_an_action_within_its_look_back() {
        let mut f = fixture();
        let verify = |n: u64| {
            NewEvent::new(action::AUDIT_VERIFY)
                .by("carol", "acme")
                .detail(format!("ok events_checked={n} head_seq={n}"))
        };
        f.log.append(verify(1)).unwrap();
        for n in 2..600 {
            f.log.append(ev(n, "acme")).unwrap();
        }
        f.log.append(verify(600)).unwrap();
        f.log.append(ev(601, "other")).unwrap();
        for n in 602..900 {
            f.log.append(ev(n, "acme")).unwrap();
        }
        f.reopen();
        let found = f.log.last_of("acme", action::AUDIT_VERIFY, 10_000).unwrap();
        assert_eq!(
            found.map(|e| e.detail),
            Some("ok events_checked=600 head_seq=600".into())
        );
        // 298 events follow it: a look-back of 100 does not reach it.
        assert!(
            f.log
                .last_of("acme", action::AUDIT_VERIFY, 100)
                .unwrap()
                .is_none()
        );
        assert!(
            f.log
                .last_of("other", action::AUDIT_VERIFY, 10_000)
                .unwrap()
                .is_none()
        );
        assert!(
            f.log
                .last_of("nobody", action::AUDIT_VERIFY, 10_000)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn each_tenant_has_its_own_chain() {
        let f = fixture();
        f.log.append(ev(1, "acme")).unwrap();
        let other = f.log.append(ev(2, "other")).unwrap();
        f.log.append(ev(3, "acme")).unwrap();
        assert_eq!((other.seq, other.prev_hash.as_str()), (1, GENESIS_HASH));
        assert_eq!(
            f.all("acme").iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(f.all("other").iter().all(|e| e.tenant == "other"));
        assert!(f.all("acm").is_empty());
        assert!(verify(f.all("acme")).ok && verify(f.all("other")).ok);
    }

    #[test]
    fn a_reopened_log_resumes_each_chain_from_its_stored_head() {
        let mut f = fixture();
        f.log.append(ev(1, "acme")).unwrap();
        f.log.append(ev(2, "acme")).unwrap();
        f.reopen();
        f.clock.advance(std::time::Duration::from_secs(1));
        let third = f.log.append(ev(3, "acme")).unwrap();
        assert_eq!(third.seq, 3);
        assert_eq!(third.time, "2026-11-30T09:31:47.334Z");
        let all = f.all("acme");
        assert_eq!(all.len(), 3);
        assert_eq!(verify(all).events_checked, 3);
        assert!(f.log.verify("acme").unwrap().outcome.ok);
    }

    /// An engine that can fail its commits, or slow them, and counts them.
    struct Wrapped {
        inner: Arc<dyn Engine>,
        fail: std::sync::atomic::AtomicBool,
        panic: std::sync::atomic::AtomicBool,
        delay: std::time::Duration,
        commits: std::sync::atomic::AtomicU64,
        /// Volatile commits are dropped, as a crash would lose them.
        lose_volatile: std::sync::atomic::AtomicBool,
    }

    impl Wrapped {
        fn new(inner: Arc<dyn Engine>, delay: std::time::Duration) -> Arc<Self> {
            Arc::new(Wrapped {
                inner,
                fail: false.into(),
                panic: false.into(),
                delay,
                commits: 0.into(),
                lose_volatile: false.into(),
            })
        }
    }

    impl Engine for Wrapped {
        fn name(&self) -> &'static str {
            "wrapped"
        }
        fn get(&self, t: Tree, k: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
            self.inner.get(t, k)
        }
        fn scan(&self, t: Tree, keys: KeyRange<'_>) -> Result<Vec<Entry>, EngineError> {
            self.inner.scan(t, keys)
        }
        fn commit(&self, b: &Batch) -> Result<(), EngineError> {
            use std::sync::atomic::Ordering::SeqCst;
            std::thread::sleep(self.delay);
            if self.fail.load(SeqCst) {
                return Err(EngineError::new("wrapped", "disk on fire"));
            }
            if self.panic.swap(false, SeqCst) {
                panic!("an engine bug");
            }
            self.commits.fetch_add(1, SeqCst);
            self.inner.commit(b)
        }
        fn commit_volatile(&self, b: &Batch) -> Result<(), EngineError> {
            if self.lose_volatile.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            self.inner.commit_volatile(b)
        }
        fn flush(&self) -> Result<(), EngineError> {
            Ok(())
        }
    }

    /// A log over `engine` with its journal in `dir`, and how many records
    /// it replayed.
    fn journaled(f: &Fixture, engine: Arc<dyn Engine>, dir: &std::path::Path) -> (AuditLog, usize) {
        let clock = Arc::new(f.clock.clone());
        AuditLog::with_journal(engine, clock, &dir.join("audit.journal")).unwrap()
    }

    /// How many of `tenant`'s events the engine holds, read by a log that
    /// has cached nothing.
    fn stored(f: &Fixture, tenant: &str) -> usize {
        AuditLog::new(f.engine.clone(), Arc::new(f.clock.clone()))
            .query(tenant, &Filter::default(), "", usize::MAX)
            .unwrap()
            .items
            .len()
    }

    #[test]
    fn journaled_appends_are_read_at_once_through_the_log_and_go_on_after_a_reopen() {
        let f = fixture();
        let dir = tempfile::tempdir().unwrap();
        let (log, replayed) = journaled(&f, f.engine.clone(), dir.path());
        assert_eq!(replayed, 0);
        let read = |log: &AuditLog| {
            log.query("acme", &Filter::default(), "", usize::MAX)
                .unwrap()
                .items
                .len()
        };
        for n in 1..=5 {
            log.append(ev(n, "acme")).unwrap();
            assert_eq!(read(&log) as u64, n);
            // The read gave the engine what the journal held.
            assert_eq!(stored(&f, "acme") as u64, n);
        }
        log.append(ev(6, "acme")).unwrap();
        assert_eq!(
            stored(&f, "acme"),
            5,
            "an append waits for the journal alone"
        );
        drop(log);
        assert_eq!(
            stored(&f, "acme"),
            6,
            "closing the log gives the engine the rest"
        );
        let (log, replayed) = journaled(&f, f.engine.clone(), dir.path());
        assert_eq!(replayed, 0, "the engine had every event already");
        assert_eq!(log.append(ev(7, "acme")).unwrap().seq, 7);
        assert_eq!(log.verify("acme").unwrap().outcome.events_checked, 7);
    }

    #[test]
    fn events_a_crash_took_from_the_engine_are_replayed_from_the_journal() {
        use std::sync::atomic::Ordering::SeqCst;
        let f = fixture();
        let dir = tempfile::tempdir().unwrap();
        let wrapped = Wrapped::new(f.engine.clone(), std::time::Duration::ZERO);
        let (log, _) = journaled(&f, wrapped.clone(), dir.path());
        for n in 1..=4 {
            log.append(ev(n, "acme")).unwrap();
        }
        // A read gives the engine these four.
        assert_eq!(log.verify("acme").unwrap().outcome.events_checked, 4);
        // From here the engine's volatile commits never reach it, as if the
        // process died before they were written back.
        wrapped.lose_volatile.store(true, SeqCst);
        for n in 5..=12 {
            log.append(ev(n, if n % 2 == 1 { "acme" } else { "bolt" }))
                .unwrap();
        }
        drop(log);
        assert_eq!((stored(&f, "acme"), stored(&f, "bolt")), (4, 0));

        let (log, replayed) = journaled(&f, f.engine.clone(), dir.path());
        assert_eq!(replayed, 8);
        assert_eq!((stored(&f, "acme"), stored(&f, "bolt")), (8, 4));
        for tenant in ["acme", "bolt"] {
            let v = log.verify(tenant).unwrap().outcome;
            assert!(v.ok, "{tenant}: {v:?}");
        }
        assert_eq!(log.append(ev(13, "acme")).unwrap().seq, 9);
        assert_eq!(log.append(ev(14, "bolt")).unwrap().seq, 5);
    }

    #[test]
    fn the_journal_never_undoes_a_change_made_to_stored_events() {
        let f = fixture();
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = journaled(&f, f.engine.clone(), dir.path());
        for n in 1..=5 {
            log.append(ev(n, "acme")).unwrap();
        }
        drop(log);
        f.engine.delete(Tree::Audit, &event_key("acme", 3)).unwrap();
        let (log, replayed) = journaled(&f, f.engine.clone(), dir.path());
        assert_eq!(replayed, 0);
        let v = log.verify("acme").unwrap().outcome;
        assert_eq!((v.ok, v.first_bad_seq), (false, 3));
    }

    #[test]
    fn a_failed_commit_consumes_no_seq() {
        use std::sync::atomic::Ordering::SeqCst;
        let f = fixture();
        let (wrapped, log) = f.wrapped(std::time::Duration::ZERO);
        log.append(ev(1, "acme")).unwrap();
        wrapped.fail.store(true, SeqCst);
        let err = log.append(ev(2, "acme")).unwrap_err();
        assert!(err.to_string().contains("disk on fire"), "{err}");
        wrapped.fail.store(false, SeqCst);
        assert_eq!(log.append(ev(3, "acme")).unwrap().seq, 2);
        assert!(log.verify("acme").unwrap().outcome.ok);
    }

    #[test]
    fn a_panicking_commit_fails_its_appends_and_the_next_append_commits() {
        use std::sync::atomic::Ordering::SeqCst;
        let f = fixture();
        let (wrapped, log) = f.wrapped(std::time::Duration::ZERO);
        wrapped.panic.store(true, SeqCst);
        let err = log.append(ev(1, "acme")).unwrap_err();
        assert!(err.to_string().contains("failed unexpectedly"), "{err}");
        assert_eq!(log.append(ev(2, "acme")).unwrap().seq, 1);
        assert!(log.verify("acme").unwrap().outcome.ok);
    }

    #[test]
    fn concurrent_appends_share_commits() {
        let f = fixture();
        let (wrapped, log) = f.wrapped(std::time::Duration::from_millis(5));
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let log = &log;
                s.spawn(move || {
                    for i in 0..10u64 {
                        log.append(ev(t * 100 + i, "acme")).unwrap();
                    }
                });
            }
        });
        let commits = wrapped.commits.load(std::sync::atomic::Ordering::SeqCst);
        assert!(commits < 60, "80 appends took {commits} commits");
        assert_eq!(log.verify("acme").unwrap().outcome.events_checked, 80);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn async_appends_through_the_writer_share_commits_and_form_one_gapless_chain() {
        let f = fixture();
        let (wrapped, log) = f.wrapped(std::time::Duration::from_millis(5));
        let writer = AuditWriter::start(&log).unwrap();
        let tasks: Vec<_> = (0..64u64)
            .map(|i| {
                let w = writer.clone();
                tokio::spawn(async move { w.append_all(vec![ev(i, "acme")]).await })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            let sealed = t.await.unwrap().unwrap();
            assert_eq!(sealed.len(), 1);
            seqs.push(sealed[0].seq);
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=64).collect::<Vec<u64>>());
        let commits = wrapped.commits.load(std::sync::atomic::Ordering::SeqCst);
        assert!(commits < 32, "64 appends took {commits} commits");
        assert_eq!(log.verify("acme").unwrap().outcome.events_checked, 64);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_async_append_keeps_its_order_and_an_empty_one_commits_nothing() {
        let f = fixture();
        let (wrapped, log) = f.wrapped(std::time::Duration::ZERO);
        let writer = AuditWriter::start(&log).unwrap();
        assert!(writer.append_all(Vec::new()).await.unwrap().is_empty());
        assert_eq!(wrapped.commits.load(std::sync::atomic::Ordering::SeqCst), 0);
        let events = vec![ev(1, "acme"), ev(2, "other"), ev(3, "acme")];
        let sealed = writer.append_all(events).await.unwrap();
        let got: Vec<(&str, u64, &str)> = sealed
            .iter()
            .map(|e| (e.tenant.as_str(), e.seq, e.payload_id.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("acme", 1, "pl_1"),
                ("other", 1, "pl_2"),
                ("acme", 2, "pl_3")
            ]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_writer_does_not_keep_the_log_open_and_fails_appends_after_it_closes() {
        let f = fixture();
        let log = Arc::new(AuditLog::new(f.engine.clone(), Arc::new(f.clock.clone())));
        let writer = AuditWriter::start(&log).unwrap();
        writer.append_all(vec![ev(1, "acme")]).await.unwrap();
        let weak = Arc::downgrade(&log);
        drop(log);
        assert!(
            weak.upgrade().is_none(),
            "the writer holds the log between commits"
        );
        let err = writer.append_all(vec![ev(2, "acme")]).await.unwrap_err();
        assert!(err.to_string().contains("audit log is closed"), "{err}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_commit_fails_its_async_callers_and_the_writer_keeps_going() {
        use std::sync::atomic::Ordering::SeqCst;
        let f = fixture();
        let (wrapped, log) = f.wrapped(std::time::Duration::ZERO);
        let writer = AuditWriter::start(&log).unwrap();
        wrapped.fail.store(true, SeqCst);
        let err = writer.append_all(vec![ev(1, "acme")]).await.unwrap_err();
        assert!(err.to_string().contains("disk on fire"), "{err}");
        wrapped.fail.store(false, SeqCst);
        let sealed = writer.append_all(vec![ev(2, "acme")]).await.unwrap();
        assert_eq!(sealed[0].seq, 1, "the failed append consumed no seq");
        assert!(log.verify("acme").unwrap().outcome.ok);
    }

    #[test]
    fn concurrent_appends_form_one_gapless_chain_per_tenant() {
        let f = fixture();
        let got: Vec<Vec<AuditEvent>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8u64)
                .map(|t| {
                    let log = &f.log;
                    s.spawn(move || {
                        (0..25u64)
                            .map(|i| {
                                let tenant = if t % 2 == 0 { "acme" } else { "other" };
                                log.append(ev(t * 100 + i, tenant)).unwrap()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for tenant in ["acme", "other"] {
            let all = f.all(tenant);
            assert_eq!(all.len(), 100, "{tenant}");
            assert_eq!(
                verify(all.clone()),
                VerifyOutcome {
                    ok: true,
                    events_checked: 100,
                    first_bad_seq: 0
                }
            );
            // Every caller got back exactly the event stored under its seq.
            let mut returned: Vec<AuditEvent> = got
                .iter()
                .flatten()
                .filter(|e| e.tenant == tenant)
                .cloned()
                .collect();
            returned.sort_by_key(|e| e.seq);
            assert_eq!(returned, all);
            // Each thread's own appends come back in its order.
            for events in &got {
                assert!(
                    events
                        .windows(2)
                        .all(|w| w[0].tenant != w[1].tenant || w[0].seq < w[1].seq)
                );
            }
        }
    }

    #[test]
    fn append_all_keeps_order_within_one_call() {
        let f = fixture();
        let sealed = f
            .log
            .append_all(vec![ev(1, "acme"), ev(2, "other"), ev(3, "acme")])
            .unwrap();
        let seqs: Vec<(&str, u64)> = sealed.iter().map(|e| (e.tenant.as_str(), e.seq)).collect();
        assert_eq!(seqs, [("acme", 1), ("other", 1), ("acme", 2)]);
        assert_eq!(sealed[2].prev_hash, sealed[0].hash);
        assert!(f.log.append_all(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn queries_filter_by_every_field_and_page_by_seq() {
        let f = fixture();
        for n in 1..=10 {
            f.log.append(ev(n, "acme")).unwrap();
            f.clock.advance(std::time::Duration::from_secs(1));
        }
        f.log
            .append(
                NewEvent::new(action::ACCESS_DENIED)
                    .by("mallory", "acme")
                    .outcome(outcome::DENIED),
            )
            .unwrap();
        let q = |filter: Filter| -> Vec<u64> {
            f.log
                .query("acme", &filter, "", 100)
                .unwrap()
                .items
                .iter()
                .map(|e| e.seq)
                .collect()
        };
        assert_eq!(
            q(Filter {
                session_id: Some("ses_1".into()),
                ..Filter::default()
            }),
            [1, 4, 7, 10]
        );
        assert_eq!(
            q(Filter {
                payload_id: Some("pl_3".into()),
                ..Filter::default()
            }),
            [3]
        );
        assert_eq!(
            q(Filter {
                principal: Some("agent-0".into()),
                ..Filter::default()
            }),
            [2, 4, 6, 8, 10]
        );
        assert_eq!(
            q(Filter {
                action: Some("access.denied".into()),
                ..Filter::default()
            }),
            [11]
        );
        assert_eq!(
            q(Filter {
                since: Some(START + 2000),
                until: Some(START + 5000),
                ..Filter::default()
            }),
            [3, 4, 5],
            "since is inclusive, until exclusive"
        );
        assert_eq!(
            q(Filter {
                principal: Some("agent-1".into()),
                session_id: Some("ses_1".into()),
                ..Filter::default()
            }),
            [1, 7]
        );

        // Pages of 3 cover everything once, in order.
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = f.log.query("acme", &Filter::default(), &token, 3).unwrap();
            assert!(page.items.len() <= 3);
            seen.extend(page.items.iter().map(|e| e.seq));
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(seen, (1..=11).collect::<Vec<_>>());
        // A full last page says nothing follows.
        assert!(
            f.log
                .query("acme", &Filter::default(), "10", 2)
                .unwrap()
                .next_token
                .is_empty()
        );

        for bad in ["x", "0", "13", "-1"] {
            let err = f.log.query("acme", &Filter::default(), bad, 3).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn a_query_stops_at_its_scan_budget_with_a_token() {
        let f = fixture();
        let events: Vec<NewEvent> = (1..=QUERY_SCAN_BUDGET + 5).map(|n| ev(n, "acme")).collect();
        f.log.append_all(events).unwrap();
        let nothing = Filter {
            action: Some("session.create".into()),
            ..Filter::default()
        };
        let first = f.log.query("acme", &nothing, "", 10).unwrap();
        assert!(first.items.is_empty());
        assert_eq!(first.next_token, (QUERY_SCAN_BUDGET + 1).to_string());
        let second = f
            .log
            .query("acme", &nothing, &first.next_token, 10)
            .unwrap();
        assert!(second.items.is_empty() && second.next_token.is_empty());
    }

    /// Rewrites the stored bytes of event `seq`.
    fn tamper(f: &Fixture, seq: u64, edit: impl FnOnce(&mut Vec<u8>)) {
        let key = event_key("acme", seq);
        let mut raw = f.engine.get(Tree::Audit, &key).unwrap().unwrap();
        edit(&mut raw);
        f.engine.put(Tree::Audit, &key, &raw).unwrap();
    }

    fn chain_of(n: u64) -> Fixture {
        let f = fixture();
        for i in 1..=n {
            f.log.append(ev(i, "acme")).unwrap();
        }
        f
    }

    fn bad_at(seq: u64) -> VerifyOutcome {
        VerifyOutcome {
            ok: false,
            events_checked: seq - 1,
            first_bad_seq: seq,
        }
    }

    #[test]
    fn verify_accepts_an_intact_chain_and_reports_its_head() {
        let f = chain_of(600);
        let v = f.log.verify("acme").unwrap();
        assert_eq!(
            v.outcome,
            VerifyOutcome {
                ok: true,
                events_checked: 600,
                first_bad_seq: 0
            }
        );
        assert_eq!(v.head_seq, 600);
        assert_eq!(v.head_hash, f.all("acme")[599].hash);
        let empty = f.log.verify("nobody").unwrap();
        assert_eq!(
            (empty.outcome.ok, empty.head_seq, empty.head_hash.as_str()),
            (true, 0, GENESIS_HASH)
        );
    }

    #[test]
    fn verify_names_an_event_with_one_byte_flipped() {
        let f = chain_of(10);
        tamper(&f, 4, |raw| {
            let at = raw.windows(7).position(|w| w == b"bytes 0").unwrap();
            raw[at] = b'B';
        });
        assert_eq!(f.log.verify("acme").unwrap().outcome, bad_at(4));
        // A byte that breaks the JSON is caught the same way.
        tamper(&f, 2, |raw| raw[1] = b'[');
        assert_eq!(f.log.verify("acme").unwrap().outcome, bad_at(2));
    }

    #[test]
    fn verify_names_a_deleted_event_a_cut_tail_and_a_resealed_last_event() {
        let f = chain_of(10);
        f.engine.delete(Tree::Audit, &event_key("acme", 6)).unwrap();
        assert_eq!(f.log.verify("acme").unwrap().outcome, bad_at(6));

        let f = chain_of(10);
        for seq in [9, 10] {
            f.engine
                .delete(Tree::Audit, &event_key("acme", seq))
                .unwrap();
        }
        assert_eq!(f.log.verify("acme").unwrap().outcome, bad_at(9), "cut tail");

        let f = chain_of(10);
        let mut last = f.all("acme").pop().unwrap();
        last.detail = "rewritten".into();
        let last = crate::audit::seal(&last.prev_hash.clone(), last);
        f.engine
            .put(Tree::Audit, &event_key("acme", 10), &encode_record(&last))
            .unwrap();
        assert!(verify(f.all("acme")).ok, "the chain alone cannot tell");
        assert_eq!(
            f.log.verify("acme").unwrap().outcome,
            bad_at(10),
            "the head can"
        );
    }

    #[test]
    fn events_past_a_lost_head_are_never_overwritten() {
        let mut f = chain_of(5);
        f.engine.delete(Tree::Meta, &head_key("acme")).unwrap();
        f.reopen();
        let next = f.log.append(ev(6, "acme")).unwrap();
        assert_eq!(next.seq, 6);
        assert_eq!(verify(f.all("acme")).events_checked, 6);
    }

    #[test]
    fn the_log_works_on_sled_too() {
        let dir = tempfile::tempdir().unwrap();
        let engine: Arc<dyn Engine> = Arc::new(
            SledEngine::open(
                &dir.path().join("meta.sled"),
                crate::store::engine::DEFAULT_CACHE_BYTES,
            )
            .unwrap(),
        );
        let log = AuditLog::new(engine.clone(), Arc::new(ManualClock::new(START)));
        for n in 1..=300 {
            log.append(ev(n, "acme")).unwrap();
        }
        let log = AuditLog::new(engine, Arc::new(ManualClock::new(START)));
        assert_eq!(log.append(ev(301, "acme")).unwrap().seq, 301);
        assert_eq!(log.verify("acme").unwrap().outcome.events_checked, 301);
    }
}
