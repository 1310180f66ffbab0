//! A bounded structural scan of JSON: counts the top-level elements of an
//! array (or keys of an object) and collects the keys of the first records,
//! reading at most a fixed prefix. A 500 MB array is never parsed whole to
//! write a preview: past the prefix, the count is a lower bound ("≥N").

/// Nesting deeper than this is reported as invalid rather than tracked.
const MAX_DEPTH: usize = 512;
/// Records whose keys are collected.
const SAMPLE_RECORDS: usize = 3;
/// Largest record parsed for its keys.
const MAX_SAMPLE_BYTES: usize = 256 * 1024;
/// Most keys reported.
const MAX_KEYS: usize = 24;
/// Chars kept of each reported key.
const MAX_KEY_CHARS: usize = 64;

fn cut_key(k: &str) -> String {
    if k.chars().count() <= MAX_KEY_CHARS {
        return k.to_owned();
    }
    let mut out: String = k.chars().take(MAX_KEY_CHARS).collect();
    out.push('…');
    out
}

/// The top-level shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Top {
    /// `[ … ]`.
    Array,
    /// `{ … }`.
    Object,
}

/// What the scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonShape {
    /// Array or object.
    pub top: Top,
    /// Elements (array) or keys (object) seen.
    pub count: u64,
    /// Whether the scan reached the closing bracket, so `count` is exact.
    pub exact: bool,
    /// Keys of the first records (array) or the top-level keys (object), in
    /// first-seen order.
    pub keys: Vec<String>,
    /// Byte offset of the first structural error seen, if any.
    pub invalid_at: Option<u64>,
}

/// Scans at most `limit` bytes of `content`. `None` when it does not start
/// with `[` or `{`.
pub fn scan(content: &[u8], limit: usize) -> Option<JsonShape> {
    let start = content.iter().position(|b| !b.is_ascii_whitespace())?;
    let top = match content[start] {
        b'[' => Top::Array,
        b'{' => Top::Object,
        _ => return None,
    };
    let bytes = &content[..content.len().min(limit)];
    let mut shape = JsonShape {
        top,
        count: 0,
        exact: false,
        keys: Vec::new(),
        invalid_at: None,
    };
    let mut stack: Vec<u8> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    // Array: start of the current top-level element, and whether one began.
    let mut element_start: Option<usize> = None;
    let mut sampled = 0usize;
    // Object: start of a top-level string that may be a key.
    let mut string_start = 0usize;
    let mut expect_key = top == Top::Object;
    let mut i = start;
    while i < bytes.len() {
        if in_string {
            let Some(close) = string_end(&bytes[i..], &mut escaped) else {
                break;
            };
            i += close;
            in_string = false;
            if top == Top::Object && stack.len() == 1 && expect_key {
                shape.count += 1;
                if shape.keys.len() < MAX_KEYS
                    && let Ok(k) = serde_json::from_slice::<String>(&bytes[string_start..=i])
                {
                    shape.keys.push(cut_key(&k));
                }
                expect_key = false;
            }
            i += 1;
            continue;
        }
        let b = bytes[i];
        match b {
            b'"' => {
                in_string = true;
                string_start = i;
                if top == Top::Array && stack.len() == 1 && element_start.is_none() {
                    element_start = Some(i);
                    shape.count += 1;
                }
            }
            b'[' | b'{' => {
                if top == Top::Array && stack.len() == 1 && element_start.is_none() {
                    element_start = Some(i);
                    shape.count += 1;
                }
                if stack.len() >= MAX_DEPTH {
                    shape.invalid_at = Some(i as u64);
                    return Some(shape);
                }
                stack.push(if b == b'[' { b']' } else { b'}' });
            }
            b']' | b'}' => {
                if stack.pop() != Some(b) {
                    shape.invalid_at = Some(i as u64);
                    return Some(shape);
                }
                if top == Top::Array && stack.len() == 1 {
                    sample(&mut shape, bytes, element_start, i + 1, &mut sampled);
                }
                if stack.is_empty() {
                    shape.exact = true;
                    if let Some(extra) =
                        bytes[i + 1..].iter().position(|b| !b.is_ascii_whitespace())
                        && bytes.len() == content.len()
                    {
                        shape.invalid_at = Some((i + 1 + extra) as u64);
                    }
                    return Some(shape);
                }
            }
            b',' if stack.len() == 1 => {
                if top == Top::Array {
                    element_start = None;
                } else {
                    expect_key = true;
                }
            }
            b if b.is_ascii_whitespace() || b == b':' => {}
            _ => {
                if top == Top::Array && stack.len() == 1 && element_start.is_none() {
                    element_start = Some(i);
                    shape.count += 1;
                }
            }
        }
        i += 1;
    }
    if bytes.len() == content.len() {
        // The whole content was read and the top level never closed.
        shape.invalid_at = Some(content.len() as u64);
    }
    Some(shape)
}

/// The index of the quote that closes a JSON string, given the bytes after
/// what was already read of it (`escape`: the last byte read was a
/// backslash, and is set again when `s` ends in one). `None` when the
/// string goes on past `s`.
pub fn string_end(s: &[u8], escape: &mut bool) -> Option<usize> {
    let mut i = 0;
    loop {
        if *escape {
            if i >= s.len() {
                return None;
            }
            *escape = false;
            i += 1;
            continue;
        }
        let j = i + memchr::memchr2(b'"', b'\\', &s[i..])?;
        if s[j] == b'"' {
            return Some(j);
        }
        *escape = true;
        i = j + 1;
    }
}

/// Collects the keys of a finished top-level record, for the first few.
fn sample(
    shape: &mut JsonShape,
    bytes: &[u8],
    start: Option<usize>,
    end: usize,
    sampled: &mut usize,
) {
    let Some(start) = start else { return };
    if *sampled >= SAMPLE_RECORDS || end - start > MAX_SAMPLE_BYTES || bytes[start] != b'{' {
        return;
    }
    *sampled += 1;
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(&bytes[start..end]) {
        for k in map.keys() {
            let k = cut_key(k);
            if shape.keys.len() < MAX_KEYS && !shape.keys.contains(&k) {
                shape.keys.push(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_array_records_exactly_when_the_end_is_read() {
        let s = scan(
            br#"[{"id":1,"t":"a]"},{"id":2,"u":[1,{"x":2}]}, 3, "s,t"]"#,
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            (s.top, s.count, s.exact, s.invalid_at),
            (Top::Array, 4, true, None)
        );
        assert_eq!(s.keys, vec!["id", "t", "u"]);
    }

    #[test]
    fn a_bounded_prefix_gives_a_lower_bound() {
        let big: String = crate::testing::json_array(10_000, |i| format!("{{\"id\":{i}}}"));
        let s = scan(big.as_bytes(), 4096).unwrap();
        assert!(!s.exact);
        assert!(s.count > 100 && s.count < 10_000, "{}", s.count);
        assert_eq!(s.invalid_at, None);
        let full = scan(big.as_bytes(), usize::MAX).unwrap();
        assert_eq!((full.count, full.exact), (10_000, true));
    }

    #[test]
    fn object_keys_are_the_top_level_ones() {
        let s = scan(
            br#"{"a": {"nested": 1}, "b\"q": [1,2], "c": "x:y"}"#,
            1 << 20,
        )
        .unwrap();
        assert_eq!(s.keys, vec!["a", "b\"q", "c"]);
        assert_eq!((s.count, s.exact), (3, true));
    }

    #[test]
    fn a_string_end_is_found_across_pieces() {
        let mut escape = false;
        assert_eq!(string_end(br#"a\"b\"#, &mut escape), None);
        assert!(escape);
        assert_eq!(string_end(br#""c" x"#, &mut escape), Some(2));
        assert!(!escape);
        assert_eq!(string_end(b"abc", &mut escape), None);
        assert!(!escape);
    }

    #[test]
    fn structural_errors_are_located() {
        assert_eq!(scan(b"[1, 2}", 100).unwrap().invalid_at, Some(5));
        assert_eq!(scan(b"[1, 2", 100).unwrap().invalid_at, Some(5));
        assert_eq!(scan(b"[1] x", 100).unwrap().invalid_at, Some(4));
        assert!(scan(b"hello", 100).is_none());
        assert_eq!(scan(b"[]", 100).unwrap().count, 0);
    }
}
