//! Previews for navigation, not summaries (behaviour.md §2): `edges`,
//! `lines` and `structured`. Every length is in chars (Unicode scalars) and
//! no cut splits a character. A cut preview of JSON says that it is cut, so
//! it is never mistaken for complete, valid JSON.

use std::fmt::Write as _;
use std::str::FromStr;

use crate::inspect::{Kind, Top, detect, scan_json};
use crate::text::{count_chars, count_of, cut_edges, cut_lines, group, head_chars};

/// Bytes of a JSON payload scanned for its record count and keys: the
/// scan is linear and the content is already in memory, so every result up
/// to the default stdout ceiling is counted exactly (as Inspect counts it);
/// past this, the count is a lower bound that names the counted prefix.
const JSON_SCAN_BYTES: usize = 64 << 20;

/// A preview style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Style {
    /// Head and tail plus a structure line (default).
    #[default]
    Structured,
    /// First and last N chars (TrueForge).
    Edges,
    /// A 4000-char head and a 1000-char tail cut at newlines (ChatCLI).
    Lines,
}

impl FromStr for Style {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let names = [
            ("structured", Style::Structured),
            ("edges", Style::Edges),
            ("lines", Style::Lines),
        ];
        crate::text::one_of("preview_style", s, &names)
    }
}

impl Style {
    /// The style's default total size in chars.
    pub fn default_chars(self) -> usize {
        match self {
            Style::Structured => 1500,
            Style::Edges => 200,
            Style::Lines => 5000,
        }
    }
}

/// A preview before the payload's handle is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The structure line (structured style only).
    pub structure: Option<String>,
    /// The whole text, or the head of a cut.
    pub head: String,
    /// `(omitted chars, tail)` when cut.
    pub tail: Option<(u64, String)>,
    /// What the content looks like.
    pub kind: Kind,
}

impl Preview {
    /// Renders the preview with the omission marker pointing at the payload.
    pub fn render(&self, path: &str, payload_id: &str) -> String {
        let mut out = String::new();
        if let Some(s) = &self.structure {
            out.push_str(s);
            out.push('\n');
        }
        out.push_str(&self.head);
        if let Some((omitted, tail)) = &self.tail {
            if !self.head.is_empty() && !self.head.ends_with('\n') {
                out.push('\n');
            }
            let _ = write!(out, "{}", marker(*omitted, path, payload_id));
            out.push('\n');
            out.push_str(tail.strip_suffix('\n').unwrap_or(tail));
            // NDJSON cut at line boundaries is still valid line by line.
            if matches!(self.kind, Kind::JsonArray | Kind::JsonObject) {
                out.push_str("\n(Cut excerpt: not valid JSON on its own.)");
            }
        }
        out
    }
}

/// The omission marker.
pub fn marker(omitted: u64, path: &str, payload_id: &str) -> String {
    format!(
        "[... {} chars omitted — full payload: {path} ({payload_id})]",
        group(omitted)
    )
}

/// Builds the preview of `content` in `style`, within `chars` total (the
/// style's default when `None`).
pub fn build(content: &[u8], content_type: &str, style: Style, chars: Option<usize>) -> Preview {
    let budget = chars.unwrap_or_else(|| style.default_chars()).max(2);
    let kind = detect(content, content_type);
    let Ok(text) = std::str::from_utf8(content) else {
        return Preview {
            structure: Some(format!(
                "Structure: binary data, {} bytes; no text preview.",
                group(content.len() as u64)
            )),
            head: String::new(),
            tail: None,
            kind: Kind::Binary,
        };
    };
    let (structure, cut) = match style {
        Style::Edges => (None, cut_edges(text, budget / 2)),
        Style::Lines => (None, cut_lines(text, budget * 4 / 5, budget / 5)),
        // The structure line counts against the budget, so a wide record's
        // key list cannot push the notice past its token bound.
        Style::Structured => {
            let line = structure_line(content, text, kind);
            let rest = budget.saturating_sub(line.chars().count()).max(budget / 2);
            (Some(line), cut_lines(text, rest * 2 / 3, rest / 3))
        }
    };
    match cut {
        None => Preview {
            structure,
            head: text.to_owned(),
            tail: None,
            kind,
        },
        Some(c) => Preview {
            structure,
            head: c.head.to_owned(),
            tail: Some((c.omitted, c.tail.to_owned())),
            kind,
        },
    }
}

fn structure_line(content: &[u8], text: &str, kind: Kind) -> String {
    let lines = line_count(content);
    let mut s = format!("Structure: {kind}");
    match kind {
        Kind::JsonArray | Kind::JsonObject => {
            if let Some(shape) = scan_json(content, JSON_SCAN_BYTES) {
                let at_least = if shape.exact { "" } else { "≥" };
                let what = match shape.top {
                    Top::Array => "records",
                    Top::Object => "top-level keys",
                };
                let _ = write!(s, " of {at_least}{} {what}", group(shape.count));
                if !shape.exact {
                    let _ = write!(s, " (counted in the first {} MiB)", JSON_SCAN_BYTES >> 20);
                }
                if !shape.keys.is_empty() {
                    let label = if shape.top == Top::Array {
                        "keys of the first records"
                    } else {
                        "keys"
                    };
                    let keys: Vec<&str> = shape.keys.iter().map(String::as_str).collect();
                    let _ = write!(s, "; {label}: {}", key_list(&keys));
                }
                if let Some(at) = shape.invalid_at {
                    let _ = write!(s, "; invalid JSON at byte {at}");
                }
            }
        }
        Kind::Ndjson => {
            let records = text.lines().filter(|l| !l.trim().is_empty()).count();
            let _ = write!(s, " of {} records", group(records as u64));
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(first) {
                let keys: Vec<&str> = map.keys().take(24).map(String::as_str).collect();
                let _ = write!(s, "; keys of the first record: {}", key_list(&keys));
            }
        }
        Kind::Csv | Kind::Tsv => {
            let header = text.lines().next().unwrap_or("");
            let _ = write!(
                s,
                " with {} data rows; header: {}",
                group(lines.saturating_sub(1)),
                head_chars(header, 300)
            );
        }
        _ => {}
    }
    let _ = write!(
        s,
        "; {}, {}.",
        count_of(lines, "line"),
        count_of(count_chars(text), "char")
    );
    s
}

/// Chars of key names listed in a structure line, so wide records do not
/// push a notice past its token budget.
const MAX_KEY_LIST_CHARS: usize = 120;

/// Keys, comma-separated, within [`MAX_KEY_LIST_CHARS`]; the rest counted.
fn key_list(keys: &[&str]) -> String {
    let mut out = String::new();
    for (i, k) in keys.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        if out.chars().count() + sep.len() + k.chars().count() > MAX_KEY_LIST_CHARS {
            let _ = write!(out, "{sep}… ({} more)", keys.len() - i);
            break;
        }
        out.push_str(sep);
        out.push_str(k);
    }
    out
}

fn line_count(content: &[u8]) -> u64 {
    let newlines = memchr::memchr_iter(b'\n', content).count() as u64;
    match content.last() {
        None => 0,
        Some(b'\n') => newlines,
        Some(_) => newlines + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_previews_stay_short_in_every_style() {
        for unit in ["é", "世", "🌍", "a🌍é世\n"] {
            let text = unit.repeat(3000);
            for style in [Style::Structured, Style::Edges, Style::Lines] {
                let p = build(text.as_bytes(), "", style, Some(50));
                let rendered = p.render("/payloads/x.txt", "pl_x");
                assert!(rendered.chars().count() < 600, "{style:?}");
            }
        }
    }

    #[test]
    fn structured_json_array_gives_count_and_keys_and_says_it_is_cut() {
        let json = crate::testing::json_array(500, |i| {
            format!("{{\"id\":{i},\"title\":\"pr {i}\",\"user\":{{\"login\":\"u\"}}}}")
        });
        let p = build(json.as_bytes(), "application/json", Style::Structured, None);
        let s = p.structure.clone().unwrap();
        assert!(
            s.starts_with(
                "Structure: JSON array of 500 records; keys of the first records: id, title, user"
            ),
            "{s}"
        );
        let r = p.render("/payloads/prs.json", "pl_1");
        assert!(
            r.contains("chars omitted — full payload: /payloads/prs.json (pl_1)]"),
            "{r}"
        );
        assert!(
            r.ends_with("(Cut excerpt: not valid JSON on its own.)"),
            "{r}"
        );
    }

    /// A 3 MB array used to be counted in its first 1 MiB only ("≥4 686
    /// records" where Inspect counted 37 243): a result in memory is
    /// counted whole, and only a bigger one gets a lower bound that names
    /// the prefix it counted.
    #[test]
    fn structured_large_arrays_are_counted_exactly_and_huge_ones_name_the_prefix() {
        let array = |n: u64, pad: usize| {
            crate::testing::json_array(n, |i| {
                format!("{{\"id\":{i},\"p\":\"{}\"}}", "x".repeat(pad))
            })
        };
        let json = array(37_243, 70);
        assert!(json.len() > 3 << 20);
        let s = build(json.as_bytes(), "", Style::Structured, None)
            .structure
            .unwrap();
        assert!(
            s.starts_with("Structure: JSON array of 37 243 records;"),
            "{s}"
        );
        let json = array(700_000, 90);
        assert!(json.len() > JSON_SCAN_BYTES);
        let s = build(json.as_bytes(), "", Style::Structured, None)
            .structure
            .unwrap();
        assert!(
            s.contains("of ≥") && s.contains("records (counted in the first 64 MiB)"),
            "{s}"
        );
    }

    #[test]
    fn structured_object_csv_and_binary() {
        let s = build(
            br#"{"total": 3, "items": [1,2,3]}"#,
            "",
            Style::Structured,
            None,
        )
        .structure
        .unwrap();
        assert!(
            s.contains("JSON object of 2 top-level keys; keys: total, items"),
            "{s}"
        );
        let s = build(b"id,name\n1,a\n2,b\n", "", Style::Structured, None)
            .structure
            .unwrap();
        assert!(s.contains("CSV with 2 data rows; header: id,name"), "{s}");
        let p = build(&[0u8, 159, 146, 150], "", Style::Structured, None);
        assert!(p.render("/p", "pl").contains("binary data, 4 bytes"));
    }
}
