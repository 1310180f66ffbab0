//! The async door to the audit log: a thread of its own commits what async
//! callers send, everything waiting in one durable commit.
//!
//! [`AuditLog`]'s methods block until the engine's commit is durable (an
//! `fdatasync`, a few hundred microseconds). An async caller that ran one on
//! its runtime worker would stall the worker's other tasks; one that handed
//! the worker away first (`block_in_place`) or hopped to the blocking pool
//! paid thread hand-offs on every call, and its reply left from a thread
//! that no longer ran the runtime. Here the caller only queues its events
//! and awaits the answer: the writer thread drains the queue, appends every
//! group through [`AuditLog::append_groups`] (so it is group-committed with
//! any blocking caller too), and answers each caller once its events are
//! durable.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::chain::AuditEvent;
use super::log::{AuditLog, NewEvent};
use crate::store::engine::EngineError;
use crate::store::{Result, StoreError};

/// Appends queued ahead of the writer; a caller past this waits for room.
const QUEUE: usize = 1024;

/// One caller's events and where its answer goes.
struct Pending {
    events: Vec<NewEvent>,
    reply: oneshot::Sender<Result<Vec<AuditEvent>>>,
}

/// The async door to an [`AuditLog`]. Cheap to clone; the writer thread
/// ends when the last clone is dropped. Appends after the log itself was
/// dropped fail as stopped.
#[derive(Clone)]
pub struct AuditWriter {
    queue: mpsc::Sender<Pending>,
    engine: &'static str,
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditWriter")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl AuditWriter {
    /// Starts the writer thread of `log`. The thread holds the log only
    /// while it commits, so the log (and the engine's files) close when its
    /// owners drop it, as without a writer.
    pub fn start(log: &Arc<AuditLog>) -> std::io::Result<Self> {
        let (queue, mut rx) = mpsc::channel::<Pending>(QUEUE);
        let engine = log.engine_name();
        let log = Arc::downgrade(log);
        std::thread::Builder::new()
            .name("spillway-audit".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut batch = vec![first];
                    while batch.len() < QUEUE {
                        match rx.try_recv() {
                            Ok(p) => batch.push(p),
                            Err(_) => break,
                        }
                    }
                    let (groups, replies): (Vec<_>, Vec<_>) =
                        batch.into_iter().map(|p| (p.events, p.reply)).unzip();
                    // The log is let go before anyone is answered, so an
                    // answered caller may close it at once.
                    let results = match log.upgrade() {
                        Some(log) => append(&log, groups),
                        None => groups.iter().map(|_| Err(stopped(engine))).collect(),
                    };
                    for (reply, result) in replies.into_iter().zip(results) {
                        // A caller that gave up no longer listens; its
                        // events are appended all the same.
                        let _ = reply.send(result);
                    }
                }
            })?;
        Ok(AuditWriter { queue, engine })
    }

    /// Appends `events` in order, in one commit with whatever else waits;
    /// returns them sealed once durable. Each joins its tenant's chain.
    pub async fn append_all(&self, events: Vec<NewEvent>) -> Result<Vec<AuditEvent>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let stopped = || stopped(self.engine);
        self.queue
            .send(Pending { events, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Appends a drained batch's groups. A panic in the log fails this
/// batch's appends and leaves the writer running.
fn append(log: &AuditLog, groups: Vec<Vec<NewEvent>>) -> Vec<Result<Vec<AuditEvent>>> {
    let n = groups.len();
    let appended =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.append_groups(groups)));
    appended.unwrap_or_else(|_| {
        tracing::error!("audit append panicked; the waiting appends failed");
        (0..n).map(|_| Err(panicked(log.engine_name()))).collect()
    })
}

/// The error of an append after the log closed.
fn stopped(engine: &'static str) -> StoreError {
    StoreError::Engine(EngineError::unavailable(
        engine,
        "the audit log is closed (the server is stopping), so the event was not appended; retry against a running server",
    ))
}

/// The error of an append whose commit panicked.
fn panicked(engine: &'static str) -> StoreError {
    StoreError::Engine(EngineError::new(
        engine,
        "the audit append failed unexpectedly and was not committed; retry the call",
    ))
}
