//! Search over payloads with ripgrep's library crates: `grep-regex` for the
//! matcher (with its compile-size limits) and `grep-searcher` for the line
//! oriented search with context. A deadline bounds the time of one call.

use std::io::{self, Read};
use std::os::unix::fs::FileExt as _;
use std::time::Instant;

use super::jsonpath::Tracker;
use crate::text::group;

use grep_matcher::Matcher as _;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{
    BinaryDetection, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch,
};

/// Longest line returned whole in a match or context; a longer line is
/// shown as a window around each match (context lines: their start), with
/// markers that say how many bytes were left out.
pub const MAX_LINE_CHARS: usize = 500;
/// Most bytes of matched and context lines one call returns, counting
/// [`HIT_OVERHEAD`] per hit, so a reply stays under a default client's
/// 4 MiB receive limit.
pub const MAX_REPLY_BYTES: usize = 3 << 20;
/// Compiled regex size limit (bytes).
const REGEX_SIZE_LIMIT: usize = 10 << 20;
/// Lazy DFA cache limit (bytes).
const DFA_SIZE_LIMIT: usize = 10 << 20;

/// What to search for.
#[derive(Debug, Clone)]
pub struct Query {
    /// The pattern.
    pub pattern: String,
    /// Treat the pattern as a literal.
    pub fixed_string: bool,
    /// Ignore case.
    pub case_insensitive: bool,
    /// Lines of context before and after each match.
    pub context_lines: usize,
}

/// One match: a whole line, or for a line longer than [`MAX_LINE_CHARS`],
/// a window around the match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// 1-based line number.
    pub line_number: u64,
    /// Byte offset of the line's start.
    pub byte_offset: u64,
    /// Byte offset of the match itself.
    pub match_offset: u64,
    /// Length of the match in bytes.
    pub match_length: u64,
    /// The line without its terminator, or the window around the match
    /// with markers counting the bytes left out on either side.
    pub line: String,
    /// For a long line, the window shown: `[start, end)` in payload bytes.
    pub window: Option<(u64, u64)>,
    /// The JSON path (jq syntax) of the innermost value holding the match:
    /// in a line that is one JSON document (minified, or an NDJSON record),
    /// or in a JSON document that spans lines (pretty-printed, or an array
    /// of one record per line).
    pub json_path: String,
    /// Context before.
    pub before: Vec<String>,
    /// Context after.
    pub after: Vec<String>,
}

/// Bytes of a long line shown before a match.
pub const WINDOW_BEFORE: usize = 160;
/// Bytes of a long line shown in all, around a match.
pub const WINDOW_BYTES: usize = 480;
/// Lines up to this many bytes are shown whole when they have at most
/// [`MAX_LINE_CHARS`] characters.
const WHOLE_LINE_BYTES: usize = 4 * MAX_LINE_CHARS;

/// Why a query could not run.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The pattern does not compile.
    #[error("invalid search pattern: {0}")]
    BadPattern(String),
    /// Reading failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A compiled query.
#[derive(Debug, Clone)]
pub struct Compiled {
    matcher: grep_regex::RegexMatcher,
    context: usize,
}

/// Compiles a query; a bad pattern is refused with the parser's message.
pub fn compile(q: &Query) -> Result<Compiled, SearchError> {
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(q.case_insensitive)
        .fixed_strings(q.fixed_string)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(DFA_SIZE_LIMIT)
        .build(&q.pattern)
        .map_err(|e| SearchError::BadPattern(e.to_string()))?;
    Ok(Compiled {
        matcher,
        context: q.context_lines,
    })
}

/// How one file's search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The whole file was searched.
    Done,
    /// The match cap was reached; more matches may exist.
    Cap,
    /// The reply's byte budget was reached; more matches may exist.
    Bytes,
    /// The deadline passed.
    Deadline,
    /// The content is binary and was skipped.
    Binary,
}

/// Searches a payload file, read by position, appending hits until
/// `budget` hits have been taken. The deadline is checked at each
/// match; a payload's scan itself is linear in its size.
pub fn search_file(
    c: &Compiled,
    file: &std::fs::File,
    budget: usize,
    bytes_left: &mut usize,
    deadline: Instant,
    hits: &mut Vec<Hit>,
) -> Result<(Stop, u64), SearchError> {
    // Read, never memory-mapped: mapping and unmapping a file per Search
    // takes the process's memory-map lock for writing, and guests growing
    // and resetting their linear memories hold it too, so under a memory
    // bomb next door the maps queued behind them (hostile scenario: Search
    // p99 2.0-5.1x its quiet windows mapped, 0.82-0.85x read).
    let mut sink = Collector::new(&c.matcher, hits, budget, *bytes_left, Some(deadline));
    sink.document = DocumentPath::of(file, deadline)?;
    search(c, ReadAt { file, at: 0 }, sink, bytes_left)
}

/// Searches `reader`, appending hits until `budget` hits have been taken.
/// Returns how the search ended and how many matches it saw.
pub fn search_reader<R: Read>(
    c: &Compiled,
    reader: R,
    budget: usize,
    bytes_left: &mut usize,
    deadline: Instant,
    hits: &mut Vec<Hit>,
) -> Result<(Stop, u64), SearchError> {
    // The reader itself enforces the deadline.
    let sink = Collector::new(&c.matcher, hits, budget, *bytes_left, None);
    let reader = DeadlineReader {
        inner: reader,
        deadline,
    };
    search(c, reader, sink, bytes_left)
}

/// Runs the search of `reader` into `sink`, hands back the reply bytes it
/// left and says how the search ended. Where the sink has no deadline the
/// reader enforces it ([`DeadlineReader`]): its time-out is a stop, not an
/// error.
fn search<R: Read>(
    c: &Compiled,
    reader: R,
    mut sink: Collector<'_>,
    bytes_left: &mut usize,
) -> Result<(Stop, u64), SearchError> {
    let outcome = builder(c)
        .build()
        .search_reader(&c.matcher, reader, &mut sink);
    *bytes_left = sink.bytes_left;
    match outcome {
        Ok(()) => Ok((sink.stop(), sink.seen)),
        Err(e) if sink.deadline.is_none() && e.kind() == io::ErrorKind::TimedOut => {
            Ok((Stop::Deadline, sink.seen))
        }
        Err(e) => Err(e.into()),
    }
}

struct Collector<'a> {
    matcher: &'a grep_regex::RegexMatcher,
    hits: &'a mut Vec<Hit>,
    budget: usize,
    seen: u64,
    pending_before: Vec<String>,
    capped: bool,
    binary: bool,
    /// Checked at each match when the reader cannot be interrupted.
    deadline: Option<Instant>,
    timed_out: bool,
    /// Bytes of lines still allowed in the reply.
    bytes_left: usize,
    out_of_bytes: bool,
    /// For a JSON document that spans lines: paths come from it, not from
    /// each line on its own.
    document: Option<DocumentPath<'a>>,
}

/// Bytes read at a time while scanning a document up to a match.
const SCAN_CHUNK: usize = 64 << 10;

/// The JSON path of matches in a document that spans lines: one forward
/// scan from the start of the file, fed up to each match in turn (matches
/// come in order), so its cost is linear in the bytes up to the last
/// match. It gives up (no more paths, the search goes on) at the deadline
/// or when the document is not JSON after all.
struct DocumentPath<'f> {
    file: &'f std::fs::File,
    tracker: Tracker,
    fed: u64,
    deadline: Instant,
    gave_up: bool,
    buf: Vec<u8>,
}

impl<'f> DocumentPath<'f> {
    /// A scanner when `file` holds one JSON document over several lines:
    /// it starts like a container and its first line (within the first
    /// [`SCAN_CHUNK`] bytes) does not close it. NDJSON and a minified
    /// document get `None`: their lines are documents of their own.
    fn of(file: &'f std::fs::File, deadline: Instant) -> io::Result<Option<Self>> {
        let mut buf = vec![0; SCAN_CHUNK];
        let n = read_full_at(file, &mut buf, 0)?;
        let head = &buf[..n];
        let Some(line_end) = memchr::memchr(b'\n', head) else {
            return Ok(None);
        };
        let first = &head[..line_end];
        if !Tracker::applies(first) {
            return Ok(None);
        }
        let mut probe = Tracker::new();
        if !probe.feed(first) || probe.is_closed() {
            return Ok(None);
        }
        Ok(Some(Self {
            file,
            tracker: Tracker::new(),
            fed: 0,
            deadline,
            gave_up: false,
            buf,
        }))
    }

    /// The path at byte `at` of the file; `None` once given up.
    fn path_at(&mut self, at: u64) -> Option<String> {
        while !self.gave_up && self.fed < at {
            let want = usize::try_from(at - self.fed).map_or(SCAN_CHUNK, |n| n.min(SCAN_CHUNK));
            let read = read_full_at(self.file, &mut self.buf[..want], self.fed);
            self.gave_up = match read {
                Ok(n) if n > 0 && self.tracker.feed(&self.buf[..n]) => {
                    self.fed += n as u64;
                    Instant::now() >= self.deadline
                }
                _ => true,
            };
        }
        if self.gave_up {
            return None;
        }
        self.tracker.path()
    }
}

/// Reads from `offset` until `buf` is full or the file ends.
/// A file read from its start by position, whatever its cursor.
struct ReadAt<'f> {
    file: &'f std::fs::File,
    at: u64,
}

impl io::Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Line numbers, context, and binary payloads skipped at the first NUL.
fn builder(c: &Compiled) -> SearcherBuilder {
    let mut b = SearcherBuilder::new();
    b.line_number(true)
        .before_context(c.context)
        .after_context(c.context)
        .binary_detection(BinaryDetection::quit(0));
    b
}

impl<'a> Collector<'a> {
    fn new(
        matcher: &'a grep_regex::RegexMatcher,
        hits: &'a mut Vec<Hit>,
        budget: usize,
        bytes_left: usize,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            matcher,
            hits,
            budget,
            seen: 0,
            pending_before: Vec::new(),
            capped: false,
            binary: false,
            deadline,
            timed_out: false,
            bytes_left,
            out_of_bytes: false,
            document: None,
        }
    }

    fn stop(&self) -> Stop {
        if self.capped {
            Stop::Cap
        } else if self.out_of_bytes {
            Stop::Bytes
        } else if self.timed_out {
            Stop::Deadline
        } else if self.binary {
            Stop::Binary
        } else {
            Stop::Done
        }
    }
}

impl Sink for Collector<'_> {
    type Error = io::Error;

    fn matched(
        &mut self,
        _: &grep_searcher::Searcher,
        mat: &SinkMatch<'_>,
    ) -> Result<bool, io::Error> {
        let mut offset = mat.absolute_byte_offset();
        for (number, line) in (mat.line_number().unwrap_or(0)..).zip(mat.lines()) {
            let text = trim_terminator(line);
            let long = is_long(text);
            // Where the matches are: every match of a long line is a hit of
            // its own; a short line is one hit, at its first match.
            let mut spans = Vec::new();
            let _ = self.matcher.find_iter(text, |m| {
                spans.push((m.start(), m.end()));
                long
            });
            if spans.is_empty() {
                // The searcher saw a match the span finder did not (an
                // empty match at the end); report the line start.
                spans.push((0, 0));
            }
            let mut path = (self.document.is_none() && Tracker::applies(text)).then(Tracker::new);
            for (start, end) in spans {
                self.seen += 1;
                if self.hits.len() >= self.budget {
                    self.capped = true;
                    return Ok(false);
                }
                if self.deadline.is_some_and(|d| Instant::now() >= d) {
                    self.timed_out = true;
                    return Ok(false);
                }
                let (shown, window) = if long {
                    let (s, e, shown) = window(text, start, end);
                    (shown, Some((offset + s as u64, offset + e as u64)))
                } else {
                    (String::from_utf8_lossy(text).into_owned(), None)
                };
                let size = HIT_OVERHEAD
                    + shown.len()
                    + self.pending_before.iter().map(String::len).sum::<usize>();
                if size > self.bytes_left {
                    self.out_of_bytes = true;
                    return Ok(false);
                }
                self.bytes_left -= size;
                let json_path = match &mut self.document {
                    Some(doc) => doc.path_at(offset + start as u64),
                    None => path.as_mut().and_then(|t| t.path_at(text, start)),
                }
                .unwrap_or_default();
                self.hits.push(Hit {
                    line_number: number,
                    byte_offset: offset,
                    match_offset: offset + start as u64,
                    match_length: (end - start) as u64,
                    line: shown,
                    window,
                    json_path,
                    before: std::mem::take(&mut self.pending_before),
                    after: Vec::new(),
                });
            }
            offset += line.len() as u64;
        }
        Ok(true)
    }

    fn context(
        &mut self,
        _: &grep_searcher::Searcher,
        ctx: &SinkContext<'_>,
    ) -> Result<bool, io::Error> {
        let line = show_line(ctx.bytes());
        if line.len() > self.bytes_left {
            return Ok(true); // no room for more context; matches may still fit
        }
        self.bytes_left -= line.len();
        match ctx.kind() {
            SinkContextKind::After => {
                if let Some(last) = self.hits.last_mut() {
                    last.after.push(line);
                }
            }
            _ => self.pending_before.push(line),
        }
        Ok(true)
    }

    fn binary_data(&mut self, _: &grep_searcher::Searcher, _: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// Reply bytes counted for each hit beyond its text: the fields and
/// framing of one match in the reply message.
pub const HIT_OVERHEAD: usize = 128;

fn trim_terminator(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}

/// Whether a line is shown as windows around its matches rather than whole.
fn is_long(text: &[u8]) -> bool {
    text.len() > WHOLE_LINE_BYTES
        || (text.len() > MAX_LINE_CHARS
            && String::from_utf8_lossy(text).chars().count() > MAX_LINE_CHARS)
}

/// The window of a long line around the match `[start, end)`: up to
/// [`WINDOW_BEFORE`] bytes before it and [`WINDOW_BYTES`] in all (a longer
/// match is cut), never splitting a UTF-8 character, with markers counting
/// what was left out. Returns the window's bounds within the line too.
fn window(text: &[u8], start: usize, end: usize) -> (usize, usize, String) {
    let end = end.min(start + WINDOW_BYTES);
    let mut s = start.saturating_sub(WINDOW_BEFORE);
    let mut e = (s + WINDOW_BYTES).max(end).min(text.len());
    if e - s < WINDOW_BYTES {
        s = e.saturating_sub(WINDOW_BYTES).min(s);
    }
    let continuation = |b: u8| b & 0xC0 == 0x80;
    while s < start && continuation(text[s]) {
        s += 1;
    }
    while e < text.len() && e > end && continuation(text[e]) {
        e -= 1;
    }
    let mut shown = String::new();
    if s > 0 {
        shown.push_str(&format!("[…{} bytes before] ", group(s as u64)));
    }
    shown.push_str(&String::from_utf8_lossy(&text[s..e]));
    if e < text.len() {
        shown.push_str(&format!(
            " […{} bytes after]",
            group((text.len() - e) as u64)
        ));
    }
    (s, e, shown)
}

/// A context line for display: terminator dropped, invalid UTF-8
/// replaced, and cut to [`MAX_LINE_CHARS`] with a marker.
fn show_line(bytes: &[u8]) -> String {
    let bytes = trim_terminator(bytes);
    if !is_long(bytes) {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let (_, e, shown) = window(bytes, 0, 0);
    debug_assert!(e <= bytes.len());
    shown
}

/// Fails reads once the deadline has passed, which stops the searcher.
struct DeadlineReader<R> {
    inner: R,
    deadline: Instant,
}

impl<R: Read> Read for DeadlineReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "search deadline passed",
            ));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn q(p: &str) -> Query {
        Query {
            pattern: p.into(),
            fixed_string: false,
            case_insensitive: false,
            context_lines: 0,
        }
    }

    fn run(query: &Query, text: &[u8], budget: usize) -> (Vec<Hit>, Stop, u64) {
        let c = compile(query).unwrap();
        let mut hits = Vec::new();
        let (stop, seen) = search_reader(
            &c,
            text,
            budget,
            &mut MAX_REPLY_BYTES.clone(),
            Instant::now() + Duration::from_secs(10),
            &mut hits,
        )
        .unwrap();
        (hits, stop, seen)
    }

    #[test]
    fn finds_lines_with_numbers_offsets_and_context() {
        let text = b"alpha\nbeta\ngamma\ndelta\nepsilon\n";
        let mut query = q("gam+a");
        query.context_lines = 1;
        let (hits, stop, seen) = run(&query, text, 10);
        assert_eq!((stop, seen), (Stop::Done, 1));
        assert_eq!(hits[0].line_number, 3);
        assert_eq!(hits[0].byte_offset, 11);
        assert_eq!(hits[0].line, "gamma");
        assert_eq!(
            (hits[0].before.clone(), hits[0].after.clone()),
            (vec!["beta".to_string()], vec!["delta".to_string()])
        );
    }

    #[test]
    fn fixed_strings_and_case_insensitivity() {
        let mut query = q("a.c");
        query.fixed_string = true;
        assert_eq!(run(&query, b"abc\na.c\n", 10).0.len(), 1);
        let mut query = q("ERROR");
        query.case_insensitive = true;
        assert_eq!(run(&query, b"error\nError\nok\n", 10).0.len(), 2);
    }

    #[test]
    fn the_cap_stops_the_search_and_says_so() {
        let text = "hit\n".repeat(100);
        let (hits, stop, _) = run(&q("hit"), text.as_bytes(), 5);
        assert_eq!((hits.len(), stop), (5, Stop::Cap));
    }

    #[test]
    fn the_reply_byte_budget_stops_the_search() {
        let c = compile(&q("x")).unwrap();
        let text = format!("{}\n", "x".repeat(400)).repeat(100);
        let mut hits = Vec::new();
        let mut left = 2 * (400 + HIT_OVERHEAD) + 100;
        let (stop, _) = search_reader(
            &c,
            text.as_bytes(),
            1000,
            &mut left,
            Instant::now() + Duration::from_secs(10),
            &mut hits,
        )
        .unwrap();
        assert_eq!((stop, hits.len()), (Stop::Bytes, 2));
        assert_eq!(left, 100);
    }

    #[test]
    fn bad_patterns_carry_the_parser_message() {
        let err = compile(&q("(unclosed")).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid search pattern") && err.contains("unclosed"),
            "{err}"
        );
    }

    #[test]
    fn huge_patterns_hit_the_size_limit() {
        let err = compile(&q(r"\w{1000}\w{1000}\w{1000}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid search pattern"), "{err}");
    }

    #[test]
    fn a_passed_deadline_stops_the_search() {
        let c = compile(&q("x")).unwrap();
        let mut hits = Vec::new();
        let (stop, _) = search_reader(
            &c,
            &b"x\n"[..],
            10,
            &mut MAX_REPLY_BYTES.clone(),
            Instant::now() - Duration::from_millis(1),
            &mut hits,
        )
        .unwrap();
        assert_eq!(stop, Stop::Deadline);
    }

    #[test]
    fn binary_content_is_skipped_and_long_lines_show_a_window_at_the_match() {
        let (_, stop, _) = run(&q("a"), b"a\x00b\na\n", 10);
        assert_eq!(stop, Stop::Binary);
        let long = format!("{}needle{}\n", "x".repeat(300), "y".repeat(900));
        let (hits, _, _) = run(&q("needle"), long.as_bytes(), 10);
        let h = &hits[0];
        assert_eq!((h.byte_offset, h.match_offset, h.match_length), (0, 300, 6));
        assert_eq!(h.window, Some((140, 620)));
        assert_eq!(
            h.line,
            format!(
                "[…140 bytes before] {}needle{} […586 bytes after]",
                "x".repeat(160),
                "y".repeat(314)
            )
        );
        assert!(!h.line.contains("line range"), "{}", h.line);
    }

    /// An 8 MB minified array is one line: each match is a hit of its own,
    /// at its own offset, with its JSON path, and a window around it.
    #[test]
    fn every_match_in_a_one_line_json_array_is_a_hit_with_offset_window_and_path() {
        let records: Vec<String> = (0..60_000)
            .map(|i| {
                let login = if i % 20_000 == 3812 { "needle" } else { "someone" };
                format!("{{\"id\":{i},\"title\":\"a pull request title {i}\",\"user\":{{\"login\":\"{login}\"}}}}")
            })
            .collect();
        let doc = format!("[{}]", records.join(","));
        assert!(doc.len() > 3_000_000);
        let (hits, stop, seen) = run(&q("needle"), doc.as_bytes(), 10);
        assert_eq!((stop, seen, hits.len()), (Stop::Done, 3, 3));
        let paths: Vec<&str> = hits.iter().map(|h| h.json_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".[3812].user.login",
                ".[23812].user.login",
                ".[43812].user.login"
            ]
        );
        for h in &hits {
            let at = h.match_offset as usize;
            assert_eq!(&doc[at..at + 6], "needle");
            assert_eq!((h.line_number, h.byte_offset), (1, 0));
            let (s, e) = h.window.unwrap();
            assert!(s < h.match_offset && e > h.match_offset + 6 && e - s <= WINDOW_BYTES as u64);
            assert!(
                h.line.contains("needle") && h.line.chars().count() < 560,
                "{}",
                h.line
            );
            assert!(h.line.contains(&doc[s as usize..e as usize]));
        }
    }

    #[test]
    fn a_window_never_splits_a_character_and_short_lines_stay_whole() {
        let long = format!("{}needle{}\n", "€".repeat(400), "€".repeat(400));
        let (hits, _, _) = run(&q("needle"), long.as_bytes(), 10);
        let (s, e) = hits[0].window.unwrap();
        assert!(long.is_char_boundary(s as usize) && long.is_char_boundary(e as usize));
        assert!(hits[0].line.contains("€€needle€€"), "{}", hits[0].line);
        let (hits, _, _) = run(&q("b"), b"{\"a\":\"b\"}\nabc\n", 10);
        assert_eq!(hits[0].line, "{\"a\":\"b\"}");
        assert_eq!((hits[0].window, hits[0].json_path.as_str()), (None, ".a"));
        assert_eq!((hits[1].match_offset, hits[1].json_path.as_str()), (11, ""));
    }

    fn run_file(query: &Query, text: &[u8]) -> Vec<Hit> {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, text).unwrap();
        let c = compile(query).unwrap();
        let mut hits = Vec::new();
        search_file(
            &c,
            &f,
            100,
            &mut MAX_REPLY_BYTES.clone(),
            Instant::now() + Duration::from_secs(10),
            &mut hits,
        )
        .unwrap();
        hits
    }

    #[test]
    fn matches_in_a_pretty_printed_document_carry_their_path_in_the_whole_document() {
        let records: Vec<serde_json::Value> = (0..300)
            .map(|i| {
                let login = if i == 211 { "needle" } else { "someone" };
                serde_json::json!({"id": i, "user": {"login": login, "tags": ["a", "b"]}})
            })
            .collect();
        let pretty = serde_json::to_vec_pretty(&serde_json::json!({"items": records})).unwrap();
        let hits = run_file(&q("needle"), &pretty);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].json_path, ".items[211].user.login");
        // One record per line inside an array: the line's own `{` is not
        // the document's start.
        let lines: Vec<String> = (0..50)
            .map(|i| {
                format!(
                    "{{\"n\":{i},\"w\":\"{}\"}}",
                    if i == 42 { "needle" } else { "hay" }
                )
            })
            .collect();
        let per_line = format!("[\n{}\n]\n", lines.join(",\n"));
        let hits = run_file(&q("needle"), per_line.as_bytes());
        assert_eq!(hits[0].json_path, ".[42].w");
    }

    #[test]
    fn ndjson_records_keep_paths_of_their_own_line_in_a_file() {
        let text = b"{\"a\":1}\n{\"b\":{\"c\":\"needle\"}}\n";
        let hits = run_file(&q("needle"), text);
        assert_eq!(hits[0].json_path, ".b.c");
    }
}
