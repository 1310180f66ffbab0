//! `.[] | f` over a top-level array, one element at a time.
//!
//! jq parses each input value whole before the filter sees it, so
//! `.[] | .user` over a 35 MB array first builds every record of the array
//! as values, about ten times the payload's size. When the filter is
//! `.[] | f` (or `.[]`), [`Scanner`] finds each top-level array's elements
//! by structure alone (strings, brackets, commas, `#` comments), and the
//! caller parses one element and runs `f` on it before the next: memory
//! stays near the payload's own size.
//!
//! The answer stays jq's:
//! - the elements are the values jq's `.[]` yields, in order, and each is
//!   parsed by jaq's own parser (`parse_single` on the element's bytes);
//! - an element that does not parse, or a structure the scan does not
//!   recognise, is handed to jaq's whole-value parser from that value on
//!   (`inputs::SliceVals`), so invalid JSON is reported with jq's message
//!   and position;
//! - the caller holds an array's outputs until every element has parsed,
//!   because jq, having parsed the array first, prints nothing for an
//!   invalid one (`main.rs`).
use jaq_json::Val;
use std::rc::Rc;

/// Whitespace between JSON tokens, as jaq's lexer reads it (`#` starts a
/// comment, which is whitespace too).
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// `Some(f)` when `code` is `.[] | f` or `.[]`: `code` with its leading
/// `.[]` written as `.  `, the same length, so positions in compile errors
/// and `$__loc__` are unchanged, and `. | f` is `f`. `|` binds loosest, so
/// a leading `.[] |` always pipes into the whole rest of the filter.
pub fn per_element(code: &str) -> Option<String> {
    let lead = code.len()
        - code
            .trim_start_matches(|c: char| c.is_ascii() && is_space(c as u8))
            .len();
    let after = code[lead..].strip_prefix(".[]")?;
    let next = after.trim_start_matches(|c: char| c.is_ascii() && is_space(c as u8));
    let pipes = next.starts_with('|') && !next.starts_with("|=");
    if !(pipes || next.is_empty()) {
        return None;
    }
    Some(format!("{}.  {after}", &code[..lead]))
}

/// The index of the first byte at or after `i` that is not whitespace or
/// inside a comment.
fn skip_space(buf: &[u8], mut i: usize) -> usize {
    while let Some(&c) = buf.get(i) {
        if is_space(c) {
            i += 1;
        } else if c == b'#' {
            i = line_end(buf, i);
        } else {
            break;
        }
    }
    i
}

/// The index of the `\n` ending the line `i` is on (or the end).
fn line_end(buf: &[u8], i: usize) -> usize {
    buf[i..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(buf.len(), |n| i + n)
}

/// The index just past the string whose `"` is at `open`; `None` if it is
/// not closed.
fn string_end(buf: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        let n = buf
            .get(i..)?
            .iter()
            .position(|&c| c == b'"' || c == b'\\')?;
        i += n;
        if buf[i] == b'"' {
            return Some(i + 1);
        }
        // a backslash: the next byte is escaped, whatever it is
        i += 2;
    }
}

/// The index just past the bracket closing the one at `open` (`[` or `{`),
/// found by structure. With `elems`, the span of each element of the
/// array (the bytes between its commas, whitespace included) is pushed.
/// `None` when the structure does not close: the caller lets jaq's parser
/// say why.
fn close(buf: &[u8], open: usize, mut elems: Option<&mut Vec<(u32, u32)>>) -> Option<usize> {
    let closer = if buf[open] == b'[' { b']' } else { b'}' };
    let mut depth = 0usize;
    let mut i = open + 1;
    let mut from = i;
    let mut commas = false;
    let push = |elems: &mut Option<&mut Vec<(u32, u32)>>, from: usize, to: usize| {
        if let Some(elems) = elems {
            elems.push((u32::try_from(from).ok()?, u32::try_from(to).ok()?));
        }
        Some(())
    };
    while let Some(&c) = buf.get(i) {
        match c {
            b'"' => i = string_end(buf, i)?,
            b'#' => i = line_end(buf, i),
            b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            b']' | b'}' if depth > 0 => {
                depth -= 1;
                i += 1;
            }
            b']' | b'}' => {
                if c != closer {
                    return None;
                }
                // `[]` and `[ ]` have no element; `[1,]` has an empty last one (invalid)
                if commas || skip_space(buf, from) < i {
                    push(&mut elems, from, i)?;
                }
                return Some(i + 1);
            }
            b',' if depth == 0 => {
                push(&mut elems, from, i)?;
                commas = true;
                i += 1;
                from = i;
            }
            _ => i += 1,
        }
    }
    None
}

/// A byte that ends a bare scalar (number, `true`, `null`, ...).
fn ends_scalar(c: u8) -> bool {
    is_space(c) || matches!(c, b'[' | b']' | b'{' | b'}' | b',' | b':' | b'"' | b'#')
}

/// A top-level array of a payload, with its elements' spans.
pub struct Array {
    buf: Rc<Vec<u8>>,
    /// where its `[` is, and just past its `]`
    pub start: usize,
    pub end: usize,
    elems: Vec<(u32, u32)>,
}

impl Array {
    /// Each element, parsed; `Err(())` for one that does not parse (the
    /// caller asks jaq's whole-value parser for the message).
    pub fn elements(&self) -> impl Iterator<Item = Result<Val, ()>> + '_ {
        self.elements_from(0)
    }

    /// [`Array::elements`] after the first `skip`, which are not parsed
    /// (`elements().skip(n)` would parse each skipped one).
    pub fn elements_from(&self, skip: usize) -> impl Iterator<Item = Result<Val, ()>> + '_ {
        let rest = self.elems.get(skip..).unwrap_or_default();
        rest.iter().map(|&(from, to)| {
            jaq_json::read::parse_single(&self.buf[from as usize..to as usize]).map_err(|_| ())
        })
    }

    /// The payload's bytes the array is in.
    pub fn buf(&self) -> &Rc<Vec<u8>> {
        &self.buf
    }

    /// The whole array as one value (for `input` and `inputs`), or `Err(())`
    /// as for [`Array::elements`].
    pub fn parse(&self) -> Result<Val, ()> {
        jaq_json::read::parse_single(&self.buf[self.start..self.end]).map_err(|_| ())
    }
}

/// What the scan found next.
pub enum Found {
    /// a top-level array
    Array(Array),
    /// another value, at these bytes
    Value(std::ops::Range<usize>),
    /// nothing but whitespace is left
    End,
    /// something the scan does not recognise, at this index: jaq's parser
    /// takes over from there
    Unknown(usize),
}

/// The top-level values of one payload, found by structure.
pub struct Scanner {
    buf: Rc<Vec<u8>>,
    pos: usize,
}

impl Scanner {
    pub fn new(buf: Rc<Vec<u8>>) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn buf(&self) -> &Rc<Vec<u8>> {
        &self.buf
    }

    pub fn next_found(&mut self) -> Found {
        let buf = &self.buf[..];
        let i = skip_space(buf, self.pos);
        let Some(&c) = buf.get(i) else {
            self.pos = i;
            return Found::End;
        };
        let end = match c {
            b'[' => {
                let mut elems = Vec::new();
                let Some(end) = close(buf, i, Some(&mut elems)) else {
                    return Found::Unknown(i);
                };
                self.pos = end;
                return Found::Array(Array {
                    buf: self.buf.clone(),
                    start: i,
                    end,
                    elems,
                });
            }
            b'{' => close(buf, i, None),
            b'"' => string_end(buf, i),
            b'b' if buf.get(i + 1) == Some(&b'"') => string_end(buf, i + 1),
            _ => {
                let n = buf[i..].iter().position(|&c| ends_scalar(c));
                Some(n.map_or(buf.len(), |n| i + n)).filter(|&end| end > i)
            }
        };
        match end {
            Some(end) => {
                self.pos = end;
                Found::Value(i..end)
            }
            None => Found::Unknown(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_leading_iteration_piped_into_the_rest_is_per_element() {
        for (code, rest) in [
            (".[] | .user", Some(".   | .user")),
            ("  .[]|select(.a) , 1", Some("  .  |select(.a) , 1")),
            (".[]", Some(".  ")),
            ("\n.[] \n", Some("\n.   \n")),
            (".[] |= 1", None),
            (".[]? | .a", None),
            (".[] , 1", None),
            ("(.[] | .a)", None),
            (".[0] | .a", None),
            ("[.[] | .a]", None),
            (".[] as $x | $x", None),
            ("def f: 1; .[] | f", None),
        ] {
            assert_eq!(per_element(code).as_deref(), rest, "{code:?}");
            if let Some(rest) = rest {
                assert_eq!(rest.len(), code.len(), "{code:?}");
            }
        }
    }

    /// What jaq's whole-value parser makes of `text`, and what scanning and
    /// parsing element by element makes of it: the same values (an array's
    /// elements one by one), or both fail.
    fn both(text: &str) -> (Result<Vec<String>, ()>, Result<Vec<String>, ()>) {
        let whole: Result<Vec<String>, ()> = jaq_json::read::parse_many(text.as_bytes())
            .map(|v| {
                v.map(|v| match v {
                    Val::Arr(items) => items
                        .iter()
                        .map(|v| format!("{v}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    v => format!("{v}"),
                })
                .map_err(|_| ())
            })
            .collect();
        let mut scan = Scanner::new(Rc::new(text.as_bytes().to_vec()));
        let mut parts = Vec::new();
        let scanned = loop {
            match scan.next_found() {
                Found::End => break Ok(parts),
                Found::Array(a) => {
                    let elems: Result<Vec<String>, ()> =
                        a.elements().map(|v| v.map(|v| format!("{v}"))).collect();
                    match elems {
                        Ok(e) => parts.push(e.join(" ")),
                        Err(()) => break Err(()),
                    }
                }
                Found::Value(r) => match jaq_json::read::parse_single(&text.as_bytes()[r]) {
                    Ok(v) => parts.push(format!("{v}")),
                    Err(_) => break Err(()),
                },
                Found::Unknown(_) => break Err(()),
            }
        };
        (whole, scanned)
    }

    #[test]
    fn scanning_finds_the_values_and_elements_the_parser_finds() {
        for text in [
            "[1, 2, 3]",
            "[]",
            "[ ]",
            "[ # no element\n ]",
            "[[1,[2,3]],{\"a\":[4,{\"b\":5}]}]",
            r#"["a,b", "c]d", "e\"f,]", "\\", "\\\"", "x\\\\"]"#,
            "[{\"a\": \"}\"}, 2]\n[3]\n{\"b\": [4, 5]}\n6 \"s\" null true",
            "[1, # a comment, with ] and \" in it\n 2]",
            "[b\"by,tes\", 1]",
            "[-1.5e3, 0, Infinity, NaN, 12345678901234567890]",
            "{\"k\": \"[\"}",
        ] {
            let (whole, scanned) = both(text);
            assert!(whole.is_ok(), "{text:?} should be valid: {whole:?}");
            assert_eq!(whole, scanned, "{text:?}");
        }
    }

    #[test]
    fn what_the_parser_refuses_scanning_never_accepts() {
        for text in [
            "[1,]",
            "[,1]",
            "[1 2]",
            "[1,,2]",
            "[1, 2",
            "[1, \"unclosed]",
            "[{\"a\" 1}]",
            "[{\"a\": 1]}",
            "[1}",
            "[tru]",
            "[1] ]",
            "[\"\\",
        ] {
            let (whole, scanned) = both(text);
            assert!(whole.is_err(), "{text:?} should be invalid");
            assert!(scanned.is_err(), "{text:?} was accepted by the scan");
        }
    }

    #[test]
    fn an_unrecognised_shape_is_left_to_the_parser_where_it_starts() {
        let mut scan = Scanner::new(Rc::new(b"[1] , 2".to_vec()));
        assert!(matches!(scan.next_found(), Found::Array(_)));
        assert!(matches!(scan.next_found(), Found::Unknown(4)));
    }

    #[test]
    fn elements_from_gives_the_elements_after_the_skipped_ones() {
        let text = r#"[1, "a,]", {"b": [2, 3]}, null, [4]]"#;
        let mut scan = Scanner::new(Rc::new(text.as_bytes().to_vec()));
        let Found::Array(a) = scan.next_found() else {
            panic!("not scanned as an array")
        };
        let show = |it: &mut dyn Iterator<Item = Result<Val, ()>>| -> Vec<String> {
            it.map(|v| format!("{}", v.unwrap())).collect()
        };
        for skip in 0..=6 {
            let expected = show(&mut a.elements().skip(skip));
            assert_eq!(show(&mut a.elements_from(skip)), expected, "skip {skip}");
        }
        assert_eq!(show(&mut a.elements_from(3)), ["null", "[4]"]);
    }
}
