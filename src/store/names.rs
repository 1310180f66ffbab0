//! Safe, unique file names for payloads: `<tool>-<call>.<ext>` (or the
//! caller's own name), reduced to `[A-Za-z0-9._-]`, never hidden, never `.`
//! or `..`, at most [`MAX_NAME`] bytes, with the extension taken from the
//! content type (or a sniff of the content when there is none).

/// Longest file name produced, extension included.
pub const MAX_NAME: usize = 120;

/// Replaces everything outside `[A-Za-z0-9._-]` with `_`, collapses runs,
/// strips leading dots and dashes, and bounds the length.
pub fn sanitize(raw: &str, max: usize) -> String {
    let mut out = String::with_capacity(raw.len().min(max));
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    let trimmed = out.trim_start_matches(['.', '-']).trim_end_matches('.');
    let mut s: String = trimmed.chars().take(max).collect();
    while s.ends_with('.') {
        s.pop();
    }
    s
}

/// The extension for a content type, if it has a well-known one.
pub fn extension_for(content_type: &str) -> Option<&'static str> {
    let essence = crate::text::essence(content_type);
    Some(match essence.as_str() {
        "application/json" => "json",
        "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonlines" => "ndjson",
        "text/csv" => "csv",
        "text/tab-separated-values" => "tsv",
        "text/html" => "html",
        "application/xml" | "text/xml" => "xml",
        "text/markdown" => "md",
        "text/plain" => "txt",
        "text/x-diff" | "text/x-patch" => "diff",
        "application/yaml" | "application/x-yaml" | "text/yaml" => "yaml",
        "application/octet-stream" => "bin",
        "application/pdf" => "pdf",
        _ => return None,
    })
}

/// A content type and extension guessed from the first bytes, for uploads
/// that name no content type.
pub fn sniff(head: &[u8], utf8: bool) -> (&'static str, &'static str) {
    if !utf8 {
        return ("application/octet-stream", "bin");
    }
    match head.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{' | b'[') => ("application/json", "json"),
        Some(b'<') => ("application/xml", "xml"),
        _ => ("text/plain; charset=utf-8", "txt"),
    }
}

/// The base name for a payload, before uniqueness is ensured.
pub fn base_name(requested: &str, tool_name: &str, tool_call_id: &str, ext: &str) -> String {
    let requested = sanitize(requested, MAX_NAME);
    if !requested.is_empty() {
        return requested;
    }
    let stem = [tool_name, tool_call_id]
        .iter()
        .map(|p| sanitize(p, 56))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let stem = if stem.is_empty() {
        "payload".to_owned()
    } else {
        stem
    };
    format!("{stem}.{ext}")
}

/// The `n`th alternative of a taken name: `report.json` → `report-2.json`.
pub fn numbered(base: &str, n: u32) -> String {
    // Only a short alphanumeric tail counts as an extension.
    let (stem, ext) = match base.rfind('.') {
        Some(i)
            if i > 0
                && base.len() - i <= 11
                && base[i + 1..].bytes().all(|b| b.is_ascii_alphanumeric())
                && !base[..i].ends_with('.') =>
        {
            (&base[..i], &base[i..])
        }
        _ => (base, ""),
    };
    let suffix = format!("-{n}");
    let room = MAX_NAME.saturating_sub(suffix.len() + ext.len());
    let stem: String = stem.chars().take(room).collect();
    format!("{stem}{suffix}{ext}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_tool_and_call_match_the_contract_example() {
        assert_eq!(
            base_name("", "github_list_prs", "call_7", "json"),
            "github_list_prs-call_7.json"
        );
        assert_eq!(base_name("", "", "", "txt"), "payload.txt");
    }

    #[test]
    fn hostile_names_become_safe_plain_names() {
        for hostile in [
            "../../etc/passwd",
            "/abs/path",
            "..",
            ".",
            ".hidden",
            "a/../b",
            "nul\0byte",
            "héllo wörld",
        ] {
            let s = sanitize(hostile, MAX_NAME);
            assert!(
                !s.contains('/') && !s.contains('\0') && !s.starts_with('.'),
                "{hostile:?} -> {s:?}"
            );
            assert!(s != ".." && s != ".");
            assert!(
                s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            );
        }
        assert_eq!(sanitize("../../etc/passwd", MAX_NAME), "_.._etc_passwd");
        assert_eq!(sanitize(&"x".repeat(500), MAX_NAME).len(), MAX_NAME);
    }

    #[test]
    fn numbering_keeps_the_extension_and_the_bound() {
        assert_eq!(numbered("report.json", 2), "report-2.json");
        assert_eq!(numbered("noext", 3), "noext-3");
        assert_eq!(numbered("_.._etc_passwd", 2), "_.._etc_passwd-2");
        assert!(numbered(&format!("{}.json", "a".repeat(118)), 99).len() <= MAX_NAME);
    }

    #[test]
    fn content_types_map_to_extensions_and_sniffing_covers_the_rest() {
        assert_eq!(
            extension_for("application/json; charset=utf-8"),
            Some("json")
        );
        assert_eq!(extension_for("text/CSV"), Some("csv"));
        assert_eq!(extension_for("application/x-weird"), None);
        assert_eq!(sniff(b"  [1,2]", true).1, "json");
        assert_eq!(sniff(b"hello", true).1, "txt");
        assert_eq!(sniff(&[0xff], false).1, "bin");
    }
}
