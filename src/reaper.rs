//! The reaper: a background task that deletes what has expired.
//!
//! It reads the expiry index in time order ([`Store::reap_due`]), never
//! scanning every payload. Work due while the server was down is found by
//! the first pass at startup. Each step deletes at most `reaper.batch`
//! entries on a blocking thread and then pauses for `reaper.pause`, so RPCs
//! always get the disk and the engine between steps. Every deletion yields
//! a stored receipt, which the reaper then audits under the principal
//! `reaper`, after the deletion (the receipt is stored either way).
//!
//! Passes resume after the last entry looked at, so entries held back by a
//! legal hold are not re-read every interval. Releasing a hold, or anything
//! else that can make skipped entries deletable, calls
//! [`ReaperHandle::rescan`], which wakes the reaper at once and restarts
//! from the oldest entry; a full rescan also happens every
//! `reaper.rescan_every` passes as a backstop.
//!
//! In fleet mode, where replicas share the metadata, one replica at a time
//! reaps: the one holding the reaper's lease in the engine
//! ([`Store::reaper_lease`]). The holder renews it before each step; the
//! others try each interval and take over once it lapses (`lease_ttl`
//! after the holder stopped renewing). Each deletion is fenced with the
//! lease's token, so a holder that stalled past its lease cannot delete
//! after the new holder started. With an embedded engine the lease is
//! always granted.
//!
//! The lease holder also samples each tenant's usage for its history
//! ([`Store::sample_usage`]: at its first pass, then at most hourly).
//!
//! Time comes from the store's [`crate::clock::Clock`], so tests move a
//! manual clock forward instead of sleeping through retention periods.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::audit::{AuditWriter, NewEvent, deletion_event};
use crate::store::Store;
use crate::store::{REAPER, ReapStep, ReceiptRecord};

/// `[reaper]` configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReaperConfig {
    /// How often the reaper looks for due entries when idle.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Deletions per step at most.
    pub batch: usize,
    /// Pause between steps while there is a backlog.
    #[serde(with = "humantime_serde")]
    pub pause: Duration,
    /// Every this many passes, start again from the oldest entry.
    pub rescan_every: u32,
    /// How long the reaper's lease lasts without renewal (fleet mode): the
    /// bound on how long reaping stops when its replica dies.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            batch: 32,
            pause: Duration::from_millis(20),
            rescan_every: 60,
            lease_ttl: Duration::from_secs(10),
        }
    }
}

/// Pokes the running reaper.
#[derive(Debug, Clone, Default)]
pub struct ReaperHandle {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// This replica's name as the lease's holder.
    holder: String,
    wake: Notify,
    rescan: AtomicBool,
    passes: AtomicU64,
}

impl ReaperHandle {
    /// Wakes the reaper now and makes it start again from the oldest due
    /// entry (a hold was lifted, or a policy shortened lifetimes).
    pub fn rescan(&self) {
        self.inner.rescan.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
    }

    /// Completed passes so far (a pass ends when nothing due is left).
    pub fn passes(&self) -> u64 {
        self.inner.passes.load(Ordering::SeqCst)
    }

    /// This replica's name as the holder of the reaper's lease.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }
}

/// Starts the purger (fleet mode, payload bytes in a bucket): every
/// `interval` (`store.purge_interval`) it removes this replica's local
/// copies of what any replica deleted ([`Store::purge_step`]). Stops when
/// the guard drops.
pub fn spawn_purger(store: Arc<Store>, interval: Duration) -> ReaperGuard {
    // Its name in the purge progress: a restarted replica is a new one.
    let replica = replica_id();
    let task = tokio::spawn(async move {
        let mut last = Arc::new(crate::store::PurgeStep::default());
        loop {
            let step = {
                let store = store.clone();
                let replica = replica.clone();
                let prev = last.clone();
                tokio::task::spawn_blocking(move || store.purge_step(&replica, interval, &prev))
                    .await
            };
            match step {
                Ok(Ok(step)) => {
                    if step.removed > 0 {
                        tracing::info!(
                            removed = step.removed,
                            "purged local copies of deleted payloads"
                        );
                    }
                    last = Arc::new(step);
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "purge step failed; retrying"),
                Err(e) => tracing::error!(error = %e, "purge step panicked; retrying"),
            }
            tokio::time::sleep(interval).await;
        }
    });
    ReaperGuard(task.abort_handle())
}

/// This process's name as a lease holder: host, process and a random
/// part, so a restarted replica is a new holder.
fn replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut nonce = [0u8; 4];
    let _ = getrandom::fill(&mut nonce);
    format!(
        "{}/{}/{}",
        host.trim(),
        std::process::id(),
        hex::encode(nonce)
    )
}

/// Stops the reaper when dropped (the server holds it until it stops).
#[derive(Debug)]
pub struct ReaperGuard(tokio::task::AbortHandle);

impl Drop for ReaperGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the reaper; it runs until the returned guard is dropped.
pub fn spawn(
    store: Arc<Store>,
    audit: AuditWriter,
    config: ReaperConfig,
) -> (ReaperHandle, ReaperGuard) {
    let holder = replica_id();
    let handle = ReaperHandle {
        inner: Arc::new(Shared {
            holder: holder.clone(),
            ..Shared::default()
        }),
    };
    let shared = handle.inner.clone();
    let task = tokio::spawn(async move {
        let mut cursor: Option<Vec<u8>> = None;
        let mut passes: u32 = 0;
        let mut held: Option<u64> = None;
        let mut first_pass = true;
        loop {
            if shared.rescan.swap(false, Ordering::SeqCst) {
                cursor = None;
            }
            let step = {
                let store = store.clone();
                let after = cursor.clone();
                let batch = config.batch.max(1);
                let holder = holder.clone();
                let ttl = config.lease_ttl;
                let first = std::mem::take(&mut first_pass);
                tokio::task::spawn_blocking(move || {
                    let Some(lease) = store.reaper_lease(&holder, ttl)? else {
                        return Ok(None);
                    };
                    let now = store.now_ms();
                    let step = store.reap_due(&lease, now, after.as_deref(), batch)?;
                    // The holder also keeps the tenants' usage history.
                    if let Err(e) = store.sample_usage(first) {
                        tracing::warn!(error = %e, "could not sample the tenants' usage; the next pass retries");
                    }
                    Ok::<_, crate::store::StoreError>(Some((lease.token, step)))
                })
                .await
            };
            let step = match step {
                Ok(Ok(Some((token, step)))) => {
                    if held != Some(token) && store.is_shared() {
                        tracing::info!(token, "this replica holds the reaper's lease and reaps");
                        cursor = None;
                    }
                    held = Some(token);
                    step
                }
                Ok(Ok(None)) => {
                    if held.take().is_some() {
                        tracing::info!(
                            "another replica holds the reaper's lease; this one stops reaping"
                        );
                    }
                    ReapStep::default()
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "reaper step failed; retrying after the interval");
                    ReapStep::default()
                }
                Err(e) => {
                    tracing::error!(error = %e, "reaper step panicked; retrying after the interval");
                    ReapStep::default()
                }
            };
            crate::metrics::reaper_lag(Duration::from_millis(step.lag_ms));
            append(&audit, &step.receipts).await;
            if !step.receipts.is_empty() || step.held > 0 || step.failed > 0 {
                tracing::info!(
                    deleted = step.receipts.len(),
                    held = step.held,
                    failed = step.failed,
                    "reaper step"
                );
            }
            if step.failed == 0 {
                cursor = step.cursor;
            }
            let wait = if step.more {
                config.pause
            } else {
                passes = passes.wrapping_add(1);
                shared.passes.fetch_add(1, Ordering::SeqCst);
                if config.rescan_every > 0 && passes.is_multiple_of(config.rescan_every) {
                    cursor = None;
                }
                config.interval
            };
            tokio::select! {
                () = shared.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    });
    (handle, ReaperGuard(task.abort_handle()))
}

/// Appends one audit event per reaper deletion.
async fn append(audit: &AuditWriter, receipts: &[ReceiptRecord]) {
    if receipts.is_empty() {
        return;
    }
    let events: Vec<NewEvent> = receipts.iter().map(|r| deletion_event(r, REAPER)).collect();
    if audit.append_all(events).await.is_err() {
        tracing::error!("could not audit the reaper's deletions; their receipts are stored");
    }
}
