//! Oversized values of an upstream's tool result, kept on disk instead of in
//! memory.
//!
//! A `tools/call` result of hundreds of megabytes would otherwise sit in the
//! proxy three times at once: rmcp's line buffer, serde_json's unescaping
//! scratch and the parsed string. [`Spiller`] sits in the upstream's frame
//! guard and rewrites each line longer than 1 MiB as it streams past. The
//! values a tool result carries its bulk in, when longer than
//! [`SPILL_ABOVE`], go to an anonymous temporary file, and the line carries a
//! short marker string in their place:
//!
//! - `result.content[i].text`, `.data` and `.blob`, and
//!   `result.content[i].resource.text` and `.blob` (unescaped, so the file
//!   holds the string itself);
//! - `result.structuredContent` (its JSON, as sent).
//!
//! The offloader takes each file back by its marker ([`Spools::take`]) and
//! streams it into Upload ([`Piece`]), so the proxy holds a few buffers
//! whatever the result's size. A marker an upstream forges names no file and
//! stays plain text; a file nobody took (a cancelled call) is dropped after
//! [`KEEP`]. Every other part of the line passes through byte for byte.

use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::inspect::string_end;

/// Values longer than this (raw JSON bytes) go to a file.
pub const SPILL_ABOVE: usize = 1 << 20;
/// How long a file waits to be taken.
pub const KEEP: Duration = Duration::from_secs(15 * 60);
/// What a marker string starts with.
const MARKER: &str = "spillway-spool:";

/// One value kept on disk.
#[derive(Debug)]
pub struct Spooled {
    file: std::fs::File,
    len: u64,
}

impl Spooled {
    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.len
    }
}

struct Entry {
    at: Instant,
    kept: Result<Spooled, String>,
}

/// The files of one proxy connection, by marker; cheap to clone.
#[derive(Clone, Default)]
pub struct Spools(Arc<Mutex<HashMap<String, Entry>>>);

impl std::fmt::Debug for Spools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |m| m.len());
        f.debug_struct("Spools").field("files", &n).finish()
    }
}

impl Spools {
    /// Keeps `kept` (a file, or why none could be written) and returns the
    /// marker string that names it.
    fn keep(&self, kept: Result<Spooled, String>) -> String {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).expect("the operating system's random source failed");
        let marker = format!("{MARKER}{}", hex::encode(id));
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, e| e.at.elapsed() < KEEP);
            m.insert(
                marker.clone(),
                Entry {
                    at: Instant::now(),
                    kept,
                },
            );
        }
        marker
    }

    /// The file a marker string names, taken out: `None` when `text` is not
    /// a marker of this connection (then it is plain text), `Err` when the
    /// value could not be written to disk.
    pub fn take(&self, text: &str) -> Option<Result<Spooled, String>> {
        if !text.starts_with(MARKER) {
            return None;
        }
        self.0.lock().ok()?.remove(text).map(|e| e.kept)
    }

    /// Drops the files of markers that will never be taken.
    fn discard(&self, markers: &[String]) {
        if let Ok(mut m) = self.0.lock() {
            for k in markers {
                m.remove(k);
            }
        }
    }

    /// Files waiting to be taken.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.0.lock().map_or(0, |m| m.len())
    }
}

/// One piece of an upload's body.
#[derive(Debug)]
pub enum Piece {
    /// Bytes in memory.
    Bytes(Bytes),
    /// A spooled value; `base64` decodes it on the way when it is valid
    /// base64 (otherwise it is sent as it is).
    File {
        /// The value.
        spooled: Spooled,
        /// Whether it holds base64 of the bytes to store.
        base64: bool,
    },
}

/// Sends `pieces` to `send` in chunks of at most `chunk` bytes, reading files
/// as it goes (blocking: run it on a blocking thread). Stops early, without an
/// error, when `send` returns false (the receiver went away).
pub fn stream_pieces(
    pieces: Vec<Piece>,
    chunk: usize,
    mut send: impl FnMut(Bytes) -> bool,
) -> std::io::Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    for p in pieces {
        match p {
            Piece::Bytes(b) => {
                let mut at = 0;
                while at < b.len() {
                    let end = (at + chunk).min(b.len());
                    if !send(b.slice(at..end)) {
                        return Ok(());
                    }
                    at = end;
                }
            }
            Piece::File {
                mut spooled,
                base64,
            } => {
                spooled.file.rewind()?;
                let decode = base64 && {
                    let mut check = base64::read::DecoderReader::new(&mut spooled.file, &b64);
                    let ok = std::io::copy(&mut check, &mut std::io::sink()).is_ok();
                    spooled.file.rewind()?;
                    ok
                };
                let mut reader: Box<dyn Read + '_> = if decode {
                    Box::new(base64::read::DecoderReader::new(&mut spooled.file, &b64))
                } else {
                    Box::new(&mut spooled.file)
                };
                loop {
                    let mut buf = vec![0u8; chunk];
                    let mut filled = 0;
                    while filled < chunk {
                        match reader.read(&mut buf[filled..])? {
                            0 => break,
                            n => filled += n,
                        }
                    }
                    if filled == 0 {
                        break;
                    }
                    buf.truncate(filled);
                    if !send(Bytes::from(buf)) {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

/// What the key of an object's current member names, as far as the spiller
/// cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Result,
    Content,
    Text,
    Data,
    Blob,
    Resource,
    Structured,
    Other,
}

impl Key {
    fn of(name: &[u8]) -> Self {
        match name {
            b"result" => Self::Result,
            b"content" => Self::Content,
            b"text" => Self::Text,
            b"data" => Self::Data,
            b"blob" => Self::Blob,
            b"resource" => Self::Resource,
            b"structuredContent" => Self::Structured,
            _ => Self::Other,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Frame {
    Object { key: Key, expect_key: bool },
    Array,
}

/// Where the lexer is in the line.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Between tokens (whitespace, punctuation, numbers and literals pass).
    Between,
    /// In a string that passes through: a key (collected) or a value.
    Str { escape: bool, key: bool },
    /// In a string value that may go to a file.
    Target { escape: bool },
    /// In the `structuredContent` value (an object or array).
    Raw {
        depth: u32,
        in_str: bool,
        escape: bool,
    },
}

/// The sink of the value being spilled: in memory until it passes
/// [`SPILL_ABOVE`], then a file (or the error that prevented one).
#[derive(Default)]
struct Sink {
    pending: Vec<u8>,
    file: Option<Result<(std::fs::File, u64), String>>,
    unescape: Unescape,
}

impl Sink {
    fn reset(&mut self) {
        self.pending.clear();
        self.file = None;
        self.unescape = Unescape::default();
    }

    /// Adds raw bytes; `unescape` for a string's contents.
    fn push(&mut self, raw: &[u8], unescape: bool) {
        if self.file.is_none() {
            self.pending.extend_from_slice(raw);
            if self.pending.len() <= SPILL_ABOVE {
                return;
            }
            self.file = Some(
                tempfile::tempfile()
                    .map(|f| (f, 0))
                    .map_err(|e| e.to_string()),
            );
            let first = std::mem::take(&mut self.pending);
            self.write(&first, unescape);
            return;
        }
        self.write(raw, unescape);
    }

    fn write(&mut self, raw: &[u8], unescape: bool) {
        let Some(Ok((file, len))) = &mut self.file else {
            return;
        };
        let mut w = Counted { inner: file, n: 0 };
        let r = if unescape {
            self.unescape.run(raw, &mut w)
        } else {
            w.write_all(raw)
        };
        *len += w.n;
        if let Err(e) = r {
            self.file = Some(Err(e.to_string()));
        }
    }

    /// The value ended: `None` when it stayed small (its raw bytes are in
    /// `pending`), else the file.
    fn finish(&mut self) -> Option<Result<Spooled, String>> {
        let kept = self.file.take()?;
        Some(kept.and_then(|(mut file, mut len)| {
            let mut w = Counted {
                inner: &mut file,
                n: 0,
            };
            self.unescape.finish(&mut w).map_err(|e| e.to_string())?;
            len += w.n;
            Ok(Spooled { file, len })
        }))
    }
}

struct Counted<'a, W> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Rewrites one line of an upstream's stdout at a time (see the module doc).
pub struct Spiller {
    spools: Spools,
    stack: Vec<Frame>,
    state: State,
    key: Vec<u8>,
    sink: Sink,
    /// Markers made for the current line.
    made: Vec<String>,
}

impl Spiller {
    /// A spiller that keeps its files in `spools`.
    pub fn new(spools: Spools) -> Self {
        Self {
            spools,
            stack: Vec::new(),
            state: State::Between,
            key: Vec::new(),
            sink: Sink::default(),
            made: Vec::new(),
        }
    }

    /// The line was dropped (over the cap): its files go too.
    pub fn abandon(&mut self) {
        self.spools.discard(&self.made);
        self.end();
    }

    /// The line ended; the next byte starts a new one.
    pub fn end(&mut self) {
        self.stack.clear();
        self.state = State::Between;
        self.key.clear();
        self.sink.reset();
        self.made.clear();
    }

    /// The value about to start is one of the bulk strings:
    /// `result.content[i].{text,data,blob}` or
    /// `result.content[i].resource.{text,blob}`.
    fn target(&self) -> bool {
        let s = self.stack.as_slice();
        let in_content = s.len() >= 4
            && key_is(&s[0], &[Key::Result])
            && key_is(&s[1], &[Key::Content])
            && matches!(s[2], Frame::Array);
        in_content
            && match s.len() {
                4 => key_is(&s[3], &[Key::Text, Key::Data, Key::Blob]),
                5 => key_is(&s[3], &[Key::Resource]) && key_is(&s[4], &[Key::Text, Key::Blob]),
                _ => false,
            }
    }

    /// The value about to start is `result.structuredContent`.
    fn structured(&self) -> bool {
        matches!(self.stack.as_slice(), [r, sc] if key_is(r, &[Key::Result]) && key_is(sc, &[Key::Structured]))
    }

    /// Feeds the next bytes of the line (no newline in them) and appends
    /// what passes on to `out`.
    pub fn feed(&mut self, seg: &[u8], out: &mut Vec<u8>) {
        let mut i = 0;
        while i < seg.len() {
            match self.state {
                State::Between => {
                    let b = seg[i];
                    i += 1;
                    self.between(b, out);
                }
                State::Str { mut escape, key } => {
                    let rest = &seg[i..];
                    let (n, ended) = match string_end(rest, &mut escape) {
                        Some(j) => (j + 1, true),
                        None => (rest.len(), false),
                    };
                    out.extend_from_slice(&rest[..n]);
                    if key && self.key.len() < 64 {
                        let body = &rest[..if ended { n - 1 } else { n }];
                        self.key
                            .extend_from_slice(&body[..body.len().min(64 - self.key.len())]);
                    }
                    i += n;
                    self.state = if ended {
                        if key {
                            let k = Key::of(&self.key);
                            if let Some(Frame::Object {
                                key: cur,
                                expect_key,
                            }) = self.stack.last_mut()
                            {
                                *cur = k;
                                *expect_key = false;
                            }
                        }
                        State::Between
                    } else {
                        State::Str { escape, key }
                    };
                }
                State::Target { mut escape } => {
                    let rest = &seg[i..];
                    // The string's bytes, without its closing quote.
                    let end = string_end(rest, &mut escape).map(|j| (j, j + 1));
                    i += self.spool_value(out, rest, end, true, State::Target { escape });
                }
                State::Raw {
                    mut depth,
                    mut in_str,
                    mut escape,
                } => {
                    let rest = &seg[i..];
                    let mut end = None;
                    let mut j = 0;
                    while j < rest.len() {
                        if in_str {
                            let Some(close) = string_end(&rest[j..], &mut escape) else {
                                break;
                            };
                            in_str = false;
                            j += close + 1;
                            continue;
                        }
                        match rest[j] {
                            b'"' => in_str = true,
                            b'{' | b'[' => depth += 1,
                            b'}' | b']' => {
                                depth -= 1;
                                if depth == 0 {
                                    end = Some(j);
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    let end = end.map(|j| (j + 1, j + 1));
                    let more = State::Raw {
                        depth,
                        in_str,
                        escape,
                    };
                    i += self.spool_value(out, rest, end, false, more);
                }
            }
        }
    }

    /// Spools more of the current value from `rest`. When the value ends
    /// in `rest` (`end`: its bytes there, and the bytes read, its closing
    /// quote too), finishes it and goes back between values; otherwise
    /// spools all of `rest` and stays in `more`. Returns the bytes read.
    fn spool_value(
        &mut self,
        out: &mut Vec<u8>,
        rest: &[u8],
        end: Option<(usize, usize)>,
        quoted: bool,
        more: State,
    ) -> usize {
        match end {
            Some((taken, read)) => {
                self.sink.push(&rest[..taken], quoted);
                self.finish_value(out, quoted);
                self.state = State::Between;
                read
            }
            None => {
                self.sink.push(rest, quoted);
                self.state = more;
                rest.len()
            }
        }
    }

    fn between(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            b'{' | b'[' if self.structured() => {
                self.sink.reset();
                self.sink.push(&[b], false);
                self.state = State::Raw {
                    depth: 1,
                    in_str: false,
                    escape: false,
                };
            }
            b'{' => {
                out.push(b);
                self.stack.push(Frame::Object {
                    key: Key::Other,
                    expect_key: true,
                });
            }
            b'[' => {
                out.push(b);
                self.stack.push(Frame::Array);
            }
            b'}' | b']' => {
                out.push(b);
                self.stack.pop();
            }
            b',' => {
                out.push(b);
                if let Some(Frame::Object { expect_key, .. }) = self.stack.last_mut() {
                    *expect_key = true;
                }
            }
            b'"' => {
                let key = matches!(
                    self.stack.last(),
                    Some(Frame::Object {
                        expect_key: true,
                        ..
                    })
                );
                if !key && self.target() {
                    self.sink.reset();
                    self.state = State::Target { escape: false };
                } else {
                    out.push(b);
                    self.key.clear();
                    self.state = State::Str { escape: false, key };
                }
            }
            _ => out.push(b),
        }
    }

    /// A bulk value ended: its raw bytes, or a marker naming its file.
    fn finish_value(&mut self, out: &mut Vec<u8>, string: bool) {
        match self.sink.finish() {
            None => {
                if string {
                    out.push(b'"');
                }
                out.extend_from_slice(&self.sink.pending);
                if string {
                    out.push(b'"');
                }
            }
            Some(kept) => {
                let marker = self.spools.keep(kept);
                out.push(b'"');
                out.extend_from_slice(marker.as_bytes());
                out.push(b'"');
                self.made.push(marker);
            }
        }
        self.sink.reset();
    }
}

/// Whether `f` is an object whose current member's key is one of `keys`.
fn key_is(f: &Frame, keys: &[Key]) -> bool {
    matches!(f, Frame::Object { key, .. } if keys.contains(key))
}

/// A streaming decoder of JSON string escapes into the bytes they stand for.
/// What is not a valid escape (a lone surrogate, a bad hex digit) becomes
/// U+FFFD, as a lenient reader would show it.
#[derive(Default)]
struct Unescape {
    esc: [u8; 12],
    n: usize,
}

const REPLACEMENT: &[u8] = "\u{fffd}".as_bytes();

fn hex4(h: &[u8]) -> Option<u32> {
    std::str::from_utf8(h)
        .ok()
        .and_then(|s| u32::from_str_radix(s, 16).ok())
}

fn put_char(cp: u32, w: &mut impl Write) -> std::io::Result<()> {
    match char::from_u32(cp) {
        Some(c) => w.write_all(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        None => w.write_all(REPLACEMENT),
    }
}

impl Unescape {
    fn run(&mut self, s: &[u8], w: &mut impl Write) -> std::io::Result<()> {
        let mut i = 0;
        while i < s.len() {
            if self.n == 0 {
                match memchr::memchr(b'\\', &s[i..]) {
                    None => return w.write_all(&s[i..]),
                    Some(j) => {
                        w.write_all(&s[i..i + j])?;
                        self.esc[0] = b'\\';
                        self.n = 1;
                        i += j + 1;
                    }
                }
            } else {
                self.esc[self.n] = s[i];
                self.n += 1;
                i += 1;
                self.step(w)?;
            }
        }
        Ok(())
    }

    /// Acts on the escape bytes so far, when they are enough.
    fn step(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        let e = self.esc;
        match self.n {
            2 => {
                let c = match e[1] {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 8,
                    b'f' => 12,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => return Ok(()),
                    _ => {
                        self.n = 0;
                        return w.write_all(REPLACEMENT);
                    }
                };
                self.n = 0;
                w.write_all(&[c])
            }
            6 => match hex4(&e[2..6]) {
                Some(cu) if (0xD800..0xDC00).contains(&cu) => Ok(()),
                Some(cu) => {
                    self.n = 0;
                    put_char(cu, w)
                }
                None => {
                    self.n = 0;
                    w.write_all(REPLACEMENT)
                }
            },
            7 if e[6] != b'\\' => {
                self.n = 0;
                w.write_all(REPLACEMENT)?;
                self.run(&e[6..7], w)
            }
            8 if e[7] != b'u' => {
                // A lone high surrogate, then another escape.
                w.write_all(REPLACEMENT)?;
                self.esc[..2].copy_from_slice(&e[6..8]);
                self.n = 2;
                self.step(w)
            }
            12 => {
                let high = hex4(&e[2..6]).unwrap_or(0);
                match hex4(&e[8..12]) {
                    Some(low) if (0xDC00..0xE000).contains(&low) => {
                        self.n = 0;
                        put_char(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00), w)
                    }
                    _ => {
                        w.write_all(REPLACEMENT)?;
                        self.esc[..6].copy_from_slice(&e[6..12]);
                        self.n = 6;
                        self.step(w)
                    }
                }
            }
            _ => Ok(()),
        }
    }

    /// The string ended: an escape left open stands for U+FFFD.
    fn finish(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        if self.n > 0 {
            self.n = 0;
            w.write_all(REPLACEMENT)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unescape_in_chunks(escaped: &[u8], chunk: usize) -> Vec<u8> {
        let mut u = Unescape::default();
        let mut out = Vec::new();
        for c in escaped.chunks(chunk.max(1)) {
            u.run(c, &mut out).unwrap();
        }
        u.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn unescaping_matches_serde_json_however_the_bytes_are_cut() {
        let texts = [
            "plain",
            "quote \" backslash \\ slash / tab \t newline \n cr \r",
            "\u{8}\u{c}\u{1}\u{1f} controls",
            "é ü 中文 🎉 astral 𝄞 and \u{fffd}",
            "",
        ];
        for t in texts {
            let json = serde_json::to_string(t).unwrap();
            // serde_json writes non-ASCII as is; escape it too, as an
            // ASCII-only writer would (Python's json.dumps does).
            let ascii: String = t
                .encode_utf16()
                .map(|u| format!("\\u{u:04x}"))
                .collect::<String>();
            for escaped in [&json[1..json.len() - 1], ascii.as_str()] {
                for chunk in [1, 2, 3, 5, 7, 64] {
                    assert_eq!(
                        unescape_in_chunks(escaped.as_bytes(), chunk),
                        t.as_bytes(),
                        "{escaped:?} in chunks of {chunk}"
                    );
                }
            }
        }
    }

    #[test]
    fn broken_escapes_become_replacement_characters() {
        let out = |s: &str| String::from_utf8(unescape_in_chunks(s.as_bytes(), 1)).unwrap();
        assert_eq!(out(r"a\ud83db"), "a\u{fffd}b");
        assert_eq!(out(r"\ud83d\n"), "\u{fffd}\n");
        assert_eq!(out(r"\ud83d\u0041"), "\u{fffd}A");
        assert_eq!(out(r"\udc00x"), "\u{fffd}x");
        assert_eq!(out(r"\uzzzz!"), "\u{fffd}!");
        assert_eq!(out(r"\q"), "\u{fffd}");
        assert_eq!(out(r"end\ud83d"), "end\u{fffd}");
    }

    fn spill(line: &[u8], chunk: usize, spools: &Spools) -> Vec<u8> {
        let mut s = Spiller::new(spools.clone());
        let mut out = Vec::new();
        for c in line.chunks(chunk) {
            s.feed(c, &mut out);
        }
        s.end();
        out
    }

    fn read_all(mut sp: Spooled) -> Vec<u8> {
        sp.file.rewind().unwrap();
        let mut v = Vec::new();
        sp.file.read_to_end(&mut v).unwrap();
        assert_eq!(v.len() as u64, sp.len);
        v
    }

    #[test]
    fn bulk_values_go_to_files_and_the_rest_passes_byte_for_byte() {
        let big_text: String = (0..60_000)
            .map(|i| format!("{{\"n\": {i}, \"s\": \"é\\\"q\"}}\n"))
            .collect();
        let structured = serde_json::json!({"rows": (0..60_000).map(|i| serde_json::json!({"id": i, "s": "x\"}]"})).collect::<Vec<_>>()});
        let image = "QUJD".repeat(400_000);
        let msg = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 7,
            "result": {
                "content": [
                    {"type": "text", "text": big_text},
                    {"type": "text", "text": "small stays"},
                    {"type": "image", "data": image, "mimeType": "image/png"},
                    {"type": "resource", "resource": {"uri": "file:///a", "text": big_text}}
                ],
                "structuredContent": structured,
                "isError": false
            }
        });
        let line = serde_json::to_vec(&msg).unwrap();
        for chunk in [4096, 65_536, 1 << 20] {
            let spools = Spools::default();
            let out = spill(&line, chunk, &spools);
            assert!(
                out.len() < 2048,
                "the rewritten line is small ({} bytes)",
                out.len()
            );
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["id"], 7);
            assert_eq!(v["result"]["content"][1]["text"], "small stays");
            assert_eq!(v["result"]["content"][2]["mimeType"], "image/png");
            assert_eq!(v["result"]["isError"], false);
            let taken = |s: &serde_json::Value| {
                read_all(spools.take(s.as_str().unwrap()).unwrap().unwrap())
            };
            assert_eq!(
                taken(&v["result"]["content"][0]["text"]),
                big_text.as_bytes()
            );
            assert_eq!(taken(&v["result"]["content"][2]["data"]), image.as_bytes());
            assert_eq!(
                taken(&v["result"]["content"][3]["resource"]["text"]),
                big_text.as_bytes()
            );
            let sc: serde_json::Value =
                serde_json::from_slice(&taken(&v["result"]["structuredContent"])).unwrap();
            assert_eq!(sc, structured);
            assert_eq!(spools.waiting(), 0);
        }
    }

    #[test]
    fn a_line_without_bulk_values_is_unchanged() {
        let spools = Spools::default();
        let notes = "n".repeat(3 << 20);
        let lines = [
            // Big, but in places a tool result does not carry its bulk.
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"contents": [{"uri": "x", "text": notes}]}}),
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "a small one"}], "_meta": {"text": notes}}}),
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": notes}}),
            // A marker-looking text from the upstream names no file.
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "result": {"content": [{"type": "text", "text": "spillway-spool:00"}]}}),
        ];
        for l in lines {
            let line = serde_json::to_vec(&l).unwrap();
            assert_eq!(spill(&line, 65_536, &spools), line);
        }
        assert_eq!(spools.waiting(), 0);
        assert!(spools.take("spillway-spool:00").is_none());
    }

    #[test]
    fn an_abandoned_line_leaves_no_files() {
        let spools = Spools::default();
        let text = "t".repeat(2 << 20);
        let line = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}, {"type": "text", "text": text}]}})).unwrap();
        let mut s = Spiller::new(spools.clone());
        let mut out = Vec::new();
        // Both strings end before the cut, so both are files by then.
        s.feed(&line[..line.len() - 3], &mut out);
        assert_eq!(spools.waiting(), 2);
        s.abandon();
        assert_eq!(spools.waiting(), 0);
    }

    #[test]
    fn pieces_stream_in_bounded_chunks_and_base64_is_decoded() {
        let spools = Spools::default();
        let raw: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let b64 = base64::engine::general_purpose::STANDARD;
        let encoded = base64::Engine::encode(&b64, &raw);
        let line = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "image", "data": encoded, "mimeType": "image/png"}, {"type": "image", "data": "not base64!".repeat(200_000), "mimeType": "image/png"}]}})).unwrap();
        let out = spill(&line, 65_536, &spools);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let take = |i: usize| {
            spools
                .take(v["result"]["content"][i]["data"].as_str().unwrap())
                .unwrap()
                .unwrap()
        };
        let pieces = vec![
            Piece::Bytes(Bytes::from_static(b"head:")),
            Piece::File {
                spooled: take(0),
                base64: true,
            },
            Piece::File {
                spooled: take(1),
                base64: true,
            },
        ];
        let mut got = Vec::new();
        let mut biggest = 0;
        stream_pieces(pieces, 1 << 20, |b| {
            biggest = biggest.max(b.len());
            got.extend_from_slice(&b);
            true
        })
        .unwrap();
        assert!(biggest <= 1 << 20);
        let mut want = b"head:".to_vec();
        want.extend_from_slice(&raw);
        // Not valid base64: kept as it was sent.
        want.extend_from_slice("not base64!".repeat(200_000).as_bytes());
        assert_eq!(got.len(), want.len());
        assert!(got == want);
    }
}
