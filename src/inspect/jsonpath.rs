//! The JSON path of a byte offset inside one JSON document, found by a
//! single forward scan that never parses values. Search uses it to say
//! where a match sits in a minified document (`.[3812].user.login`), so the
//! model can hand the path to jq instead of reading megabytes around it.
//!
//! The tracker only moves forward: several matches in one line are
//! located in one pass over the line, so the cost is linear in the bytes up
//! to the last match.

/// Nesting deeper than this stops the tracker (no path is given).
const MAX_DEPTH: usize = 256;
/// Longest key kept; longer keys are cut with `…`.
const MAX_KEY_BYTES: usize = 64;
/// Longest path rendered; a longer one is cut at the front with `…`.
const MAX_PATH_CHARS: usize = 200;

#[derive(Debug, Clone)]
enum Frame {
    /// Index of the current element.
    Array(u64),
    /// The current key (once read), and whether a key comes next.
    Object {
        key: Option<String>,
        expect_key: bool,
    },
}

/// A forward-only scanner over one JSON document.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    stack: Vec<Frame>,
    pos: usize,
    in_string: bool,
    escaped: bool,
    key: Option<Vec<u8>>,
    broken: bool,
}

impl Tracker {
    /// A tracker at the start of a document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `bytes` starts (after whitespace) like a JSON container.
    pub fn applies(bytes: &[u8]) -> bool {
        matches!(
            bytes.iter().find(|b| !b.is_ascii_whitespace()),
            Some(b'[' | b'{')
        )
    }

    /// The path (jq syntax) of the innermost value that holds byte `at` of
    /// `doc`; `None` when the nesting is too deep or `at` is behind a
    /// position already passed. `doc` must be the same document on every
    /// call.
    pub fn path_at(&mut self, doc: &[u8], at: usize) -> Option<String> {
        if at < self.pos || self.broken {
            return None;
        }
        let end = at.min(doc.len());
        for &b in &doc[self.pos..end] {
            self.step(b);
            if self.broken {
                return None;
            }
        }
        self.pos = end;
        Some(self.render())
    }

    /// Feeds the next bytes of a document read in pieces (a file that
    /// spans lines); `false` once the tracker has given up.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if self.broken {
                return false;
            }
            self.step(b);
        }
        self.pos += bytes.len();
        !self.broken
    }

    /// The path at the position fed so far; `None` once given up.
    pub fn path(&self) -> Option<String> {
        (!self.broken).then(|| self.render())
    }

    /// Whether every container opened so far has closed again (a document
    /// fed whole is then complete).
    pub fn is_closed(&self) -> bool {
        self.stack.is_empty() && !self.in_string
    }

    fn step(&mut self, b: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
                return;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(k) = self.key.take()
                    && let Some(Frame::Object { key, .. }) = self.stack.last_mut()
                {
                    *key = Some(cut_key(&k));
                }
                return;
            }
            if let Some(k) = &mut self.key
                && k.len() <= MAX_KEY_BYTES
            {
                k.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if let Some(Frame::Object {
                    expect_key: true, ..
                }) = self.stack.last()
                {
                    self.key = Some(Vec::new());
                }
            }
            b'{' | b'[' => {
                if self.stack.len() >= MAX_DEPTH {
                    self.broken = true;
                    return;
                }
                self.stack.push(if b == b'{' {
                    Frame::Object {
                        key: None,
                        expect_key: true,
                    }
                } else {
                    Frame::Array(0)
                });
            }
            b'}' | b']' => {
                self.stack.pop();
            }
            b',' => match self.stack.last_mut() {
                Some(Frame::Array(i)) => *i += 1,
                Some(Frame::Object { key, expect_key }) => {
                    *key = None;
                    *expect_key = true;
                }
                None => {}
            },
            b':' => {
                if let Some(Frame::Object { expect_key, .. }) = self.stack.last_mut() {
                    *expect_key = false;
                }
            }
            _ => {}
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.stack {
            match f {
                Frame::Array(i) => {
                    if out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(&format!("[{i}]"));
                }
                Frame::Object { key: Some(k), .. } => {
                    if is_ident(k) {
                        out.push('.');
                        out.push_str(k);
                    } else {
                        if out.is_empty() {
                            out.push('.');
                        }
                        out.push('[');
                        out.push_str(&serde_json::to_string(k).unwrap_or_default());
                        out.push(']');
                    }
                }
                Frame::Object { key: None, .. } => {}
            }
        }
        if out.is_empty() {
            return ".".into();
        }
        let chars = out.chars().count();
        if chars > MAX_PATH_CHARS {
            let tail: String = out.chars().skip(chars - MAX_PATH_CHARS).collect();
            return format!("…{tail}");
        }
        out
    }
}

fn is_ident(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn cut_key(k: &[u8]) -> String {
    let text = String::from_utf8_lossy(k);
    if k.len() <= MAX_KEY_BYTES {
        return text.into_owned();
    }
    let mut out: String = text.chars().take(MAX_KEY_BYTES / 2).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(doc: &str, needle: &str) -> String {
        let at = doc.find(needle).unwrap();
        Tracker::new().path_at(doc.as_bytes(), at).unwrap()
    }

    #[test]
    fn paths_name_array_indexes_and_keys_in_jq_syntax() {
        let doc = r#"[{"id":1,"user":{"login":"a"}},{"id":2,"user":{"login":"bob"}}]"#;
        assert_eq!(path(doc, "\"bob\""), ".[1].user.login");
        assert_eq!(path(doc, "2,"), ".[1].id");
        let obj = r#"{"items":[{"a b":[0,1,"x"]}]}"#;
        assert_eq!(path(obj, "\"x\""), r#".items[0]["a b"][2]"#);
    }

    #[test]
    fn strings_with_brackets_commas_and_escapes_do_not_confuse_the_scan() {
        let doc = r#"[{"t":"a,[}\"{,"},{"t":"needle"}]"#;
        assert_eq!(path(doc, "needle"), ".[1].t");
    }

    #[test]
    fn one_tracker_locates_successive_offsets_in_one_pass() {
        let doc = r#"[{"k":"x"},{"k":"x"},{"k":"x"}]"#;
        let mut t = Tracker::new();
        let found: Vec<String> = doc
            .match_indices("\"x\"")
            .map(|(at, _)| t.path_at(doc.as_bytes(), at).unwrap())
            .collect();
        assert_eq!(found, [".[0].k", ".[1].k", ".[2].k"]);
        assert_eq!(t.path_at(doc.as_bytes(), 0), None, "never moves backwards");
    }

    #[test]
    fn too_deep_nesting_gives_no_path() {
        let doc = format!(
            "{}x{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        let at = doc.find('x').unwrap();
        assert_eq!(Tracker::new().path_at(doc.as_bytes(), at), None);
        assert!(Tracker::applies(b"  [1]") && !Tracker::applies(b"x[1]"));
    }
}
