//! Deletion that propagates and survives crashes.
//!
//! Every deletion — DeletePayload, DeleteSession, a close with
//! `delete_on_close`, the reaper — goes through [`Store::delete`]:
//!
//! 1. **Plan.** The target's payloads, then everything derived from them,
//!    transitively, through the derived index (script outputs, archived
//!    history), in whichever session they live. A legal hold on any session
//!    the plan touches refuses the whole deletion, naming the hold.
//! 2. **Intent.** One commit writes the signed receipt, a tombstone for
//!    every removed ID, and a [`DeletionIntent`] naming what is left to do.
//! 3. **Files.** Each payload's link is unlinked; deduplicated bytes go with
//!    their last link. Deleted sessions lose their directory.
//! 4. **Metadata.** One commit removes the records and index entries
//!    (line index, names, content index, expiry, derived index), takes the
//!    freed usage off surviving sessions, and removes the intent.
//!
//! **Fleet mode.** Step 2 also appends the deleted payloads' local copies
//! to the purge log ([`Tree::Purges`]), which every replica tails
//! ([`Store::purge_step`]) with an exclusive cursor. An entry's key starts
//! with a position allocated under the deletion lock, strictly after the
//! newest entry's (kept in [`Tree::Meta`] and committed with the entry), so
//! keys grow in commit order even when the deleting replicas' clocks
//! disagree or step back: a tailer past a key has seen every entry before
//! it. Each replica records how far it got and when
//! ([`Tree::PurgeProgress`], at least every [`HEARTBEAT_MS`]). DeletePayload
//! and DeleteSession then wait, up to `store.purge_confirm_timeout`, until
//! every live replica (one that reported within [`LIVE_MS`]) has passed the
//! deletion's entry, and sign that time and the replica count into the
//! receipt ([`Store::confirm_purge`]). Liveness compares one replica's
//! clock with another's report, so it assumes clocks agree to well within
//! [`LIVE_MS`].
//!
//! A crash after step 2 leaves the intent; [`Store::finish_interrupted`]
//! redoes steps 3 and 4 at the next start, before reconciliation. Both are
//! idempotent, and the usage change commits together with the intent's
//! removal, so it applies exactly once.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::io;

use super::engine::{Batch, Tree};
use super::records::{
    self, DeletionIntent, PayloadRecord, ReceiptRecord, RemovedItem, SessionRecord, keys, removed,
};
use super::{Result, Store, StoreError, blobs, check_hold, payload_id_from_listing_key};
use crate::ids::{PayloadId, ReceiptId, SessionId};

/// What to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One payload and what derives from it.
    Payload(PayloadId),
    /// A session: its payloads, what derives from them, and the session.
    Session(SessionId),
    /// A session's payloads (and what derives from them), keeping the
    /// closed session's record: a close with `delete_on_close`.
    SessionContents(SessionId),
}

impl Target {
    fn id(&self) -> &str {
        match self {
            Target::Payload(p) => p.as_str(),
            Target::Session(s) | Target::SessionContents(s) => s.as_str(),
        }
    }
}

/// Why, and for whom, a deletion happens.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// What.
    pub target: Target,
    /// The principal, or `reaper`.
    pub requested_by: &'a str,
    /// The reason recorded in the receipt.
    pub reason: &'a str,
    /// The reaper's lease: its deletions commit only while it holds it.
    pub fence: Option<&'a super::engine::Lease>,
}

/// Kind byte of an expiry entry for a closed session whose payloads are
/// to be deleted (`delete_on_close` deferred by a legal hold, or
/// interrupted).
pub const EXPIRY_CLOSE: u8 = b'C';

/// A deletion worked out under the locks, not yet carried out.
struct Plan {
    payloads: Vec<PayloadRecord>,
    items: Vec<RemovedItem>,
    sessions: Vec<SessionRecord>,
    usage: Vec<(SessionId, u64, u64)>,
    expiry_keys: Vec<Vec<u8>>,
    /// Every session the plan touches (for the locks and hold checks).
    touched: BTreeSet<SessionId>,
}

/// The key of a deletion's purge entry: its position (see
/// [`Store::next_purge_position`]), then the receipt ID.
fn purge_key(position_ms: u64, receipt: &ReceiptId) -> Vec<u8> {
    let mut k = position_ms.to_be_bytes().to_vec();
    k.extend_from_slice(receipt.as_str().as_bytes());
    k
}

/// Where in [`Tree::Meta`] the newest purge entry's position is kept (8
/// bytes, big-endian milliseconds).
const PURGE_HIGH_WATER: &[u8] = b"purges.high_water";

/// How long purge entries stay for replicas to tail; a replica away for
/// longer reconciles its directory at startup instead.
const PURGE_KEEP_MS: u64 = 3_600_000;

/// What one pass over the purge log did.
#[derive(Debug, Default)]
pub struct PurgeStep {
    /// Local copies removed.
    pub removed: u64,
    /// Where the next pass resumes.
    pub cursor: Option<Vec<u8>>,
    /// When this replica last recorded its progress (store clock).
    pub reported_ms: crate::clock::Millis,
}

/// A replica reports its purge progress at least this often (more often
/// when its cursor moves).
pub const HEARTBEAT_MS: crate::clock::Millis = 1_000;

/// A replica whose last report is older than this is taken for gone: a
/// deletion does not wait for it.
pub const LIVE_MS: crate::clock::Millis = 3_000;

/// How often a deletion looks at the replicas' progress while it waits.
const CONFIRM_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// A replica's entry in [`Tree::PurgeProgress`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Progress {
    /// The purge key it has applied everything up to (hex; empty for none).
    cursor: String,
    /// When it said so, by its clock.
    reported_ms: crate::clock::Millis,
    /// How often it reports at least: the larger of [`HEARTBEAT_MS`] and
    /// its `store.purge_interval`.
    #[serde(default)]
    every_ms: crate::clock::Millis,
}

impl Progress {
    /// Whether the replica reported recently enough, at `now`, to be taken
    /// for alive: within [`LIVE_MS`], or three of its own report periods
    /// when it tails less often than that.
    fn live(&self, now: crate::clock::Millis) -> bool {
        now - self.reported_ms <= LIVE_MS.max(self.every_ms.saturating_mul(3))
    }
}

impl Store {
    /// Removes this replica's local copies of what deletions (on any
    /// replica) removed since `last.cursor`, records how far it got under
    /// `replica` when the cursor moved or `HEARTBEAT_MS` after
    /// `last.reported_ms`, and drops purge entries and progress reports
    /// older than an hour. Called every `every` (`store.purge_interval`)
    /// by the server in fleet mode.
    pub fn purge_step(
        &self,
        replica: &str,
        every: std::time::Duration,
        last: &PurgeStep,
    ) -> Result<PurgeStep> {
        let after = last.cursor.as_deref();
        let mut step = PurgeStep {
            cursor: last.cursor.clone(),
            reported_ms: last.reported_ms,
            ..PurgeStep::default()
        };
        let start = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let entries = self
            .engine
            .range(Tree::Purges, start, std::ops::Bound::Unbounded, 256)?;
        for (key, value) in entries {
            let copies: Vec<(String, String)> = serde_json::from_slice(&value).unwrap_or_default();
            for (sid, name) in copies {
                let Ok(sid) = SessionId::parse(&sid) else {
                    continue;
                };
                if let Some(objects) = &self.objects {
                    objects.cache.removed(&sid, &name);
                }
                let Ok(dir) = self.blobs.session_dir(&sid) else {
                    continue;
                };
                if dir.remove_file(&name).is_ok() {
                    step.removed += 1;
                }
            }
            step.cursor = Some(key);
        }
        let now = self.now_ms();
        if step.cursor != last.cursor || now - last.reported_ms >= HEARTBEAT_MS {
            let progress = Progress {
                cursor: step.cursor.as_deref().map(hex::encode).unwrap_or_default(),
                reported_ms: now,
                every_ms: HEARTBEAT_MS.max(i64::try_from(every.as_millis()).unwrap_or(i64::MAX)),
            };
            self.engine.put(
                Tree::PurgeProgress,
                replica.as_bytes(),
                &serde_json::to_vec(&progress).expect("a struct of strings and integers"),
            )?;
            step.reported_ms = now;
        }
        let gone: Vec<Vec<u8>> = self
            .engine
            .range(
                Tree::PurgeProgress,
                std::ops::Bound::Unbounded,
                std::ops::Bound::Unbounded,
                4096,
            )?
            .into_iter()
            .filter(|(_, v)| {
                serde_json::from_slice::<Progress>(v)
                    .is_ok_and(|p| now - p.reported_ms > PURGE_KEEP_MS as crate::clock::Millis)
            })
            .map(|(k, _)| k)
            .collect();
        if !gone.is_empty() {
            let mut b = Batch::new();
            for k in gone {
                b.delete(Tree::PurgeProgress, k);
            }
            self.engine.commit(&b)?;
        }
        let old = now.max(0) as u64;
        let horizon = old.saturating_sub(PURGE_KEEP_MS).to_be_bytes();
        let stale = self.engine.range(
            Tree::Purges,
            std::ops::Bound::Unbounded,
            std::ops::Bound::Excluded(horizon.as_slice()),
            256,
        )?;
        if !stale.is_empty() {
            let mut b = Batch::new();
            for (k, _) in stale {
                b.delete(Tree::Purges, k);
            }
            self.engine.commit(&b)?;
        }
        Ok(step)
    }
}

impl Store {
    /// Fleet mode: waits, up to `store.purge_confirm_timeout`, until every
    /// live replica has applied the purge entry `purge` of `receipt`'s
    /// deletion, then records when and how many in the receipt, signs it
    /// again and stores it. Without a purge entry, when the wait runs out,
    /// or when the engine fails meanwhile (the deletion is done and durable
    /// either way), the receipt comes back as it was.
    pub(super) fn confirm_purge(
        &self,
        receipt: ReceiptRecord,
        purge: Option<Vec<u8>>,
    ) -> ReceiptRecord {
        let (Some(settings), Some(target)) = (&self.settings.objects, purge) else {
            return receipt;
        };
        if receipt.deleted_payload_ids.is_empty() {
            return receipt;
        }
        match self.await_purge(&receipt, &target, settings.purge_confirm_timeout) {
            Ok(Some(confirmed)) => confirmed,
            Ok(None) => receipt,
            Err(e) => {
                tracing::warn!(receipt_id = %receipt.id, error = %e, "could not confirm the purge; the receipt goes without the confirmation");
                receipt
            }
        }
    }

    fn await_purge(
        &self,
        receipt: &ReceiptRecord,
        target: &[u8],
        timeout: std::time::Duration,
    ) -> Result<Option<ReceiptRecord>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let now = self.now_ms();
            let reports = self.engine.range(
                Tree::PurgeProgress,
                std::ops::Bound::Unbounded,
                std::ops::Bound::Unbounded,
                4096,
            )?;
            let live: Vec<Vec<u8>> = reports
                .iter()
                .filter_map(|(_, v)| serde_json::from_slice::<Progress>(v).ok())
                .filter(|p| p.live(now))
                .map(|p| hex::decode(p.cursor).unwrap_or_default())
                .collect();
            if !live.is_empty() && live.iter().all(|c| c.as_slice() >= target) {
                let mut confirmed = receipt.clone();
                confirmed.purge_confirmed = Some(crate::receipt::PurgeConfirmation {
                    at_ms: now,
                    replicas: u32::try_from(live.len()).unwrap_or(u32::MAX),
                });
                confirmed.signature = self
                    .receipt_key
                    .sign(&crate::receipt::Signed::from(&confirmed));
                self.engine.put(
                    Tree::Receipts,
                    confirmed.id.as_str().as_bytes(),
                    &records::encode(&confirmed),
                )?;
                return Ok(Some(confirmed));
            }
            if std::time::Instant::now() >= deadline {
                let waiting = live.iter().filter(|c| c.as_slice() < target).count();
                tracing::warn!(receipt_id = %receipt.id, live = live.len(), waiting, "not every live replica confirmed the purge in time; the receipt goes without the confirmation");
                return Ok(None);
            }
            std::thread::sleep(CONFIRM_POLL);
        }
    }

    /// The position of the next purge entry: the deleting clock's time, or
    /// one past the newest entry's position when that is not behind it.
    /// Called under the deletion lock, and committed with the entry, so
    /// positions grow in commit order whatever the replicas' clocks say: a
    /// replica tailing past a position has seen every entry before it.
    fn next_purge_position(&self, now: crate::clock::Millis) -> Result<u64> {
        let newest = match self.engine.get(Tree::Meta, PURGE_HIGH_WATER)? {
            Some(raw) => u64::from_be_bytes(raw.as_slice().try_into().map_err(|_| {
                StoreError::Corrupt(records::RecordError::UnknownFormat(raw.first().copied()))
            })?),
            None => 0,
        };
        Ok((now.max(0) as u64).max(newest.saturating_add(1)))
    }
}

/// The name of the deletion lock across replicas.
const DELETE_LOCK: &str = "deletions";

/// How many times planning retries when the set of sessions involved
/// changes between planning and locking.
const PLAN_ATTEMPTS: usize = 8;

impl Store {
    /// Deletes `req.target` and everything derived from it; returns the
    /// signed receipt once the deletion is complete and durable.
    pub fn delete(&self, req: &Request<'_>) -> Result<ReceiptRecord> {
        self.delete_logged(req).map(|(receipt, _)| receipt)
    }

    /// [`Store::delete`], with the key of the deletion's purge entry (fleet
    /// mode) for [`Store::confirm_purge`].
    pub(super) fn delete_logged(
        &self,
        req: &Request<'_>,
    ) -> Result<(ReceiptRecord, Option<Vec<u8>>)> {
        let _one_at_a_time = self.lock_named(&self.delete_lock, DELETE_LOCK)?;
        let mut plan = self.plan(&req.target)?;
        for _ in 0..PLAN_ATTEMPTS {
            let _guards = self.lock_all(&plan.touched)?;
            let fresh = self.plan(&req.target)?;
            if fresh.touched != plan.touched {
                // A derived payload appeared in another session meanwhile.
                plan = fresh;
                continue;
            }
            return self.carry_out(req, fresh);
        }
        Err(StoreError::Invalid(format!(
            "the payloads derived from {} kept changing while it was being deleted; retry the deletion",
            req.target.id()
        )))
    }

    /// Finishes deletions a crash interrupted. Runs at startup, before
    /// reconciliation (which would otherwise mark their payloads missing).
    /// Each one's receipt goes to `finished` after its files are removed and
    /// before its intent is: the caller audits it durably in between.
    pub(super) fn finish_interrupted(
        &self,
        finished: &mut dyn FnMut(&ReceiptRecord) -> Result<()>,
    ) -> Result<usize> {
        // On a shared engine, another replica's deletion in progress has an
        // intent too: the deletion lock waits for it to finish, so only
        // intents whose deleter crashed are left.
        let _one_at_a_time = self.lock_named(&self.delete_lock, DELETE_LOCK)?;
        let mut count = 0;
        loop {
            let batch = self
                .engine
                .scan_prefix(Tree::DeletionIntents, b"", None, 64)?;
            if batch.is_empty() {
                return Ok(count);
            }
            for (_, raw) in batch {
                let intent: DeletionIntent = records::decode(&raw)?;
                tracing::warn!(receipt_id = %intent.receipt_id, payloads = intent.payloads.len(), "finishing a deletion interrupted by a crash");
                self.remove_files(&intent)?;
                // The interrupted call may not have audited it: the caller
                // says here that it finished (a duplicate is better than a
                // gap), before the intent goes.
                match self.receipt(&intent.receipt_id) {
                    Ok(receipt) => finished(&receipt)?,
                    Err(e) => {
                        tracing::error!(receipt_id = %intent.receipt_id, error = %e, "an interrupted deletion's receipt is unreadable; finished it without an audit event");
                    }
                }
                self.commit_removal(&intent)?;
                count += 1;
            }
        }
    }

    /// Locks the stripes of `sessions` in ascending order, here and (on a
    /// shared engine) across replicas.
    fn lock_all(&self, sessions: &BTreeSet<SessionId>) -> Result<super::Held<'_>> {
        let stripes: BTreeSet<usize> = sessions.iter().map(|s| self.stripe_of(s)).collect();
        let local = stripes
            .iter()
            .map(|&i| self.stripes[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let keys: Vec<_> = stripes.into_iter().map(Store::stripe_key).collect();
        Ok(super::Held {
            _engine: self.engine.lock(&keys)?,
            _local: local,
        })
    }

    fn plan(&self, target: &Target) -> Result<Plan> {
        let mut plan = Plan {
            payloads: Vec::new(),
            items: Vec::new(),
            sessions: Vec::new(),
            usage: Vec::new(),
            expiry_keys: Vec::new(),
            touched: BTreeSet::new(),
        };
        let mut seen: HashSet<PayloadId> = HashSet::new();
        let mut queue: VecDeque<(PayloadRecord, String)> = VecDeque::new();
        match target {
            Target::Payload(id) => {
                let p = self.payload(id)?;
                seen.insert(p.id.clone());
                queue.push_back((p, String::new()));
            }
            Target::Session(id) | Target::SessionContents(id) => {
                let s = self.session(id)?;
                plan.touched.insert(s.id.clone());
                for p in self.session_payloads(id)? {
                    seen.insert(p.id.clone());
                    queue.push_back((p, String::new()));
                }
                if matches!(target, Target::Session(_)) {
                    plan.items.push(RemovedItem {
                        kind: removed::SESSION.into(),
                        id: s.id.to_string(),
                        session_id: s.id.to_string(),
                        ..Default::default()
                    });
                    plan.expiry_keys.push(keys::expiry(
                        s.expires_ms,
                        keys::EXPIRY_SESSION,
                        s.id.as_str(),
                    ));
                    plan.sessions.push(s.clone());
                }
                if let Some(closed) = s.closed_ms {
                    let pending = keys::expiry(closed, EXPIRY_CLOSE, s.id.as_str());
                    if matches!(target, Target::SessionContents(_))
                        && self.engine.get(Tree::Expiry, &pending)?.is_none()
                    {
                        // The close's deletion is done already (the reaper
                        // and the close may race for it).
                        return Err(StoreError::NotFound {
                            kind: "pending delete_on_close of session",
                            id: s.id.to_string(),
                        });
                    }
                    plan.expiry_keys.push(pending);
                }
            }
        }
        while let Some((p, because)) = queue.pop_front() {
            for child in self.derived_children(&p.id)? {
                if seen.insert(child.id.clone()) {
                    queue.push_back((child, format!("derived from {}", p.id)));
                }
            }
            let kind = if because.is_empty() {
                removed::PAYLOAD
            } else if p.archive_key.is_empty() {
                removed::DERIVED_PAYLOAD
            } else {
                removed::ARCHIVE_ENTRY
            };
            plan.touched.insert(p.session_id.clone());
            plan.items.push(RemovedItem {
                kind: kind.into(),
                id: p.id.to_string(),
                session_id: p.session_id.to_string(),
                content_sha256: p.sha256.clone(),
                bytes: p.size,
                because,
            });
            plan.items.push(RemovedItem {
                kind: removed::LINE_INDEX.into(),
                id: p.id.to_string(),
                session_id: p.session_id.to_string(),
                ..Default::default()
            });
            if let Some(objects) = &self.objects {
                plan.items.push(RemovedItem {
                    kind: removed::OBJECT.into(),
                    id: objects.key(&p.session_id, &p.id).to_string(),
                    session_id: p.session_id.to_string(),
                    content_sha256: p.sha256.clone(),
                    bytes: p.size,
                    because: "the bucket's object, and every replica's local copy (purged through the metadata store)".into(),
                });
            }
            plan.payloads.push(p);
        }
        for sid in &plan.touched {
            check_hold(&self.session(sid)?)?;
        }
        self.plan_freed_content(&mut plan)?;
        Ok(plan)
    }

    /// Works out which stored bytes lose their last reference, the usage
    /// each surviving session gets back, and which cached Inspect results
    /// go with the bytes.
    fn plan_freed_content(&self, plan: &mut Plan) -> Result<()> {
        let going: HashSet<&str> = plan.payloads.iter().map(|p| p.id.as_str()).collect();
        let deleted_sessions: HashSet<&SessionId> = plan.sessions.iter().map(|s| &s.id).collect();
        // (session, sha) → size, for each distinct content removed.
        let mut contents: BTreeMap<(SessionId, String), u64> = BTreeMap::new();
        let mut counts: BTreeMap<SessionId, u64> = BTreeMap::new();
        for p in &plan.payloads {
            contents.insert((p.session_id.clone(), p.sha256.clone()), p.size);
            *counts.entry(p.session_id.clone()).or_default() += 1;
        }
        let mut freed: BTreeMap<SessionId, u64> = BTreeMap::new();
        for ((sid, sha), size) in contents {
            if self.content_survives(&sid, &sha, &going)? {
                continue;
            }
            *freed.entry(sid.clone()).or_default() += size;
            plan.items.push(RemovedItem {
                kind: removed::CONTENT_BLOB.into(),
                id: sha.clone(),
                session_id: sid.to_string(),
                content_sha256: sha.clone(),
                bytes: size,
                because: String::new(),
            });
            if self.content_cache.holds(&sha) {
                plan.items.push(RemovedItem {
                    kind: removed::INSPECT_CACHE.into(),
                    id: sha.clone(),
                    session_id: sid.to_string(),
                    content_sha256: sha,
                    ..Default::default()
                });
            }
        }
        for (sid, n) in counts {
            if !deleted_sessions.contains(&sid) {
                let bytes = freed.get(&sid).copied().unwrap_or(0);
                plan.usage.push((sid, bytes, n));
            }
        }
        Ok(())
    }

    /// Whether a payload not in `going` still holds these bytes.
    fn content_survives(&self, sid: &SessionId, sha: &str, going: &HashSet<&str>) -> Result<bool> {
        let prefix = keys::content_prefix(sid, sha);
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page =
                self.engine
                    .scan_prefix(Tree::ContentIndex, &prefix, after.as_deref(), 256)?;
            let done = page.len() < 256;
            for (key, _) in page {
                if !going.contains(String::from_utf8_lossy(&key[prefix.len()..]).as_ref()) {
                    return Ok(true);
                }
                after = Some(key);
            }
            if done {
                return Ok(false);
            }
        }
    }

    fn carry_out(&self, req: &Request<'_>, plan: Plan) -> Result<(ReceiptRecord, Option<Vec<u8>>)> {
        let root = match &req.target {
            Target::Payload(id) => self.payload(id)?.session_id,
            Target::Session(s) | Target::SessionContents(s) => s.clone(),
        };
        let session = self.session(&root)?;
        let mut receipt = ReceiptRecord {
            id: ReceiptId::generate(),
            target_id: req.target.id().to_owned(),
            reason: req.reason.to_owned(),
            requested_by: req.requested_by.to_owned(),
            tenant: session.tenant.clone(),
            owner: session.owner.clone(),
            share_with: session.share_with.clone(),
            deleted_ms: self.now_ms(),
            deleted_payload_ids: plan.payloads.iter().map(|p| p.id.clone()).collect(),
            bytes_deleted: plan.payloads.iter().map(|p| p.size).sum(),
            content_sha256: plan.payloads.iter().map(|p| p.sha256.clone()).collect(),
            removed: plan.items,
            signature: String::new(),
            purge_confirmed: None,
        };
        receipt.signature = self
            .receipt_key
            .sign(&crate::receipt::Signed::from(&receipt));
        let intent = DeletionIntent {
            receipt_id: receipt.id.clone(),
            payloads: plan.payloads,
            sessions: plan.sessions,
            usage: plan.usage,
            expiry_keys: plan.expiry_keys,
        };

        // Step 2: the receipt, the tombstones and the intent, durably.
        let mut b = Batch::new();
        b.put(
            Tree::Receipts,
            receipt.id.as_str(),
            records::encode(&receipt),
        )
        .put(
            Tree::DeletionIntents,
            receipt.id.as_str(),
            records::encode(&intent),
        )
        .put(Tree::DeletedTargets, req.target.id(), receipt.id.as_str());
        let mut purge = None;
        if self.objects.is_some() {
            // Every replica's local copies go too: each tails this.
            let copies: Vec<(String, String)> = intent
                .payloads
                .iter()
                .map(|p| (p.session_id.to_string(), p.name.clone()))
                .collect();
            let position = self.next_purge_position(receipt.deleted_ms)?;
            let key = purge_key(position, &receipt.id);
            b.put(
                Tree::Purges,
                key.clone(),
                serde_json::to_vec(&copies).expect("strings serialize"),
            )
            .put(
                Tree::Meta,
                PURGE_HIGH_WATER,
                position.to_be_bytes().to_vec(),
            );
            purge = Some(key);
        }
        if let Some(lease) = req.fence {
            // Once the intent is in, finishing is safe for anyone; a reaper
            // that lost its lease must not start one.
            b.fence(lease);
        }
        for p in &intent.payloads {
            b.put(Tree::DeletedTargets, p.id.as_str(), receipt.id.as_str());
        }
        for s in &intent.sessions {
            b.put(Tree::DeletedTargets, s.id.as_str(), receipt.id.as_str());
        }
        self.engine.commit(&b)?;
        crate::faults::hit("deletion.after_intent");

        // Steps 3 and 4.
        self.remove_files(&intent)?;
        crate::faults::hit("deletion.after_files");
        self.commit_removal(&intent)?;
        self.drop_cached(&receipt);
        Ok((receipt, purge))
    }

    fn remove_files(&self, intent: &DeletionIntent) -> Result<()> {
        if let Some(objects) = &self.objects {
            objects.delete_all(
                intent
                    .payloads
                    .iter()
                    .map(|p| (p.session_id.clone(), p.id.clone()))
                    .collect(),
            )?;
            for p in &intent.payloads {
                objects.cache.removed(&p.session_id, &p.name);
            }
        }
        let deleted: HashSet<&SessionId> = intent.sessions.iter().map(|s| &s.id).collect();
        let mut dirs: BTreeMap<&SessionId, ()> = BTreeMap::new();
        for p in intent
            .payloads
            .iter()
            .filter(|p| !deleted.contains(&p.session_id))
        {
            let dir = match self.blobs.session_dir(&p.session_id) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            match dir.remove_file(&p.name) {
                Ok(()) => {
                    dirs.insert(&p.session_id, ());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        for sid in dirs.keys() {
            blobs::fsync_dir(&*self.blobs.session_dir(sid)?)?;
        }
        for s in &intent.sessions {
            self.blobs.remove_session_dir(&s.id)?;
        }
        Ok(())
    }

    fn commit_removal(&self, intent: &DeletionIntent) -> Result<()> {
        let mut b = Batch::new();
        for p in &intent.payloads {
            self.forget_payload(&mut b, p);
        }
        for s in &intent.sessions {
            b.delete(Tree::Sessions, s.id.as_str()).delete(
                Tree::TenantSessions,
                keys::tenant_session(&s.tenant, s.created_ms, &s.id),
            );
        }
        for k in &intent.expiry_keys {
            b.delete(Tree::Expiry, k.clone());
        }
        for (sid, bytes, count) in &intent.usage {
            if let Some(mut s) = self.session_opt(sid)? {
                s.usage_bytes = s.usage_bytes.saturating_sub(*bytes);
                s.usage_payloads = s.usage_payloads.saturating_sub(*count);
                b.put(Tree::Sessions, sid.as_str(), records::encode(&s));
            }
        }
        b.delete(Tree::DeletionIntents, intent.receipt_id.as_str());
        self.engine.commit(&b)?;
        Ok(())
    }

    /// Forgets what the content cache holds of the bytes the deletion freed.
    fn drop_cached(&self, receipt: &ReceiptRecord) {
        for item in &receipt.removed {
            if item.kind == removed::CONTENT_BLOB {
                self.content_cache.forget(&item.content_sha256);
            }
        }
    }

    /// Every payload of a session, in creation order.
    pub(super) fn session_payloads(&self, id: &SessionId) -> Result<Vec<PayloadRecord>> {
        let mut out = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self.engine.scan_prefix(
                Tree::SessionPayloads,
                id.as_str().as_bytes(),
                after.as_deref(),
                1024,
            )?;
            let done = page.len() < 1024;
            for (key, _) in page {
                let pid = payload_id_from_listing_key(&key)?;
                if let Some(p) = self.payload_opt(&pid)? {
                    out.push(p);
                }
                after = Some(key);
            }
            if done {
                return Ok(out);
            }
        }
    }

    /// The live payloads derived directly from `parent`.
    fn derived_children(&self, parent: &PayloadId) -> Result<Vec<PayloadRecord>> {
        let prefix = parent.as_str().as_bytes();
        let mut out = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self
                .engine
                .scan_prefix(Tree::Derived, prefix, after.as_deref(), 1024)?;
            let done = page.len() < 1024;
            for (key, _) in page {
                let child = PayloadId::parse(&String::from_utf8_lossy(&key[prefix.len()..]))
                    .map_err(|e| StoreError::Invalid(e.to_string()))?;
                if let Some(p) = self.payload_opt(&child)? {
                    out.push(p);
                }
                after = Some(key);
            }
            if done {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_live_for_3_s_or_three_of_its_own_report_periods() {
        let p = |reported_ms, every_ms| Progress {
            cursor: String::new(),
            reported_ms,
            every_ms,
        };
        assert!(p(10_000, 1_000).live(13_000));
        assert!(!p(10_000, 1_000).live(13_001));
        // A replica tailing every 10 s is waited for up to 30 s.
        assert!(p(10_000, 10_000).live(40_000));
        assert!(!p(10_000, 10_000).live(40_001));
        // A report without the period (an older replica): the 3 s bound.
        let old: Progress = serde_json::from_str(r#"{"cursor":"","reported_ms":10000}"#).unwrap();
        assert!(old.live(13_000) && !old.live(13_001));
    }
}
