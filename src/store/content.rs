//! One streaming pass over payload bytes as they are written: SHA-256, size,
//! line count, char count, UTF-8 validity, and the sparse line index.
//!
//! [`Scan`] runs that pass beside the writes: past [`SCAN_THREAD_AFTER`]
//! bytes it moves to a thread of its own, so that a large upload's hash
//! and its page-cache copy overlap instead of adding up on one thread.

use std::sync::mpsc::{SyncSender, sync_channel};
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

    /// Bytes seen so far.
    pub fn size(&self) -> u64 {
        self.size
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

/// Content up to this size is scanned on the writer's thread: a thread of
/// its own costs more than it saves on a small payload.
pub const SCAN_THREAD_AFTER: u64 = 8 << 20;
/// Chunks handed to the scan thread and not yet scanned, at most; past it
/// the writer waits. The store hands over pieces of at most 1 MiB, copied
/// or shared with a received chunk (itself at most one request message),
/// so this bounds what a scan holds.
const SCAN_QUEUE: usize = 4;

/// The content pass of one payload being written, on the writer's thread
/// until the content passes [`SCAN_THREAD_AFTER`], then on its own.
#[derive(Debug)]
pub struct Scan {
    size: u64,
    state: ScanState,
}

#[derive(Debug)]
enum ScanState {
    Inline(ContentScanner),
    Threaded {
        chunks: SyncSender<Bytes>,
        scanner: JoinHandle<ContentScanner>,
    },
    /// No thread could be started: the pass is lost, and the upload fails
    /// at `finish`.
    NoThread(String),
}

impl Default for Scan {
    fn default() -> Self {
        Self::new()
    }
}

impl Scan {
    /// A pass at offset 0.
    pub fn new() -> Self {
        Self {
            size: 0,
            state: ScanState::Inline(ContentScanner::new()),
        }
    }

    /// Bytes taken so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Takes the next chunk, copying it if the pass runs on its own thread.
    pub fn update(&mut self, chunk: &[u8]) {
        match &mut self.state {
            ScanState::Inline(scanner) if self.size + chunk.len() as u64 <= SCAN_THREAD_AFTER => {
                self.size += chunk.len() as u64;
                scanner.update(chunk);
            }
            // The upload fails at `finish`: nothing to copy for.
            ScanState::NoThread(_) => self.size += chunk.len() as u64,
            _ => self.update_shared(Bytes::copy_from_slice(chunk)),
        }
    }

    /// Takes the next chunk without copying it. Call it before writing the
    /// chunk, so that the two overlap.
    pub fn update_shared(&mut self, chunk: Bytes) {
        self.size += chunk.len() as u64;
        if let ScanState::Inline(scanner) = &mut self.state {
            if self.size <= SCAN_THREAD_AFTER {
                scanner.update(&chunk);
                return;
            }
            let (tx, rx) = sync_channel::<Bytes>(SCAN_QUEUE);
            let mut moved = std::mem::take(scanner);
            let spawned = std::thread::Builder::new()
                .name("spillway-scan".into())
                .spawn(move || {
                    while let Ok(chunk) = rx.recv() {
                        moved.update(&chunk);
                    }
                    moved
                });
            match spawned {
                Ok(handle) => {
                    self.state = ScanState::Threaded {
                        chunks: tx,
                        scanner: handle,
                    }
                }
                // The scanner went with the closure that did not start
                // (only when the process is out of threads).
                Err(e) => {
                    self.state = ScanState::NoThread(e.to_string());
                    return;
                }
            }
        }
        if let ScanState::Threaded { chunks, .. } = &self.state {
            // A send fails only when the scan thread has gone, which
            // `finish` reports.
            let _ = chunks.send(chunk);
        }
    }

    /// Finishes the pass: the facts, or an error when its thread failed.
    pub fn finish(self) -> std::io::Result<ContentFacts> {
        let scanner = match self.state {
            ScanState::Inline(scanner) => scanner,
            ScanState::Threaded { chunks, scanner } => {
                drop(chunks);
                scanner.join().map_err(|_| {
                    std::io::Error::other(
                        "the content scan thread failed; nothing was stored, retry the upload",
                    )
                })?
            }
            ScanState::NoThread(why) => {
                return Err(std::io::Error::other(format!(
                    "the server could not start a thread for the content scan ({why}); retry the upload"
                )));
            }
        };
        debug_assert_eq!(scanner.size(), self.size);
        Ok(scanner.finish())
    }
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

    #[test]
    fn a_scan_that_moves_to_its_own_thread_learns_what_one_pass_learns() {
        // Multibyte text with a character split at the hand-over point and
        // past it, and one invalid byte near the end in the second case.
        let text = "héllo 🌍 世界, a line\n".repeat((SCAN_THREAD_AFTER as usize / 25) + 50_000);
        let mut bad = text.clone().into_bytes();
        let at = bad.len() - 10;
        bad[at] = 0xff;
        for data in [text.as_bytes(), &bad] {
            let whole = scan_in_chunks(data, data.len());
            for (chunk, shared) in [(65_537, true), (1 << 20, false), (333_333, true)] {
                let mut s = Scan::new();
                for c in data.chunks(chunk) {
                    if shared {
                        s.update_shared(Bytes::copy_from_slice(c));
                    } else {
                        s.update(c);
                    }
                }
                assert!(
                    matches!(s.state, ScanState::Threaded { .. }),
                    "a pass past {SCAN_THREAD_AFTER} bytes runs on its own thread"
                );
                assert_eq!(s.size(), data.len() as u64);
                assert_eq!(
                    s.finish().unwrap(),
                    whole,
                    "chunks of {chunk}, shared {shared}"
                );
            }
        }
        let mut small = Scan::new();
        small.update(b"a\nb");
        assert!(matches!(small.state, ScanState::Inline(_)));
        assert_eq!(small.finish().unwrap(), scan_in_chunks(b"a\nb", 1));
    }

    #[test]
    fn a_pass_that_could_not_start_its_thread_takes_more_chunks_then_refuses_with_the_reason() {
        let mut s = Scan {
            size: SCAN_THREAD_AFTER,
            state: ScanState::NoThread("Resource temporarily unavailable".into()),
        };
        s.update(&[b'x'; 1000]);
        s.update_shared(Bytes::from_static(b"more"));
        assert_eq!(s.size(), SCAN_THREAD_AFTER + 1004);
        let err = s.finish().unwrap_err().to_string();
        assert!(err.contains("could not start a thread"), "{err}");
        assert!(err.contains("Resource temporarily unavailable"), "{err}");
        assert!(err.contains("retry the upload"), "{err}");
    }

    #[test]
    fn a_pass_whose_thread_died_neither_blocks_the_writer_nor_yields_facts() {
        let (tx, rx) = sync_channel::<Bytes>(SCAN_QUEUE);
        let scanner = std::thread::spawn(move || -> ContentScanner {
            let _first = rx.recv();
            panic!("the scan thread dies on its first chunk (deliberately, in this test)");
        });
        let mut s = Scan {
            size: 0,
            state: ScanState::Threaded {
                chunks: tx,
                scanner,
            },
        };
        // Far more chunks than the queue holds: with the thread gone, the
        // sends fail at once instead of waiting for room.
        for _ in 0..(SCAN_QUEUE * 8) {
            s.update_shared(Bytes::from_static(&[b'y'; 4096]));
        }
        assert_eq!(s.size(), (SCAN_QUEUE * 8 * 4096) as u64);
        let err = s.finish().unwrap_err().to_string();
        assert!(err.contains("scan thread failed"), "{err}");
        assert!(err.contains("nothing was stored"), "{err}");
        assert!(err.contains("retry the upload"), "{err}");
    }
}
