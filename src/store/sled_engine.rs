//! [`Engine`] over sled 0.34: one sled tree per tree, one multi-tree
//! transaction per batch.
//!
//! sled's own `flush` ends in `sync_file_range`, which survives a process
//! kill but not a power loss. So after every commit this engine flushes and
//! then `fsync`s sled's log file, any new blob file (sled writes values
//! past ~128 KiB to `blobs/` without syncing them), and the directories;
//! only then does `commit` return. That costs throughput, and buys the same
//! guarantee redb gives.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sled::Transactional;
use sled::transaction::TransactionError;

use super::engine::{Batch, Engine, EngineError, Entry, KeyRange, Tree};

const NAME: &str = "sled";

/// How long [`SledEngine::open`] waits for the lock on sled's log file.
///
/// sled 0.34 lets go of that lock only when its last background thread
/// ends, which can be moments after the previous `Db` was dropped
/// (spacejam/sled#1289), so an open right after a close in the same
/// process can find it still held.
const LOCK_WAIT: Duration = Duration::from_secs(5);

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::new(NAME, e)
}

/// The sled engine.
#[derive(Debug)]
pub struct SledEngine {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    /// sled's log file, fsynced after each flush.
    log: File,
    /// sled's directory, fsynced so new segments' names are durable too.
    dir: File,
    /// sled's blob directory, and the blob files already fsynced.
    blobs: PathBuf,
    synced_blobs: Mutex<HashSet<OsString>>,
}

impl SledEngine {
    /// Opens the database at `path` with a page cache of at most
    /// `cache_bytes` (sled's own default is 1 GiB).
    pub fn open(path: &Path, cache_bytes: usize) -> Result<Self, EngineError> {
        wait_for_lock(&path.join("db"), LOCK_WAIT)?;
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes as u64)
            .open()
            .map_err(err)?;
        let trees = Tree::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        db.flush().map_err(err)?;
        let log = File::open(path.join("db")).map_err(err)?;
        let dir = File::open(path).map_err(err)?;
        let engine = Self {
            db,
            trees,
            log,
            dir,
            blobs: path.join("blobs"),
            synced_blobs: Mutex::new(HashSet::new()),
        };
        engine.sync()?;
        Ok(engine)
    }

    fn tree(&self, tree: Tree) -> &sled::Tree {
        &self.trees[tree.index()]
    }

    fn sync(&self) -> Result<(), EngineError> {
        self.db.flush().map_err(err)?;
        self.log.sync_all().map_err(err)?;
        self.sync_blobs()?;
        self.dir.sync_all().map_err(err)
    }

    fn sync_blobs(&self) -> Result<(), EngineError> {
        let entries = match std::fs::read_dir(&self.blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = HashSet::new();
        let mut new_files = false;
        for entry in entries {
            let name = entry.map_err(err)?.file_name();
            if !synced.contains(&name) {
                match File::open(self.blobs.join(&name)) {
                    Ok(f) => f.sync_all().map_err(err)?,
                    // sled removed it meanwhile: nothing left to make durable.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(err(e)),
                }
                new_files = true;
            }
            present.insert(name);
        }
        *synced = present;
        if new_files {
            File::open(&self.blobs)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(())
    }
}

impl Engine for SledEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.tree(tree).get(key).map_err(err)?.map(|v| v.to_vec()))
    }

    fn scan(&self, tree: Tree, keys: KeyRange<'_>) -> Result<Vec<Entry>, EngineError> {
        // sled panics on an inverted range; `Engine::range` never asks for one.
        let mut out = Vec::new();
        let items = self.tree(tree).range::<&[u8], _>((keys.start, keys.end));
        for item in items.take(keys.limit) {
            let (k, v) = item.map_err(err)?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: &Batch) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.commit_volatile(batch)?;
        self.sync()
    }

    fn commit_volatile(&self, batch: &Batch) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        let result: Result<(), TransactionError<()>> = self.trees.as_slice().transaction(|views| {
            for op in batch.ops() {
                let view = &views[op.tree.index()];
                match &op.value {
                    Some(v) => {
                        view.insert(op.key.as_slice(), v.as_slice())?;
                    }
                    None => {
                        view.remove(op.key.as_slice())?;
                    }
                }
            }
            Ok(())
        });
        result.map_err(|e| err(format!("{e:?}")))
    }

    fn flush(&self) -> Result<(), EngineError> {
        self.sync()
    }
}

/// Waits until nothing holds the lock on sled's log file at `log`, for at
/// most `wait`. sled itself only tries once; a lock that outlives `wait`
/// belongs to another process, and the error says so.
fn wait_for_lock(log: &Path, wait: Duration) -> Result<(), EngineError> {
    let file = match File::open(log) {
        Ok(file) => file,
        // A new database: sled creates the file and takes the lock.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    loop {
        match file.try_lock() {
            // Dropping `file` lets go of the probe's own lock.
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(err(format_args!(
                    "the database is still locked after {} s: another process \
                     is using this data directory; stop it, or give this server \
                     its own data directory",
                    wait.as_secs_f64()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_the_engine_conformance_suite_and_keeps_commits_across_reopen() {
        super::super::engine::file_conformance("meta.sled", SledEngine::open);
    }

    #[test]
    fn an_open_waits_for_a_lock_let_go_moments_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sled");
        drop(SledEngine::open(&path, 1 << 20).unwrap());
        let holder = File::open(path.join("db")).unwrap();
        holder.lock().unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            drop(holder);
        });
        let started = Instant::now();
        SledEngine::open(&path, 1 << 20).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        releaser.join().unwrap();
    }

    #[test]
    fn a_lock_held_past_the_wait_fails_naming_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("db");
        let holder = File::create(&log).unwrap();
        holder.lock().unwrap();
        let e = wait_for_lock(&log, Duration::from_millis(50)).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("still locked"), "{message}");
        assert!(message.contains("another process"), "{message}");
        drop(holder);
        wait_for_lock(&log, Duration::from_millis(50)).unwrap();
    }
}
