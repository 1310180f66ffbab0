//! The audit journal: an audit append made durable by one small write to a
//! file of its own, on a local engine (redb, sled).
//!
//! **Why.** A durable engine commit writes back every page the commit
//! touched: for an audit append, the event's leaf, the head's leaf, the
//! table roots and the allocator's state, seven pages scattered through the
//! file, and then waits for all of them. Here an append writes one record to
//! a preallocated file and waits for that alone. The same batch is applied
//! to the engine later, without waiting for it to reach the disk
//! ([`Engine::commit_volatile`]): [`Journal::settle`] applies every batch
//! journaled since the last one, in order, and the log calls it before
//! anything reads the audit trees (and when it closes), so an append waits
//! for the one write and readers still see every acknowledged event. What waits to be applied is bounded by the file's
//! capacity: a checkpoint settles first. A crash can lose the engine's
//! volatile commits and what was not yet applied, never a record: the next
//! open replays what the engine lacks.
//!
//! **Format.** The file is [`CAPACITY`] bytes, zero-filled when made, so an
//! append never changes its size and `fdatasync` flushes data alone.
//! Records follow each other from offset 0, each a header (magic, payload
//! length, generation, the first 8 bytes of the SHA-256 of generation and
//! payload) and the batch's writes. Replay reads records while all of that
//! holds: a torn record ends it, and its append was never acknowledged.
//!
//! **Generations.** The current generation is stored in the engine
//! ([`Tree::Meta`], [`GENERATION_KEY`]). A checkpoint commits the next one
//! durably, which makes every earlier volatile commit durable too, and
//! starts the file over at offset 0; records of older generations are never
//! replayed. Opening replays the current generation's records that the
//! engine needs (the caller decides which, see [`Journal::open`]) and
//! checkpoints, in one durable commit.
//!
//! **Failures.** A write or sync that fails turns the journal off for the
//! life of the process: that append and every later one commit durably
//! through the engine, as without a journal, and the server logs it once.
//! A journal write that succeeds before the engine's volatile commit fails
//! can leave an event that the caller was told failed (replayed after a
//! crash); an acknowledged append is never lost.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::store::Result;
use crate::store::engine::{Batch, Engine, EngineError, Tree};

/// The journal's size on disk; a checkpoint starts it over when a record
/// does not fit. About 1 500 exec events.
pub const CAPACITY: u64 = 1 << 20;
/// The key of the current generation in [`Tree::Meta`].
pub const GENERATION_KEY: &[u8] = b"audit_journal_generation";

/// The most of an existing journal that an open reads: records lie within
/// the capacity it was made with, and no version made one larger.
const MAX_READ: u64 = 64 << 20;
const MAGIC: [u8; 4] = *b"SPJ1";
/// Magic, payload length (u32), generation (u64), checksum (8 bytes).
const HEADER: usize = 4 + 4 + 8 + 8;
const PUT: u8 = 1;
const DELETE: u8 = 0;

/// The journal in front of a local engine's audit commits.
#[derive(Debug)]
pub struct Journal {
    file: File,
    capacity: u64,
    generation: u64,
    /// Where the next record goes.
    offset: u64,
    /// Set by a failed write or sync: every later commit goes to the engine.
    off: bool,
    /// Batches journaled and not yet applied to the engine, in order.
    unapplied: Vec<Batch>,
}

impl Journal {
    /// Opens the journal at `path` (making it when missing), replays into
    /// `engine` every record of the current generation for which `needed`
    /// says yes, and starts the next generation, all in one durable commit.
    /// Returns the journal and how many records it replayed.
    pub fn open(
        path: &Path,
        engine: &dyn Engine,
        needed: impl FnMut(&Batch) -> Result<bool>,
    ) -> Result<(Journal, usize)> {
        Self::open_with(path, engine, CAPACITY, needed)
    }

    fn open_with(
        path: &Path,
        engine: &dyn Engine,
        capacity: u64,
        mut needed: impl FnMut(&Batch) -> Result<bool>,
    ) -> Result<(Journal, usize)> {
        let generation = match engine.get(Tree::Meta, GENERATION_KEY)? {
            Some(raw) => u64::from_le_bytes(raw.as_slice().try_into().map_err(|_| {
                EngineError::new(engine.name(), "the audit journal's generation is corrupt")
            })?),
            None => 0,
        };
        let unreadable = |e: std::io::Error| {
            EngineError::new(
                "audit journal",
                format!(
                    "audit.journal in the data directory could not be read ({e}), so the \
                     audit events it may hold were not replayed; fix its permissions or the \
                     disk and start again, or move it aside to start without them"
                ),
            )
        };
        let (file, old) = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => {
                let mut bytes = Vec::new();
                (&file)
                    .take(MAX_READ)
                    .read_to_end(&mut bytes)
                    .map_err(unreadable)?;
                (Some(file), bytes)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => (None, Vec::new()),
            Err(e) => return Err(unreadable(e).into()),
        };
        let mut replay = Batch::new();
        let mut replayed = 0;
        for batch in records(&old, generation) {
            if needed(&batch)? {
                replayed += 1;
                for op in batch.ops() {
                    match &op.value {
                        Some(v) => replay.put(op.tree, op.key.clone(), v.clone()),
                        None => replay.delete(op.tree, op.key.clone()),
                    };
                }
            }
        }
        // One durable commit: what the engine lacked, and the generation
        // that makes every record in the file stale.
        replay.put(
            Tree::Meta,
            GENERATION_KEY.to_vec(),
            (generation + 1).to_le_bytes().to_vec(),
        );
        engine.commit(&replay)?;
        let file = match file {
            Some(f) if old.len() as u64 == capacity => f,
            _ => make(path, capacity).map_err(|e| {
                EngineError::new(
                    "audit journal",
                    format!(
                        "audit.journal could not be made in the data directory ({e}); \
                         free space there or fix its permissions, then start again"
                    ),
                )
            })?,
        };
        let journal = Journal {
            file,
            capacity,
            generation: generation + 1,
            offset: 0,
            off: false,
            unapplied: Vec::new(),
        };
        Ok((journal, replayed))
    }

    /// Makes `batch` durable: a record here, to be applied to `engine` by
    /// the next [`Journal::settle`]; or, when the journal is off or the
    /// batch does not fit in it, a durable engine commit after everything
    /// journaled before it is applied.
    pub fn commit(&mut self, engine: &dyn Engine, batch: Batch) -> Result<()> {
        let mut record = encode(self.generation, &batch);
        if self.off || record.len() as u64 > self.capacity {
            return self.commit_in_engine(engine, &batch);
        }
        if self.offset + record.len() as u64 > self.capacity {
            self.checkpoint(engine)?;
            // Sealed anew: a record belongs to the generation it is in.
            record = encode(self.generation, &batch);
        }
        let written = self
            .file
            .write_all_at(&record, self.offset)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            tracing::error!(
                error = %e,
                "the audit journal failed; audit appends commit through the engine from now on"
            );
            self.off = true;
            return self.commit_in_engine(engine, &batch);
        }
        self.offset += record.len() as u64;
        self.unapplied.push(batch);
        Ok(())
    }

    /// Applies every batch journaled and not yet applied to `engine`, in
    /// order and in one volatile commit. On failure they stay to be
    /// applied by the next call (each batch writes fixed keys, so applying
    /// one again changes nothing).
    pub fn settle(&mut self, engine: &dyn Engine) -> Result<()> {
        match self.unapplied.len() {
            0 => return Ok(()),
            1 => engine.commit_volatile(&self.unapplied[0])?,
            _ => {
                let mut all = Batch::new();
                for op in self.unapplied.iter().flat_map(Batch::ops) {
                    match &op.value {
                        Some(v) => all.put(op.tree, op.key.clone(), v.clone()),
                        None => all.delete(op.tree, op.key.clone()),
                    };
                }
                engine.commit_volatile(&all)?;
            }
        }
        self.unapplied.clear();
        Ok(())
    }

    /// A durable engine commit of `batch`, after what is journaled: batches
    /// move chain heads forward, so they reach the engine in order.
    fn commit_in_engine(&mut self, engine: &dyn Engine, batch: &Batch) -> Result<()> {
        self.settle(engine)?;
        Ok(engine.commit(batch)?)
    }

    /// Commits the next generation durably (and with it every volatile
    /// commit before it, once what is journaled is applied), and starts the
    /// file over.
    fn checkpoint(&mut self, engine: &dyn Engine) -> Result<()> {
        self.settle(engine)?;
        let mut b = Batch::new();
        b.put(
            Tree::Meta,
            GENERATION_KEY.to_vec(),
            (self.generation + 1).to_le_bytes().to_vec(),
        );
        engine.commit(&b)?;
        self.generation += 1;
        self.offset = 0;
        Ok(())
    }
}

/// Makes a zero-filled journal of `capacity` bytes at `path`, durably.
fn make(path: &Path, capacity: u64) -> std::io::Result<File> {
    let tmp = path.with_extension("tmp");
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::fsutil::PRIVATE_FILE_MODE)
            .open(&tmp)?
    };
    let zeros = vec![0u8; 64 << 10];
    let mut at = 0;
    while at < capacity {
        let n = zeros.len().min((capacity - at) as usize);
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(file)
}

fn checksum(generation: u64, payload: &[u8]) -> [u8; 8] {
    let mut h = Sha256::new();
    h.update(generation.to_le_bytes());
    h.update(payload);
    h.finalize()[..8].try_into().expect("8 of 32 bytes")
}

/// `batch` as one record of `generation`.
fn encode(generation: u64, batch: &Batch) -> Vec<u8> {
    // The payload goes in after room for the header, which is filled in
    // once the payload's length and checksum are known.
    let mut record = vec![0u8; HEADER];
    for op in batch.ops() {
        record.push(op.tree.index() as u8);
        record.extend_from_slice(&(op.key.len() as u32).to_le_bytes());
        record.extend_from_slice(&op.key);
        match &op.value {
            Some(v) => {
                record.push(PUT);
                record.extend_from_slice(&(v.len() as u32).to_le_bytes());
                record.extend_from_slice(v);
            }
            None => record.push(DELETE),
        }
    }
    let len = (record.len() - HEADER) as u32;
    let sum = checksum(generation, &record[HEADER..]);
    record[..4].copy_from_slice(&MAGIC);
    record[4..8].copy_from_slice(&len.to_le_bytes());
    record[8..16].copy_from_slice(&generation.to_le_bytes());
    record[16..HEADER].copy_from_slice(&sum);
    record
}

/// The batches of `generation`'s records in `bytes`, in order, up to the
/// first record that is not one of them whole.
fn records(bytes: &[u8], generation: u64) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let (magic, rest) = header.split_at(4);
        let (len, rest) = rest.split_at(4);
        let (record_generation, sum) = rest.split_at(8);
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        let record_generation = u64::from_le_bytes(record_generation.try_into().expect("8 bytes"));
        if magic != MAGIC || record_generation != generation || sum != checksum(generation, payload)
        {
            break;
        }
        match decode(payload) {
            Some(batch) => out.push(batch),
            None => break,
        }
        at += HEADER + len;
    }
    out
}

/// The writes of one record's payload; `None` when they do not parse.
fn decode(mut p: &[u8]) -> Option<Batch> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (p.get(..n)?, p.get(n..)?);
        *p = rest;
        Some(head)
    }
    fn len(p: &mut &[u8]) -> Option<usize> {
        Some(u32::from_le_bytes(take(p, 4)?.try_into().ok()?) as usize)
    }
    let mut batch = Batch::new();
    while !p.is_empty() {
        let tree = *Tree::ALL.get(take(&mut p, 1)?[0] as usize)?;
        let n = len(&mut p)?;
        let key = take(&mut p, n)?.to_vec();
        match take(&mut p, 1)?[0] {
            PUT => {
                let n = len(&mut p)?;
                batch.put(tree, key, take(&mut p, n)?.to_vec());
            }
            DELETE => {
                batch.delete(tree, key);
            }
            _ => return None,
        }
    }
    Some(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RedbEngine;

    fn batch(n: u64) -> Batch {
        let mut b = Batch::new();
        b.put(Tree::Audit, format!("k{n}").into_bytes(), vec![n as u8; 40]);
        b.delete(Tree::Audit, format!("gone{n}").into_bytes());
        b
    }

    fn keys(batches: &[Batch]) -> Vec<Vec<u8>> {
        batches.iter().map(|b| b.ops()[0].key.clone()).collect()
    }

    fn engine(dir: &Path) -> RedbEngine {
        RedbEngine::open(&dir.join("meta.redb"), 1 << 20).unwrap()
    }

    #[test]
    fn records_decode_to_the_batches_written_in_order() {
        let bytes: Vec<u8> = (1..=3).flat_map(|n| encode(7, &batch(n))).collect();
        let read = records(&bytes, 7);
        assert_eq!(
            keys(&read),
            [b"k1".to_vec(), b"k2".to_vec(), b"k3".to_vec()]
        );
        assert_eq!(read[1].ops()[0].value, Some(vec![2u8; 40]));
        assert_eq!(read[1].ops()[1].value, None);
        assert_eq!(read[1].ops()[1].key, b"gone2");
    }

    #[test]
    fn replay_stops_at_a_torn_record_a_flipped_byte_or_another_generation() {
        let one = encode(7, &batch(1));
        let two = encode(7, &batch(2));
        // Torn: the second record cut short, then zeros (the file's fill).
        let mut torn = [one.clone(), two[..two.len() - 5].to_vec()].concat();
        torn.resize(torn.len() + 64, 0);
        assert_eq!(keys(&records(&torn, 7)), [b"k1".to_vec()]);
        // A byte of the second record's payload changed.
        let mut flipped = [one.clone(), two.clone()].concat();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(keys(&records(&flipped, 7)), [b"k1".to_vec()]);
        // A record left from an older generation past the newer ones.
        let stale = [one.clone(), encode(6, &batch(2))].concat();
        assert_eq!(keys(&records(&stale, 7)), [b"k1".to_vec()]);
        assert!(records(&stale, 8).is_empty());
        // Zeros alone are no record.
        assert!(records(&[0u8; 4096], 0).is_empty());
    }

    #[test]
    fn a_full_journal_checkpoints_and_a_reopen_replays_only_the_current_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        let engine = engine(dir.path());
        let record = encode(1, &batch(0)).len() as u64;
        let capacity = record * 4;
        let (mut journal, replayed) =
            Journal::open_with(&path, &engine, capacity, |_| Ok(true)).unwrap();
        assert_eq!((replayed, journal.generation), (0, 1));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), capacity);
        for n in 0..10 {
            journal.commit(&engine, batch(n)).unwrap();
        }
        // 4 records a generation: 0-3, 4-7, then 8 and 9 in the third.
        assert_eq!(journal.generation, 3);
        drop(journal);
        let mut seen = Vec::new();
        let (journal, replayed) = Journal::open_with(&path, &engine, capacity, |b| {
            seen.push(b.ops()[0].key.clone());
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, [b"k8".to_vec(), b"k9".to_vec()]);
        assert_eq!((replayed, journal.generation), (2, 4));
        for n in 0..10 {
            let key = format!("k{n}");
            assert!(engine.get(Tree::Audit, key.as_bytes()).unwrap().is_some());
        }
        assert_eq!(
            engine.get(Tree::Meta, GENERATION_KEY).unwrap(),
            Some(4u64.to_le_bytes().to_vec())
        );
    }

    #[test]
    fn journaled_batches_reach_the_engine_in_order_when_settled_and_before_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        let engine = engine(dir.path());
        let capacity = encode(1, &batch(0)).len() as u64 * 2;
        let (mut journal, _) = Journal::open_with(&path, &engine, capacity, |_| Ok(true)).unwrap();
        journal.commit(&engine, batch(1)).unwrap();
        assert_eq!(engine.get(Tree::Audit, b"k1").unwrap(), None);
        // A later batch writing the same key wins once both are applied.
        let mut again = Batch::new();
        again.put(Tree::Audit, b"k1".to_vec(), vec![9]);
        journal.commit(&engine, again).unwrap();
        journal.settle(&engine).unwrap();
        assert_eq!(engine.get(Tree::Audit, b"k1").unwrap(), Some(vec![9]));
        journal.settle(&engine).unwrap();
        // The file is full: the next commit checkpoints, and the checkpoint
        // applies what it held before it makes those records stale.
        journal.commit(&engine, batch(2)).unwrap();
        journal.commit(&engine, batch(3)).unwrap();
        journal.commit(&engine, batch(4)).unwrap();
        assert_eq!(journal.generation, 3);
        assert!(engine.get(Tree::Audit, b"k2").unwrap().is_some());
        assert!(engine.get(Tree::Audit, b"k3").unwrap().is_some());
        assert_eq!(engine.get(Tree::Audit, b"k4").unwrap(), None);
        drop(journal);
        let mut seen = Vec::new();
        Journal::open_with(&path, &engine, capacity, |b| {
            seen.push(b.ops()[0].key.clone());
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, [b"k4".to_vec()]);
        assert!(engine.get(Tree::Audit, b"k4").unwrap().is_some());
    }

    #[test]
    fn records_the_caller_does_not_need_are_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        let (mut journal, _) = Journal::open(&path, &engine(dir.path()), |_| Ok(true)).unwrap();
        // Into an engine that never sees the volatile commits: a crash.
        let lost = tempfile::tempdir().unwrap();
        let lost = engine(lost.path());
        for n in 1..=3 {
            journal.commit(&lost, batch(n)).unwrap();
        }
        drop(journal);
        let engine = engine(dir.path());
        let (_, replayed) = Journal::open(&path, &engine, |b| Ok(b.ops()[0].key != b"k2")).unwrap();
        assert_eq!(replayed, 2);
        assert!(engine.get(Tree::Audit, b"k1").unwrap().is_some());
        assert_eq!(engine.get(Tree::Audit, b"k2").unwrap(), None);
        assert!(engine.get(Tree::Audit, b"k3").unwrap().is_some());
    }

    #[test]
    fn a_failed_journal_write_turns_it_off_and_appends_commit_durably_in_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        let engine = engine(dir.path());
        let (mut journal, _) = Journal::open(&path, &engine, |_| Ok(true)).unwrap();
        journal.commit(&engine, batch(1)).unwrap();
        // A handle that cannot write: every write fails from here on.
        journal.file = File::open(&path).unwrap();
        journal.commit(&engine, batch(2)).unwrap();
        assert!(journal.off);
        journal.commit(&engine, batch(3)).unwrap();
        for key in [b"k1", b"k2", b"k3"] {
            assert!(engine.get(Tree::Audit, key).unwrap().is_some());
        }
    }

    #[test]
    fn a_journal_that_cannot_be_read_stops_the_open_and_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        std::fs::create_dir(&path).unwrap();
        let e = Journal::open(&path, &engine(dir.path()), |_| Ok(true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("audit.journal in the data directory could not be read"),
            "{e}"
        );
        assert!(e.contains("move it aside"), "{e}");
    }

    #[test]
    fn a_batch_larger_than_the_journal_commits_durably_in_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        let engine = engine(dir.path());
        let (mut journal, _) = Journal::open_with(&path, &engine, 4096, |_| Ok(true)).unwrap();
        let mut big = Batch::new();
        big.put(Tree::Audit, b"big".to_vec(), vec![1u8; 8192]);
        journal.commit(&engine, big).unwrap();
        assert_eq!((journal.offset, journal.off), (0, false));
        assert_eq!(
            engine.get(Tree::Audit, b"big").unwrap(),
            Some(vec![1u8; 8192])
        );
        // The journal goes on taking the batches that fit.
        journal.commit(&engine, batch(1)).unwrap();
        assert!(journal.offset > 0);
    }

    #[test]
    fn an_oversized_journal_is_read_only_up_to_its_bound_and_made_anew() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.journal");
        // Sparse: the bytes past the bound are never read.
        File::create(&path)
            .unwrap()
            .set_len(MAX_READ + (1 << 20))
            .unwrap();
        let (_, replayed) = Journal::open(&path, &engine(dir.path()), |_| Ok(true)).unwrap();
        assert_eq!(replayed, 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), CAPACITY);
    }
}
