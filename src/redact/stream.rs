//! The window engine behind one-shot and streaming redaction.
//!
//! The input is cut into zones of `STEP` bytes at fixed offsets. Matches
//! that start in zone `z` are searched in the window from `CONTEXT` bytes
//! before the zone to [`WINDOW`] bytes after its start (or the input's end),
//! so every search has at least [`MAX_MATCH_LEN`] bytes plus `CONTEXT` bytes
//! of look-ahead past any start it accepts. Windows depend only on offsets,
//! never on how the input arrived, which is why a stream and a one-shot call
//! give the same bytes. A stream holds one window (plus its look-behind
//! context) and no more, whatever the size of its input or its chunks.
//!
//! Within a window, each rule's next match is remembered until the scan
//! passes its start, so each rule scans a window about once.

use std::borrow::Cow;
use std::sync::Arc;

use super::RedactCounts;
use super::rules::Rule;

/// The longest match that is always found whole (see the module docs of
/// [`crate::redact`] for what happens to longer ones).
pub const MAX_MATCH_LEN: usize = 16 * 1024;

/// The bytes one search sees past its zone's start; also about what a stream
/// keeps buffered.
pub const WINDOW: usize = 64 * 1024;

/// Look-around bytes kept before a window and past the longest match: more
/// than any regex assertion looks at (a UTF-8 char is at most 4 bytes).
const CONTEXT: usize = 16;

/// The zone size: a match starting anywhere in a zone has `MAX_MATCH_LEN`
/// plus `CONTEXT` bytes after it inside the window.
const STEP: u64 = (WINDOW - MAX_MATCH_LEN - CONTEXT) as u64;

/// Where redacted output goes.
pub(crate) trait Emit {
    /// Bytes that pass through.
    fn copy(&mut self, bytes: &[u8]);
    /// A marker that replaces `matched`.
    fn replace(&mut self, marker: &[u8], matched: &[u8]);
}

impl Emit for Vec<u8> {
    fn copy(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn replace(&mut self, marker: &[u8], _matched: &[u8]) {
        self.extend_from_slice(marker);
    }
}

/// One-shot output that copies nothing until the first match.
pub(crate) struct Lazy<'a> {
    input: &'a [u8],
    passed: usize,
    out: Option<Vec<u8>>,
}

impl<'a> Lazy<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        Lazy {
            input,
            passed: 0,
            out: None,
        }
    }

    pub fn into_cow(self) -> Cow<'a, [u8]> {
        match self.out {
            Some(v) => Cow::Owned(v),
            None => Cow::Borrowed(self.input),
        }
    }
}

impl Emit for Lazy<'_> {
    fn copy(&mut self, bytes: &[u8]) {
        match &mut self.out {
            Some(out) => out.extend_from_slice(bytes),
            None => self.passed += bytes.len(),
        }
    }

    fn replace(&mut self, marker: &[u8], _matched: &[u8]) {
        let input = self.input;
        let passed = self.passed;
        let out = self.out.get_or_insert_with(|| {
            let mut v = Vec::with_capacity(input.len());
            v.extend_from_slice(&input[..passed]);
            v
        });
        out.extend_from_slice(marker);
    }
}

/// A rule's next match in the current window, as far as known.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// Not searched since the window or the scan position moved past it.
    Unknown,
    /// No match from the scan position to the window's end.
    None,
    /// A match at these input offsets.
    At(u64, u64),
}

/// Scan state: the position up to which output was emitted.
#[derive(Debug)]
struct Scan {
    pos: u64,
    zone: u64,
    next: Vec<Next>,
    tallies: Vec<u64>,
}

impl Scan {
    fn new(rules: usize) -> Self {
        Scan {
            pos: 0,
            zone: u64::MAX,
            next: vec![Next::Unknown; rules],
            tallies: vec![0; rules],
        }
    }

    /// The first input offset a later `run` may need.
    fn keep_from(&self) -> u64 {
        (self.pos / STEP * STEP).saturating_sub(CONTEXT as u64)
    }

    /// Emits everything that `text` (the input from offset `base`, which is
    /// at most `keep_from()`) decides. `last`: no input follows `text`.
    fn run(&mut self, rules: &[Rule], text: &[u8], base: u64, last: bool, out: &mut impl Emit) {
        debug_assert!(base <= self.keep_from());
        let end = base + text.len() as u64;
        let at = |offset: u64| (offset - base) as usize;
        while self.pos < end {
            let zone = self.pos / STEP;
            let start = zone * STEP;
            let zone_end = start + STEP;
            let mut window_end = start + WINDOW as u64;
            if window_end > end {
                if !last {
                    return;
                }
                window_end = end;
            }
            if self.zone != zone {
                self.zone = zone;
                self.next.fill(Next::Unknown);
            }
            let hay_start = start.saturating_sub(CONTEXT as u64);
            let hay = &text[at(hay_start)..at(window_end)];
            match self.best(rules, hay, hay_start) {
                Some((s, e, i)) if s < zone_end => {
                    out.copy(&text[at(self.pos)..at(s)]);
                    out.replace(&rules[i].marker, &text[at(s)..at(e)]);
                    self.tallies[i] += 1;
                    self.pos = e;
                }
                _ => {
                    let upto = zone_end.min(end);
                    out.copy(&text[at(self.pos)..at(upto)]);
                    self.pos = upto;
                }
            }
        }
    }

    /// The winning next match over all rules: leftmost, then longest, then
    /// the rule listed first.
    fn best(&mut self, rules: &[Rule], hay: &[u8], hay_start: u64) -> Option<(u64, u64, usize)> {
        let from = (self.pos - hay_start) as usize;
        let mut best: Option<(u64, u64, usize)> = None;
        for (i, rule) in rules.iter().enumerate() {
            let (s, e) = match self.next[i] {
                Next::None => continue,
                Next::At(s, e) if s >= self.pos => (s, e),
                Next::At(..) | Next::Unknown => match rule.find(hay, from) {
                    Some(r) => {
                        let (s, e) = (hay_start + r.start as u64, hay_start + r.end as u64);
                        self.next[i] = Next::At(s, e);
                        (s, e)
                    }
                    None => {
                        self.next[i] = Next::None;
                        continue;
                    }
                },
            };
            if best.is_none_or(|(bs, be, _)| s < bs || (s == bs && e > be)) {
                best = Some((s, e, i));
            }
        }
        best
    }
}

/// Redacts a whole input; returns the per-rule tallies.
pub(crate) fn redact_all(rules: &[Rule], input: &[u8], out: &mut impl Emit) -> Vec<u64> {
    let mut scan = Scan::new(rules.len());
    scan.run(rules, input, 0, true, out);
    scan.tallies
}

/// Streaming redaction: push chunks of any size, then finish. The output is
/// the same as one-shot redaction of the whole input, and the stream holds at
/// most [`WINDOW`] bytes (plus a few of context) of it. Output lags input by
/// up to a window: whatever cannot be decided yet is held until more input
/// or `finish`.
#[derive(Debug)]
pub struct RedactStream {
    rules: Arc<[Rule]>,
    scan: Scan,
    buf: Vec<u8>,
    base: u64,
}

impl RedactStream {
    pub(crate) fn new(rules: Arc<[Rule]>) -> Self {
        let cap = if rules.is_empty() {
            0
        } else {
            CONTEXT + WINDOW
        };
        RedactStream {
            scan: Scan::new(rules.len()),
            rules,
            buf: Vec::with_capacity(cap),
            base: 0,
        }
    }

    /// Redacts the next chunk, appending what is decided to `out`.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) {
        if self.rules.is_empty() {
            out.extend_from_slice(chunk);
            return;
        }
        while !chunk.is_empty() {
            let room = CONTEXT + WINDOW - self.buf.len();
            debug_assert!(room > 0, "a full buffer always completes a window");
            let (now, rest) = chunk.split_at(room.min(chunk.len()));
            self.buf.extend_from_slice(now);
            chunk = rest;
            self.scan.run(&self.rules, &self.buf, self.base, false, out);
            let keep = self.scan.keep_from();
            if keep > self.base {
                self.buf.drain(..(keep - self.base) as usize);
                self.base = keep;
            }
        }
    }

    /// The counts so far (of output already emitted).
    pub fn counts(&self) -> RedactCounts {
        RedactCounts::from_tallies(&self.rules, &self.scan.tallies)
    }

    /// Redacts what is still held, appends it to `out`, and returns the counts.
    pub fn finish(mut self, out: &mut Vec<u8>) -> RedactCounts {
        self.scan.run(&self.rules, &self.buf, self.base, true, out);
        self.counts()
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::redact::Redactor;

    const ALL: [&str; 6] = [
        "builtin:aws_access_key",
        "builtin:bearer_token",
        "builtin:private_key",
        "builtin:email",
        "builtin:credit_card",
        r"tok_[0-9a-f]{6,}",
    ];

    fn redactor(rules: &[&str]) -> Redactor {
        Redactor::compile(&rules.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    fn streamed(r: &Redactor, input: &[u8], cuts: &[usize]) -> (Vec<u8>, RedactCounts) {
        let mut s = r.stream();
        let mut out = Vec::new();
        let mut at = 0;
        for &cut in cuts {
            s.push(&input[at..cut], &mut out);
            at = cut;
        }
        s.push(&input[at..], &mut out);
        let counts = s.finish(&mut out);
        (out, counts)
    }

    /// Whole-input redaction with no windows: each rule searches the entire
    /// rest of the input every time.
    fn reference(r: &Redactor, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let mut best: Option<(usize, usize, usize)> = None;
            for (i, rule) in r.rules.iter().enumerate() {
                if let Some(m) = rule.find(input, pos)
                    && best.is_none_or(|(s, e, _)| m.start < s || (m.start == s && m.end > e))
                {
                    best = Some((m.start, m.end, i));
                }
            }
            let Some((s, e, i)) = best else { break };
            out.extend_from_slice(&input[pos..s]);
            out.extend_from_slice(&r.rules[i].marker);
            pos = e;
        }
        out.extend_from_slice(&input[pos..]);
        out
    }

    fn pem(body_bytes: usize) -> Vec<u8> {
        let mut body = String::new();
        while body.len() < body_bytes {
            body.push_str("MIIJKAIBAAKCAgEAv3t+XbQ1cKzV0m0y8dFh7lZr2q9Yw4sNn6uPjTgHhE5R0fA=\n");
        }
        format!("-----BEGIN RSA PRIVATE KEY-----\n{body}-----END RSA PRIVATE KEY-----").into_bytes()
    }

    /// Mixed text and binary with secrets: one across each zone start and
    /// each window end (at a random overlap, cycling through the secrets),
    /// and more at random. One key block is nearly `MAX_MATCH_LEN` long.
    /// For each seed, its generator and a mixed input of `len` bytes drawn
    /// from it.
    fn mixed_inputs(
        seeds: std::ops::Range<u64>,
        len: usize,
    ) -> impl Iterator<Item = (u64, StdRng, Vec<u8>)> {
        seeds.map(move |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let input = mixed(&mut rng, len);
            (seed, rng, input)
        })
    }

    fn mixed(rng: &mut StdRng, len: usize) -> Vec<u8> {
        let secrets: Vec<Vec<u8>> = vec![
            pem(MAX_MATCH_LEN - 200),
            b"AKIAIOSFODNN7EXAMPLE".to_vec(),
            b"Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123456789._-~+/==".to_vec(),
            b"ops.team+alerts@example.co.uk".to_vec(),
            b"4111 1111 1111 1111".to_vec(),
            pem(1600),
            b"5500-0000-0000-0004".to_vec(),
            b"tok_0123456789abcdef".to_vec(),
        ];
        assert!(secrets[0].len() <= MAX_MATCH_LEN);
        let words: [&[u8]; 8] = [
            b"lorem ",
            b"ipsum\n",
            b"{\"id\": 42, ",
            b"\"ok\": true}\n",
            b"\xff\xfe\x00",
            b"caf\xc3\xa9 ",
            b"1234567 ",
            b"a@b ",
        ];
        let fill = |out: &mut Vec<u8>, rng: &mut StdRng, to: usize| {
            while out.len() + 64 < to {
                let secret = &secrets[rng.random_range(1..secrets.len())];
                if rng.random_range(0..40) == 0 && out.len() + secret.len() + 64 < to {
                    out.extend_from_slice(secret);
                    out.push(b'\n');
                } else {
                    out.extend_from_slice(words[rng.random_range(0..words.len())]);
                }
            }
            out.resize(to.max(out.len()), b' ');
        };
        let edges = (1..)
            .map(|k| k * STEP as usize)
            .flat_map(|e| [e, e + MAX_MATCH_LEN + CONTEXT])
            .take_while(|&e| e < len);
        let mut out = Vec::with_capacity(len + 2 * MAX_MATCH_LEN);
        for (n, edge) in edges.enumerate() {
            let secret = &secrets[n % secrets.len()];
            let at = edge - rng.random_range(0..=secret.len());
            if at > out.len() {
                fill(&mut out, rng, at);
                out.extend_from_slice(secret);
                out.push(b' ');
            }
        }
        fill(&mut out, rng, len);
        out
    }

    #[test]
    fn stream_equals_one_shot_for_every_two_and_three_way_split() {
        let r = redactor(&ALL);
        let input = b"x AKIAIOSFODNN7EXAMPLE, Bearer abcdefghijklmnopqrstuv== a.b@c.io 4111-1111-1111-1111 tok_abcdef9 \xff end";
        let (whole, counts) = r.redact(input);
        assert_eq!(counts.total, 5, "{}", String::from_utf8_lossy(&whole));
        for i in 0..=input.len() {
            assert_eq!(
                streamed(&r, input, &[i]),
                (whole.to_vec(), counts.clone()),
                "cut {i}"
            );
            for j in i..=input.len() {
                assert_eq!(
                    streamed(&r, input, &[i, j]).0,
                    whole.as_ref(),
                    "cuts {i} {j}"
                );
            }
        }
    }

    #[test]
    fn stream_equals_one_shot_for_random_chunkings_of_large_input() {
        let r = redactor(&ALL);
        for (seed, mut rng, input) in mixed_inputs(0..6, 5 * WINDOW) {
            let (whole, counts) = r.redact(&input);
            for name in crate::redact::BUILTIN_NAMES {
                assert!(counts.get(name) > 0, "{name}: {counts:?}");
            }
            for round in 0..4 {
                let max = [7, 1000, WINDOW / 3, 3 * WINDOW][round];
                let mut cuts = Vec::new();
                let mut at = 0;
                loop {
                    at += rng.random_range(1..=max);
                    if at >= input.len() {
                        break;
                    }
                    cuts.push(at);
                }
                let (out, c) = streamed(&r, &input, &cuts);
                assert!(out == whole.as_ref(), "seed {seed}, chunks up to {max}");
                assert_eq!(c, counts);
            }
        }
    }

    #[test]
    fn windows_find_every_match_up_to_max_match_len_as_whole_input_search_would() {
        let r = redactor(&ALL);
        for (seed, _, input) in mixed_inputs(10..14, 6 * WINDOW) {
            assert!(
                r.redact(&input).0.as_ref() == reference(&r, &input),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_key_block_longer_than_the_window_passes_through_in_stream_and_one_shot() {
        let r = redactor(&["builtin:private_key"]);
        let mut input = b"lead ".to_vec();
        input.extend_from_slice(&pem(WINDOW + 1000));
        let (whole, counts) = r.redact(&input);
        assert_eq!(whole.as_ref(), &input[..]);
        assert!(counts.is_empty());
        assert_eq!(streamed(&r, &input, &[3, 40_000, 60_000]).0, input);
        // The same block within the limit is found.
        let short = pem(MAX_MATCH_LEN - 100);
        assert_eq!(r.redact(&short).0.as_ref(), b"[REDACTED:private_key]");
    }

    #[test]
    fn a_greedy_match_longer_than_the_window_is_cut_at_window_ends() {
        let r = redactor(&["x+"]);
        let input = vec![b'x'; 3 * WINDOW];
        let (whole, counts) = r.redact(&input);
        assert!(counts.total >= 3, "{counts:?}");
        assert_eq!(
            whole.as_ref(),
            b"[REDACTED:custom]".repeat(counts.total as usize)
        );
        assert_eq!(
            streamed(&r, &input, &[1, WINDOW, WINDOW + 17]).0,
            whole.as_ref()
        );
    }

    #[test]
    fn a_match_across_the_first_window_end_is_found_whole() {
        // Nothing else matches, so the scan reaches the window's end from the
        // first zone; the token must not be cut there.
        let r = redactor(&["builtin:bearer_token", r"tok_[0-9a-f]{6,}"]);
        for secret in [
            &b"tok_0123456789abcdef0123"[..],
            b"Bearer abcdefghijklmnopqrstuvwxyz0123",
        ] {
            for back in [1, 8, secret.len() - 1] {
                let mut input = vec![b' '; WINDOW - back];
                input.extend_from_slice(secret);
                input.extend_from_slice(b" tail");
                let (out, counts) = r.redact(&input);
                assert_eq!(counts.total, 1, "{back}");
                assert!(out.ends_with(b"] tail"), "{back}");
                assert_eq!(streamed(&r, &input, &[WINDOW - 3]).0, out.as_ref());
            }
        }
    }

    #[test]
    fn look_behind_context_survives_zone_starts() {
        // "X" right before the key means no word boundary, so no match, even
        // when the key starts exactly where a zone starts.
        let r = redactor(&["builtin:aws_access_key"]);
        for start in STEP as usize - 2..STEP as usize + 3 {
            let mut input = vec![b' '; start - 1];
            input.extend_from_slice(b"XAKIAIOSFODNN7EXAMPLE ");
            input.resize(2 * WINDOW, b' ');
            assert!(r.redact(&input).1.is_empty(), "key at {start}");
            input[start - 1] = b' ';
            assert_eq!(r.redact(&input).1.total, 1, "key at {start}");
        }
    }

    /// Streams go into upload tasks: they must be `Send` and own what they use.
    #[allow(dead_code)]
    fn streams_and_redactors_move_between_tasks() {
        fn movable<T: Send + Sync + 'static>() {}
        movable::<RedactStream>();
        movable::<Redactor>();
    }

    #[test]
    fn a_stream_holds_at_most_one_window_whatever_the_chunk_size() {
        let r = redactor(&ALL);
        let mut s = r.stream();
        let chunk = vec![b'a'; 1 << 20];
        let mut out = Vec::new();
        for _ in 0..4 {
            s.push(&chunk, &mut out);
            assert!(s.buf.capacity() <= CONTEXT + WINDOW, "{}", s.buf.capacity());
            assert!(out.len() + s.buf.len() >= s.base as usize);
        }
        s.finish(&mut out);
        assert_eq!(out.len(), 4 << 20);
    }
}
