//! Search over payloads with ripgrep's library crates: `grep-regex` for the
//! matcher (with its compile-size limits) and `grep-searcher` for the line
//! oriented search with context. A deadline bounds the time of one call.

use std::io::{self, Read};
use std::time::Instant;

use grep_regex::RegexMatcherBuilder;
use grep_searcher::{
    BinaryDetection, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch,
};

/// Longest line returned in a match or context; longer lines are cut with a
/// marker that says how much was left out.
pub const MAX_LINE_CHARS: usize = 500;
/// Most bytes of matched and context lines one call returns, so a reply
/// stays well inside the response message limit.
pub const MAX_REPLY_BYTES: usize = 4 << 20;
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

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// 1-based line number.
    pub line_number: u64,
    /// Byte offset of the line's start.
    pub byte_offset: u64,
    /// The line, without its terminator, possibly cut.
    pub line: String,
    /// Context before.
    pub before: Vec<String>,
    /// Context after.
    pub after: Vec<String>,
}

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

/// Searches a payload file through a read-only memory map, appending hits
/// until `budget` hits have been taken. The deadline is checked at each
/// match; a payload's scan itself is linear in its size.
pub fn search_file(
    c: &Compiled,
    file: &std::fs::File,
    budget: usize,
    bytes_left: &mut usize,
    deadline: Instant,
    hits: &mut Vec<Hit>,
) -> Result<(Stop, u64), SearchError> {
    // SAFETY: payload files are written once, renamed into place and never
    // modified or truncated afterwards (deletion only unlinks, which leaves
    // an existing mapping valid), so the mapped bytes cannot change under
    // the searcher.
    #[allow(unsafe_code)]
    let mmap = unsafe { grep_searcher::MmapChoice::auto() };
    let mut searcher = builder(c).memory_map(mmap).build();
    let mut sink = Collector::new(hits, budget, *bytes_left, Some(deadline));
    searcher.search_file(&c.matcher, file, &mut sink)?;
    *bytes_left = sink.bytes_left;
    Ok((sink.stop(), sink.seen))
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
    let mut searcher = builder(c).build();
    // The reader itself enforces the deadline.
    let mut sink = Collector::new(hits, budget, *bytes_left, None);
    let reader = DeadlineReader {
        inner: reader,
        deadline,
    };
    let outcome = searcher.search_reader(&c.matcher, reader, &mut sink);
    *bytes_left = sink.bytes_left;
    match outcome {
        Ok(()) => Ok((sink.stop(), sink.seen)),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok((Stop::Deadline, sink.seen)),
        Err(e) => Err(e.into()),
    }
}

struct Collector<'a> {
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
        hits: &'a mut Vec<Hit>,
        budget: usize,
        bytes_left: usize,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
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
            self.seen += 1;
            if self.hits.len() >= self.budget {
                self.capped = true;
                return Ok(false);
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                self.timed_out = true;
                return Ok(false);
            }
            let shown = show_line(line);
            let size = shown.len() + self.pending_before.iter().map(String::len).sum::<usize>();
            if size > self.bytes_left {
                self.out_of_bytes = true;
                return Ok(false);
            }
            self.bytes_left -= size;
            self.hits.push(Hit {
                line_number: number,
                byte_offset: offset,
                line: shown,
                before: std::mem::take(&mut self.pending_before),
                after: Vec::new(),
            });
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

/// A line for display: terminator dropped, invalid UTF-8 replaced, and cut
/// to [`MAX_LINE_CHARS`] with a marker.
fn show_line(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let text = String::from_utf8_lossy(bytes);
    let total = text.chars().count();
    if total <= MAX_LINE_CHARS {
        return text.into_owned();
    }
    let head: String = text.chars().take(MAX_LINE_CHARS).collect();
    format!(
        "{head}…[{} more chars on this line; Read the line range for all of it]",
        total - MAX_LINE_CHARS
    )
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
        let mut left = 1000;
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
        assert!(left < 400);
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
    fn binary_content_is_skipped_and_long_lines_are_cut() {
        let (_, stop, _) = run(&q("a"), b"a\x00b\na\n", 10);
        assert_eq!(stop, Stop::Binary);
        let long = format!("{}needle{}\n", "x".repeat(300), "y".repeat(900));
        let (hits, _, _) = run(&q("needle"), long.as_bytes(), 10);
        assert!(
            hits[0].line.contains("more chars on this line"),
            "{}",
            hits[0].line
        );
        assert!(hits[0].line.chars().count() < 600);
    }
}
