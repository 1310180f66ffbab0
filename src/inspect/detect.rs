//! Content-type detection from a bounded prefix: the one detector behind
//! offload previews, Inspect and history microcompaction.
//!
//! It looks at up to [`SNIFF_BYTES`] of the content (far more than the first
//! 200 chars, so a Python file that opens with `import` is still called
//! Python) plus the caller's content-type hint, and never parses more than
//! that prefix.

use std::fmt;

/// Most bytes the detector looks at.
pub const SNIFF_BYTES: usize = 16 * 1024;

/// A source language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Python.
    Python,
    /// Go.
    Go,
    /// Rust.
    Rust,
    /// JavaScript or TypeScript.
    JavaScript,
    /// Java.
    Java,
    /// C or C++.
    C,
    /// A shell script.
    Shell,
}

impl Lang {
    fn name(self) -> &'static str {
        match self {
            Lang::Python => "Python",
            Lang::Go => "Go",
            Lang::Rust => "Rust",
            Lang::JavaScript => "JavaScript",
            Lang::Java => "Java",
            Lang::C => "C/C++",
            Lang::Shell => "shell",
        }
    }
}

/// What the content looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A JSON object.
    JsonObject,
    /// A JSON array.
    JsonArray,
    /// Newline-delimited JSON.
    Ndjson,
    /// Comma-separated values.
    Csv,
    /// Tab-separated values.
    Tsv,
    /// XML.
    Xml,
    /// HTML.
    Html,
    /// Source code.
    Source(Lang),
    /// A unified diff.
    Diff,
    /// `git log` output.
    GitLog,
    /// Log lines with timestamps or levels.
    Log,
    /// Markdown.
    Markdown,
    /// Plain text.
    Text,
    /// Not text.
    Binary,
}

impl Kind {
    /// A short machine name (`json`, `ndjson`, `csv`, `python`, …).
    pub fn short(self) -> &'static str {
        match self {
            Kind::JsonObject | Kind::JsonArray => "json",
            Kind::Ndjson => "ndjson",
            Kind::Csv => "csv",
            Kind::Tsv => "tsv",
            Kind::Xml => "xml",
            Kind::Html => "html",
            Kind::Source(Lang::Python) => "python",
            Kind::Source(Lang::Go) => "go",
            Kind::Source(Lang::Rust) => "rust",
            Kind::Source(Lang::JavaScript) => "javascript",
            Kind::Source(Lang::Java) => "java",
            Kind::Source(Lang::C) => "c",
            Kind::Source(Lang::Shell) => "shell",
            Kind::Diff => "diff",
            Kind::GitLog => "git-log",
            Kind::Log => "log",
            Kind::Markdown => "markdown",
            Kind::Text => "text",
            Kind::Binary => "binary",
        }
    }

    /// Whether the content is JSON of some shape.
    pub fn is_json(self) -> bool {
        matches!(self, Kind::JsonObject | Kind::JsonArray | Kind::Ndjson)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::JsonObject => f.write_str("JSON object"),
            Kind::JsonArray => f.write_str("JSON array"),
            Kind::Ndjson => f.write_str("NDJSON"),
            Kind::Csv => f.write_str("CSV"),
            Kind::Tsv => f.write_str("TSV"),
            Kind::Xml => f.write_str("XML"),
            Kind::Html => f.write_str("HTML"),
            Kind::Source(l) => write!(f, "{} source", l.name()),
            Kind::Diff => f.write_str("diff"),
            Kind::GitLog => f.write_str("git log"),
            Kind::Log => f.write_str("log"),
            Kind::Markdown => f.write_str("Markdown"),
            Kind::Text => f.write_str("text"),
            Kind::Binary => f.write_str("binary data"),
        }
    }
}

/// Detects the kind of `content` (only its first `SNIFF_BYTES` are read),
/// using `content_type` as a hint where it is specific.
pub fn detect(content: &[u8], content_type: &str) -> Kind {
    let head = &content[..content.len().min(SNIFF_BYTES)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        // A prefix cut inside a character is still text.
        Err(e) if e.error_len().is_none() && head.len() == SNIFF_BYTES => {
            std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default()
        }
        Err(_) => return Kind::Binary,
    };
    if text.contains('\0') {
        return Kind::Binary;
    }
    if let Some(kind) = from_content_type(content_type, text) {
        return kind;
    }
    sniff(text)
}

fn from_content_type(content_type: &str, text: &str) -> Option<Kind> {
    let essence = crate::text::essence(content_type);
    Some(match essence.as_str() {
        "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonlines" => Kind::Ndjson,
        "application/json" => match text.trim_start().as_bytes().first() {
            Some(b'[') => Kind::JsonArray,
            Some(b'{') if looks_ndjson(text) => Kind::Ndjson,
            Some(b'{') => Kind::JsonObject,
            _ => return None,
        },
        "text/csv" => Kind::Csv,
        "text/tab-separated-values" => Kind::Tsv,
        "text/html" => Kind::Html,
        "application/xml" | "text/xml" => Kind::Xml,
        "text/markdown" => Kind::Markdown,
        "text/x-diff" | "text/x-patch" => Kind::Diff,
        "text/x-python" | "text/x-script.python" => Kind::Source(Lang::Python),
        "text/javascript" | "application/javascript" => Kind::Source(Lang::JavaScript),
        _ => return None,
    })
}

fn sniff(text: &str) -> Kind {
    let trimmed = text.trim_start();
    match trimmed.as_bytes().first() {
        Some(b'[') if plausible_json_start(trimmed) => return Kind::JsonArray,
        Some(b'{') if looks_ndjson(trimmed) => return Kind::Ndjson,
        Some(b'{') if plausible_json_start(trimmed) => return Kind::JsonObject,
        Some(b'<') => {
            let lower: String = trimmed
                .chars()
                .take(512)
                .collect::<String>()
                .to_ascii_lowercase();
            if lower.starts_with("<!doctype html") || lower.contains("<html") {
                return Kind::Html;
            }
            if lower.starts_with("<?xml") || lower.starts_with('<') && lower.contains("</") {
                return Kind::Xml;
            }
        }
        _ => {}
    }
    let lines: Vec<&str> = text.lines().take(200).collect();
    if trimmed.starts_with("diff --git ")
        || (lines.iter().any(|l| l.starts_with("--- "))
            && lines.iter().any(|l| l.starts_with("+++ "))
            && lines.iter().any(|l| l.starts_with("@@")))
    {
        return Kind::Diff;
    }
    if trimmed.starts_with("commit ")
        && lines
            .first()
            .is_some_and(|l| l.len() >= 47 && l[7..47].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Kind::GitLog;
    }
    if let Some(lang) = source_language(trimmed, &lines) {
        return Kind::Source(lang);
    }
    if let Some(kind) = delimited(&lines) {
        return kind;
    }
    let loggy = lines.iter().filter(|l| looks_like_log_line(l)).count();
    if lines.len() >= 3 && loggy * 2 >= lines.len() {
        return Kind::Log;
    }
    let markdown = lines
        .iter()
        .filter(|l| {
            l.starts_with("# ")
                || l.starts_with("## ")
                || l.starts_with("```")
                || l.starts_with("- [")
        })
        .count();
    if markdown >= 2 {
        return Kind::Markdown;
    }
    Kind::Text
}

/// The first non-blank char after an opening bracket must be able to
/// continue JSON, so that `[INFO] …` log lines are not taken for JSON.
fn plausible_json_start(s: &str) -> bool {
    let mut chars = s.chars();
    let open = chars.next();
    let next = chars.find(|c| !c.is_whitespace());
    match (open, next) {
        (_, None) => true,
        (Some('['), Some(c)) => {
            matches!(c, '{' | '[' | '"' | ']' | '-' | '0'..='9' | 't' | 'f' | 'n')
        }
        (Some('{'), Some(c)) => matches!(c, '"' | '}'),
        _ => false,
    }
}

fn looks_ndjson(text: &str) -> bool {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(first), Some(second)) = (lines.next(), lines.next()) else {
        return false;
    };
    let first = first.trim();
    first.starts_with('{')
        && first.ends_with('}')
        && serde_json::from_str::<serde::de::IgnoredAny>(first).is_ok()
        && second.trim_start().starts_with('{')
}

fn source_language(text: &str, lines: &[&str]) -> Option<Lang> {
    if text.starts_with("#!") {
        let first = lines.first().copied().unwrap_or("");
        if first.contains("python") {
            return Some(Lang::Python);
        }
        if first.contains("node") {
            return Some(Lang::JavaScript);
        }
        if first.contains("sh") {
            return Some(Lang::Shell);
        }
    }
    let count = |pred: &dyn Fn(&str) -> bool| lines.iter().filter(|l| pred(l.trim_start())).count();
    let scores = [
        (
            Lang::Python,
            count(&|l| {
                (l.starts_with("def ")
                    || l.starts_with("class ")
                    || l.starts_with("elif ")
                    || l.starts_with("async def "))
                    && l.trim_end().ends_with(':')
                    || l.starts_with("from ") && l.contains(" import ")
                    || l.starts_with("if __name__")
                    || l.starts_with("self.")
            }) * 2
                + count(&|l| {
                    l.starts_with("import ") && !l.contains(" from ") && !l.ends_with(';')
                }),
        ),
        (
            Lang::Go,
            count(&|l| l.starts_with("package ") || l.starts_with("func ") || l.contains(" := "))
                * 2
                + count(&|l| l.starts_with("import (")),
        ),
        (
            Lang::Rust,
            count(&|l| {
                l.starts_with("fn ")
                    || l.starts_with("pub fn ")
                    || l.starts_with("impl ")
                    || l.starts_with("use ") && l.contains("::")
                    || l.starts_with("let mut ")
                    || l.starts_with("#[")
            }) * 2,
        ),
        (
            Lang::JavaScript,
            count(&|l| {
                l.starts_with("function ")
                    || l.starts_with("const ") && (l.contains("=>") || l.contains("require("))
                    || l.starts_with("export ")
                    || l.starts_with("import ") && l.contains(" from ")
                    || l.contains("console.log(")
            }) * 2,
        ),
        (
            Lang::Java,
            count(&|l| {
                l.starts_with("public class ")
                    || l.starts_with("private ")
                    || l.starts_with("public static ")
                    || l.starts_with("import java")
            }) * 2,
        ),
        (
            Lang::C,
            count(&|l| {
                l.starts_with("#include ")
                    || l.starts_with("int main(")
                    || l.starts_with("#define ")
            }) * 2,
        ),
        (
            Lang::Shell,
            count(&|l| {
                l.starts_with("echo ")
                    || l.starts_with("export ") && l.contains('=')
                    || l.starts_with("fi")
                    || l.starts_with("done")
            }),
        ),
    ];
    let (lang, score) = scores.iter().max_by_key(|(_, s)| *s).copied()?;
    (score >= 4).then_some(lang)
}

fn delimited(lines: &[&str]) -> Option<Kind> {
    let sample: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.is_empty())
        .take(20)
        .collect();
    if sample.len() < 2 {
        return None;
    }
    for (delim, kind) in [('\t', Kind::Tsv), (',', Kind::Csv)] {
        let counts: Vec<usize> = sample
            .iter()
            .map(|l| count_outside_quotes(l, delim))
            .collect();
        // The last sampled line may be cut; require agreement on the rest.
        let judged = &counts[..counts.len() - usize::from(counts.len() > 2)];
        if judged[0] >= 1 && judged.iter().all(|&c| c == judged[0]) {
            return Some(kind);
        }
    }
    None
}

fn count_outside_quotes(line: &str, delim: char) -> usize {
    let mut quoted = false;
    line.chars()
        .filter(|&c| {
            if c == '"' {
                quoted = !quoted;
            }
            c == delim && !quoted
        })
        .count()
}

fn looks_like_log_line(l: &str) -> bool {
    let b = l.as_bytes();
    let iso_date =
        b.len() >= 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[7] == b'-';
    iso_date
        || ["INFO", "WARN", "ERROR", "DEBUG", "TRACE"]
            .iter()
            .any(|lvl| {
                l.starts_with(lvl)
                    || l.starts_with(&format!("[{lvl}"))
                    || l.contains(&format!(" {lvl} "))
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Kind {
        detect(s.as_bytes(), "")
    }

    #[test]
    fn detects_json_shapes_and_ndjson() {
        assert_eq!(d("[{\"id\":1},{\"id\":2}]"), Kind::JsonArray);
        assert_eq!(d("  {\"a\": [1, 2]}"), Kind::JsonObject);
        assert_eq!(d("{\"id\":1}\n{\"id\":2}\n"), Kind::Ndjson);
        assert_eq!(
            detect(b"{\"a\":1}", "application/json; charset=utf-8"),
            Kind::JsonObject
        );
        assert_eq!(detect(b"{\"a\":1}\n", "application/x-ndjson"), Kind::Ndjson);
    }

    #[test]
    fn log_lines_in_brackets_are_not_json() {
        assert_eq!(d("[INFO] starting\n[INFO] ready\n[WARN] slow\n"), Kind::Log);
        assert_eq!(
            d(
                "2026-11-30T10:00:00Z INFO a\n2026-11-30T10:00:01Z INFO b\n2026-11-30T10:00:02Z WARN c\n"
            ),
            Kind::Log
        );
    }

    #[test]
    fn detects_csv_tsv_xml_html() {
        assert_eq!(
            d("id,name,\"city, state\"\n1,a,\"x, y\"\n2,b,z\n"),
            Kind::Csv
        );
        assert_eq!(d("id\tname\n1\ta\n2\tb\n"), Kind::Tsv);
        assert_eq!(d("<?xml version=\"1.0\"?><a><b/></a>"), Kind::Xml);
        assert_eq!(d("<!DOCTYPE html><html><body></body></html>"), Kind::Html);
    }

    #[test]
    fn detects_diff_and_git_log() {
        assert_eq!(
            d("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"),
            Kind::Diff
        );
        let log = format!(
            "commit {}\nAuthor: A <a@b>\nDate:   now\n\n    msg\n",
            "a".repeat(40)
        );
        assert_eq!(d(&log), Kind::GitLog);
    }

    #[test]
    fn python_that_starts_with_import_is_python_not_generic_source() {
        let py = "import os\nimport sys\n\n\ndef main():\n    print(os.getcwd())\n\n\nclass Thing:\n    pass\n\nif __name__ == \"__main__\":\n    main()\n";
        assert_eq!(d(py), Kind::Source(Lang::Python));
        assert_eq!(Kind::Source(Lang::Python).to_string(), "Python source");
    }

    #[test]
    fn detects_other_languages() {
        assert_eq!(
            d("package main\n\nimport \"fmt\"\n\nfunc main() {\n\tx := 1\n\tfmt.Println(x)\n}\n"),
            Kind::Source(Lang::Go)
        );
        assert_eq!(
            d("use std::io;\n\nfn main() {\n    let mut x = 1;\n}\n\npub fn f() {}\n"),
            Kind::Source(Lang::Rust)
        );
        assert_eq!(
            d("import x from 'y';\nconst f = () => 1;\nfunction g() {}\nconsole.log(f());\n"),
            Kind::Source(Lang::JavaScript)
        );
    }

    #[test]
    fn binary_and_plain_text() {
        assert_eq!(detect(&[0xff, 0xfe, 0x00, 0x01], ""), Kind::Binary);
        assert_eq!(d("just some words\nand more words\n"), Kind::Text);
        assert_eq!(d(""), Kind::Text);
    }

    #[test]
    fn a_prefix_cut_inside_a_character_is_still_text() {
        let mut s = "a".repeat(SNIFF_BYTES - 1);
        s.push('é');
        assert_eq!(d(&s), Kind::Text);
    }
}
