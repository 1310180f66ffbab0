//! Chat-history JSON to and from the neutral model, in three provider
//! formats:
//! - OpenAI Chat Completions: assistant `tool_calls`, `role: tool` messages
//!   with `tool_call_id`;
//! - OpenAI Responses: input items, `function_call` and
//!   `function_call_output` paired by `call_id`;
//! - Anthropic Messages: `tool_use` and `tool_result` content blocks,
//!   `is_error`, a top-level `system`.
//!
//! A history may be a bare array, or an object with `messages` (`input` for
//! Responses); the object's other fields are kept as they are. Whatever the
//! model does not interpret is kept verbatim as a [`Part`]: for Chat and
//! Anthropic one content part or block (an image, a document, a thinking
//! block, a text block with `cache_control`), for Responses one input item
//! (a reasoning item, a message with an image). Parts of a tool result's
//! content that are not plain text stay with that result (`of_result`).
//!
//! Import then export gives back equivalent JSON: the same messages, roles,
//! texts, calls, results and parts. What may change: a one-part text array
//! comes back as a plain string, several text parts of one tool result come
//! back as one text, Chat's "developer" role comes back as "system", and
//! Responses items lose their `id` and `status` fields (except items kept
//! verbatim).

use serde_json::{Map, Value, json};

use super::model::{Block, Message, Part, Role, ToolResult, ToolUse};

/// The formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI Chat Completions.
    OpenAi,
    /// OpenAI Responses.
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
}

impl Format {
    /// The field of an object history that holds the list.
    fn list_key(self) -> &'static str {
        match self {
            Format::OpenAiResponses => "input",
            Format::OpenAi | Format::Anthropic => "messages",
        }
    }
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
    let key = format.list_key();
    let (list, mut rest) = match value {
        Value::Array(a) => (a, None),
        Value::Object(mut o) => match o.shift_remove(key) {
            Some(Value::Array(a)) => (a, Some(o)),
            // Responses also takes a bare string as the whole input.
            Some(Value::String(s)) if format == Format::OpenAiResponses => {
                (vec![json!({"role": "user", "content": s})], Some(o))
            }
            _ => return Err(err(format!("the object has no {key:?} array"))),
        },
        _ => {
            return Err(err(format!(
                "a history is an array, or an object with a {key:?} array"
            )));
        }
    };
    let mut messages = Vec::with_capacity(list.len() + 1);
    if format == Format::Anthropic
        && let Some(system) = rest.as_mut().and_then(|r| r.shift_remove("system"))
    {
        messages.push(Message {
            role: Role::System,
            blocks: anthropic_system(&system)?,
        });
    }
    for (i, m) in list.into_iter().enumerate() {
        let at = format!("{key}[{i}]");
        let Value::Object(m) = m else {
            return Err(err(format!("{at} is not an object")));
        };
        match format {
            Format::OpenAi => messages.push(openai_in(m, &at)?),
            Format::Anthropic => messages.push(anthropic_in(m, &at)?),
            Format::OpenAiResponses => responses_in(m, &at, &mut messages)?,
        }
    }
    Ok(History { messages, rest })
}

/// Writes a history.
pub fn export(history: &History, format: Format) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut system: Vec<Value> = Vec::new();
    for m in &history.messages {
        match format {
            Format::OpenAi => openai_out(m, &mut out),
            Format::OpenAiResponses => responses_out(m, &mut out),
            Format::Anthropic if m.role == Role::System => {
                system.extend(m.blocks.iter().filter_map(|b| match b {
                    Block::Text(t) => Some(json!({"type": "text", "text": t})),
                    Block::Part(p) => Some(part_value(p)),
                    _ => None,
                }));
            }
            Format::Anthropic => anthropic_out(m, &mut out),
        }
    }
    let system = match system.as_slice() {
        [] => None,
        [one] if is_plain_text(one, &[]) => Some(one["text"].clone()),
        _ => Some(Value::Array(system)),
    };
    match &history.rest {
        None if system.is_none() => Value::Array(out),
        rest => {
            let mut o = rest.clone().unwrap_or_default();
            if let Some(system) = system {
                o.insert("system".into(), system);
            }
            o.insert(format.list_key().into(), Value::Array(out));
            Value::Object(o)
        }
    }
}

/// The JSON of a part; a part whose text is not JSON (sent in the neutral
/// model by a client) goes out as a JSON string rather than being dropped.
fn part_value(p: &Part) -> Value {
    serde_json::from_str(&p.json).unwrap_or_else(|_| Value::String(p.json.clone()))
}

fn part(v: &Value, of_result: bool) -> Block {
    Block::Part(Part {
        json: v.to_string(),
        of_result,
    })
}

/// A `{type: text, text}` part with nothing else that matters, so that it
/// can become a plain [`Block::Text`] and come back equal. `ignorable` are
/// other keys whose empty-array value may be dropped.
fn is_plain_text(v: &Value, ignorable: &[&str]) -> bool {
    let Some(o) = v.as_object() else { return false };
    o.get("text").is_some_and(Value::is_string)
        && o.iter().all(|(k, v)| match k.as_str() {
            "text" => true,
            "type" => matches!(v.as_str(), Some("text" | "input_text" | "output_text")),
            k if ignorable.contains(&k) => v.as_array().is_some_and(Vec::is_empty),
            _ => false,
        })
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn role_of(m: &Map<String, Value>, at: &str) -> Result<Role, AdapterError> {
    match m.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        Some("tool") => Ok(Role::Tool),
        other => Err(err(format!(
            "{at}.role is {other:?}; expected system, developer, user, assistant or tool"
        ))),
    }
}

/// Message content: a string, or parts where plain text parts become text
/// blocks and every other part is kept verbatim.
fn content_blocks(v: &Value, at: &str, ignorable: &[&str]) -> Result<Vec<Block>, AdapterError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![Block::Text(s.clone())]),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if is_plain_text(p, ignorable) {
                    Ok(Block::Text(str_of(p, "text").to_owned()))
                } else if p.is_object() {
                    Ok(part(p, false))
                } else {
                    Err(err(format!("{at}[{i}] is not a content part object")))
                }
            })
            .collect(),
        _ => Err(err(format!(
            "{at} is neither text nor a list of content parts"
        ))),
    }
}

/// A tool result's content: its text parts joined, and its other parts kept
/// verbatim to follow the result as [`Part`]s with `of_result`.
fn result_content(v: &Value, at: &str) -> Result<(String, Vec<Block>), AdapterError> {
    match v {
        Value::Null => Ok((String::new(), Vec::new())),
        Value::String(s) => Ok((s.clone(), Vec::new())),
        Value::Array(parts) => {
            let mut text: Vec<&str> = Vec::new();
            let mut rest = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                if is_plain_text(p, &[]) {
                    text.push(str_of(p, "text"));
                } else if p.is_object() {
                    rest.push(part(p, true));
                } else {
                    return Err(err(format!("{at}[{i}] is not a content part object")));
                }
            }
            Ok((text.join("\n"), rest))
        }
        other => Ok((other.to_string(), Vec::new())),
    }
}

/// A result's content for export: a string, or (with parts) an array of
/// `text_type` text and the parts.
fn result_value(content: &str, parts: &[&Part], text_type: &str) -> Value {
    if parts.is_empty() {
        return Value::String(content.to_owned());
    }
    let mut a = Vec::with_capacity(parts.len() + 1);
    if !content.is_empty() {
        a.push(json!({"type": text_type, "text": content}));
    }
    a.extend(parts.iter().map(|p| part_value(p)));
    Value::Array(a)
}

/// Text and part blocks as message content: a string for one text, else an
/// array of `text_type` parts and verbatim parts; `None` when there are none.
fn content_value(blocks: &[&Block], text_type: &str) -> Option<Value> {
    match blocks {
        [] => None,
        [Block::Text(t)] => Some(Value::String(t.clone())),
        many => Some(Value::Array(
            many.iter()
                .filter_map(|b| match b {
                    Block::Text(t) => Some(json!({"type": text_type, "text": t})),
                    Block::Part(p) => Some(part_value(p)),
                    _ => None,
                })
                .collect(),
        )),
    }
}

/// The blocks of a result followed by its own parts, grouped.
fn results_with_parts(m: &Message) -> Vec<(&ToolResult, Vec<&Part>)> {
    let mut out: Vec<(&ToolResult, Vec<&Part>)> = Vec::new();
    let mut last_was_result = false;
    for b in &m.blocks {
        match b {
            Block::ToolResult(r) => {
                out.push((r, Vec::new()));
                last_was_result = true;
            }
            Block::Part(p) if p.of_result && last_was_result => {
                if let Some((_, parts)) = out.last_mut() {
                    parts.push(p);
                }
            }
            _ => last_was_result = false,
        }
    }
    out
}

/// Whether block `i` of `m` is a part that belongs to a preceding result.
fn attached(m: &Message, i: usize) -> bool {
    m.blocks[..=i]
        .iter()
        .rev()
        .find(|b| !matches!(b, Block::Part(p) if p.of_result))
        .is_some_and(|b| matches!(b, Block::ToolResult(_)))
        && matches!(&m.blocks[i], Block::Part(p) if p.of_result)
}

// OpenAI Chat Completions.

fn openai_in(m: Map<String, Value>, at: &str) -> Result<Message, AdapterError> {
    let role = role_of(&m, at)?;
    let content = m.get("content").unwrap_or(&Value::Null);
    if role == Role::Tool {
        let (text, parts) = result_content(content, &format!("{at}.content"))?;
        let mut blocks = vec![Block::ToolResult(ToolResult {
            tool_use_id: m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            content: text,
            is_error: false,
            error_code: String::new(),
            tool_name: m
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })];
        blocks.extend(parts);
        return Ok(Message { role, blocks });
    }
    let mut blocks = content_blocks(content, &format!("{at}.content"), &[])?;
    if let Some(Value::Array(calls)) = m.get("tool_calls") {
        for (i, c) in calls.iter().enumerate() {
            let f = c
                .get("function")
                .ok_or_else(|| err(format!("{at}.tool_calls[{i}] has no function")))?;
            blocks.push(Block::ToolUse(ToolUse {
                id: str_of(c, "id").to_owned(),
                name: str_of(f, "name").to_owned(),
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
    let content: Vec<&Block> = m
        .blocks
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            matches!(b, Block::Text(_)) || (matches!(b, Block::Part(_)) && !attached(m, *i))
        })
        .map(|(_, b)| b)
        .collect();
    let calls: Vec<Value> = m
        .tool_uses()
        .map(|u| json!({"id": u.id, "type": "function", "function": {"name": u.name, "arguments": u.input_json}}))
        .collect();
    if m.role != Role::Tool && (!content.is_empty() || !calls.is_empty() || !m.has_results()) {
        let mut o = Map::new();
        o.insert("role".into(), Value::String(role.into()));
        o.insert(
            "content".into(),
            content_value(&content, "text").unwrap_or(Value::Null),
        );
        if !calls.is_empty() {
            o.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(o));
    }
    // Each result is its own `role: tool` message.
    for (r, parts) in results_with_parts(m) {
        out.push(json!({
            "role": "tool",
            "tool_call_id": r.tool_use_id,
            "content": result_value(&r.content, &parts, "text"),
        }));
    }
}

// OpenAI Responses.

/// Appends `block` to the assistant message at the end of `messages`,
/// starting one if the last message is not the assistant's: one assistant
/// turn is every output item (reasoning, text, calls) until the next input.
fn push_assistant(messages: &mut Vec<Message>, block: Block) {
    match messages.last_mut() {
        Some(m) if m.role == Role::Assistant => m.blocks.push(block),
        _ => messages.push(Message {
            role: Role::Assistant,
            blocks: vec![block],
        }),
    }
}

fn responses_in(
    m: Map<String, Value>,
    at: &str,
    messages: &mut Vec<Message>,
) -> Result<(), AdapterError> {
    let item = Value::Object(m);
    let kind = item.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") => {
            let Some(map) = item.as_object() else {
                unreachable!("built from a map")
            };
            let role = role_of(map, at)?;
            if role == Role::Tool {
                return Err(err(format!(
                    "{at}.role is \"tool\", which Responses does not have; send a function_call_output item"
                )));
            }
            let content = item.get("content").unwrap_or(&Value::Null);
            let blocks = content_blocks(
                content,
                &format!("{at}.content"),
                &["annotations", "logprobs"],
            )?;
            // A message with anything but text is kept whole.
            if blocks.iter().any(|b| matches!(b, Block::Part(_))) {
                let b = part(&item, false);
                if role == Role::Assistant {
                    push_assistant(messages, b);
                } else {
                    messages.push(Message {
                        role,
                        blocks: vec![b],
                    });
                }
                return Ok(());
            }
            if role == Role::Assistant {
                for b in blocks {
                    push_assistant(messages, b);
                }
            } else {
                messages.push(Message { role, blocks });
            }
        }
        Some("function_call") => push_assistant(
            messages,
            Block::ToolUse(ToolUse {
                id: str_of(&item, "call_id").to_owned(),
                name: str_of(&item, "name").to_owned(),
                input_json: item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}")
                    .to_owned(),
            }),
        ),
        Some("function_call_output") => {
            let (text, parts) = result_content(
                item.get("output").unwrap_or(&Value::Null),
                &format!("{at}.output"),
            )?;
            let mut blocks = vec![Block::ToolResult(ToolResult {
                tool_use_id: str_of(&item, "call_id").to_owned(),
                content: text,
                is_error: false,
                error_code: String::new(),
                tool_name: String::new(),
            })];
            blocks.extend(parts);
            messages.push(Message {
                role: Role::Tool,
                blocks,
            });
        }
        // Reasoning, built-in tool calls, references: kept whole, in the
        // assistant turn they belong to.
        Some(_) => push_assistant(messages, part(&item, false)),
    }
    Ok(())
}

fn responses_out(m: &Message, out: &mut Vec<Value>) {
    let role = match m.role {
        Role::System => "system",
        Role::Assistant => "assistant",
        Role::User | Role::Tool => "user",
    };
    let text_type = if m.role == Role::Assistant {
        "output_text"
    } else {
        "input_text"
    };
    let mut texts: Vec<&Block> = Vec::new();
    let flush = |texts: &mut Vec<&Block>, out: &mut Vec<Value>| {
        responses_texts(m.role == Role::Assistant, role, text_type, texts, out);
    };
    let results = results_with_parts(m);
    let mut next_result = results.iter();
    for (i, b) in m.blocks.iter().enumerate() {
        match b {
            Block::Text(_) => texts.push(b),
            Block::ToolUse(u) => {
                flush(&mut texts, out);
                out.push(json!({"type": "function_call", "call_id": u.id, "name": u.name, "arguments": u.input_json}));
            }
            Block::ToolResult(_) => {
                flush(&mut texts, out);
                if let Some((r, parts)) = next_result.next() {
                    out.push(json!({"type": "function_call_output", "call_id": r.tool_use_id, "output": result_value(&r.content, parts, "input_text")}));
                }
            }
            Block::Part(_) if attached(m, i) => {}
            Block::Part(p) => {
                flush(&mut texts, out);
                out.push(part_value(p));
            }
        }
    }
    flush(&mut texts, out);
}

/// Writes the pending texts of a message as one message item (an
/// assistant's as one easy message each) and clears them.
fn responses_texts(
    assistant: bool,
    role: &str,
    text_type: &str,
    texts: &mut Vec<&Block>,
    out: &mut Vec<Value>,
) {
    if assistant {
        for t in texts.iter() {
            if let Block::Text(t) = t {
                out.push(json!({"role": role, "content": t}));
            }
        }
    } else if let Some(content) = content_value(texts, text_type) {
        out.push(json!({"role": role, "content": content}));
    }
    texts.clear();
}

// Anthropic Messages.

fn anthropic_system(v: &Value) -> Result<Vec<Block>, AdapterError> {
    content_blocks(v, "system", &[])
}

fn anthropic_in(m: Map<String, Value>, at: &str) -> Result<Message, AdapterError> {
    let role = role_of(&m, at)?;
    let content = m.get("content").unwrap_or(&Value::Null);
    let blocks = match content {
        Value::Array(items) => {
            let mut blocks = Vec::with_capacity(items.len());
            for (i, b) in items.iter().enumerate() {
                let at = format!("{at}.content[{i}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") if is_plain_text(b, &[]) => {
                        blocks.push(Block::Text(str_of(b, "text").to_owned()));
                    }
                    Some("tool_use") => blocks.push(Block::ToolUse(ToolUse {
                        id: str_of(b, "id").to_owned(),
                        name: str_of(b, "name").to_owned(),
                        input_json: b
                            .get("input")
                            .map_or_else(|| "{}".to_owned(), Value::to_string),
                    })),
                    Some("tool_result") => {
                        let (text, parts) = result_content(
                            b.get("content").unwrap_or(&Value::Null),
                            &format!("{at}.content"),
                        )?;
                        blocks.push(Block::ToolResult(ToolResult {
                            tool_use_id: str_of(b, "tool_use_id").to_owned(),
                            content: text,
                            is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                            error_code: String::new(),
                            tool_name: String::new(),
                        }));
                        blocks.extend(parts);
                    }
                    // Images, documents, thinking, text with cache_control
                    // or citations, server tool blocks: kept verbatim.
                    Some(_) => blocks.push(part(b, false)),
                    None => {
                        return Err(err(format!(
                            "{at} has no \"type\"; an Anthropic content block names its type (text, image, tool_use, tool_result, ...)"
                        )));
                    }
                }
            }
            blocks
        }
        other => content_blocks(other, &format!("{at}.content"), &[])?,
    };
    // Export folds system messages into the top-level `system`, which holds
    // text only: refuse calls and results there rather than drop them.
    if role == Role::System
        && blocks
            .iter()
            .any(|b| matches!(b, Block::ToolUse(_) | Block::ToolResult(_)))
    {
        return Err(err(format!(
            "{at} is a system message with tool_use or tool_result blocks; a system message holds text only"
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
    let results = results_with_parts(m);
    let mut next_result = results.iter();
    let mut blocks: Vec<Value> = Vec::with_capacity(m.blocks.len());
    for (i, b) in m.blocks.iter().enumerate() {
        match b {
            Block::Text(t) => blocks.push(json!({"type": "text", "text": t})),
            Block::ToolUse(u) => {
                let input = serde_json::from_str::<Value>(&u.input_json)
                    .unwrap_or_else(|_| Value::String(u.input_json.clone()));
                blocks
                    .push(json!({"type": "tool_use", "id": u.id, "name": u.name, "input": input}));
            }
            Block::ToolResult(_) => {
                if let Some((r, parts)) = next_result.next() {
                    let mut o = json!({"type": "tool_result", "tool_use_id": r.tool_use_id, "content": result_value(&r.content, parts, "text")});
                    if r.is_error {
                        o["is_error"] = Value::Bool(true);
                    }
                    blocks.push(o);
                }
            }
            Block::Part(_) if attached(m, i) => {}
            Block::Part(p) => blocks.push(part_value(p)),
        }
    }
    let only_results = m.has_results()
        && m.blocks.iter().all(|b| {
            matches!(
                b,
                Block::ToolResult(_)
                    | Block::Part(Part {
                        of_result: true,
                        ..
                    })
            )
        });
    if only_results
        && let Some(prev) = out.last_mut()
        && prev["role"] == "user"
        && let Some(prev_blocks) = prev["content"].as_array_mut()
        && prev_blocks.iter().all(|b| b["type"] == "tool_result")
    {
        prev_blocks.extend(blocks);
        return;
    }
    let content = match blocks.as_slice() {
        [one] if is_plain_text(one, &[]) => one["text"].clone(),
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
    fn openai_images_come_back_verbatim_beside_the_text() {
        let v = json!([
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
            ]}
        ]);
        assert_eq!(round_trip(v.clone(), Format::OpenAi), v);
        let h = import(v, Format::OpenAi).unwrap();
        assert!(matches!(h.messages[0].blocks[1], Block::Part(_)));
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
    fn anthropic_keeps_images_thinking_cached_system_and_result_images() {
        let v = json!({
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "text", "text": "Screenshot it."}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig=="},
                    {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                        {"type": "text", "text": "taken"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                    ]}
                ]}
            ]
        });
        assert_eq!(round_trip(v.clone(), Format::Anthropic), v);
        let h = import(v, Format::Anthropic).unwrap();
        let last = &h.messages[3];
        assert!(matches!(
            &last.blocks[1],
            Block::Part(Part {
                of_result: true,
                ..
            })
        ));
        assert_eq!(last.tool_results().next().unwrap().content, "taken");
    }

    #[test]
    fn responses_round_trips_items_with_reasoning_parallel_calls_and_images() {
        let v = json!({
            "model": "gpt-x",
            "instructions": "You are careful.",
            "input": [
                {"role": "developer", "content": "Answer in English."},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "Compare these."},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
                ]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {"type": "function_call_output", "call_id": "call_2", "output": "24C"},
                {"role": "assistant", "content": "Rome is warmer."}
            ]
        });
        let back = round_trip(v.clone(), Format::OpenAiResponses);
        let mut want = v.clone();
        // The developer role comes back as system; all else is equal.
        want["input"][0]["role"] = json!("system");
        assert_eq!(back, want);
        let h = import(v, Format::OpenAiResponses).unwrap();
        // Reasoning and both calls are one assistant turn.
        assert_eq!(h.messages[2].role, Role::Assistant);
        assert_eq!(h.messages[2].tool_uses().count(), 2);
        assert!(matches!(h.messages[1].blocks[0], Block::Part(_)));
    }

    #[test]
    fn responses_output_messages_become_easy_messages() {
        let v = json!([
            {"role": "user", "content": "hi"},
            {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "hello", "annotations": []}]}
        ]);
        let back = round_trip(v, Format::OpenAiResponses);
        assert_eq!(
            back,
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
        );
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
        let r = export(&h, Format::OpenAiResponses);
        assert_eq!(r.as_array().unwrap().len(), 4);
        assert_eq!(r[3]["type"], "function_call_output");
        assert_eq!(r[3]["call_id"], "b");
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
        assert!(e.contains("an array, or an object"), "{e}");
        let e = import(
            json!([{"role": "user", "content": [{"source": {}}]}]),
            Format::Anthropic,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("messages[0].content[0] has no \"type\""), "{e}");
        let e = import(json!({"input": 3}), Format::OpenAiResponses)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"input\" array"), "{e}");
    }
}
