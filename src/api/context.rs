//! `spillway.v1.Context`: RepairHistory, CompactHistory, Recall.

use tracing::instrument;

use super::convert;
use crate::context::{
    self, Block, CompactSettings, FormatError, HistoryShape, Message, RepairReport, Role,
};
use crate::error::ApiError;
use crate::proto::{self, block, context_server::Context};

/// Most messages in one history.
const MAX_MESSAGES: usize = 100_000;

front!(
    /// The Context service.
    ContextService
);

/// Messages from the wire, validated.
pub fn messages_from_proto(messages: Vec<proto::Message>) -> Result<Vec<Message>, ApiError> {
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::BadRequest(format!(
            "{} messages; at most {MAX_MESSAGES} are allowed",
            messages.len()
        )));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match proto::Role::try_from(m.role) {
                Ok(proto::Role::System) => Role::System,
                Ok(proto::Role::User) => Role::User,
                Ok(proto::Role::Assistant) => Role::Assistant,
                Ok(proto::Role::Tool) => Role::Tool,
                _ => return Err(ApiError::BadRequest(format!("messages[{i}].role is not set; use ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL"))),
            };
            let blocks = m
                .blocks
                .into_iter()
                .enumerate()
                .map(|(j, b)| match b.block {
                    Some(block::Block::Text(t)) => Ok(Block::Text(t)),
                    Some(block::Block::ToolUse(u)) => Ok(Block::ToolUse(context::ToolUse { id: u.id, name: u.name, input_json: u.input_json })),
                    Some(block::Block::ToolResult(r)) => Ok(Block::ToolResult(context::ToolResult {
                        tool_use_id: r.tool_use_id,
                        content: r.content,
                        is_error: r.is_error,
                        error_code: r.error_code,
                        tool_name: r.tool_name,
                    })),
                    Some(block::Block::Part(p)) => Ok(Block::Part(context::Part { json: p.json, of_result: p.of_result })),
                    None => Err(ApiError::BadRequest(format!("messages[{i}].blocks[{j}] is empty; set text, tool_use, tool_result or part"))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Message { role, blocks })
        })
        .collect()
}

/// Messages for the wire.
pub fn messages_to_proto(messages: Vec<Message>) -> Vec<proto::Message> {
    messages
        .into_iter()
        .map(|m| proto::Message {
            role: match m.role {
                Role::System => proto::Role::System,
                Role::User => proto::Role::User,
                Role::Assistant => proto::Role::Assistant,
                Role::Tool => proto::Role::Tool,
            } as i32,
            blocks: m
                .blocks
                .into_iter()
                .map(|b| proto::Block {
                    block: Some(match b {
                        Block::Text(t) => block::Block::Text(t),
                        Block::ToolUse(u) => block::Block::ToolUse(proto::ToolUseBlock {
                            id: u.id,
                            name: u.name,
                            input_json: u.input_json,
                        }),
                        Block::ToolResult(r) => block::Block::ToolResult(proto::ToolResultBlock {
                            tool_use_id: r.tool_use_id,
                            content: r.content,
                            is_error: r.is_error,
                            error_code: r.error_code,
                            tool_name: r.tool_name,
                        }),
                        Block::Part(p) => block::Block::Part(proto::PartBlock {
                            json: p.json,
                            of_result: p.of_result,
                        }),
                    }),
                })
                .collect(),
        })
        .collect()
}

/// The history of a request: provider JSON when `format` is set (see
/// [`formats`]), else the neutral messages. Parses on the blocking pool.
async fn history_in(
    format: i32,
    json: String,
    messages: Vec<proto::Message>,
) -> Result<(Vec<Message>, Option<HistoryShape>), ApiError> {
    let bad = |e: FormatError| match e {
        FormatError::TooLarge { .. } => ApiError::Limit(e.to_string()),
        e => ApiError::BadRequest(e.to_string()),
    };
    let Some(format) =
        context::requested_format(format, &json, !messages.is_empty()).map_err(bad)?
    else {
        return messages_from_proto(messages).map(|m| (m, None));
    };
    let (m, shape) =
        off_runtime(move || context::decode_history(format, &json).map_err(bad)).await?;
    if m.len() > MAX_MESSAGES {
        return Err(ApiError::BadRequest(format!(
            "{} messages; at most {MAX_MESSAGES} are allowed",
            m.len()
        )));
    }
    Ok((m, Some(shape)))
}

/// A reply's history: in the request's format, or as neutral messages.
async fn history_out(
    messages: Vec<Message>,
    shape: Option<HistoryShape>,
) -> Result<(Vec<proto::Message>, String), ApiError> {
    match shape {
        Some(shape) => {
            off_runtime(move || Ok((Vec::new(), context::encode_history(shape, messages)))).await
        }
        None => Ok((messages_to_proto(messages), String::new())),
    }
}

/// Runs a conversion of a large history on the blocking pool.
async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("history conversion failed: {e}")))?
}

fn repair_report(r: RepairReport) -> proto::RepairReport {
    proto::RepairReport {
        synthetic_results_injected: r.synthetic_results_injected,
        orphan_results_removed: r.orphan_results_removed,
        duplicate_tool_uses_pruned: r.duplicate_tool_uses_pruned,
        results_relocated: r.results_relocated,
        missing_tool_use_ids: r.missing_tool_use_ids,
        orphan_tool_result_ids: r.orphan_tool_result_ids,
    }
}

fn settings(s: Option<proto::CompactSettings>) -> Result<CompactSettings, ApiError> {
    // The service checks the values.
    let d = CompactSettings::default();
    let Some(s) = s else { return Ok(d) };
    let out = CompactSettings {
        per_result_chars: s.per_result_chars.unwrap_or(d.per_result_chars),
        per_turn_chars: s.per_turn_chars.unwrap_or(d.per_turn_chars),
        truncate_age: s.truncate_age.unwrap_or(d.truncate_age),
        clear_age: s.clear_age.unwrap_or(d.clear_age),
        min_chars: s.min_chars.unwrap_or(d.min_chars),
        exempt_tools: if s.exempt_tools.is_empty() {
            d.exempt_tools
        } else {
            s.exempt_tools
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect()
        },
    };
    Ok(out)
}

rpcs! {
    impl Context for ContextService {
        #[instrument(name = "context.repair", skip_all, err(level = "info"))]
        fn repair_history(&self, p, r: proto::RepairHistoryRequest)
            -> proto::RepairHistoryResponse
        {
            let (messages, shape) = history_in(r.format, r.history_json, r.messages).await?;
            let reply = self.service.repair_history(&p, messages).await?;
            let (messages, history_json) = history_out(reply.messages, shape).await?;
            proto::RepairHistoryResponse {
                messages,
                report: Some(repair_report(reply.report)),
                history_json,
            }
        }

        #[instrument(name = "context.compact", skip_all, fields(session_id), err(level = "info"))]
        fn compact_history(&self, p, r: proto::CompactHistoryRequest)
            -> proto::CompactHistoryResponse
        {
            let settings = settings(r.settings)?;
            let (messages, shape) = history_in(r.format, r.history_json, r.messages).await?;
            let reply = self
                .service
                .compact_history(&p, &r.session_id, messages, r.current_turn, settings)
                .await?;
            let report = reply.report;
            let (messages, history_json) = history_out(reply.messages, shape).await?;
            proto::CompactHistoryResponse {
                messages,
                history_json,
                report: Some(proto::CompactReport {
                    truncated: report.truncated,
                    summarized: report.summarized,
                    budget_offloaded: report.budget_offloaded,
                    chars_saved: report.chars_saved,
                    archived_keys: report.archived_keys,
                    stored_keys: report.stored_keys,
                    redactions: convert::redaction_map(&reply.redactions),
                }),
                repair: Some(repair_report(reply.repair)),
            }
        }

        #[instrument(name = "context.recall", skip_all, err(level = "info"))]
        fn recall(&self, p, r: proto::RecallRequest) -> proto::RecallResponse {
            let (id, content) = self.service.recall(&p, &r.session_id, &r.key).await?;
            proto::RecallResponse {
                content,
                payload_id: id.to_string(),
            }
        }
    }
}
