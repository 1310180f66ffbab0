//! Chat-history JSON to and from the neutral model: OpenAI Chat Completions
//! (assistant `tool_calls`, `role: tool` messages with `tool_call_id`) and
//! Anthropic Messages (`tool_use` and `tool_result` content blocks,
//! `is_error`, a top-level `system`).
//!
//! A file may be a bare array of messages or an object with `messages`;
//! other top-level fields of an object are kept as they are. Import then
//! export gives back equivalent JSON: the same messages, roles, texts, calls
//! and results (a one-part text array may come back as a plain string).

use serde_json::{Map, Value, json};

use super::model::{Block, Message, Role, ToolResult, ToolUse};

/// The two formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI Chat Completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

/// A history file: its messages and whatever else the object held.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    /// The messages.
    pub messages: Vec<Message>,
    /// Other top-level fields (for an object file), kept for export.
    pub rest: Option<Map<String, Value>>,
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AdapterError(String);

fn err(msg: impl Into<String>) -> AdapterError {
    AdapterError(msg.into())
}

/// Reads a history.
pub fn import(value: Value, format: Format) -> Result<History, AdapterError> {
    let (list, mut rest) = match value {
        Value::Array(a) => (a, None),
        Value::Object(mut o) => match o.remove("messages") {
            Some(Value::Array(a)) => (a, Some(o)),
            _ => return Err(err("the object has no \"messages\" array")),
        },
        _ => {
            return Err(err(
                "a history is an array of messages, or an object with a \"messages\" array",
            ));
        }
    };
    let mut messages = Vec::with_capacity(list.len() + 1);
    if format == Format::Anthropic
        && let Some(system) = rest.as_mut().and_then(|r| r.remove("system"))
    {
        messages.push(Message {
            role: Role::System,
            blocks: texts(&system, "system")?,
        });
    }
    for (i, m) in list.into_iter().enumerate() {
        let where_ = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(err(format!("{where_} is not an object")));
        };
        messages.push(match format {
            Format::OpenAi => openai_in(&m, &where_)?,
            Format::Anthropic => anthropic_in(&m, &where_)?,
        });
    }
    Ok(History { messages, rest })
}

/// Writes a history.
pub fn export(history: &History, format: Format) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut system: Vec<String> = Vec::new();
    for m in &history.messages {
        match format {
            Format::OpenAi => openai_out(m, &mut out),
            Format::Anthropic => {
                if m.role == Role::System {
                    system.extend(m.blocks.iter().filter_map(|b| match b {
                        Block::Text(t) => Some(t.clone()),
                        _ => None,
                    }));
                } else {
                    anthropic_out(m, &mut out);
                }
            }
        }
    }
    match &history.rest {
        None if system.is_empty() => Value::Array(out),
        rest => {
            let mut o = rest.clone().unwrap_or_default();
            if !system.is_empty() {
                o.insert("system".into(), Value::String(system.join("\n")));
            }
            o.insert("messages".into(), Value::Array(out));
            Value::Object(o)
        }
    }
}

fn role_of(m: &Map<String, Value>, where_: &str) -> Result<Role, AdapterError> {
    match m.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        Some("tool") => Ok(Role::Tool),
        other => Err(err(format!(
            "{where_}.role is {other:?}; expected system, user, assistant or tool"
        ))),
    }
}

/// Text blocks from a string or an array of `{type: text, text}` parts.
fn texts(v: &Value, where_: &str) -> Result<Vec<Block>, AdapterError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![Block::Text(s.clone())]),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(i, p)| match p.get("text").and_then(Value::as_str) {
                Some(t) => Ok(Block::Text(t.to_owned())),
                None => Err(err(format!("{where_}[{i}] is not a text part"))),
            })
            .collect(),
        _ => Err(err(format!(
            "{where_} is neither text nor a list of text parts"
        ))),
    }
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn openai_in(m: &Map<String, Value>, where_: &str) -> Result<Message, AdapterError> {
    let role = role_of(m, where_)?;
    if role == Role::Tool {
        let id = m
            .get("tool_call_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Ok(Message {
            role,
            blocks: vec![Block::ToolResult(ToolResult {
                tool_use_id: id.to_owned(),
                content: text_of(m.get("content").unwrap_or(&Value::Null)),
                is_error: false,
                error_code: String::new(),
                tool_name: m
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            })],
        });
    }
    let mut blocks = texts(
        m.get("content").unwrap_or(&Value::Null),
        &format!("{where_}.content"),
    )?;
    if let Some(Value::Array(calls)) = m.get("tool_calls") {
        for (i, c) in calls.iter().enumerate() {
            let f = c
                .get("function")
                .ok_or_else(|| err(format!("{where_}.tool_calls[{i}] has no function")))?;
            blocks.push(Block::ToolUse(ToolUse {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                name: f
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                input_json: f
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}")
                    .to_owned(),
            }));
        }
    }
    Ok(Message { role, blocks })
}

fn openai_out(m: &Message, out: &mut Vec<Value>) {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let text: Vec<&str> = m
        .blocks
        .iter()
        .filter_map(|b| {
            if let Block::Text(t) = b {
                Some(t.as_str())
            } else {
                None
            }
        })
        .collect();
    let content = match text.as_slice() {
        [] => Value::Null,
        [one] => Value::String((*one).to_owned()),
        many => Value::Array(
            many.iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        ),
    };
    let calls: Vec<Value> = m
        .tool_uses()
        .map(|u| json!({"id": u.id, "type": "function", "function": {"name": u.name, "arguments": u.input_json}}))
        .collect();
    if m.role != Role::Tool && (!text.is_empty() || !calls.is_empty() || !m.has_results()) {
        let mut o = Map::new();
        o.insert("role".into(), Value::String(role.into()));
        o.insert("content".into(), content);
        if !calls.is_empty() {
            o.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(o));
    }
    // Each result is its own `role: tool` message.
    for r in m.tool_results() {
        let mut o = Map::new();
        o.insert("role".into(), Value::String("tool".into()));
        o.insert("tool_call_id".into(), Value::String(r.tool_use_id.clone()));
        o.insert("content".into(), Value::String(r.content.clone()));
        out.push(Value::Object(o));
    }
}

fn anthropic_in(m: &Map<String, Value>, where_: &str) -> Result<Message, AdapterError> {
    let role = role_of(m, where_)?;
    let content = m.get("content").unwrap_or(&Value::Null);
    let blocks = match content {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let at = format!("{where_}.content[{i}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => Ok(Block::Text(
                        b.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    )),
                    Some("tool_use") => Ok(Block::ToolUse(ToolUse {
                        id: b
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        name: b
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        input_json: b
                            .get("input")
                            .map_or_else(|| "{}".to_owned(), Value::to_string),
                    })),
                    Some("tool_result") => Ok(Block::ToolResult(ToolResult {
                        tool_use_id: b
                            .get("tool_use_id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        content: text_of(b.get("content").unwrap_or(&Value::Null)),
                        is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                        error_code: String::new(),
                        tool_name: String::new(),
                    })),
                    other => Err(err(format!(
                        "{at}.type is {other:?}; expected text, tool_use or tool_result"
                    ))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => texts(other, &format!("{where_}.content"))?,
    };
    // Export folds system messages into the top-level `system` string, which
    // holds text only: refuse calls and results there rather than drop them.
    if role == Role::System && blocks.iter().any(|b| !matches!(b, Block::Text(_))) {
        return Err(err(format!(
            "{where_} is a system message with tool_use or tool_result blocks; a system message holds text only"
        )));
    }
    Ok(Message { role, blocks })
}

fn anthropic_out(m: &Message, out: &mut Vec<Value>) {
    // Results go in a user message; consecutive result messages merge, as
    // Anthropic wants every result of a turn in the next user message.
    let role = match m.role {
        Role::Assistant => "assistant",
        _ => "user",
    };
    let blocks: Vec<Value> = m
        .blocks
        .iter()
        .map(|b| match b {
            Block::Text(t) => json!({"type": "text", "text": t}),
            Block::ToolUse(u) => {
                let input = serde_json::from_str::<Value>(&u.input_json).unwrap_or_else(|_| Value::String(u.input_json.clone()));
                json!({"type": "tool_use", "id": u.id, "name": u.name, "input": input})
            }
            Block::ToolResult(r) => {
                let mut o = json!({"type": "tool_result", "tool_use_id": r.tool_use_id, "content": r.content});
                if r.is_error {
                    o["is_error"] = Value::Bool(true);
                }
                o
            }
        })
        .collect();
    let only_results =
        m.has_results() && m.blocks.iter().all(|b| matches!(b, Block::ToolResult(_)));
    if only_results
        && let Some(prev) = out.last_mut()
        && prev["role"] == "user"
        && prev["content"]
            .as_array()
            .is_some_and(|c| c.iter().all(|b| b["type"] == "tool_result"))
    {
        prev["content"]
            .as_array_mut()
            .expect("checked")
            .extend(blocks);
        return;
    }
    let content = match blocks.as_slice() {
        [one] if one["type"] == "text" => one["text"].clone(),
        _ => Value::Array(blocks),
    };
    out.push(json!({"role": role, "content": content}));
}

#[cfg(test)]
mod tests {
    /// Found by `fuzz/fuzz_targets/history.rs`: a tool call in an Anthropic
    /// system message used to import, then vanish on export (system
    /// messages become the top-level text-only `system`).
    #[test]
    fn anthropic_system_message_with_a_tool_call_is_refused_not_dropped() {
        let v = serde_json::json!({"messages": [
            {"role": "system", "content": [
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}
        ]});
        let e = super::import(v, super::Format::Anthropic).unwrap_err();
        assert!(
            e.to_string().contains("messages[0] is a system message"),
            "{e}"
        );
        // Text-only system messages are still fine.
        let v = serde_json::json!({"messages": [
            {"role": "system", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": "hi"}
        ]});
        assert!(super::import(v, super::Format::Anthropic).is_ok());
    }

    use super::*;

    fn round_trip(v: Value, f: Format) -> Value {
        export(&import(v, f).unwrap(), f)
    }

    #[test]
    fn openai_round_trips_a_multi_turn_history_with_parallel_calls() {
        let v = json!({
            "model": "gpt-x",
            "messages": [
                {"role": "system", "content": "You are careful."},
                {"role": "user", "content": "Triage the open PRs."},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "list_prs", "arguments": "{\"state\":\"open\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "list_issues", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "[{\"id\":1}]"},
                {"role": "tool", "tool_call_id": "call_2", "content": "[]"},
                {"role": "assistant", "content": "One PR is open."},
                {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "text", "text": "more?"}]}
            ]
        });
        assert_eq!(round_trip(v.clone(), Format::OpenAi), v);
        let h = import(v, Format::OpenAi).unwrap();
        assert_eq!(h.messages.len(), 7);
        assert_eq!(h.messages[2].tool_uses().count(), 2);
    }

    #[test]
    fn anthropic_round_trips_tool_use_and_results_with_errors() {
        let v = json!({
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "Fetch both."},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Fetching."},
                    {"type": "tool_use", "id": "toolu_1", "name": "web_fetch", "input": {"url": "https://a"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "web_fetch", "input": {"url": "https://b"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "page a"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": true}
                ]},
                {"role": "assistant", "content": "A loaded; B timed out."}
            ]
        });
        assert_eq!(round_trip(v.clone(), Format::Anthropic), v);
        let h = import(v, Format::Anthropic).unwrap();
        assert_eq!(h.messages[0].role, Role::System);
        let results: Vec<&ToolResult> = h.messages[3].tool_results().collect();
        assert!(results[1].is_error);
    }

    #[test]
    fn repaired_results_export_in_each_format() {
        // Results as separate Tool messages (what repair emits) merge into one
        // Anthropic user message.
        let h = History {
            messages: vec![
                Message {
                    role: Role::Assistant,
                    blocks: vec![
                        Block::ToolUse(ToolUse {
                            id: "a".into(),
                            name: "t".into(),
                            input_json: "{}".into(),
                        }),
                        Block::ToolUse(ToolUse {
                            id: "b".into(),
                            name: "t".into(),
                            input_json: "{}".into(),
                        }),
                    ],
                },
                Message {
                    role: Role::Tool,
                    blocks: vec![Block::ToolResult(ToolResult {
                        tool_use_id: "a".into(),
                        content: "1".into(),
                        is_error: false,
                        error_code: String::new(),
                        tool_name: String::new(),
                    })],
                },
                Message {
                    role: Role::Tool,
                    blocks: vec![Block::ToolResult(ToolResult {
                        tool_use_id: "b".into(),
                        content: "x".into(),
                        is_error: true,
                        error_code: "missing_result".into(),
                        tool_name: String::new(),
                    })],
                },
            ],
            rest: None,
        };
        let a = export(&h, Format::Anthropic);
        assert_eq!(a.as_array().unwrap().len(), 2);
        assert_eq!(a[1]["content"][1]["is_error"], true);
        let o = export(&h, Format::OpenAi);
        assert_eq!(o.as_array().unwrap().len(), 3);
        assert_eq!(o[2]["tool_call_id"], "b");
    }

    #[test]
    fn malformed_files_are_refused_with_the_place() {
        let e = import(json!({"messages": [{"role": "robot"}]}), Format::OpenAi)
            .unwrap_err()
            .to_string();
        assert!(e.contains("messages[0].role"), "{e}");
        let e = import(json!(42), Format::Anthropic)
            .unwrap_err()
            .to_string();
        assert!(e.contains("array of messages"), "{e}");
        let e = import(
            json!([{"role": "user", "content": [{"type": "image"}]}]),
            Format::Anthropic,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("messages[0].content[0].type"), "{e}");
    }
}
