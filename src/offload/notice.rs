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
    /// Its shape, which decides the next steps offered.
    pub shape: Shape,
}

/// The shape of a stored result, as far as the next steps care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Text of several lines: line ranges work.
    Lines,
    /// Text on one line (minified JSON, say): a line range is all of it.
    OneLine,
    /// Not text: Search skips it.
    Binary,
}

impl Shape {
    /// The shape of content that is (or is not) text, of `lines` lines.
    pub fn of(binary: bool, lines: u64) -> Shape {
        if binary {
            Shape::Binary
        } else if lines <= 1 {
            Shape::OneLine
        } else {
            Shape::Lines
        }
    }
}

/// Whose tool names a notice's next steps use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// The gRPC RPCs (`Inspect`, `Search`, `Read`, `Exec`).
    #[default]
    Grpc,
    /// The MCP tools of `spillway mcp` (`spillway_inspect`, ...), with
    /// their argument names.
    Mcp,
}

/// Writes the notice, in the gRPC dialect (the tests' shorthand).
#[cfg(test)]
fn render(f: &NoticeFacts<'_>, why: Why, preview: &str) -> String {
    render_in(Dialect::Grpc, f, why, preview)
}

/// Writes the notice, with next steps in `dialect`.
pub fn render_in(dialect: Dialect, f: &NoticeFacts<'_>, why: Why, preview: &str) -> String {
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
    let lines = match f.shape {
        Shape::Binary => "binary".to_owned(),
        _ => count_of(f.lines, "line"),
    };
    let _ = writeln!(
        n,
        "Handle {} at {}: {}, {lines}, {}.",
        f.payload_id,
        f.path,
        count_of(f.size, "byte"),
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
    let id = f.payload_id;
    let path = f.path;
    let _ = match (dialect, f.shape) {
        (Dialect::Grpc, Shape::Lines) => write!(
            n,
            "Next: 1) Inspect {id}; 2) confirm shape and count; 3) Search it or Read line ranges; \
4) filter or group with Exec (jq, javascript, python) on its path; 5) print only the evidence; 6) keep the handle."
        ),
        (Dialect::Grpc, Shape::OneLine) => write!(
            n,
            "Next: 1) Inspect {id}; 2) confirm shape and count; 3) Search it (hits give byte offsets and JSON paths) \
or Read byte ranges (it is one line, so no line ranges); \
4) filter or group with Exec (jq, javascript, python) on its path; 5) print only the evidence; 6) keep the handle."
        ),
        (Dialect::Grpc, Shape::Binary) => write!(
            n,
            "Next: 1) Read byte ranges of {id} (Search skips binary data); \
2) decode it with Exec python, opening its path with open(path, 'rb'); 3) print only the evidence; 4) keep the handle."
        ),
        (Dialect::Mcp, Shape::Lines) => write!(
            n,
            "Next: 1) spillway_inspect {{\"payload_id\": \"{id}\"}}; 2) confirm shape and count; \
3) spillway_search {{\"pattern\": \"...\", \"payload_ids\": [\"{id}\"]}} or spillway_read {{\"payload_id\": \"{id}\", \"start_line\": 1, \"end_line\": 50}}; \
4) filter or group with spillway_exec {{\"runtime\": \"jq\", \"script\": \"...\", \"payload_ids\": [\"{id}\"]}} (or javascript, python; the file is {path}); \
5) print only the evidence; 6) keep the handle."
        ),
        (Dialect::Mcp, Shape::OneLine) => write!(
            n,
            "Next: 1) spillway_inspect {{\"payload_id\": \"{id}\"}}; 2) confirm shape and count; \
3) spillway_search {{\"pattern\": \"...\", \"payload_ids\": [\"{id}\"]}} (hits give byte offsets and JSON paths) \
or spillway_read {{\"payload_id\": \"{id}\", \"offset\": 0, \"length\": 4096}} (it is one line, so no line ranges); \
4) filter or group with spillway_exec {{\"runtime\": \"jq\", \"script\": \"...\", \"payload_ids\": [\"{id}\"]}} (or javascript, python; the file is {path}); \
5) print only the evidence; 6) keep the handle."
        ),
        (Dialect::Mcp, Shape::Binary) => write!(
            n,
            "Next: 1) spillway_read {{\"payload_id\": \"{id}\", \"offset\": 0, \"length\": 4096}} (spillway_search skips binary data); \
2) decode it with spillway_exec {{\"runtime\": \"python\", \"script\": \"...\", \"payload_ids\": [\"{id}\"]}}, opening {path} with open(path, 'rb'); \
3) print only the evidence; 4) keep the handle."
        ),
    };
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
            shape: Shape::Lines,
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
    fn an_mcp_notice_names_the_mcp_tools_and_their_arguments() {
        let n = render_in(Dialect::Mcp, &facts(), Why::PerCall(6000), "x");
        let next = n.lines().last().unwrap();
        assert!(
            next.contains(
                "spillway_inspect {\"payload_id\": \"pl_0123456789abcdef0123456789abcdef\"}"
            ),
            "{next}"
        );
        for tool in [
            "spillway_search",
            "spillway_read",
            "spillway_exec",
            "\"runtime\": \"jq\"",
        ] {
            assert!(next.contains(tool), "{tool} missing: {next}");
        }
        assert!(!next.contains("Inspect pl_"), "{next}");
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

    /// The per-call notice for a JSON result with the structured preview,
    /// and its size in tokens (chars / 4).
    fn structured_notice(json: &str, f: &NoticeFacts<'_>) -> (String, u64) {
        use crate::offload::estimate::{Estimator, estimate_text};
        use crate::offload::preview::{Style, build};
        let preview = build(json.as_bytes(), "application/json", Style::Structured, None)
            .render(f.path, f.payload_id);
        let n = render(f, Why::PerCall(6000), &preview);
        let tokens = estimate_text(&n, Estimator::Chars4);
        (n, tokens)
    }

    #[test]
    fn a_default_notice_is_under_600_tokens() {
        let json = crate::testing::json_array(2000, |i| {
            format!(
                "{{\"id\":{i},\"title\":\"pull request number {i}\",\"user\":{{\"login\":\"someone\"}}}}"
            )
        });
        let (n, tokens) = structured_notice(&json, &facts());
        assert!(tokens < 600, "{tokens} tokens:\n{n}");
    }

    /// A wide case: a one-line array of records with 24 long keys, with an
    /// Anthropic-style call ID, still fits the budget (the structure line
    /// cuts the key list; the fixed text grows only with the names).
    #[test]
    fn a_one_line_notice_of_wide_records_is_under_600_tokens() {
        let record: String = (0..24)
            .map(|k| format!("\"a_rather_long_field_name_number_{k:02}_of_this_record\":{k}"))
            .collect::<Vec<_>>()
            .join(",");
        let json = format!("[{}]", vec![format!("{{{record}}}"); 3000].join(","));
        let mut f = facts();
        f.tool_call_id = "toolu_01A09q90qw90lq917835lq9";
        f.path = "/payloads/github_list_prs-toolu_01A09q90qw90lq917835lq9.json";
        f.lines = 1;
        f.shape = Shape::OneLine;
        let (n, tokens) = structured_notice(&json, &f);
        assert!(tokens < 600, "{tokens} tokens:\n{n}");
        assert!(n.contains("of 3 000 records"), "{n}");
        assert!(!n.contains("Read line ranges"), "{n}");
    }
}

/// Notices as the model reads them, for review: `tests/fixtures/notices.txt`
/// holds the expected text, so any change to the wording shows up in a diff.
/// Regenerate with `SPILLWAY_UPDATE_FIXTURES=1 cargo test --lib notices_match`.
#[cfg(test)]
mod fixture {
    use super::*;
    use crate::offload::preview::{Style, build};

    const ID: &str = "pl_0123456789abcdef0123456789abcdef";

    /// The facts every sample shares; each sets its own tool, path,
    /// lines, tokens, type and shape.
    fn plain<'a>() -> NoticeFacts<'a> {
        NoticeFacts {
            tool_name: "",
            tool_call_id: "",
            is_error: false,
            payload_id: ID,
            path: "",
            size: 0,
            lines: 0,
            tokens: (0, false),
            content_type: "",
            shape: Shape::Lines,
        }
    }

    /// One notice of the fixture, for `content` (its size is the
    /// content's) as `content_type`.
    fn sample(
        name: &str,
        content: &[u8],
        content_type: &str,
        facts: NoticeFacts<'_>,
        why: Why,
        style: Style,
    ) -> String {
        let facts = NoticeFacts {
            size: content.len() as u64,
            ..facts
        };
        let preview =
            build(content, content_type, style, None).render(facts.path, facts.payload_id);
        format!("===== {name}\n{}\n", render(&facts, why, &preview))
    }

    #[test]
    fn notices_match_the_reviewed_fixture() {
        let prs = crate::testing::json_array(900, |i| {
            format!("{{\"id\":{i},\"title\":\"Fix flaky test {i}\",\"state\":\"open\"}}")
        });
        let log: String = (0..3000)
            .map(|i| format!("2026-11-30T10:00:00Z INFO request {i} served in 12 ms\n"))
            .collect();
        let trace: String = (0..500)
            .map(|i| format!("  File \"app.py\", line {i}, in handler\n"))
            .collect();
        let mut out = String::new();
        out += &sample(
            "per-call, JSON array, structured",
            prs.as_bytes(),
            "application/json",
            NoticeFacts {
                tool_name: "github_list_prs",
                tool_call_id: "call_7",
                path: "/payloads/github_list_prs-call_7.json",
                lines: 1,
                tokens: ((prs.len() as u64).div_ceil(4), false),
                content_type: "application/json",
                shape: Shape::OneLine,
                ..plain()
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
                path: "/payloads/fetch_logs-call_2.txt",
                lines: 3000,
                tokens: (4200, false),
                content_type: "text/plain",
                shape: Shape::Lines,
                ..plain()
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
                path: "/payloads/run_tests.txt",
                lines: 500,
                tokens: (6100, true),
                content_type: "text/plain; charset=utf-8",
                shape: Shape::Lines,
                ..plain()
            },
            Why::PerCall(6000),
            Style::Edges,
        );
        let wasm: Vec<u8> = (0..40_000u32)
            .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
            .collect();
        out += &sample(
            "per-call, binary",
            &wasm,
            "application/octet-stream",
            NoticeFacts {
                tool_name: "fetch_artifact",
                tool_call_id: "call_9",
                path: "/payloads/fetch_artifact-call_9.bin",
                lines: 795,
                tokens: (40_000, false),
                content_type: "application/octet-stream",
                shape: Shape::Binary,
                ..plain()
            },
            Why::PerCall(6000),
            Style::Structured,
        );
        // What a compacted history leaves of an old result.
        out += &format!(
            "===== compaction stub, cleared\n{}\n",
            crate::context::cleared_stub(&crate::context::ArchiveInfo {
                key: "0123456789abcdef".into(),
                lines: 1,
                chars: 164_736,
                kind: "JSON array".into(),
            })
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
