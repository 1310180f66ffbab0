//! Startup reconciliation of disk and metadata. Removes temporary upload
//! files, payload files no record names, and session directories no session
//! owns; marks payloads whose file is gone as missing; recreates a missing
//! session directory. Logs what it repaired, by ID only.
//!
//! On a shared engine (fleet mode), or with the bytes in a bucket, the
//! metadata describes more than this replica's directory holds (its files
//! are its own uploads and a cache of the bucket): it
//! reconciles its own directories (temporary and unrecorded files, and
//! directories of sessions that are gone), and never marks a payload
//! missing for a file that lives elsewhere.

use std::collections::HashSet;

use super::blobs::{self, TEMP_PREFIX};
use super::engine::Tree;
use super::records::{self, PayloadRecord};
use super::{Result, Store};
use crate::ids::SessionId;

/// What reconciliation found and fixed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Sessions checked.
    pub sessions_checked: u64,
    /// Temporary upload files removed.
    pub temp_files_removed: u64,
    /// Payload files without metadata removed.
    pub orphan_files_removed: u64,
    /// Directories without a session removed.
    pub orphan_dirs_removed: u64,
    /// Payloads whose file was missing, now marked.
    pub missing_payloads: Vec<String>,
    /// Deletions a crash had interrupted, finished before reconciling.
    pub deletions_finished: u64,
}

impl ReconcileReport {
    /// True when nothing needed repair.
    pub fn is_clean(&self) -> bool {
        self.temp_files_removed == 0
            && self.orphan_files_removed == 0
            && self.orphan_dirs_removed == 0
            && self.missing_payloads.is_empty()
    }
}

pub(super) fn reconcile(store: &Store) -> Result<ReconcileReport> {
    let mut report = ReconcileReport::default();
    for name in store.blobs.list_session_dirs()? {
        let known = match SessionId::parse(&name) {
            Ok(id) => store
                .engine
                .get(Tree::Sessions, id.as_str().as_bytes())?
                .is_some(),
            Err(_) => false,
        };
        if !known {
            tracing::warn!(entry_sha256 = %short_hash(&name), "removing a session directory with no session record");
            store.blobs.remove_dir_named(&name)?;
            report.orphan_dirs_removed += 1;
        }
    }
    if store.engine.shared() || store.objects.is_some() {
        for name in store.blobs.list_session_dirs()? {
            if let Ok(id) = SessionId::parse(&name) {
                reconcile_session(store, &id, false, &mut report)?;
                report.sessions_checked += 1;
            }
        }
        log(&report);
        return Ok(report);
    }
    let mut after: Option<Vec<u8>> = None;
    loop {
        let batch = store.engine.range(
            Tree::Sessions,
            after
                .as_deref()
                .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
            std::ops::Bound::Unbounded,
            256,
        )?;
        let done = batch.len() < 256;
        for (key, _) in batch {
            let id = SessionId::parse(&String::from_utf8_lossy(&key))
                .map_err(|e| super::StoreError::Invalid(e.to_string()))?;
            reconcile_session(store, &id, true, &mut report)?;
            report.sessions_checked += 1;
            after = Some(key);
        }
        if done {
            break;
        }
    }
    log(&report);
    Ok(report)
}

fn log(report: &ReconcileReport) {
    if report.is_clean() {
        tracing::info!(
            sessions = report.sessions_checked,
            "storage reconciled: nothing to repair"
        );
    } else {
        tracing::warn!(
            sessions = report.sessions_checked,
            temp_files_removed = report.temp_files_removed,
            orphan_files_removed = report.orphan_files_removed,
            orphan_dirs_removed = report.orphan_dirs_removed,
            missing_payloads = report.missing_payloads.len(),
            "storage reconciled: repaired"
        );
    }
}

/// Reconciles one session's directory; `owns_all` when this process holds
/// every file of the store (an embedded engine), so a file not found is a
/// payload missing.
fn reconcile_session(
    store: &Store,
    id: &SessionId,
    owns_all: bool,
    report: &mut ReconcileReport,
) -> Result<()> {
    if owns_all {
        store.blobs.create_session_dir(id)?;
    }
    let dir = store.blobs.session_dir(id)?;
    let records: Vec<PayloadRecord> = store.session_payloads(id)?;
    let expected: HashSet<&str> = records.iter().map(|p| p.name.as_str()).collect();
    let mut present = HashSet::new();
    let mut removed = false;
    for name in blobs::list_names(&dir)? {
        if name.starts_with(TEMP_PREFIX) {
            dir.remove_file(&name)?;
            report.temp_files_removed += 1;
            removed = true;
        } else if !expected.contains(name.as_str()) {
            tracing::warn!(session_id = %id, entry_sha256 = %short_hash(&name), "removing a payload file with no record");
            if dir.remove_file(&name).is_err() {
                dir.remove_dir_all(&name)?;
            }
            report.orphan_files_removed += 1;
            removed = true;
        } else {
            present.insert(name);
        }
    }
    if removed {
        blobs::fsync_dir(&dir)?;
    }
    for mut p in records.into_iter().filter(|_| owns_all) {
        if !present.contains(&p.name) && !p.missing {
            tracing::error!(session_id = %id, payload_id = %p.id, "payload file is missing; marking the payload missing");
            p.missing = true;
            store.engine.put(
                Tree::Payloads,
                p.id.as_str().as_bytes(),
                &records::encode(&p),
            )?;
            report.missing_payloads.push(p.id.to_string());
        }
    }
    Ok(())
}

/// Names found on disk may be anything; log a short hash instead.
fn short_hash(name: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(name.as_bytes())[..6])
}
