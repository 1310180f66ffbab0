//! Structure inference for Inspect, streaming in bounded memory whatever the
//! payload's size: JSON (object or array) and NDJSON records with field
//! paths, types, presence and examples; CSV/TSV columns and rows; text lines.
//!
//! JSON is walked record by record: a structural scanner finds each
//! top-level element in the stream and only that element is parsed, so a
//! 1 GiB array needs memory for one record, not for the array.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Read};

use super::detect::{self, Kind};
use crate::text::{count_of, group};

/// Largest single record (JSON element or NDJSON line) that is parsed for
/// fields; larger ones are counted but not described.
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// Records parsed for their fields; later records are counted and checked
/// structurally, not parsed, so Inspect's cost stays near a plain scan.
pub const SAMPLED_RECORDS: u64 = 10_000;
/// Field paths tracked; later new paths are counted as "more".
const MAX_FIELDS: usize = 256;
/// Nesting depth of field paths.
const MAX_DEPTH: usize = 4;
/// Longest field path listed, in bytes; longer keys are counted as "more".
const MAX_PATH_BYTES: usize = 200;
/// Distinct unlisted paths remembered (for the "and N more" count).
const MAX_MORE: usize = 4096;
/// JSON nesting the streaming walker follows; deeper is reported as where
/// the walker stopped.
const MAX_NESTING: usize = 512;
/// Columns listed for CSV/TSV.
const MAX_COLUMNS: usize = 1000;
/// Sample lines kept for text.
const SAMPLE_LINES: usize = 5;
/// Chars kept of each sample line and example value.
const SAMPLE_CHARS: usize = 160;
/// Fields listed in the summary.
const SUMMARY_FIELDS: usize = 12;
/// Read size.
const CHUNK: usize = 256 * 1024;

/// One field path of JSON records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldInfo {
    /// `user.login`, `labels[]`, `labels[].name`.
    pub path: String,
    /// Types seen: null, bool, int, float, string, array, object.
    pub types: Vec<String>,
    /// Records in which the path is present.
    pub present_count: u64,
    /// A JSON-encoded example value (cut to a few dozen chars).
    pub example: String,
}

/// JSON facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonStructure {
    /// `array`, `object` or `ndjson`.
    pub top_level: String,
    /// Elements, keys or records.
    pub record_count: u64,
    /// Field paths in first-seen order.
    pub fields: Vec<FieldInfo>,
    /// Paths not listed because of the field limit.
    pub more_fields: u64,
    /// Records too large to describe, or NDJSON lines that were not JSON.
    pub skipped_records: u64,
    /// Records parsed for `fields` (the first [`SAMPLED_RECORDS`]);
    /// presence counts are out of this many.
    pub sampled_records: u64,
    /// First NDJSON line that was not JSON.
    pub first_bad_line: Option<u64>,
}

/// CSV/TSV facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvStructure {
    /// `,` or `\t`.
    pub delimiter: char,
    /// Header fields (the first 1000, each cut).
    pub columns: Vec<String>,
    /// How many columns the header has.
    pub column_count: u64,
    /// Data rows.
    pub row_count: u64,
    /// True when counting stopped at a record over the record limit (an
    /// unclosed quote, typically); `row_count` is then a lower bound.
    pub stopped_at_oversized_record: bool,
}

/// Text facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextStructure {
    /// Chars of the longest line.
    pub longest_line: u64,
    /// Its 1-based number.
    pub longest_line_number: u64,
    /// The first lines, cut.
    pub sample_lines: Vec<String>,
}

/// What Inspect says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Structure {
    /// `json`, `ndjson`, `csv`, `tsv`, `text`, `binary`, …
    pub detected_type: String,
    /// Bytes.
    pub size_bytes: u64,
    /// Lines.
    pub line_count: u64,
    /// For JSON and NDJSON.
    pub json: Option<JsonStructure>,
    /// For CSV and TSV.
    pub csv: Option<CsvStructure>,
    /// For text (also filled for everything that is text).
    pub text: Option<TextStructure>,
    /// Where JSON-looking content stopped being valid JSON.
    pub invalid_json_at: Option<u64>,
    /// A short paragraph to act on.
    pub summary: String,
}

/// Infers the structure of `reader`'s content (`size` bytes, `line_count`
/// lines, `content_type` as stored).
pub fn infer<R: Read>(
    mut reader: R,
    size: u64,
    line_count: u64,
    content_type: &str,
) -> io::Result<Structure> {
    let mut head = Vec::with_capacity(detect::SNIFF_BYTES);
    (&mut reader)
        .take(detect::SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
    let kind = detect::detect(&head, content_type);
    let rest = io::Cursor::new(head).chain(reader);
    let mut s = Structure {
        detected_type: kind.short().to_owned(),
        size_bytes: size,
        line_count,
        json: None,
        csv: None,
        text: None,
        invalid_json_at: None,
        summary: String::new(),
    };
    if kind == Kind::Binary {
        s.summary = format!(
            "Binary data, {}; Inspect cannot describe it and Search skips it. Read byte ranges of it, or decode it with an Exec python script that opens its /payloads path with open(path, 'rb').",
            count_of(size, "byte")
        );
        return Ok(s);
    }
    let mut text = TextStats::default();
    match kind {
        Kind::JsonArray | Kind::JsonObject => {
            let mut walker = JsonWalker::new();
            for_each_chunk(rest, |chunk| {
                text.update(chunk);
                walker.update(chunk);
            })?;
            match walker.finish() {
                Ok(j) => s.json = Some(j),
                Err(at) => {
                    s.invalid_json_at = Some(at);
                    s.detected_type = "text".into();
                }
            }
        }
        Kind::Ndjson => {
            let mut nd = NdjsonStats::default();
            for_each_chunk(rest, |chunk| {
                text.update(chunk);
                nd.update(chunk);
            })?;
            s.json = Some(nd.finish());
        }
        Kind::Csv | Kind::Tsv => {
            let delimiter = if kind == Kind::Tsv { b'\t' } else { b',' };
            let tee = Tee {
                inner: rest,
                text: &mut text,
            };
            s.csv = Some(csv_structure(tee, delimiter)?);
        }
        _ => for_each_chunk(rest, |chunk| text.update(chunk))?,
    }
    s.text = Some(text.finish());
    s.summary = summarize(&s, kind);
    Ok(s)
}

fn for_each_chunk<R: Read>(mut r: R, mut f: impl FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        f(&buf[..n]);
    }
}

/// Passes reads through while feeding the text statistics.
struct Tee<'a, R> {
    inner: R,
    text: &'a mut TextStats,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.text.update(&buf[..n]);
        Ok(n)
    }
}

fn csv_structure<R: Read>(r: R, delimiter: u8) -> io::Result<CsvStructure> {
    // Bytes read since the last complete record: one record (an unclosed
    // quote, say) may not grow past MAX_RECORD_BYTES.
    let since_record = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let guarded = RecordGuard {
        inner: r,
        since_record: since_record.clone(),
    };
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .flexible(true)
        .has_headers(true)
        .from_reader(guarded);
    let headers = match reader.headers() {
        Ok(h) => h.clone(),
        Err(e) => return Err(io::Error::other(e)),
    };
    since_record.set(0);
    let column_count = headers.len() as u64;
    let columns = headers
        .iter()
        .take(MAX_COLUMNS)
        .map(|c| cut(c, SAMPLE_CHARS))
        .collect();
    let mut row_count = 0u64;
    let mut record = csv::ByteRecord::new();
    let mut oversized = false;
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(true) => row_count += 1,
            Ok(false) => break,
            Err(e) => match e.kind() {
                csv::ErrorKind::Io(io) if io.kind() == io::ErrorKind::FileTooLarge => {
                    oversized = true;
                    break;
                }
                csv::ErrorKind::Io(_) => return Err(io::Error::other(e)),
                // A malformed row still counts; keep going.
                _ => row_count += 1,
            },
        }
        since_record.set(0);
    }
    Ok(CsvStructure {
        delimiter: delimiter as char,
        columns,
        column_count,
        row_count,
        stopped_at_oversized_record: oversized,
    })
}

struct RecordGuard<R> {
    inner: R,
    since_record: std::rc::Rc<std::cell::Cell<usize>>,
}

impl<R: Read> Read for RecordGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.since_record.get() > MAX_RECORD_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "a CSV record is larger than the record limit",
            ));
        }
        let n = self.inner.read(buf)?;
        self.since_record.set(self.since_record.get() + n);
        Ok(n)
    }
}

/// Line statistics without keeping lines.
#[derive(Default)]
struct TextStats {
    line: u64,
    current_chars: u64,
    longest: u64,
    longest_number: u64,
    samples: Vec<String>,
    current_sample: Vec<u8>,
}

/// A statistic of a stream's lines, fed in chunks: [`Lines::update`] cuts
/// each chunk at its newlines.
trait Lines {
    /// More of the current line.
    fn part(&mut self, part: &[u8]);
    /// The current line ended.
    fn end_line(&mut self);

    /// Feeds the next chunk of the stream.
    fn update(&mut self, chunk: &[u8]) {
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', chunk) {
            self.part(&chunk[start..nl]);
            self.end_line();
            start = nl + 1;
        }
        self.part(&chunk[start..]);
    }
}

impl Lines for TextStats {
    fn part(&mut self, part: &[u8]) {
        self.current_chars += bytecount::num_chars(part) as u64;
        if self.samples.len() < SAMPLE_LINES && self.current_sample.len() < SAMPLE_CHARS * 4 {
            let room = SAMPLE_CHARS * 4 - self.current_sample.len();
            self.current_sample
                .extend_from_slice(&part[..part.len().min(room)]);
        }
    }

    fn end_line(&mut self) {
        self.line += 1;
        if self.current_chars > self.longest {
            self.longest = self.current_chars;
            self.longest_number = self.line;
        }
        if self.samples.len() < SAMPLE_LINES {
            let text = String::from_utf8_lossy(&self.current_sample);
            self.samples
                .push(cut(text.trim_end_matches('\r'), SAMPLE_CHARS));
        }
        self.current_chars = 0;
        self.current_sample.clear();
    }
}

impl TextStats {
    fn finish(mut self) -> TextStructure {
        if self.current_chars > 0 || !self.current_sample.is_empty() {
            self.end_line();
        }
        TextStructure {
            longest_line: self.longest,
            longest_line_number: self.longest_number,
            sample_lines: self.samples,
        }
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// Field statistics over records.
#[derive(Default)]
struct Fields {
    order: Vec<String>,
    stats: HashMap<String, (BTreeSet<&'static str>, u64, String)>,
    more: HashSet<String>,
}

impl Fields {
    fn record(&mut self, value: &serde_json::Value, prefix: &str) {
        let mut seen = HashSet::new();
        self.walk(value, prefix, 0, &mut seen);
    }

    fn walk(
        &mut self,
        v: &serde_json::Value,
        path: &str,
        depth: usize,
        seen: &mut HashSet<String>,
    ) {
        use serde_json::Value as V;
        if !path.is_empty() {
            self.note(path, v, seen);
        }
        if depth >= MAX_DEPTH {
            return;
        }
        match v {
            V::Object(map) => {
                for (k, child) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    self.walk(child, &p, depth + 1, seen);
                }
            }
            V::Array(items) => {
                let p = format!("{path}[]");
                // Describe the elements' fields through the first few only.
                for item in items.iter().take(16) {
                    if let V::Object(map) = item {
                        for (k, child) in map {
                            self.walk(child, &format!("{p}.{k}"), depth + 1, seen);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn note(&mut self, path: &str, v: &serde_json::Value, seen: &mut HashSet<String>) {
        let path = match v {
            serde_json::Value::Array(_) => format!("{path}[]"),
            _ => path.to_owned(),
        };
        if !self.stats.contains_key(&path) {
            if self.stats.len() >= MAX_FIELDS || path.len() > MAX_PATH_BYTES {
                if self.more.len() < MAX_MORE {
                    self.more.insert(path);
                }
                return;
            }
            self.order.push(path.clone());
            self.stats
                .insert(path.clone(), (BTreeSet::new(), 0, String::new()));
        }
        let entry = self.stats.get_mut(&path).expect("inserted above");
        entry.0.insert(type_name(v));
        if seen.insert(path) {
            entry.1 += 1;
        }
        if entry.2.is_empty() && !v.is_null() && !v.is_object() && !v.is_array() {
            entry.2 = cut(&v.to_string(), 80);
        }
    }

    fn finish(self) -> (Vec<FieldInfo>, u64) {
        let mut stats = self.stats;
        let fields = self
            .order
            .into_iter()
            .map(|path| {
                let (types, present_count, example) =
                    stats.remove(&path).expect("ordered paths have stats");
                FieldInfo {
                    path,
                    types: types.into_iter().map(str::to_owned).collect(),
                    present_count,
                    example,
                }
            })
            .collect();
        (fields, self.more.len() as u64)
    }
}

fn type_name(v: &serde_json::Value) -> &'static str {
    use serde_json::Value as V;
    match v {
        V::Null => "null",
        V::Bool(_) => "bool",
        V::Number(n) if n.is_f64() => "float",
        V::Number(_) => "int",
        V::String(_) => "string",
        V::Array(_) => "array",
        V::Object(_) => "object",
    }
}

/// Streams a JSON array or object, parsing one top-level element at a time.
struct JsonWalker {
    offset: u64,
    depth: usize,
    in_string: bool,
    escaped: bool,
    top: Option<u8>,
    closed: bool,
    /// The element being captured, with its start offset.
    element: Vec<u8>,
    element_start: u64,
    capturing: bool,
    /// Whether the current element's bytes are kept for parsing.
    keep: bool,
    sampled: u64,
    oversized: bool,
    /// Object: the last top-level key, and whether a key is expected next.
    key: Vec<u8>,
    in_key: bool,
    expect_key: bool,
    pending_key: Option<String>,
    records: u64,
    skipped: u64,
    objects: u64,
    fields: Fields,
    error: Option<u64>,
    stack: Vec<u8>,
}

impl JsonWalker {
    fn new() -> Self {
        Self {
            offset: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            top: None,
            closed: false,
            element: Vec::new(),
            element_start: 0,
            capturing: false,
            keep: false,
            sampled: 0,
            oversized: false,
            key: Vec::new(),
            in_key: false,
            expect_key: false,
            pending_key: None,
            records: 0,
            skipped: 0,
            objects: 0,
            fields: Fields::default(),
            error: None,
            stack: Vec::new(),
        }
    }

    fn update(&mut self, chunk: &[u8]) {
        for (i, &b) in chunk.iter().enumerate() {
            if self.error.is_some() {
                return;
            }
            let at = self.offset + i as u64;
            self.step(b, at);
        }
        self.offset += chunk.len() as u64;
    }

    fn fail(&mut self, at: u64) {
        self.error.get_or_insert(at);
    }

    fn step(&mut self, b: u8, at: u64) {
        if self.closed {
            if !b.is_ascii_whitespace() {
                self.fail(at);
            }
            return;
        }
        // Capture bytes of the current element (strings included).
        if self.capturing && self.keep {
            if self.element.len() < MAX_RECORD_BYTES {
                self.element.push(b);
            } else {
                self.oversized = true;
            }
        }
        if self.in_string {
            if self.in_key {
                self.key.push(b);
            }
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.in_key {
                    self.in_key = false;
                    self.pending_key = serde_json::from_slice::<String>(&self.key).ok();
                    self.expect_key = false;
                }
                if self.capturing && self.depth == 1 {
                    self.end_element();
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.top == Some(b'{') && self.expect_key {
                    self.in_key = true;
                    self.key.clear();
                    self.key.push(b);
                } else if self.depth == 1 && !self.capturing {
                    self.begin_element(b, at);
                }
            }
            b'[' | b'{' => {
                if self.depth == 0 {
                    if self.top.is_some() {
                        return self.fail(at);
                    }
                    self.top = Some(b);
                    self.expect_key = b == b'{';
                } else if self.depth == 1 && !self.capturing {
                    self.begin_element(b, at);
                }
                if self.stack.len() >= MAX_NESTING {
                    return self.fail(at);
                }
                self.stack.push(if b == b'[' { b']' } else { b'}' });
                self.depth += 1;
            }
            b']' | b'}' => {
                if self.stack.pop() != Some(b) {
                    return self.fail(at);
                }
                self.depth -= 1;
                if self.depth == 1 && self.capturing {
                    self.end_element();
                } else if self.depth == 0 {
                    if self.capturing {
                        // A scalar element ended by the closing bracket.
                        if self.keep {
                            self.element.pop();
                        }
                        self.end_element();
                    }
                    self.closed = true;
                }
            }
            b',' if self.depth == 1 => {
                if self.capturing {
                    if self.keep {
                        self.element.pop();
                    }
                    self.end_element();
                }
                self.expect_key = self.top == Some(b'{');
            }
            b':' if self.depth == 1 => {}
            b if b.is_ascii_whitespace() => {}
            _ if self.depth == 0 => self.fail(at),
            _ => {
                if self.depth == 1 && !self.capturing {
                    self.begin_element(b, at);
                }
            }
        }
    }

    fn begin_element(&mut self, first: u8, at: u64) {
        self.capturing = true;
        self.keep = self.sampled < SAMPLED_RECORDS;
        self.oversized = false;
        self.element.clear();
        if self.keep {
            self.element.push(first);
        }
        self.element_start = at;
    }

    fn end_element(&mut self) {
        self.capturing = false;
        self.records += 1;
        let prefix = match self.top {
            Some(b'{') => self.pending_key.take().unwrap_or_default(),
            _ => String::new(),
        };
        if !self.keep {
            return;
        }
        if self.oversized {
            self.skipped += 1;
            return;
        }
        self.sampled += 1;
        let trimmed = trim_ascii(&self.element);
        match serde_json::from_slice::<serde_json::Value>(trimmed) {
            Ok(v) => {
                if v.is_object() {
                    self.objects += 1;
                }
                if self.top == Some(b'{') {
                    let mut seen = HashSet::new();
                    self.fields.walk(&v, &prefix, 0, &mut seen);
                } else {
                    self.fields.record(&v, "");
                }
            }
            Err(e) => {
                let at = self.element_start + position(trimmed, e.line(), e.column());
                self.fail(at);
            }
        }
    }

    fn finish(self) -> Result<JsonStructure, u64> {
        if let Some(at) = self.error {
            return Err(at);
        }
        if !self.closed {
            return Err(self.offset);
        }
        let (fields, more_fields) = self.fields.finish();
        Ok(JsonStructure {
            top_level: if self.top == Some(b'{') {
                "object"
            } else {
                "array"
            }
            .to_owned(),
            record_count: self.records,
            fields,
            more_fields,
            skipped_records: self.skipped,
            sampled_records: self.sampled,
            first_bad_line: None,
        })
        .map(|mut j| {
            // Remember whether every element of an array was an object.
            if self.top == Some(b'[') && self.objects < self.records {
                j.top_level = "array".into();
            }
            j
        })
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// Byte position of a 1-based line and column inside `b`.
fn position(b: &[u8], line: usize, column: usize) -> u64 {
    let mut offset = 0usize;
    for _ in 1..line {
        match memchr::memchr(b'\n', &b[offset..]) {
            Some(p) => offset += p + 1,
            None => break,
        }
    }
    (offset + column.saturating_sub(1)) as u64
}

/// NDJSON records, one per line, parsed line by line.
#[derive(Default)]
struct NdjsonStats {
    line: Vec<u8>,
    line_number: u64,
    oversized: bool,
    records: u64,
    sampled: u64,
    bad: u64,
    first_bad: Option<u64>,
    fields: Fields,
}

impl Lines for NdjsonStats {
    fn part(&mut self, part: &[u8]) {
        if self.sampled >= SAMPLED_RECORDS {
            // Past the sample only whether the line is blank matters.
            if self.line.is_empty() && part.iter().any(|b| !b.is_ascii_whitespace()) {
                self.line.push(b'x');
            }
            return;
        }
        if self.line.len() + part.len() > MAX_RECORD_BYTES {
            self.oversized = true;
        } else {
            self.line.extend_from_slice(part);
        }
    }

    fn end_line(&mut self) {
        self.line_number += 1;
        let text = trim_ascii(&self.line);
        if self.sampled >= SAMPLED_RECORDS {
            if !text.is_empty() {
                self.records += 1;
            }
        } else if self.oversized {
            self.records += 1;
        } else if !text.is_empty() {
            match serde_json::from_slice::<serde_json::Value>(text) {
                Ok(v) => {
                    self.records += 1;
                    self.sampled += 1;
                    self.fields.record(&v, "");
                }
                Err(_) => {
                    self.bad += 1;
                    self.first_bad.get_or_insert(self.line_number);
                }
            }
        }
        self.line.clear();
        self.oversized = false;
    }
}

impl NdjsonStats {
    fn finish(mut self) -> JsonStructure {
        if !self.line.is_empty() || self.oversized {
            self.end_line();
        }
        let (fields, more_fields) = self.fields.finish();
        JsonStructure {
            top_level: "ndjson".into(),
            record_count: self.records,
            fields,
            more_fields,
            skipped_records: self.bad,
            sampled_records: self.sampled,
            first_bad_line: self.first_bad,
        }
    }
}

fn summarize(s: &Structure, kind: Kind) -> String {
    let mut out = String::new();
    if let Some(at) = s.invalid_json_at {
        let _ = write!(
            out,
            "Invalid JSON at byte {at}: the content looks like JSON but does not parse, so it is described as text. "
        );
    }
    if let Some(j) = &s.json {
        let records = match j.top_level.as_str() {
            "object" => format!(
                "JSON object with {}",
                count_of(j.record_count, "top-level key")
            ),
            "ndjson" => format!("NDJSON of {}", count_of(j.record_count, "record")),
            _ => format!("JSON array of {}", count_of(j.record_count, "element")),
        };
        out.push_str(&records);
        if !j.fields.is_empty() {
            let denominator = j.sampled_records.max(1);
            let listed: Vec<String> = j
                .fields
                .iter()
                .take(SUMMARY_FIELDS)
                .map(|f| {
                    let pct = if j.top_level == "object" {
                        String::new()
                    } else {
                        format!(", {}%", f.present_count * 100 / denominator)
                    };
                    format!("{} ({}{pct})", f.path, f.types.join("|"))
                })
                .collect();
            if j.sampled_records < j.record_count && j.top_level != "object" {
                let _ = write!(
                    out,
                    "; fields (from the first {}) {}",
                    count_of(j.sampled_records, "record"),
                    listed.join(", ")
                );
            } else {
                let _ = write!(out, "; fields {}", listed.join(", "));
            }
            let more = (j.fields.len() - listed.len()) as u64 + j.more_fields;
            if more > 0 {
                let _ = write!(out, " … and {more} more");
            }
        }
        out.push('.');
        if j.skipped_records > 0 {
            match j.first_bad_line {
                Some(line) => {
                    let _ = write!(
                        out,
                        " {} not valid JSON (first: line {line}).",
                        count_of(j.skipped_records, "line")
                    );
                }
                None => {
                    let _ = write!(
                        out,
                        " {} over {} MiB not described.",
                        count_of(j.skipped_records, "record"),
                        MAX_RECORD_BYTES >> 20
                    );
                }
            }
        }
    } else if let Some(c) = &s.csv {
        let name = if kind == Kind::Tsv { "TSV" } else { "CSV" };
        let cols: Vec<&str> = c
            .columns
            .iter()
            .take(SUMMARY_FIELDS)
            .map(String::as_str)
            .collect();
        let _ = write!(
            out,
            "{name} with {} ({}) and {}.",
            count_of(c.column_count, "column"),
            cols.join(", "),
            count_of(c.row_count, "data row")
        );
        if c.stopped_at_oversized_record {
            let _ = write!(
                out,
                " Counting stopped at a record over {} MiB (an unclosed quote?), so there are at least that many rows.",
                MAX_RECORD_BYTES >> 20
            );
        }
    } else if let Some(t) = &s.text {
        let what = if s.invalid_json_at.is_some() {
            Kind::Text
        } else {
            kind
        };
        let _ = write!(
            out,
            "{} of {}",
            capitalize(&what.to_string()),
            count_of(s.line_count, "line")
        );
        if t.longest_line > 0 {
            let _ = write!(
                out,
                "; longest line {} (line {})",
                count_of(t.longest_line, "char"),
                group(t.longest_line_number)
            );
        }
        out.push('.');
    }
    let _ = write!(out, " {} in all.", count_of(s.size_bytes, "byte"));
    out
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inspect(content: &[u8], content_type: &str) -> Structure {
        let lines = {
            let n = memchr::memchr_iter(b'\n', content).count() as u64;
            if content.is_empty() {
                0
            } else if content.ends_with(b"\n") {
                n
            } else {
                n + 1
            }
        };
        infer(content, content.len() as u64, lines, content_type).unwrap()
    }

    fn field<'a>(s: &'a Structure, path: &str) -> &'a FieldInfo {
        s.json
            .as_ref()
            .unwrap()
            .fields
            .iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("no field {path}: {s:#?}"))
    }

    #[test]
    fn json_array_fields_types_presence_and_examples() {
        let mut items = Vec::new();
        for i in 0..100 {
            let labels = if i % 4 == 0 {
                String::new()
            } else {
                ",\"labels\":[{\"name\":\"bug\"}]".to_owned()
            };
            items.push(format!(
                "{{\"id\":{i},\"user\":{{\"login\":\"u{i}\"}},\"score\":{}.5{labels}}}",
                i
            ));
        }
        let s = inspect(format!("[{}]", items.join(",")).as_bytes(), "");
        let j = s.json.as_ref().unwrap();
        assert_eq!((j.top_level.as_str(), j.record_count), ("array", 100));
        assert_eq!(field(&s, "id").types, vec!["int"]);
        assert_eq!(field(&s, "id").present_count, 100);
        assert_eq!(field(&s, "id").example, "0");
        assert_eq!(field(&s, "user.login").example, "\"u0\"");
        assert_eq!(field(&s, "score").types, vec!["float"]);
        assert_eq!(field(&s, "labels[]").present_count, 75);
        assert_eq!(field(&s, "labels[].name").types, vec!["string"]);
        assert!(s.summary.starts_with("JSON array of 100 elements; fields id (int, 100%), user (object, 100%), user.login (string, 100%)"), "{}", s.summary);
        assert!(s.summary.contains("labels[] (array, 75%)"), "{}", s.summary);
    }

    #[test]
    fn fields_come_from_a_bounded_sample_while_every_record_is_counted() {
        let n = SAMPLED_RECORDS + 500;
        let json = crate::testing::json_array(n, |i| format!("{{\"i\":{i}}}"));
        let s = inspect(json.as_bytes(), "");
        let j = s.json.as_ref().unwrap();
        assert_eq!((j.record_count, j.sampled_records), (n, SAMPLED_RECORDS));
        assert_eq!(field(&s, "i").present_count, SAMPLED_RECORDS);
        assert!(
            s.summary
                .contains("fields (from the first 10 000 records) i (int, 100%)"),
            "{}",
            s.summary
        );
        let nd: String = (0..n).map(|i| format!("{{\"i\":{i}}}\n")).collect();
        let j = inspect(nd.as_bytes(), "").json.unwrap();
        assert_eq!((j.record_count, j.sampled_records), (n, SAMPLED_RECORDS));
    }

    #[test]
    fn chunk_boundaries_do_not_change_the_answer() {
        let json = crate::testing::json_array(5000, |i| format!("{{\"k\":\"v,{i}]\\\"\"}}"));
        let whole = inspect(json.as_bytes(), "");
        assert_eq!(whole.json.as_ref().unwrap().record_count, 5000);
        assert_eq!(field(&whole, "k").present_count, 5000);
    }

    #[test]
    fn json_object_lists_top_level_keys() {
        let s = inspect(
            br#"{"total": 2, "items": [{"id": 1}, {"id": 2}], "next": null}"#,
            "application/json",
        );
        let j = s.json.as_ref().unwrap();
        assert_eq!((j.top_level.as_str(), j.record_count), ("object", 3));
        assert_eq!(field(&s, "items[].id").types, vec!["int"]);
        assert!(
            s.summary.starts_with(
                "JSON object with 3 top-level keys; fields total (int), items[] (array)"
            ),
            "{}",
            s.summary
        );
    }

    #[test]
    fn malformed_json_says_where_and_falls_back_to_text() {
        let s = inspect(b"[{\"a\":1},{\"a\":2,}]", "");
        assert_eq!(s.invalid_json_at, Some(16));
        assert_eq!(s.detected_type, "text");
        assert!(s.json.is_none());
        assert!(
            s.summary.starts_with("Invalid JSON at byte 16"),
            "{}",
            s.summary
        );
        let s = inspect(b"[1, 2", "");
        assert_eq!(s.invalid_json_at, Some(5));
    }

    #[test]
    fn ndjson_records_and_bad_lines() {
        let s = inspect(
            b"{\"a\":1}\n{\"a\":2,\"b\":\"x\"}\nnot json\n{\"a\":3}\n",
            "application/x-ndjson",
        );
        let j = s.json.as_ref().unwrap();
        assert_eq!(
            (j.record_count, j.skipped_records, j.first_bad_line),
            (3, 1, Some(3))
        );
        assert_eq!(field(&s, "b").present_count, 1);
        assert!(
            s.summary.contains("1 line not valid JSON (first: line 3)"),
            "{}",
            s.summary
        );
    }

    #[test]
    fn csv_and_tsv_columns_and_rows() {
        let s = inspect(b"id,name,city\n1,a,\"x, y\"\n2,b,z\n", "");
        let c = s.csv.as_ref().unwrap();
        assert_eq!(
            (c.delimiter, c.columns.clone(), c.row_count),
            (',', vec!["id".to_string(), "name".into(), "city".into()], 2)
        );
        assert_eq!(
            s.summary,
            "CSV with 3 columns (id, name, city) and 2 data rows. 30 bytes in all."
        );
        let s = inspect(b"a\tb\n1\t2\n", "");
        assert_eq!(s.csv.unwrap().delimiter, '\t');
    }

    #[test]
    fn hostile_shapes_stay_bounded() {
        // Deep nesting stops the walker at the nesting limit.
        let deep = format!("[{}]", "[".repeat(MAX_NESTING + 10));
        let s = inspect(deep.as_bytes(), "");
        assert_eq!(s.invalid_json_at, Some(MAX_NESTING as u64));
        // Thousands of distinct keys: the listed fields and the remembered
        // overflow stay bounded.
        let wide = format!(
            "[{{{}}}]",
            (0..20_000)
                .map(|i| format!("\"k{i}\":1"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let j = inspect(wide.as_bytes(), "").json.unwrap();
        assert_eq!(j.fields.len(), MAX_FIELDS);
        assert_eq!(j.more_fields, MAX_MORE as u64);
        // An unclosed quote does not become one giant record.
        let mut csv = b"a,b\n1,\"".to_vec();
        csv.extend(std::iter::repeat_n(b'x', MAX_RECORD_BYTES + 1_000_000));
        let c = inspect(&csv, "text/csv").csv.unwrap();
        assert!(c.stopped_at_oversized_record);
    }

    #[test]
    fn text_longest_line_and_samples() {
        let s = inspect("short\nthe longest line here\nmid line\n".as_bytes(), "");
        let t = s.text.as_ref().unwrap();
        assert_eq!((t.longest_line, t.longest_line_number), (21, 2));
        assert_eq!(
            t.sample_lines,
            vec!["short", "the longest line here", "mid line"]
        );
    }

    #[test]
    fn empty_one_huge_line_and_binary() {
        let s = inspect(b"", "");
        assert_eq!((s.detected_type.as_str(), s.line_count), ("text", 0));
        let huge = "z".repeat(3 << 20);
        let s = inspect(huge.as_bytes(), "");
        let t = s.text.unwrap();
        assert_eq!((t.longest_line, t.longest_line_number), (3 << 20, 1));
        assert!(t.sample_lines[0].chars().count() <= SAMPLE_CHARS + 1);
        let s = inspect(&[0u8, 1, 2, 255], "");
        assert_eq!(s.detected_type, "binary");
        assert!(
            s.summary.starts_with("Binary data, 4 bytes"),
            "{}",
            s.summary
        );
    }
}
