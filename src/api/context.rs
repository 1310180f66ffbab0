//! `spillway.v1.Context`: RepairHistory, CompactHistory, Recall.

use std::collections::HashMap;

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{AppState, blocking, convert, principal, redaction_detail};
use crate::audit::{NewEvent, action};
use crate::auth::access::Rpc;
use crate::context::compact::{self, Archive, ArchiveInfo, CompactSettings};
use crate::context::model::{self, Block, Message, Role};
use crate::context::repair::{self, RepairReport};
use crate::error::ApiError;
use crate::ids::PayloadId;
use crate::proto::{self, block, context_server::Context};
use crate::redact::{RedactCounts, Redactor};
use crate::store::ReadSpec;
use crate::store::records::SessionRecord;
use crate::store::{Quota, Store, StoreError, UploadMeta};

/// Most messages in one history.
const MAX_MESSAGES: usize = 100_000;

/// The Context service.
#[derive(Debug, Clone)]
pub struct ContextService {
    state: AppState,
}

impl ContextService {
    /// Wraps the shared state.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

/// Archives originals as payloads of the session, found again by recall key.
/// An archived result that names payloads (an offload notice does) is
/// recorded as derived from them, so deleting a payload deletes its
/// archived notices too. Originals arrive redacted (see [`redact_results`]);
/// `redactions` holds the counts of each redacted one, by its recall key,
/// for the payload's record.
struct StoreArchive<'a> {
    store: &'a Store,
    session: &'a SessionRecord,
    quota: Quota,
    redactions: HashMap<String, RedactCounts>,
}

/// Payload IDs an archived result may name and be recorded as derived from.
const MAX_ARCHIVE_REFERENCES: usize = 64;

impl StoreArchive<'_> {
    /// The payloads `content` names that this session or its parent holds.
    fn referenced(&self, content: &str) -> Result<Vec<PayloadId>, StoreError> {
        static ID: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new(&format!("{}[0-9a-f]{{32}}", PayloadId::PREFIX))
                .expect("a valid pattern")
        });
        let mut out: Vec<PayloadId> = Vec::new();
        for m in ID.find_iter(content) {
            let Ok(id) = PayloadId::parse(m.as_str()) else {
                continue;
            };
            if out.contains(&id) {
                continue;
            }
            let readable = match self.store.payload(&id) {
                Ok(p) => {
                    p.session_id == self.session.id
                        || self.session.parent.as_ref() == Some(&p.session_id)
                }
                Err(StoreError::NotFound { .. }) => false,
                Err(e) => return Err(e),
            };
            if readable {
                out.push(id);
                if out.len() == MAX_ARCHIVE_REFERENCES {
                    break;
                }
            }
        }
        Ok(out)
    }
}

impl Archive for StoreArchive<'_> {
    type Error = StoreError;

    fn find(&mut self, key: &str) -> Result<Option<ArchiveInfo>, StoreError> {
        let Some(p) = self.store.find_content(&self.session.id, key)? else {
            return Ok(None);
        };
        let head = self.store.read(
            &p,
            ReadSpec::Bytes {
                offset: 0,
                length: 16 * 1024,
            },
            16 * 1024,
        )?;
        Ok(Some(ArchiveInfo {
            key: key.to_owned(),
            lines: p.line_count,
            chars: p.chars,
            kind: crate::inspect::detect::detect(&head.data, "").to_string(),
        }))
    }

    fn store(
        &mut self,
        key: &str,
        content: &str,
        tool_name: &str,
    ) -> Result<ArchiveInfo, StoreError> {
        let mut derived_from = self.referenced(content)?;
        // An archive of bytes stored as a payload is an archive of that
        // payload, even when it does not name it.
        let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(content.as_bytes()));
        if let Some(same) = self.store.find_content(&self.session.id, &sha)?
            && !derived_from.contains(&same.id)
        {
            derived_from.push(same.id);
        }
        let mut upload = self.store.begin_upload(
            &self.session.id,
            UploadMeta {
                name: format!("ccr-{key}.txt"),
                content_type: "text/plain; charset=utf-8".into(),
                tool_name: tool_name.to_owned(),
                derived_from,
                archive_key: key.to_owned(),
                quota: self.quota,
                redactions: self.redactions.get(key).cloned().unwrap_or_default(),
                ..Default::default()
            },
        )?;
        upload.write(content.as_bytes())?;
        upload.finish()?;
        Ok(compact::describe(key, content))
    }
}

/// Redacts the content of every tool result in place, before anything reads
/// it: what is archived, previewed and returned is the redacted text, and
/// recall keys are those of the redacted text (so Recall finds what was
/// stored). Returns the total, and the counts of each changed result by its
/// new recall key.
fn redact_results(
    messages: &mut [Message],
    redactor: &Redactor,
) -> (RedactCounts, HashMap<String, RedactCounts>) {
    let mut total = RedactCounts::default();
    let mut by_key = HashMap::new();
    if redactor.is_empty() {
        return (total, by_key);
    }
    for block in messages.iter_mut().flat_map(|m| m.blocks.iter_mut()) {
        let Block::ToolResult(r) = block else {
            continue;
        };
        let (text, counts) = redactor.redact_str(&r.content);
        if counts.is_empty() {
            continue;
        }
        r.content = text.into_owned();
        total.add(&counts);
        by_key
            .entry(compact::recall_key(&r.content))
            .or_insert_with(RedactCounts::default)
            .add(&counts);
    }
    (total, by_key)
}

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
                    Some(block::Block::ToolUse(u)) => Ok(Block::ToolUse(model::ToolUse { id: u.id, name: u.name, input_json: u.input_json })),
                    Some(block::Block::ToolResult(r)) => Ok(Block::ToolResult(model::ToolResult {
                        tool_use_id: r.tool_use_id,
                        content: r.content,
                        is_error: r.is_error,
                        error_code: r.error_code,
                        tool_name: r.tool_name,
                    })),
                    None => Err(ApiError::BadRequest(format!("messages[{i}].blocks[{j}] is empty; set text, tool_use or tool_result"))),
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
                    }),
                })
                .collect(),
        })
        .collect()
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
    // A budget below a preview's own size could never be met.
    if out.per_result_chars < 6000 || out.per_turn_chars < out.per_result_chars {
        return Err(ApiError::BadRequest(format!(
            "settings.per_result_chars must be at least 6000 and settings.per_turn_chars at least per_result_chars; got {} and {}",
            out.per_result_chars, out.per_turn_chars
        )));
    }
    if out.truncate_age == 0 || out.clear_age < out.truncate_age {
        return Err(ApiError::BadRequest(
            "settings.truncate_age must be at least 1 and clear_age at least truncate_age".into(),
        ));
    }
    Ok(out)
}

#[tonic::async_trait]
impl Context for ContextService {
    #[instrument(name = "context.repair", skip_all, err(level = "info"))]
    async fn repair_history(
        &self,
        req: Request<proto::RepairHistoryRequest>,
    ) -> Result<Response<proto::RepairHistoryResponse>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::RepairHistory).await?;
        let messages = messages_from_proto(req.into_inner().messages)?;
        // No session here: the server's and the caller's tenant's rules.
        let tenant = self.state.tenant_policy(&p.tenant).await?;
        let rules =
            crate::policy::effective(&self.state.server_policy(), &tenant, &Default::default())
                .redact;
        let redactor = self.state.redactor(&rules).await?;
        let (messages, report) = blocking(move || {
            let mut messages = messages;
            redact_results(&mut messages, &redactor);
            Ok::<_, ApiError>(repair::repair(messages))
        })
        .await?;
        Ok(Response::new(proto::RepairHistoryResponse {
            messages: messages_to_proto(messages),
            report: Some(repair_report(report)),
        }))
    }

    #[instrument(
        name = "context.compact",
        skip_all,
        fields(session_id),
        err(level = "info")
    )]
    async fn compact_history(
        &self,
        req: Request<proto::CompactHistoryRequest>,
    ) -> Result<Response<proto::CompactHistoryResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let session = self
            .state
            .session_for(&p, Rpc::CompactHistory, &r.session_id)
            .await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        let settings = settings(r.settings)?;
        let messages = messages_from_proto(r.messages)?;
        let current_turn = if r.current_turn == 0 {
            messages
                .iter()
                .filter(|m| m.role == Role::Assistant)
                .count() as u32
        } else {
            r.current_turn
        };
        let (policy, redactor) = self.state.session_redactor(&session).await?;
        let quota = AppState::quota(&policy);
        let store = self.state.store.clone();
        let sid = session.id.clone();
        let (messages, repaired, report, redacted) = blocking(move || {
            let mut messages = messages;
            let (redacted, redactions) = redact_results(&mut messages, &redactor);
            let mut archive = StoreArchive {
                store: &store,
                session: &session,
                quota,
                redactions,
            };
            compact::compact(messages, current_turn, &settings, &mut archive)
                .map(|(m, repaired, report)| (m, repaired, report, redacted))
        })
        .await?;
        self.state
            .audit(
                &p,
                NewEvent::new(action::HISTORY_COMPACT)
                    .session(&sid)
                    .detail(format!(
                        "archived={} truncated={} summarized={} budget_offloaded={} chars_saved={}{}",
                        report.archived_keys.len(),
                        report.truncated,
                        report.summarized,
                        report.budget_offloaded,
                        report.chars_saved,
                        redaction_detail(&redacted)
                    )),
            )
            .await?;
        tracing::info!(
            archived = report.archived_keys.len(),
            chars_saved = report.chars_saved,
            "history compacted"
        );
        Ok(Response::new(proto::CompactHistoryResponse {
            messages: messages_to_proto(messages),
            report: Some(proto::CompactReport {
                truncated: report.truncated,
                summarized: report.summarized,
                budget_offloaded: report.budget_offloaded,
                chars_saved: report.chars_saved,
                archived_keys: report.archived_keys,
                redactions: convert::redaction_map(&redacted),
            }),
            repair: Some(repair_report(repaired)),
        }))
    }

    #[instrument(name = "context.recall", skip_all, err(level = "info"))]
    async fn recall(
        &self,
        req: Request<proto::RecallRequest>,
    ) -> Result<Response<proto::RecallResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let session = self
            .state
            .session_for(&p, Rpc::Recall, &r.session_id)
            .await?;
        let key = r
            .key
            .trim()
            .trim_start_matches("<<ccr:")
            .trim_end_matches(">>")
            .to_ascii_lowercase();
        if key.len() != 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ApiError::BadRequest(format!(
                "key {:?} is not a recall key: give the 16 hex digits of a <<ccr:KEY>> marker",
                r.key.chars().take(40).collect::<String>()
            ))
            .into());
        }
        let limit = self.state.config.limits.read_max_bytes;
        // Without allow_download, Recall returns no more than a Read may.
        let preview = (!self.state.effective_policy(&session).await?.allow_download)
            .then(|| self.state.config.offload.preview_size() as u64);
        let store = self.state.store.clone();
        let sid = session.id.clone();
        let found = blocking(move || -> Result<_, ApiError> {
            let Some(p) = store.find_content(&sid, &key)? else {
                return Err(ApiError::Missing(format!(
                    "no archived result <<ccr:{key}>> in session {sid}; archives live and die with their session, so it was never archived here or has been deleted"
                )));
            };
            if let Some(preview) = preview
                && p.size > preview
            {
                return Err(ApiError::Denied(format!(
                    "this session's policy has allow_download = false, so Recall returns at most {preview} bytes (the preview size) and the archived result is {} bytes; Read payload {} in ranges of at most {preview} bytes, or Search or Inspect it, or ask compliance to allow downloads",
                    p.size, p.id
                )));
            }
            if p.size > limit {
                return Err(ApiError::Limit(format!(
                    "the archived result is {} bytes, over limits.read_max_bytes ({limit}); Read payload {} in ranges, or Search it",
                    p.size, p.id
                )));
            }
            let out = store.read(&p, ReadSpec::Bytes { offset: 0, length: p.size.max(1) }, p.size.max(1))?;
            Ok((p.id.to_string(), String::from_utf8_lossy(&out.data).into_owned(), p.sha256, key))
        })
        .await;
        let found = self
            .state
            .refusal(&p, Rpc::Recall, found, session.id.as_str(), "")
            .await?;
        self.state
            .audit(
                &p,
                NewEvent::new(action::HISTORY_RECALL)
                    .session(&session.id)
                    .payload(&found.0)
                    .sha256(found.2)
                    .detail(format!("key={} bytes={}", found.3, found.1.len())),
            )
            .await?;
        Ok(Response::new(proto::RecallResponse {
            content: found.1,
            payload_id: found.0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_redacted_and_counted_by_their_new_recall_key() {
        let r = Redactor::compile(&["builtin:email".to_owned()]).unwrap();
        let result = |content: &str| {
            Block::ToolResult(model::ToolResult {
                tool_use_id: "t".into(),
                content: content.into(),
                is_error: false,
                error_code: String::new(),
                tool_name: "read".into(),
            })
        };
        let mut messages = vec![
            Message {
                role: Role::User,
                blocks: vec![Block::Text("mail me at a@b.io".into())],
            },
            Message {
                role: Role::Tool,
                blocks: vec![result("from a@b.io to c@d.io"), result("clean")],
            },
        ];
        let (total, by_key) = redact_results(&mut messages, &r);
        assert_eq!(total.get("email"), 2);
        let Block::ToolResult(t) = &messages[1].blocks[0] else {
            unreachable!()
        };
        assert_eq!(t.content, "from [REDACTED:email] to [REDACTED:email]");
        assert_eq!(by_key.len(), 1);
        assert_eq!(by_key[&compact::recall_key(&t.content)].total, 2);
        // Only tool output is redacted.
        assert_eq!(
            messages[0].blocks[0],
            Block::Text("mail me at a@b.io".into())
        );
    }
}
