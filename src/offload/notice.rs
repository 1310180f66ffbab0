//! The notice that replaces an offloaded result in the model's context.
//! In order: what happened and why, the handle and its facts, the preview,
//! and the next steps of progressive inspection. It is written for an LLM:
//! plain, specific, and actionable.

use std::fmt::Write as _;

use crate::text::{count_of, group};

/// Why a result was offloaded, with the threshold that decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Over its per-call threshold.
    PerCall(u64),
    /// The turn's combined results were over the aggregate threshold.
    Aggregate(u64),
}

/// What the notice says about the stored payload.
#[derive(Debug, Clone)]
pub struct NoticeFacts<'a> {
    /// Tool name.
    pub tool_name: &'a str,
    /// Tool call ID.
    pub tool_call_id: &'a str,
    /// Error result?
    pub is_error: bool,
    /// Payload ID.
    pub payload_id: &'a str,
    /// Sandbox path.
    pub path: &'a str,
    /// Size in bytes.
    pub size: u64,
    /// Line count.
    pub lines: u64,
    /// Estimated tokens, and whether that is a lower bound.
    pub tokens: (u64, bool),
    /// Content type.
    pub content_type: &'a str,
}

/// Writes the notice.
pub fn render(f: &NoticeFacts<'_>, why: Why, preview: &str) -> String {
    let tool = if f.tool_name.is_empty() {
        "the tool"
    } else {
        f.tool_name
    };
    let call = if f.tool_call_id.is_empty() {
        String::new()
    } else {
        format!(" (call {})", f.tool_call_id)
    };
    let what = if f.is_error {
        "an error result"
    } else {
        "a result"
    };
    let at_least = if f.tokens.1 { "at least " } else { "about " };
    let reason = match why {
        Why::PerCall(t) => format!("over the per-call limit of {} tokens", group(t)),
        Why::Aggregate(t) => format!(
            "and this turn's results together were over the combined limit of {} tokens (this was the largest one still inline)",
            group(t)
        ),
    };
    let mut n = String::new();
    let _ = writeln!(
        n,
        "[Saved to file] {tool}{call} returned {what} of {at_least}{} tokens, {reason}, so it was saved whole instead of shown.",
        group(f.tokens.0)
    );
    let _ = writeln!(
        n,
        "Handle {} at {}: {}, {}, {}.",
        f.payload_id,
        f.path,
        count_of(f.size, "byte"),
        count_of(f.lines, "line"),
        if f.content_type.is_empty() {
            "unknown type"
        } else {
            f.content_type
        }
    );
    n.push_str("Preview (for navigation, not a summary):\n");
    n.push_str(preview);
    if !preview.ends_with('\n') {
        n.push('\n');
    }
    let _ = write!(
        n,
        "Next: 1) Inspect {id}; 2) confirm shape and count; 3) Search it or Read line ranges; \
4) filter or group with Exec (jq, javascript, python) on {path}; 5) print only the evidence; 6) keep the handle.",
        id = f.payload_id,
        path = f.path
    );
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>() -> NoticeFacts<'a> {
        NoticeFacts {
            tool_name: "github_list_prs",
            tool_call_id: "call_7",
            is_error: false,
            payload_id: "pl_0123456789abcdef0123456789abcdef",
            path: "/payloads/github_list_prs-call_7.json",
            size: 193_240,
            lines: 4210,
            tokens: (48_310, false),
            content_type: "application/json",
        }
    }

    /// Read aloud, a notice must tell an LLM what happened, where the data
    /// is, and what to do next, in that order.
    #[test]
    fn a_per_call_notice_reads_in_the_specified_order() {
        let n = render(
            &facts(),
            Why::PerCall(6000),
            "Structure: JSON array of 1 200 records\n[{\"id\":1}",
        );
        let first = n.lines().next().unwrap();
        assert_eq!(
            first,
            "[Saved to file] github_list_prs (call call_7) returned a result of about 48 310 tokens, over the per-call limit of 6 000 tokens, so it was saved whole instead of shown."
        );
        let order = [
            "saved whole",
            "Handle pl_",
            "at /payloads/github_list_prs-call_7.json",
            "193 240 bytes",
            "Preview",
            "Structure: JSON array",
            "Next: 1) Inspect pl_",
            "6) keep the handle",
        ];
        let mut at = 0;
        for part in order {
            let found = n[at..]
                .find(part)
                .unwrap_or_else(|| panic!("{part:?} missing or out of order in:\n{n}"));
            at += found;
        }
    }

    #[test]
    fn aggregate_and_error_notices_say_so() {
        let mut f = facts();
        f.is_error = true;
        f.tokens = (9000, true);
        let n = render(&f, Why::Aggregate(10_000), "x");
        assert!(
            n.contains("returned an error result of at least 9 000 tokens"),
            "{n}"
        );
        assert!(n.contains("combined limit of 10 000 tokens"), "{n}");
    }

    #[test]
    fn a_default_notice_is_under_600_tokens() {
        use crate::offload::preview::{Style, build};
        let json = format!("[{}]", (0..2000).map(|i| format!("{{\"id\":{i},\"title\":\"pull request number {i}\",\"user\":{{\"login\":\"someone\"}}}}")).collect::<Vec<_>>().join(","));
        let f = facts();
        let preview = build(json.as_bytes(), "application/json", Style::Structured, None)
            .render(f.path, f.payload_id);
        let n = render(&f, Why::PerCall(6000), &preview);
        let tokens = crate::offload::estimate::estimate_text(
            &n,
            crate::offload::estimate::Estimator::Chars4,
        );
        assert!(tokens < 600, "{tokens} tokens:\n{n}");
    }
}

/// Notices as the model reads them, for review: `tests/fixtures/notices.txt`
/// holds the expected text, so any change to the wording shows up in a diff.
/// Regenerate with `SPILLWAY_UPDATE_FIXTURES=1 cargo test --lib notices_match`.
#[cfg(test)]
mod fixture {
    use super::*;
    use crate::offload::preview::{Style, build};

    fn sample(
        name: &str,
        content: &[u8],
        content_type: &str,
        facts: NoticeFacts<'_>,
        why: Why,
        style: Style,
    ) -> String {
        let preview =
            build(content, content_type, style, None).render(facts.path, facts.payload_id);
        format!("===== {name}\n{}\n", render(&facts, why, &preview))
    }

    #[test]
    fn notices_match_the_reviewed_fixture() {
        let prs = format!(
            "[{}]",
            (0..900)
                .map(|i| format!(
                    "{{\"id\":{i},\"title\":\"Fix flaky test {i}\",\"state\":\"open\"}}"
                ))
                .collect::<Vec<_>>()
                .join(",")
        );
        let log: String = (0..3000)
            .map(|i| format!("2026-11-30T10:00:00Z INFO request {i} served in 12 ms\n"))
            .collect();
        let trace: String = (0..500)
            .map(|i| format!("  File \"app.py\", line {i}, in handler\n"))
            .collect();
        let id = "pl_0123456789abcdef0123456789abcdef";
        let mut out = String::new();
        out += &sample(
            "per-call, JSON array, structured",
            prs.as_bytes(),
            "application/json",
            NoticeFacts {
                tool_name: "github_list_prs",
                tool_call_id: "call_7",
                is_error: false,
                payload_id: id,
                path: "/payloads/github_list_prs-call_7.json",
                size: prs.len() as u64,
                lines: 1,
                tokens: ((prs.len() as u64).div_ceil(4), false),
                content_type: "application/json",
            },
            Why::PerCall(6000),
            Style::Structured,
        );
        out += &sample(
            "aggregate, log text, lines",
            log.as_bytes(),
            "text/plain",
            NoticeFacts {
                tool_name: "fetch_logs",
                tool_call_id: "call_2",
                is_error: false,
                payload_id: id,
                path: "/payloads/fetch_logs-call_2.txt",
                size: log.len() as u64,
                lines: 3000,
                tokens: (4200, false),
                content_type: "text/plain",
            },
            Why::Aggregate(10_000),
            Style::Lines,
        );
        out += &sample(
            "error result, edges",
            trace.as_bytes(),
            "",
            NoticeFacts {
                tool_name: "run_tests",
                tool_call_id: "",
                is_error: true,
                payload_id: id,
                path: "/payloads/run_tests.txt",
                size: trace.len() as u64,
                lines: 500,
                tokens: (6100, true),
                content_type: "text/plain; charset=utf-8",
            },
            Why::PerCall(6000),
            Style::Edges,
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/notices.txt");
        if std::env::var_os("SPILLWAY_UPDATE_FIXTURES").is_some() {
            std::fs::write(path, &out).unwrap();
        }
        let expected = std::fs::read_to_string(path).expect("tests/fixtures/notices.txt exists");
        assert_eq!(
            out, expected,
            "notice text changed; review it, then regenerate the fixture"
        );
    }
}
