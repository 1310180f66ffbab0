//! The input stream: the payloads, in order, parsed as JSON values or read as lines.
use core::cell::RefCell;
use jaq_json::Val;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

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

type Vals = Box<dyn Iterator<Item = Result<Val, String>>>;

/// The stream of input values over all payloads.
pub struct PayloadInputs<'a> {
    payloads: std::vec::IntoIter<Payload>,
    mode: Mode,
    slurp: bool,
    filename: &'a RefCell<Val>,
    cur: Option<Vals>,
}

impl<'a> PayloadInputs<'a> {
    pub fn new(
        payloads: Vec<Payload>,
        mode: Mode,
        slurp: bool,
        filename: &'a RefCell<Val>,
    ) -> Self {
        let payloads = payloads.into_iter();
        Self {
            payloads,
            mode,
            slurp,
            filename,
            cur: None,
        }
    }

    /// The next value of the (unslurped) stream.
    fn next_value(&mut self) -> Option<Result<Val, String>> {
        loop {
            if let Some(cur) = &mut self.cur {
                match cur.next() {
                    Some(Err(e)) => {
                        // no resynchronisation after bad input: stop
                        self.cur = None;
                        self.payloads = Vec::new().into_iter();
                        return Some(Err(e));
                    }
                    Some(v) => return Some(v),
                    None => self.cur = None,
                }
            }
            let p = self.payloads.next()?;
            *self.filename.borrow_mut() = Val::from(p.name.clone());
            match open(&p, self.mode) {
                Ok(vals) => self.cur = Some(vals),
                Err(e) => {
                    self.payloads = Vec::new().into_iter();
                    return Some(Err(e));
                }
            }
        }
    }

    fn slurped(&mut self) -> Result<Val, String> {
        match self.mode {
            Mode::Json => core::iter::from_fn(|| self.next_value()).collect(),
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
        if self.slurp {
            self.slurp = false;
            let v = self.slurped();
            // a slurped stream has exactly one value
            self.payloads = Vec::new().into_iter();
            self.cur = None;
            return Some(v);
        }
        self.next_value()
    }
}

fn open_error(p: &Payload, e: std::io::Error) -> String {
    format!("cannot open payload {} ({}): {e}", p.name, p.path.display())
}

fn read_error(p: &Payload, e: std::io::Error) -> String {
    format!("cannot read payload {}: {e}", p.name)
}

fn open(p: &Payload, mode: Mode) -> Result<Vals, String> {
    let f = File::open(&p.path).map_err(|e| open_error(p, e))?;
    let name = p.name.clone();
    match mode {
        Mode::Raw => Ok(Box::new(Lines {
            r: BufReader::with_capacity(BUF_SIZE, f),
            name,
        })),
        Mode::Json => {
            let size = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            if size <= READ_WHOLE_MAX {
                let mut buf = Vec::with_capacity(size as usize);
                let mut f = f;
                f.read_to_end(&mut buf).map_err(|e| read_error(p, e))?;
                Ok(Box::new(SliceVals::new(buf, name)))
            } else {
                let r = BufReader::with_capacity(BUF_SIZE, f);
                let vals = jaq_json::read::read_many(r);
                Ok(Box::new(vals.map(move |r| {
                    r.map_err(|e| format!("payload {name}: invalid JSON: {e}"))
                })))
            }
        }
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

/// JSON values parsed from a buffer that this iterator owns.
struct SliceVals {
    /// owned; freed in `drop`, after `iter` (which borrows it)
    buf: *mut [u8],
    iter: Option<Box<dyn Iterator<Item = Result<Val, jaq_json::read::Error>>>>,
    name: String,
}

impl SliceVals {
    fn new(buf: Vec<u8>, name: String) -> Self {
        let buf: *mut [u8] = Box::into_raw(buf.into_boxed_slice());
        // SAFETY: `buf` lives until `drop`, which drops `iter` first; the values
        // the parser yields own their data and never borrow from `buf`.
        let slice: &'static [u8] = unsafe { &*buf };
        let iter = Box::new(jaq_json::read::parse_many(slice));
        Self {
            buf,
            iter: Some(iter),
            name,
        }
    }

    fn describe(&self, e: jaq_json::read::Error) -> String {
        // "byte offset N: ..." -> add the line and column, helpful for NDJSON
        let msg = e.to_string();
        let offset = msg
            .strip_prefix("byte offset ")
            .and_then(|s| s.split(':').next())
            .and_then(|n| n.parse::<usize>().ok());
        // SAFETY: see `new`
        let buf: &[u8] = unsafe { &*self.buf };
        let at = match offset {
            Some(o) if o <= buf.len() => {
                let before = &buf[..o];
                let line = before.iter().filter(|c| **c == b'\n').count() + 1;
                let col = o - before
                    .iter()
                    .rposition(|c| *c == b'\n')
                    .map_or(0, |i| i + 1)
                    + 1;
                format!(" (line {line}, column {col})")
            }
            _ => String::new(),
        };
        format!("payload {}: invalid JSON at {msg}{at}", self.name)
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
        self.iter = None;
        // SAFETY: allocated by `Box::into_raw` in `new`, freed exactly once, nothing borrows it now
        drop(unsafe { Box::from_raw(self.buf) });
    }
}
