//! Text helpers for notices, previews and structures: numbers in words
//! (grouped digits, counted nouns), content-type essences, and cuts that
//! keep a head and a tail without splitting a character. A leaf: depends on
//! nothing else in the crate.

/// `1 line`, `2 lines`, with grouped digits.
pub fn count_of(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", group(n))
    }
}

/// `48210` → `48 210`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// A content type's essence: its media type without parameters, in lower
/// case (`Application/JSON; charset=utf-8` is `application/json`).
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The value that `s` names in `names`; or, for the setting `what`, an
/// error that lists the names (`what "x" is not one of a, b`).
pub fn one_of<T: Copy>(what: &str, s: &str, names: &[(&str, T)]) -> Result<T, String> {
    match names.iter().find(|(name, _)| *name == s) {
        Some((_, value)) => Ok(*value),
        None => {
            let all: Vec<&str> = names.iter().map(|(name, _)| *name).collect();
            Err(format!("{what} {s:?} is not one of {}", all.join(", ")))
        }
    }
}

/// A head and a tail with the count of chars between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut<'a> {
    /// The start.
    pub head: &'a str,
    /// The end.
    pub tail: &'a str,
    /// Chars left out between them.
    pub omitted: u64,
}

/// The first `n` chars.
pub fn head_chars(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// The last `n` chars.
pub fn tail_chars(text: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    match text.char_indices().rev().nth(n - 1) {
        Some((i, _)) => &text[i..],
        None => text,
    }
}

/// Chars (Unicode scalars) in `s`, counted a word at a time.
pub fn count_chars(s: &str) -> u64 {
    bytecount::num_chars(s.as_bytes()) as u64
}

/// TrueForge's edges: the first and last `n` chars; whole when the text has
/// `2n` chars or fewer.
pub fn cut_edges(text: &str, n: usize) -> Option<Cut<'_>> {
    let total = count_chars(text);
    if total <= 2 * n as u64 {
        return None;
    }
    Some(Cut {
        head: head_chars(text, n),
        tail: tail_chars(text, n),
        omitted: total - 2 * n as u64,
    })
}

/// ChatCLI's lines cut: a head of `head` chars cut back to its last newline
/// when that newline lies past half of the head, and a tail of `tail` chars
/// that starts after its first newline when that newline lies within the
/// first half of the tail. Whole when the text is no longer than
/// `head + tail + 100`.
pub fn cut_lines(text: &str, head: usize, tail: usize) -> Option<Cut<'_>> {
    let total = count_chars(text);
    if total <= (head + tail + 100) as u64 {
        return None;
    }
    let mut h = head_chars(text, head);
    if let Some(nl) = h.rfind('\n')
        && count_chars(&h[..nl]) > (head / 2) as u64
    {
        h = &h[..nl];
    }
    let mut t = tail_chars(text, tail);
    if let Some(nl) = t.find('\n')
        && count_chars(&t[..nl]) < (tail / 2) as u64
    {
        t = &t[nl + 1..];
    }
    Some(Cut {
        head: h,
        tail: t,
        omitted: total - count_chars(h) - count_chars(t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits_with_spaces() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(48_210), "48 210");
        assert_eq!(group(1_234_567), "1 234 567");
    }

    #[test]
    fn one_is_singular_and_others_are_plural_with_grouped_digits() {
        assert_eq!(count_of(1, "line"), "1 line");
        assert_eq!(count_of(0, "line"), "0 lines");
        assert_eq!(count_of(48_210, "byte"), "48 210 bytes");
    }

    /// The default lines cut: a 4000-char head and a 1000-char tail.
    fn lines_cut(text: &str) -> Cut<'_> {
        cut_lines(text, 4000, 1000).unwrap()
    }

    #[test]
    fn edges_keep_short_content_whole_and_cut_long_content() {
        assert_eq!(cut_edges(&"a".repeat(200), 100), None);
        let text = format!("{}{}{}", "h".repeat(100), "m".repeat(50), "t".repeat(100));
        let c = cut_edges(&text, 100).unwrap();
        assert_eq!(
            (c.head, c.tail, c.omitted),
            ("h".repeat(100).as_str(), "t".repeat(100).as_str(), 50)
        );
    }

    #[test]
    fn lines_keep_content_up_to_head_plus_tail_plus_100_whole() {
        assert_eq!(cut_lines(&"x".repeat(5100), 4000, 1000), None);
        assert!(cut_lines(&"x".repeat(5101), 4000, 1000).is_some());
    }

    #[test]
    fn lines_head_cuts_back_to_a_newline_past_half() {
        // Newline at char 3000 (past 2000): head ends there.
        let text = format!("{}\n{}", "a".repeat(3000), "b".repeat(10_000));
        let c = lines_cut(&text);
        assert_eq!(c.head, "a".repeat(3000));
        // Newline at char 1000 (not past half): head keeps 4000 chars.
        let text = format!("{}\n{}", "a".repeat(1000), "b".repeat(10_000));
        assert_eq!(count_chars(lines_cut(&text).head), 4000);
    }

    #[test]
    fn lines_tail_starts_after_a_newline_in_its_first_half() {
        let text = format!("{}\n{}", "a".repeat(10_000), "z".repeat(700));
        // The tail's first 1000 chars hold a newline at 299 (< 500).
        let c = lines_cut(&text);
        assert_eq!(c.tail, "z".repeat(700));
        let text = format!("{}\n{}", "a".repeat(10_000), "z".repeat(300));
        // Newline at 699 in the tail (not in the first half): tail kept whole.
        assert_eq!(count_chars(lines_cut(&text).tail), 1000);
    }

    #[test]
    fn omitted_counts_add_up() {
        let text = "line of text\n".repeat(2000);
        let c = lines_cut(&text);
        assert_eq!(
            count_chars(c.head) + count_chars(c.tail) + c.omitted,
            count_chars(&text)
        );
    }

    #[test]
    fn multibyte_text_is_never_split_at_any_cut_point() {
        for unit in ["é", "世", "🌍", "a🌍é世\n"] {
            let text = unit.repeat(3000);
            for n in [1usize, 2, 3, 7, 99, 100] {
                if let Some(c) = cut_edges(&text, n) {
                    assert_eq!(count_chars(c.head), n as u64);
                    assert_eq!(count_chars(c.tail), n as u64);
                }
                if let Some(c) = cut_lines(&text, n * 10, n * 3) {
                    // Slices of a &str are valid UTF-8 by construction; check
                    // that the counts still reconcile.
                    assert_eq!(
                        count_chars(c.head) + count_chars(c.tail) + c.omitted,
                        count_chars(&text),
                        "{unit:?} {n}"
                    );
                }
            }
        }
    }
}
