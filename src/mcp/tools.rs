//! Spillway's agent-facing operations as MCP tools: their names,
//! descriptions (written for an LLM), input and output JSON Schemas, and the
//! calls behind them. A refusal (policy, quota, unknown handle) comes back as
//! a tool result with `isError: true` carrying the gRPC status message.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::backend::Backend;
use crate::proto;

/// The names of Spillway's tools; an upstream tool with one of these names is
/// refused at proxy startup.
pub const NAMES: [&str; 6] = [
    "spillway_list",
    "spillway_inspect",
    "spillway_search",
    "spillway_read",
    "spillway_exec",
    "spillway_recall",
];

/// Most bytes `spillway_read` returns in one call.
pub const READ_MAX_BYTES: u64 = 64 * 1024;

fn obj(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn tool(name: &'static str, description: &'static str, input: Value, output: Value) -> Tool {
    let mut t = Tool::new(name, description, obj(input));
    t.output_schema = Some(obj(output));
    let mut a = ToolAnnotations::default();
    a.read_only_hint = Some(true);
    a.open_world_hint = Some(false);
    t.annotations = Some(a);
    t
}

fn payload_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "payload_id": {"type": "string"},
            "name": {"type": "string"},
            "path": {"type": "string", "description": "Where scripts of spillway_exec find it"},
            "size_bytes": {"type": "integer"},
            "line_count": {"type": "integer"},
            "estimated_tokens": {"type": "integer"},
            "content_type": {"type": "string"},
            "tool_name": {"type": "string"},
            "is_error": {"type": "boolean"},
            "uri": {"type": "string"}
        },
        "required": ["payload_id", "name", "path", "size_bytes", "line_count"]
    })
}

/// The six tools, in a stable order.
pub fn list() -> Vec<Tool> {
    vec![
        tool(
            "spillway_list",
            "List the payloads saved in this session: tool results too large to show inline, and script outputs. \
Each entry has a payload_id (the handle to pass to the other spillway_ tools), its size, line count, estimated tokens, \
content type and the tool that produced it. Use it when you have lost a handle.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
            json!({"type": "object", "properties": {"payloads": {"type": "array", "items": payload_schema()}}, "required": ["payloads"]}),
        ),
        tool(
            "spillway_inspect",
            "Describe a saved payload's structure without reading it whole: detected type (JSON, NDJSON, CSV, log, text...), \
line and record counts, the JSON field paths with types and examples, or the CSV columns. Call this first on a new handle, \
then pick spillway_search, spillway_read or spillway_exec.",
            json!({"type": "object", "properties": {
                "payload_id": {"type": "string", "description": "The handle, pl_ followed by 32 hex digits, from a notice or spillway_list"}
            }, "required": ["payload_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {
                "payload_id": {"type": "string"}, "detected_type": {"type": "string"}, "size_bytes": {"type": "integer"},
                "line_count": {"type": "integer"}, "summary": {"type": "string"}, "structure": {"type": "object"}
            }, "required": ["payload_id", "detected_type", "summary"]}),
        ),
        tool(
            "spillway_search",
            "Search saved payloads for a regular expression (Rust regex syntax) or a literal string, like grep. Returns matching \
lines with their payload_id and 1-based line number, optionally with context lines. Omit payload_ids to search every payload \
of the session. Use it to find an entity, then spillway_read around the line numbers.",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string", "description": "Regex, or a literal string when fixed_string is true"},
                "payload_ids": {"type": "array", "items": {"type": "string"}, "description": "Payloads to search; default: all of the session's"},
                "fixed_string": {"type": "boolean", "default": false},
                "case_insensitive": {"type": "boolean", "default": false},
                "context_lines": {"type": "integer", "minimum": 0, "maximum": 10, "default": 0},
                "max_matches": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100}
            }, "required": ["pattern"], "additionalProperties": false}),
            json!({"type": "object", "properties": {
                "matches": {"type": "array", "items": {"type": "object", "properties": {
                    "payload_id": {"type": "string"}, "line_number": {"type": "integer"}, "line": {"type": "string"},
                    "before": {"type": "array", "items": {"type": "string"}}, "after": {"type": "array", "items": {"type": "string"}}
                }}},
                "truncated": {"type": "boolean"}, "total_matches_seen": {"type": "integer"}, "note": {"type": "string"}
            }, "required": ["matches", "truncated"]}),
        ),
        tool(
            "spillway_read",
            "Read part of a saved payload: a 1-based inclusive line range (start_line, end_line), or a byte range (offset, length). \
At most 64 KiB per call; the reply says where it stopped and whether the end was reached, so read the next range if you need more. \
Prefer spillway_search or spillway_exec over reading large payloads page by page.",
            json!({"type": "object", "properties": {
                "payload_id": {"type": "string"},
                "start_line": {"type": "integer", "minimum": 1, "description": "First line, 1-based"},
                "end_line": {"type": "integer", "minimum": 1, "description": "Last line, inclusive; omit for 'as far as max_bytes allows'"},
                "offset": {"type": "integer", "minimum": 0, "description": "Byte offset (instead of lines)"},
                "length": {"type": "integer", "minimum": 1, "description": "Bytes from offset"},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": READ_MAX_BYTES, "default": READ_MAX_BYTES}
            }, "required": ["payload_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {
                "payload_id": {"type": "string"}, "text": {"type": "string"}, "first_line": {"type": "integer"}, "last_line": {"type": "integer"},
                "start_offset": {"type": "integer"}, "end_offset": {"type": "integer"}, "total_bytes": {"type": "integer"},
                "total_lines": {"type": "integer"}, "eof": {"type": "boolean"}
            }, "required": ["payload_id", "text", "eof"]}),
        ),
        tool(
            "spillway_exec",
            "Run a deterministic script over saved payloads in a sandbox (no network) and get its stdout. runtime is jq, \
javascript or python. jq reads the payloads given in payload_ids as its input (like `jq SCRIPT file...`); javascript and \
python find every payload of the session as files under /payloads/ (by name and by id, see the 'path' of spillway_list or \
the notice). Print only the evidence you need: a count, a filtered list, a grouped total. For jq, args are its flags (e.g. [\"-r\"] or [\"-s\"]).",
            json!({"type": "object", "properties": {
                "runtime": {"type": "string", "enum": ["jq", "javascript", "python"]},
                "script": {"type": "string", "description": "The jq program, or the JavaScript or Python source"},
                "payload_ids": {"type": "array", "items": {"type": "string"}, "description": "Input payloads; default: all of the session's"},
                "args": {"type": "array", "items": {"type": "string"}, "description": "Arguments; for jq, its flags"},
                "timeout_ms": {"type": "integer", "minimum": 1, "description": "Wall-clock limit; default: the runtime's"}
            }, "required": ["runtime", "script"], "additionalProperties": false}),
            json!({"type": "object", "properties": {
                "status": {"type": "string"}, "exit_code": {"type": "integer"}, "stdout": {"type": "string"},
                "stderr": {"type": "string"}, "message": {"type": "string"}, "stdout_payload_id": {"type": "string"}
            }, "required": ["status", "stdout"]}),
        ),
        tool(
            "spillway_recall",
            "Fetch the original of a tool result that history compaction replaced with a <<ccr:KEY>> marker. Pass the 16 hex \
digits (or the whole marker) as key.",
            json!({"type": "object", "properties": {
                "key": {"type": "string", "description": "16 hex digits, or <<ccr:KEY>>"}
            }, "required": ["key"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"content": {"type": "string"}, "payload_id": {"type": "string"}}, "required": ["content"]}),
        ),
    ]
}

/// The resource URI of a payload.
pub fn payload_uri(id: &str) -> String {
    format!("spillway://payloads/{id}")
}

/// A payload as the tools describe it.
pub fn payload_json(p: &proto::Payload) -> Value {
    json!({
        "payload_id": p.id, "name": p.name, "path": p.path, "size_bytes": p.size_bytes,
        "line_count": p.line_count, "estimated_tokens": p.estimated_tokens, "content_type": p.content_type,
        "tool_name": p.tool_name, "is_error": p.is_error, "uri": payload_uri(&p.id)
    })
}

/// A refusal: the gRPC status message, as an `isError` tool result.
pub fn refusal(tool: &str, s: &tonic::Status) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{tool} was refused ({:?}): {}",
        s.code(),
        s.message()
    ))])
}

/// A bad argument, as an `isError` tool result.
pub fn bad_args(tool: &str, why: impl std::fmt::Display) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{tool}: {why}. Fix the arguments and call it again; its input schema is in tools/list."
    ))])
}

fn ok(text: String, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

fn str_arg<'a>(args: &'a JsonObject, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn u64_arg(args: &JsonObject, key: &str) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} must be a non-negative integer, got {v}")),
    }
}

fn strings_arg(args: &JsonObject, key: &str) -> Result<Vec<String>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{key} must be an array of strings"))
            })
            .collect(),
        Some(_) => Err(format!("{key} must be an array of strings")),
    }
}

/// Runs one of Spillway's tools in `session`. Never fails: a refusal is an
/// `isError` result.
pub async fn call(
    backend: &Backend,
    session: &str,
    name: &str,
    args: &JsonObject,
) -> CallToolResult {
    match call_inner(backend, session, name, args).await {
        Ok(r) => r,
        Err(Failure::Status(s)) => refusal(name, &s),
        Err(Failure::Args(why)) => bad_args(name, why),
    }
}

enum Failure {
    Status(tonic::Status),
    Args(String),
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Self::Status(s)
    }
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Self::Args(s)
    }
}

fn required<'a>(args: &'a JsonObject, key: &str) -> Result<&'a str, Failure> {
    str_arg(args, key)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Failure::Args(format!("the argument {key} (a string) is required")))
}

async fn call_inner(
    backend: &Backend,
    session: &str,
    name: &str,
    args: &JsonObject,
) -> Result<CallToolResult, Failure> {
    match name {
        "spillway_list" => {
            let mut all = Vec::new();
            let mut token = String::new();
            // Bounded: at most 10 pages of 200.
            for _ in 0..10 {
                let page = backend.list(session, token).await?;
                all.extend(page.payloads);
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            let mut text = format!("{} payload(s) in session {session}", all.len());
            if !token.is_empty() {
                text.push_str(" (the first 2000 only)");
            }
            text.push('\n');
            for p in &all {
                text.push_str(&format!(
                    "- {} {} ({} bytes, {} lines, ~{} tokens, {}{})\n",
                    p.id,
                    p.path,
                    p.size_bytes,
                    p.line_count,
                    p.estimated_tokens,
                    if p.content_type.is_empty() {
                        "unknown type"
                    } else {
                        &p.content_type
                    },
                    if p.tool_name.is_empty() {
                        String::new()
                    } else {
                        format!(", from {}", p.tool_name)
                    }
                ));
            }
            let items: Vec<Value> = all.iter().map(payload_json).collect();
            Ok(ok(text, json!({"payloads": items})))
        }
        "spillway_inspect" => {
            let id = required(args, "payload_id")?;
            let s = backend.inspect(id).await?;
            let structure = serde_json::to_value(&s).unwrap_or(Value::Null);
            let text = format!(
                "{} is {} ({} bytes, {} lines).\n{}",
                s.payload_id, s.detected_type, s.size_bytes, s.line_count, s.summary
            );
            Ok(ok(
                text,
                json!({"payload_id": s.payload_id, "detected_type": s.detected_type, "size_bytes": s.size_bytes,
                       "line_count": s.line_count, "summary": s.summary, "structure": structure}),
            ))
        }
        "spillway_search" => {
            let pattern = required(args, "pattern")?;
            let context = u64_arg(args, "context_lines")?.unwrap_or(0);
            let max = u64_arg(args, "max_matches")?.unwrap_or(100);
            let req = proto::SearchRequest {
                session_id: session.to_owned(),
                payload_ids: strings_arg(args, "payload_ids")?,
                pattern: pattern.to_owned(),
                fixed_string: args
                    .get("fixed_string")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                case_insensitive: args
                    .get("case_insensitive")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                context_lines: context.min(10) as u32,
                max_matches: max.min(10_000) as u32,
            };
            let r = backend.search(req).await?;
            let mut text = format!(
                "{} match(es){}\n",
                r.matches.len(),
                if r.truncated {
                    format!(" shown, {} seen; more were left out", r.total_matches_seen)
                } else {
                    String::new()
                }
            );
            if !r.note.is_empty() {
                text.push_str(&format!("Note: {}\n", r.note));
            }
            let mut items = Vec::with_capacity(r.matches.len());
            for m in &r.matches {
                for b in &m.before {
                    text.push_str(&format!("{}-  {b}\n", m.payload_id));
                }
                text.push_str(&format!("{}:{}: {}\n", m.payload_id, m.line_number, m.line));
                for a in &m.after {
                    text.push_str(&format!("{}-  {a}\n", m.payload_id));
                }
                items.push(
                    json!({"payload_id": m.payload_id, "line_number": m.line_number, "line": m.line,
                                  "before": m.before, "after": m.after}),
                );
            }
            Ok(ok(
                text,
                json!({"matches": items, "truncated": r.truncated, "total_matches_seen": r.total_matches_seen, "note": r.note}),
            ))
        }
        "spillway_read" => {
            let id = required(args, "payload_id")?;
            let max = u64_arg(args, "max_bytes")?
                .unwrap_or(READ_MAX_BYTES)
                .clamp(1, READ_MAX_BYTES);
            let start_line = u64_arg(args, "start_line")?;
            let end_line = u64_arg(args, "end_line")?;
            let offset = u64_arg(args, "offset")?;
            let length = u64_arg(args, "length")?;
            let range = match (start_line.or(end_line), offset.or(length)) {
                (Some(_), Some(_)) => {
                    return Err(Failure::Args(
                        "give a line range (start_line, end_line) or a byte range (offset, length), not both".into(),
                    ));
                }
                (Some(_), None) => Some(proto::read_request::Range::LineRange(proto::LineRange {
                    start_line: start_line.unwrap_or(1).max(1),
                    end_line: end_line.unwrap_or(0),
                })),
                (None, Some(_)) => Some(proto::read_request::Range::ByteRange(proto::ByteRange {
                    offset: offset.unwrap_or(0),
                    length: length.unwrap_or(0),
                })),
                (None, None) => None,
            };
            let r = backend
                .read(proto::ReadRequest {
                    payload_id: id.to_owned(),
                    max_bytes: max,
                    range,
                })
                .await?;
            let body = String::from_utf8_lossy(&r.data).into_owned();
            let more = if r.eof {
                " (end of payload)"
            } else {
                "; more follows: read from the next line or offset"
            };
            let text = format!("{id} {}{more}\n{body}", r.span());
            Ok(ok(
                text,
                json!({"payload_id": id, "text": body, "first_line": r.first_line, "last_line": r.last_line,
                       "start_offset": r.start_offset, "end_offset": r.end_offset, "total_bytes": r.total_bytes,
                       "total_lines": r.total_lines, "eof": r.eof}),
            ))
        }
        "spillway_exec" => {
            let runtime = required(args, "runtime")?;
            if !["jq", "javascript", "python"].contains(&runtime) {
                return Err(Failure::Args(format!(
                    "runtime must be jq, javascript or python, got {runtime:?}"
                )));
            }
            let script = required(args, "script")?;
            let limits = u64_arg(args, "timeout_ms")?.map(|t| proto::ExecLimits {
                timeout_ms: t,
                ..Default::default()
            });
            let req = proto::ExecRequest {
                session_id: session.to_owned(),
                runtime: runtime.to_owned(),
                source: script.to_owned(),
                inputs: strings_arg(args, "payload_ids")?,
                args: strings_arg(args, "args")?,
                limits,
                ..Default::default()
            };
            let r = backend.exec(req).await?;
            let status = proto::ExecStatus::try_from(r.status)
                .map(|s| {
                    s.as_str_name()
                        .trim_start_matches("EXEC_STATUS_")
                        .to_ascii_lowercase()
                })
                .unwrap_or_else(|_| "unknown".into());
            let failed = status != "ok";
            let mut text = r.stdout.clone();
            if failed || !r.stderr.is_empty() {
                text.push_str(&format!(
                    "\n[status {status}, exit code {}]{}{}",
                    r.exit_code,
                    if r.message.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", r.message)
                    },
                    if r.stderr.is_empty() {
                        String::new()
                    } else {
                        format!("\nstderr:\n{}", r.stderr)
                    }
                ));
            }
            let stdout_payload = r
                .stdout_payload
                .as_ref()
                .map(|p| p.id.clone())
                .unwrap_or_default();
            let mut result = ok(
                text,
                json!({"status": status, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                       "message": r.message, "stdout_payload_id": stdout_payload}),
            );
            if failed {
                result.is_error = Some(true);
            }
            Ok(result)
        }
        "spillway_recall" => {
            let key = required(args, "key")?;
            let r = backend.recall(session, key).await?;
            Ok(ok(
                r.content.clone(),
                json!({"content": r.content, "payload_id": r.payload_id}),
            ))
        }
        other => Err(Failure::Args(format!(
            "there is no Spillway tool named {other:?}; the tools are {}",
            NAMES.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Python kit (clients/python) gives a model the same tools as the
    /// MCP front: same names, descriptions and input schemas.
    #[test]
    fn the_python_kits_tools_json_matches_the_mcp_tools() {
        let spec: Value =
            serde_json::from_str(include_str!("../../clients/python/src/spillway/tools.json"))
                .unwrap();
        let kit = spec["tools"].as_array().unwrap();
        let mcp = list();
        assert_eq!(
            kit.iter()
                .map(|t| t["name"].as_str().unwrap())
                .collect::<Vec<_>>(),
            mcp.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>()
        );
        for (k, t) in kit.iter().zip(&mcp) {
            assert_eq!(
                k["description"].as_str(),
                t.description.as_deref(),
                "{}",
                t.name
            );
            assert_eq!(
                k["input_schema"],
                Value::Object((*t.input_schema).clone()),
                "{}",
                t.name
            );
        }
        for name in spec["default"].as_array().unwrap() {
            assert!(NAMES.contains(&name.as_str().unwrap()), "{name}");
        }
    }
}
