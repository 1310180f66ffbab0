//! One streaming pass over payload bytes as they are written: SHA-256, size,
//! line count, char count, UTF-8 validity, and the sparse line index.
//!
//! [`ScanAhead`] runs that pass beside the write instead of after it: once
//! an upload is past its first large chunk, the scanner moves to its own
//! thread, fed through a bounded queue of shared chunks, so hashing one
//! chunk overlaps copying the next into the page cache.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::lines::LineIndexBuilder;

/// What one pass learned about the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentFacts {
    /// Hex SHA-256.
    pub sha256: String,
    /// Bytes.
    pub size: u64,
    /// Newlines, plus one when the content does not end with one; 0 when empty.
    pub line_count: u64,
    /// Unicode scalar values when UTF-8, bytes otherwise.
    pub chars: u64,
    /// Whether the content is valid UTF-8.
    pub utf8: bool,
    /// The first bytes, for type sniffing.
    pub head: Vec<u8>,
    /// The sparse line index, encoded.
    pub line_index: Vec<u8>,
}

/// Bytes kept from the start of the content for sniffing.
const HEAD_BYTES: usize = 512;

/// Accumulates [`ContentFacts`] chunk by chunk.
#[derive(Debug, Default)]
pub struct ContentScanner {
    hasher: Sha256,
    size: u64,
    chars: u64,
    last_byte: Option<u8>,
    /// `None` once the content is known not to be UTF-8.
    utf8: Option<Utf8Stream>,
    head: Vec<u8>,
    index: LineIndexBuilder,
}

impl ContentScanner {
    /// A scanner at offset 0.
    pub fn new() -> Self {
        Self {
            utf8: Some(Utf8Stream::default()),
            ..Default::default()
        }
    }

    /// Takes the next chunk.
    pub fn update(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        self.hasher.update(chunk);
        // Every byte that is not a UTF-8 continuation byte starts a char
        // (SIMD-counted; only meaningful while the content is still UTF-8).
        if self.utf8.is_some() {
            self.chars += bytecount::num_chars(chunk) as u64;
        }
        if self.head.len() < HEAD_BYTES {
            let take = (HEAD_BYTES - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
        }
        if let Some(state) = &mut self.utf8
            && !state.feed(chunk)
        {
            self.utf8 = None;
        }
        self.index.update(self.size, chunk);
        self.size += chunk.len() as u64;
        self.last_byte = chunk.last().copied();
    }

    /// Finishes the pass.
    pub fn finish(self) -> ContentFacts {
        let utf8 = self.utf8.is_some_and(|s| s.is_complete());
        // The line index counts every newline on its way.
        let newlines = self.index.newlines();
        let line_count = match self.last_byte {
            None => 0,
            Some(b'\n') => newlines,
            Some(_) => newlines + 1,
        };
        ContentFacts {
            sha256: hex::encode(self.hasher.finalize()),
            size: self.size,
            line_count,
            chars: if utf8 { self.chars } else { self.size },
            utf8,
            head: self.head,
            line_index: self.index.finish(),
        }
    }
}

/// Chunks waiting for the scanner thread: with chunks of at most one gRPC
/// message, the memory this pins is bounded by this many messages.
const SCAN_QUEUE: usize = 4;
/// A chunk at least this large moves the scan to its own thread; smaller
/// ones (and whole small payloads) are scanned inline, where a thread
/// would cost more than it overlaps.
const SCAN_AHEAD_BYTES: usize = 256 << 10;

/// A [`ContentScanner`] that runs inline until the first large chunk, then on
/// its own thread (see the module doc). Chunks are scanned in the order
/// they are given, wherever they run, so the facts are the same.
#[derive(Debug)]
pub struct ScanAhead {
    size: u64,
    state: ScanState,
}

#[derive(Debug)]
enum ScanState {
    Inline(ContentScanner),
    Ahead {
        queue: SyncSender<Bytes>,
        worker: JoinHandle<Option<ContentScanner>>,
    },
}

impl Default for ScanAhead {
    fn default() -> Self {
        Self::new()
    }
}

impl ScanAhead {
    /// A scan at offset 0, inline.
    pub fn new() -> Self {
        Self {
            size: 0,
            state: ScanState::Inline(ContentScanner::new()),
        }
    }

    /// Bytes given so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Takes the next chunk, borrowed: scanned now, or copied to the
    /// thread once the scan runs there.
    pub fn update(&mut self, chunk: &[u8]) {
        match &mut self.state {
            ScanState::Inline(s) => s.update(chunk),
            ScanState::Ahead { .. } => return self.update_owned(Bytes::copy_from_slice(chunk)),
        }
        self.size += chunk.len() as u64;
    }

    /// Takes the next chunk, shared: a large one starts the thread, and
    /// from then on chunks queue for it (waiting while [`SCAN_QUEUE`] are
    /// queued) instead of being scanned here.
    pub fn update_owned(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.size += chunk.len() as u64;
        if let ScanState::Inline(_) = self.state
            && chunk.len() >= SCAN_AHEAD_BYTES
        {
            self.start_thread();
        }
        match &mut self.state {
            ScanState::Inline(s) => s.update(&chunk),
            ScanState::Ahead { queue, .. } => {
                // The thread only ends when the queue closes (or by a
                // panic, which `finish` reports).
                let _ = queue.send(chunk);
            }
        }
    }

    /// Moves the scanner to its own thread; stays inline when the thread
    /// cannot be started. The scanner is handed over only once the thread
    /// runs, so a failed start leaves it where it was.
    fn start_thread(&mut self) {
        let (queue, chunks) = sync_channel::<Bytes>(SCAN_QUEUE);
        let (hand_over, handed) = sync_channel::<ContentScanner>(1);
        let spawned = std::thread::Builder::new()
            .name("spillway-scan".into())
            .spawn(move || Some(scan_queue(handed.recv().ok()?, chunks)));
        let worker = match spawned {
            Ok(worker) => worker,
            Err(e) => {
                tracing::warn!(error = %e, "could not start a scanner thread; scanning inline");
                return;
            }
        };
        let ScanState::Inline(scanner) =
            std::mem::replace(&mut self.state, ScanState::Ahead { queue, worker })
        else {
            unreachable!("start_thread is called only while inline")
        };
        // The thread waits for exactly this one message.
        let _ = hand_over.send(scanner);
    }

    /// Finishes the pass, waiting for the thread's queue to drain.
    pub fn finish(self) -> std::io::Result<ContentFacts> {
        match self.state {
            ScanState::Inline(s) => Ok(s.finish()),
            ScanState::Ahead { queue, worker } => {
                drop(queue);
                match worker.join() {
                    Ok(Some(scanner)) => Ok(scanner.finish()),
                    _ => Err(std::io::Error::other(
                        "the content scanner thread stopped before the end of the upload",
                    )),
                }
            }
        }
    }
}

/// The scanner thread: every queued chunk, in order, until the queue closes.
fn scan_queue(mut scanner: ContentScanner, chunks: Receiver<Bytes>) -> ContentScanner {
    for chunk in chunks {
        scanner.update(&chunk);
    }
    scanner
}

/// Incremental UTF-8 validation across chunk boundaries.
#[derive(Debug, Default)]
struct Utf8Stream {
    /// Bytes of a character split by the last chunk boundary.
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Validates the next chunk; false once invalid.
    fn feed(&mut self, mut chunk: &[u8]) -> bool {
        // Complete a character split by the previous boundary, one byte at a time.
        while !self.pending.is_empty() {
            let Some((&b, rest)) = chunk.split_first() else {
                return true;
            };
            self.pending.push(b);
            chunk = rest;
            match std::str::from_utf8(&self.pending) {
                Ok(_) => self.pending.clear(),
                Err(e) if e.error_len().is_some() => return false,
                Err(_) if self.pending.len() >= 4 => return false,
                Err(_) => {}
            }
        }
        match std::str::from_utf8(chunk) {
            Ok(_) => true,
            Err(e) if e.error_len().is_some() => false,
            Err(e) => {
                self.pending.extend_from_slice(&chunk[e.valid_up_to()..]);
                true
            }
        }
    }

    fn is_complete(&self) -> bool {
        self.pending.is_empty()
    }
}

/// The SHA-256 (hex) of everything `file` holds from its start, read in
/// 1 MiB pieces.
pub fn sha256_of(mut file: std::fs::File) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in_chunks(data: &[u8], chunk: usize) -> ContentFacts {
        let mut s = ContentScanner::new();
        for c in data.chunks(chunk.max(1)) {
            s.update(c);
        }
        s.finish()
    }

    #[test]
    fn counts_lines_as_the_contract_defines() {
        assert_eq!(scan_in_chunks(b"", 3).line_count, 0);
        assert_eq!(scan_in_chunks(b"a", 3).line_count, 1);
        assert_eq!(scan_in_chunks(b"a\n", 3).line_count, 1);
        assert_eq!(scan_in_chunks(b"a\nb", 3).line_count, 2);
        assert_eq!(scan_in_chunks(b"\n\n", 3).line_count, 2);
    }

    #[test]
    fn multibyte_text_split_at_every_boundary_is_valid_utf8_with_right_char_count() {
        let text = "héllo 🌍 世界\n".repeat(5);
        for chunk in 1..12 {
            let f = scan_in_chunks(text.as_bytes(), chunk);
            assert!(f.utf8, "chunk size {chunk}");
            assert_eq!(f.chars, text.chars().count() as u64);
        }
    }

    #[test]
    fn invalid_or_truncated_utf8_is_detected_and_counted_as_bytes() {
        let mut bad = "ok ".as_bytes().to_vec();
        bad.push(0xff);
        let f = scan_in_chunks(&bad, 2);
        assert!(!f.utf8);
        assert_eq!(f.chars, 4);
        let truncated = &"🌍".as_bytes()[..3];
        assert!(!scan_in_chunks(truncated, 1).utf8);
    }

    #[test]
    fn hash_matches_a_one_shot_digest() {
        let data = vec![7u8; 100_000];
        let f = scan_in_chunks(&data, 4096);
        assert_eq!(f.sha256, hex::encode(Sha256::digest(&data)));
        assert_eq!(f.head.len(), HEAD_BYTES);
    }

    /// Multibyte text over several line-index blocks, with an invalid byte
    /// at `bad` when given and no final newline.
    fn mixed_text(bad: Option<usize>) -> Vec<u8> {
        let mut data = "héllo 🌍 世界 line\n".repeat(120_000).into_bytes();
        data.extend_from_slice("no newline at the end 🌍".as_bytes());
        if let Some(at) = bad {
            data[at] = 0xff;
        }
        data
    }

    #[test]
    fn scanning_ahead_on_a_thread_learns_the_same_facts_as_scanning_inline() {
        let cases = [
            ("valid text", mixed_text(None)),
            (
                "an invalid byte past the first large chunk",
                mixed_text(Some(2_000_000)),
            ),
        ];
        for (name, data) in cases {
            let inline = scan_in_chunks(&data, 64 << 10);
            // Small chunks first (inline), then large shared ones (the
            // thread), then borrowed ones again (copied to the thread),
            // each split mid-character somewhere.
            let mut ahead = ScanAhead::new();
            let (first, rest) = data.split_at(100_001);
            for c in first.chunks(7_001) {
                ahead.update_owned(Bytes::copy_from_slice(c));
            }
            assert!(matches!(ahead.state, ScanState::Inline(_)), "{name}");
            let (middle, last) = rest.split_at(rest.len() - 300_003);
            for c in middle.chunks(SCAN_AHEAD_BYTES + 3) {
                ahead.update_owned(Bytes::copy_from_slice(c));
            }
            assert!(matches!(ahead.state, ScanState::Ahead { .. }), "{name}");
            for c in last.chunks(10_007) {
                ahead.update(c);
            }
            assert_eq!(ahead.size(), data.len() as u64, "{name}");
            assert_eq!(ahead.finish().unwrap(), inline, "{name}");
        }
    }

    #[test]
    fn a_small_payload_is_scanned_inline_without_a_thread() {
        let mut ahead = ScanAhead::new();
        ahead.update_owned(Bytes::from_static(b"small\n"));
        ahead.update(b"and borrowed");
        assert!(matches!(ahead.state, ScanState::Inline(_)));
        assert_eq!(
            ahead.finish().unwrap(),
            scan_in_chunks(b"small\nand borrowed", 4)
        );
    }
}
