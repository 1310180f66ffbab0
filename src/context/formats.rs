//! Provider-format histories on the wire: the `format` and `history_json`
//! fields of RepairHistory and CompactHistory. A history arrives as provider
//! JSON, goes through the same repair and compaction as the neutral
//! messages, and goes back in the same format with whatever the object held
//! besides its messages. The CLI, the Python kit and any other front send
//! the JSON as it is, so the [`super::adapters`] are the one converter.

use serde_json::{Map, Value};

use super::adapters::{self, AdapterError, Format, History};
use super::model::Message;

/// Largest `history_json` accepted (32 MiB).
pub const MAX_HISTORY_JSON_BYTES: usize = 32 << 20;

/// Why a provider-format history was refused.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Over [`MAX_HISTORY_JSON_BYTES`].
    #[error(
        "history_json is {bytes} bytes, over the limit of {limit} bytes for a provider-format history; compact the older part of the history first and send the rest, or send it in the neutral `messages` field"
    )]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// `history_json` without `format`.
    #[error(
        "history_json is set but format is not; set format to HISTORY_FORMAT_OPENAI_CHAT, HISTORY_FORMAT_OPENAI_RESPONSES or HISTORY_FORMAT_ANTHROPIC, or send the neutral messages"
    )]
    NoFormat,
    /// A `format` number this server does not know.
    #[error(
        "format {0} is not a HistoryFormat this server knows; use HISTORY_FORMAT_OPENAI_CHAT (1), HISTORY_FORMAT_OPENAI_RESPONSES (2) or HISTORY_FORMAT_ANTHROPIC (3)"
    )]
    Unknown(i32),
    /// Both the neutral messages and `history_json`.
    #[error(
        "both messages and history_json are set; with format {0} send the history only in history_json"
    )]
    Both(&'static str),
    /// `format` was set and `history_json` is empty.
    #[error(
        "format is {0} but history_json is empty; put the history's JSON in history_json, or unset format and send the neutral messages"
    )]
    Empty(&'static str),
    /// Not JSON at all.
    #[error(
        "history_json is not valid JSON ({0}); send the history exactly as the provider's API takes it"
    )]
    NotJson(serde_json::Error),
    /// JSON, but not a history of that format.
    #[error("history_json is not a {format} history: {source}")]
    Shape {
        /// The format's name.
        format: &'static str,
        /// What was wrong, and where.
        source: AdapterError,
    },
}

/// What of a provider-format request the reply needs: the format, and the
/// object's other fields.
#[derive(Debug, Clone)]
pub struct Shape {
    format: Format,
    rest: Option<Map<String, Value>>,
}

/// The name clients use for a format (the proto enum value's name).
pub fn name(format: Format) -> &'static str {
    match format {
        Format::OpenAi => "HISTORY_FORMAT_OPENAI_CHAT",
        Format::OpenAiResponses => "HISTORY_FORMAT_OPENAI_RESPONSES",
        Format::Anthropic => "HISTORY_FORMAT_ANTHROPIC",
    }
}

/// The format a request asks for (`format` is the proto `HistoryFormat`
/// number), or `None` for the neutral messages; refuses a mix.
pub fn requested(
    format: i32,
    history_json: &str,
    has_messages: bool,
) -> Result<Option<Format>, FormatError> {
    use crate::proto::HistoryFormat as H;
    let format = match H::try_from(format) {
        Ok(H::Unspecified) if history_json.is_empty() => return Ok(None),
        Ok(H::Unspecified) => return Err(FormatError::NoFormat),
        Ok(H::OpenaiChat) => Format::OpenAi,
        Ok(H::OpenaiResponses) => Format::OpenAiResponses,
        Ok(H::Anthropic) => Format::Anthropic,
        Err(_) => return Err(FormatError::Unknown(format)),
    };
    if has_messages {
        return Err(FormatError::Both(name(format)));
    }
    Ok(Some(format))
}

/// Reads `json` as a history in `format`.
pub fn decode(format: Format, json: &str) -> Result<(Vec<Message>, Shape), FormatError> {
    if json.len() > MAX_HISTORY_JSON_BYTES {
        return Err(FormatError::TooLarge {
            bytes: json.len(),
            limit: MAX_HISTORY_JSON_BYTES,
        });
    }
    if json.trim().is_empty() {
        return Err(FormatError::Empty(name(format)));
    }
    let value: Value = serde_json::from_str(json).map_err(FormatError::NotJson)?;
    let History { messages, rest } =
        adapters::import(value, format).map_err(|source| FormatError::Shape {
            format: name(format),
            source,
        })?;
    Ok((messages, Shape { format, rest }))
}

/// Writes `messages` back as JSON of the request's shape.
pub fn encode(shape: Shape, messages: Vec<Message>) -> String {
    let history = History {
        messages,
        rest: shape.rest,
    };
    adapters::export(&history, shape.format).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_history_names_the_limit_and_what_to_do() {
        let big = format!("[{}]", " ".repeat(MAX_HISTORY_JSON_BYTES));
        let e = decode(Format::OpenAi, &big).unwrap_err().to_string();
        assert!(e.contains("over the limit of 33554432 bytes"), "{e}");
        assert!(e.contains("compact the older part"), "{e}");
    }

    #[test]
    fn bad_json_and_wrong_shapes_say_which_format_was_expected() {
        let e = decode(Format::Anthropic, "{").unwrap_err().to_string();
        assert!(e.starts_with("history_json is not valid JSON"), "{e}");
        let e = decode(Format::OpenAiResponses, "{\"messages\": []}")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a HISTORY_FORMAT_OPENAI_RESPONSES history"),
            "{e}"
        );
        let e = decode(Format::OpenAi, "").unwrap_err().to_string();
        assert!(e.contains("history_json is empty"), "{e}");
    }

    #[test]
    fn the_reply_keeps_the_object_fields_beside_the_messages() {
        let (m, shape) = decode(
            Format::OpenAi,
            r#"{"model":"gpt-x","messages":[{"role":"user","content":"hi"}],"temperature":0}"#,
        )
        .unwrap();
        assert_eq!(
            encode(shape, m),
            r#"{"model":"gpt-x","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#
        );
    }
}
