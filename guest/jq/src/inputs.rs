//! The input stream: the payloads, in order, parsed as JSON values or read as lines.
use crate::stream::{self, Found, Scanner};
use core::cell::RefCell;
use jaq_json::Val;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::rc::Rc;

/// Payloads up to this size are read whole and parsed from memory (about twice
/// as fast); larger ones are parsed as a stream through a buffered reader.
const READ_WHOLE_MAX: u64 = 64 << 20;
const BUF_SIZE: usize = 256 << 10;

#[derive(Clone, Copy)]
pub enum Mode {
    Json,
    Raw,
}

pub struct Payload {
    /// shown in error messages and by `input_filename`
    pub name: String,
    pub path: PathBuf,
}

/// A file name given on the command line: relative names are under /payloads.
pub fn resolve(file: &str) -> PathBuf {
    if file.starts_with('/') {
        PathBuf::from(file)
    } else {
        PathBuf::from(super::PAYLOADS_DIR).join(file)
    }
}

pub fn file_payload(file: &str) -> Result<Payload, String> {
    let path = resolve(file);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(Payload {
            name: file.to_string(),
            path,
        }),
        _ => Err(format!(
            "input file {file:?} not found under /payloads (the filter is the script, \
             not an argument; with no file arguments every payload is read)"
        )),
    }
}

/// The payloads listed in /spillway/payloads.json, in order.
pub fn read_payloads_json(path: &str) -> Result<Vec<Payload>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let list = jaq_json::read::parse_single(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let Val::Arr(items) = list else {
        return Err(format!("{path}: not a JSON array"));
    };
    let field = |item: &Val, key: &str| match item {
        Val::Obj(o) => match o.get(&Val::from(key.to_string())) {
            Some(Val::TStr(s) | Val::BStr(s)) => Some(String::from_utf8_lossy(s).into_owned()),
            _ => None,
        },
        _ => None,
    };
    let file = path;
    items
        .iter()
        .map(|item| {
            let name = field(item, "name").or_else(|| field(item, "id"));
            let path = field(item, "path");
            match (name, path) {
                (Some(name), Some(path)) => Ok(Payload {
                    name,
                    path: path.into(),
                }),
                (Some(name), None) => Ok(Payload {
                    path: resolve(&name),
                    name,
                }),
                (None, Some(path)) => Ok(Payload {
                    name: path.clone(),
                    path: path.into(),
                }),
                (None, None) => Err(format!("{file}: an entry has neither name nor path")),
            }
        })
        .collect()
}

/// One input: a value, or (when the filter runs per element) a top-level
/// array left unparsed.
pub enum Input {
    Val(Val),
    Array(ArrayInput),
}

/// A top-level array, and what to say if it turns out not to parse.
pub struct ArrayInput {
    pub array: stream::Array,
    name: String,
}

impl ArrayInput {
    /// jaq's own message for the invalid JSON from this array on.
    pub fn error(&self) -> String {
        let buf = self.array.buf().clone();
        match SliceVals::new(buf, self.array.start, self.name.clone()).next() {
            Some(Err(e)) => e,
            // the scan and jaq's parser disagree on validity: never seen; say what is known
            _ => format!(
                "payload {}: invalid JSON in the array at byte offset {}",
                self.name, self.array.start
            ),
        }
    }
}

impl Input {
    /// The input as one value, parsing an array whole.
    pub fn into_val(self) -> Result<Val, String> {
        match self {
            Input::Val(v) => Ok(v),
            Input::Array(a) => a.array.parse().map_err(|()| a.error()),
        }
    }
}

type Vals = Box<dyn Iterator<Item = Result<Input, String>>>;

/// The stream of input values over all payloads.
pub struct PayloadInputs<'a> {
    payloads: std::vec::IntoIter<Payload>,
    mode: Mode,
    slurp: bool,
    /// top-level arrays (of payloads read whole) come as [`Input::Array`]
    arrays: bool,
    filename: &'a RefCell<Val>,
    cur: Option<Vals>,
}

impl<'a> PayloadInputs<'a> {
    pub fn new(
        payloads: Vec<Payload>,
        mode: Mode,
        slurp: bool,
        arrays: bool,
        filename: &'a RefCell<Val>,
    ) -> Self {
        let payloads = payloads.into_iter();
        Self {
            payloads,
            mode,
            slurp,
            arrays: arrays && !slurp && matches!(mode, Mode::Json),
            filename,
            cur: None,
        }
    }

    /// The next input: with `arrays`, a top-level array is left unparsed.
    pub fn next_input(&mut self) -> Option<Result<Input, String>> {
        if self.slurp {
            self.slurp = false;
            let v = self.slurped();
            // a slurped stream has exactly one value
            self.payloads = Vec::new().into_iter();
            self.cur = None;
            return Some(v.map(Input::Val));
        }
        self.next_value()
    }

    /// No more inputs: after bad input there is no resynchronisation.
    pub fn stop(&mut self) {
        self.cur = None;
        self.payloads = Vec::new().into_iter();
    }

    /// The next value of the (unslurped) stream.
    fn next_value(&mut self) -> Option<Result<Input, String>> {
        loop {
            if let Some(cur) = &mut self.cur {
                match cur.next() {
                    Some(Err(e)) => {
                        self.stop();
                        return Some(Err(e));
                    }
                    Some(v) => return Some(v),
                    None => self.cur = None,
                }
            }
            let p = self.payloads.next()?;
            *self.filename.borrow_mut() = Val::from(p.name.clone());
            match open(&p, self.mode, self.arrays) {
                Ok(vals) => self.cur = Some(vals),
                Err(e) => {
                    self.stop();
                    return Some(Err(e));
                }
            }
        }
    }

    fn slurped(&mut self) -> Result<Val, String> {
        match self.mode {
            Mode::Json => core::iter::from_fn(|| self.next_value())
                .map(|r| r.and_then(Input::into_val))
                .collect(),
            Mode::Raw => {
                let mut all = Vec::new();
                for p in self.payloads.by_ref() {
                    let mut f = File::open(&p.path).map_err(|e| open_error(&p, e))?;
                    f.read_to_end(&mut all).map_err(|e| read_error(&p, e))?;
                }
                Ok(Val::utf8_str(all))
            }
        }
    }
}

impl Iterator for PayloadInputs<'_> {
    type Item = Result<Val, String>;

    fn next(&mut self) -> Option<Self::Item> {
        let v = self.next_input()?.and_then(Input::into_val);
        if v.is_err() {
            // an array that did not parse: like any bad input, the end
            self.stop();
        }
        Some(v)
    }
}

/// The stream as `input` and `inputs` read it (whole values), while the
/// main loop reads the same stream through [`PayloadInputs::next_input`].
pub struct Shared<'s, 'a>(pub &'s RefCell<PayloadInputs<'a>>);

impl Iterator for Shared<'_, '_> {
    type Item = Result<Val, String>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.borrow_mut().next()
    }
}

fn open_error(p: &Payload, e: std::io::Error) -> String {
    format!("cannot open payload {} ({}): {e}", p.name, p.path.display())
}

fn read_error(p: &Payload, e: std::io::Error) -> String {
    format!("cannot read payload {}: {e}", p.name)
}

fn open(p: &Payload, mode: Mode, arrays: bool) -> Result<Vals, String> {
    let f = File::open(&p.path).map_err(|e| open_error(p, e))?;
    let name = p.name.clone();
    let vals: Box<dyn Iterator<Item = Result<Val, String>>> = match mode {
        Mode::Raw => Box::new(Lines {
            r: BufReader::with_capacity(BUF_SIZE, f),
            name,
        }),
        Mode::Json => {
            let size = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            if size <= READ_WHOLE_MAX {
                let mut buf = Vec::with_capacity(size as usize);
                let mut f = f;
                f.read_to_end(&mut buf).map_err(|e| read_error(p, e))?;
                let buf = Rc::new(buf);
                if arrays {
                    return Ok(Box::new(ScannedVals {
                        scan: Scanner::new(buf),
                        parser: None,
                        name,
                    }));
                }
                Box::new(SliceVals::new(buf, 0, name))
            } else {
                let r = BufReader::with_capacity(BUF_SIZE, f);
                let vals = jaq_json::read::read_many(r);
                Box::new(
                    vals.map(move |r| r.map_err(|e| format!("payload {name}: invalid JSON: {e}"))),
                )
            }
        }
    };
    Ok(Box::new(vals.map(|r| r.map(Input::Val))))
}

/// A payload's values found by [`Scanner`], its top-level arrays left
/// unparsed; from the first thing the scan does not recognise on, jaq's
/// parser reads the rest.
struct ScannedVals {
    scan: Scanner,
    parser: Option<SliceVals>,
    name: String,
}

impl Iterator for ScannedVals {
    type Item = Result<Input, String>;
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(parser) = &mut self.parser {
            return parser.next().map(|r| r.map(Input::Val));
        }
        let buf = self.scan.buf().clone();
        let from = match self.scan.next_found() {
            Found::End => return None,
            Found::Array(array) => {
                let name = self.name.clone();
                return Some(Ok(Input::Array(ArrayInput { array, name })));
            }
            Found::Value(at) => match jaq_json::read::parse_single(&buf[at.clone()]) {
                Ok(v) => return Some(Ok(Input::Val(v))),
                Err(_) => at.start,
            },
            Found::Unknown(at) => at,
        };
        self.parser = Some(SliceVals::new(buf, from, self.name.clone()));
        self.next()
    }
}

/// `-R`: every line, without its `\n`, is a string.
struct Lines {
    r: BufReader<File>,
    name: String,
}

impl Iterator for Lines {
    type Item = Result<Val, String>;
    fn next(&mut self) -> Option<Self::Item> {
        let mut line = Vec::new();
        match self.r.read_until(b'\n', &mut line) {
            Ok(0) => None,
            Ok(_) => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                Some(Ok(Val::utf8_str(line)))
            }
            Err(e) => Some(Err(format!("cannot read payload {}: {e}", self.name))),
        }
    }
}

/// JSON values parsed from a shared buffer, from `start` on.
struct SliceVals {
    /// borrows `buf`: dropped first (see `drop`)
    iter: Option<Box<dyn Iterator<Item = Result<Val, jaq_json::read::Error>>>>,
    buf: Rc<Vec<u8>>,
    start: usize,
    name: String,
}

impl SliceVals {
    fn new(buf: Rc<Vec<u8>>, start: usize, name: String) -> Self {
        let rest: *const [u8] = &buf[start..];
        // SAFETY: the bytes live in the `Vec` that `buf` keeps alive until
        // `drop`, which drops `iter` first; nothing mutates them (the `Rc`
        // is never unwrapped); the values the parser yields own their data
        // and never borrow from `buf`.
        let slice: &'static [u8] = unsafe { &*rest };
        let iter = Box::new(jaq_json::read::parse_many(slice));
        Self {
            iter: Some(iter),
            buf,
            start,
            name,
        }
    }

    fn describe(&self, e: jaq_json::read::Error) -> String {
        // "byte offset N: ..." (N from `start`) -> the offset in the payload,
        // and its line and column, helpful for NDJSON
        let msg = e.to_string();
        let parsed = msg.strip_prefix("byte offset ").and_then(|s| {
            let (n, rest) = s.split_once(':')?;
            Some((n.parse::<usize>().ok()? + self.start, rest))
        });
        let buf: &[u8] = &self.buf;
        match parsed {
            Some((o, rest)) if o <= buf.len() => {
                let before = &buf[..o];
                let line = before.iter().filter(|c| **c == b'\n').count() + 1;
                let col = o - before
                    .iter()
                    .rposition(|c| *c == b'\n')
                    .map_or(0, |i| i + 1)
                    + 1;
                format!(
                    "payload {}: invalid JSON at byte offset {o}:{rest} (line {line}, column {col})",
                    self.name
                )
            }
            _ => format!("payload {}: invalid JSON at {msg}", self.name),
        }
    }
}

impl Iterator for SliceVals {
    type Item = Result<Val, String>;
    fn next(&mut self) -> Option<Self::Item> {
        match self.iter.as_mut()?.next()? {
            Ok(v) => Some(Ok(v)),
            Err(e) => {
                let e = self.describe(e);
                self.iter = None;
                Some(Err(e))
            }
        }
    }
}

impl Drop for SliceVals {
    fn drop(&mut self) {
        // before `buf`, which it borrows
        self.iter = None;
    }
}
