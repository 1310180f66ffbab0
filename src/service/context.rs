//! History operations: RepairHistory, CompactHistory and Recall.
//!
//! Tool results are redacted before anything reads them; originals that
//! compaction clears are archived as payloads of the session, found again
//! by their recall key.

use std::collections::HashMap;

use super::{Service, blocking, redaction_detail};
use crate::audit::{NewEvent, action};
use crate::auth::Principal;
use crate::auth::access::Rpc;
use crate::context::{
    self, Archive, ArchiveInfo, Block, CompactReport, CompactSettings, Message, RepairReport, Role,
};
use crate::error::{ApiError, ApiResult};
use crate::ids::PayloadId;
use crate::redact::{RedactCounts, Redactor};
use crate::store::{Quota, ReadSpec, SessionRecord, Store, StoreError, UploadMeta};

/// A repaired history.
#[derive(Debug)]
pub struct RepairReply {
    /// The messages, paired.
    pub messages: Vec<Message>,
    /// What was repaired.
    pub report: RepairReport,
}

/// A compacted history.
#[derive(Debug)]
pub struct CompactReply {
    /// The messages, compacted.
    pub messages: Vec<Message>,
    /// What compaction did.
    pub report: CompactReport,
    /// What the repair before it did.
    pub repair: RepairReport,
    /// Redactions in the tool results, over all of them.
    pub redactions: RedactCounts,
}

/// Checks compaction settings: a budget below a preview's own size could
/// never be met.
fn check_settings(s: &CompactSettings) -> ApiResult<()> {
    if s.per_result_chars < 6000 || s.per_turn_chars < s.per_result_chars {
        return Err(ApiError::BadRequest(format!(
            "settings.per_result_chars must be at least 6000 and settings.per_turn_chars at least per_result_chars; got {} and {}",
            s.per_result_chars, s.per_turn_chars
        )));
    }
    if s.truncate_age == 0 || s.clear_age < s.truncate_age {
        return Err(ApiError::BadRequest(
            "settings.truncate_age must be at least 1 and clear_age at least truncate_age".into(),
        ));
    }
    Ok(())
}

impl Service {
    /// Repairs tool-use/result pairing. No session: the server's and the
    /// caller's tenant's redaction rules apply.
    pub async fn repair_history(
        &self,
        p: &Principal,
        messages: Vec<Message>,
    ) -> ApiResult<RepairReply> {
        self.authorize(p, Rpc::RepairHistory).await?;
        let tenant = self.tenant_policy(&p.tenant).await?;
        let rules =
            crate::policy::effective(&self.server_policy(), &tenant, &Default::default()).redact;
        let redactor = self.redactor(&rules).await?;
        blocking(move || {
            let mut messages = messages;
            redact_results(&mut messages, &redactor);
            let (messages, report) = context::repair(messages);
            Ok::<_, ApiError>(RepairReply { messages, report })
        })
        .await
    }

    /// Compacts a history within its budgets, archiving what it clears in
    /// the session. `current_turn` 0: the count of assistant messages.
    pub async fn compact_history(
        &self,
        p: &Principal,
        session_id: &str,
        messages: Vec<Message>,
        current_turn: u32,
        settings: CompactSettings,
    ) -> ApiResult<CompactReply> {
        let session = self.session_for(p, Rpc::CompactHistory, session_id).await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        check_settings(&settings)?;
        let current_turn = match current_turn {
            0 => messages
                .iter()
                .filter(|m| m.role == Role::Assistant)
                .count() as u32,
            n => n,
        };
        let (policy, redactor) = self.session_redactor(&session).await?;
        let (quota, store, sid) = (
            Service::quota(&policy),
            self.store.clone(),
            session.id.clone(),
        );
        let reply = blocking(move || {
            let mut messages = messages;
            let (redactions, by_key) = redact_results(&mut messages, &redactor);
            let mut archive = StoreArchive {
                store: &store,
                session: &session,
                quota,
                redactions: by_key,
            };
            context::compact(messages, current_turn, &settings, &mut archive).map(
                |(messages, repair, report)| CompactReply {
                    messages,
                    report,
                    repair,
                    redactions,
                },
            )
        })
        .await?;
        let r = &reply.report;
        let detail = format!(
            "archived={} stored={} truncated={} summarized={} budget_offloaded={} chars_saved={}{}",
            r.archived_keys.len(),
            r.stored_keys.len(),
            r.truncated,
            r.summarized,
            r.budget_offloaded,
            r.chars_saved,
            redaction_detail(&reply.redactions)
        );
        let event = NewEvent::new(action::HISTORY_COMPACT)
            .session(&sid)
            .detail(detail);
        self.audit(p, event).await?;
        tracing::info!(
            archived = r.archived_keys.len(),
            stored = r.stored_keys.len(),
            chars_saved = r.chars_saved,
            "history compacted"
        );
        Ok(reply)
    }

    /// The archived original behind a `<<ccr:KEY>>` marker: its payload ID
    /// and its text.
    pub async fn recall(
        &self,
        p: &Principal,
        session_id: &str,
        raw_key: &str,
    ) -> ApiResult<(PayloadId, String)> {
        let session = self.session_for(p, Rpc::Recall, session_id).await?;
        let key = raw_key
            .trim()
            .trim_start_matches("<<ccr:")
            .trim_end_matches(">>")
            .to_ascii_lowercase();
        if key.len() != 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ApiError::BadRequest(format!(
                "key {:?} is not a recall key: give the 16 hex digits of a <<ccr:KEY>> marker",
                raw_key.chars().take(40).collect::<String>()
            )));
        }
        let limit = super::payloads::read_data_ceiling(self.config.limits.read_max_bytes);
        // Without allow_download, Recall returns no more than a Read may.
        let preview = (!self.effective_policy(&session).await?.allow_download)
            .then(|| self.config.offload.preview_size() as u64);
        let store = self.store.clone();
        let sid = session.id.clone();
        let found = blocking(move || recall_archived(&store, &sid, &key, preview, limit)).await;
        let (payload, content, key) = self
            .refusal(p, Rpc::Recall, found, session.id.as_str(), "")
            .await?;
        let event = NewEvent::new(action::HISTORY_RECALL)
            .session(&session.id)
            .payload(&payload.id)
            .sha256(payload.sha256.clone())
            .detail(format!("key={key} bytes={}", content.len()));
        self.audit(p, event).await?;
        Ok((payload.id, content))
    }
}

/// The archived result of `key` in `sid`, whole, within the preview bound
/// (without `allow_download`) and `limits.read_max_bytes`.
fn recall_archived(
    store: &Store,
    sid: &crate::ids::SessionId,
    key: &str,
    preview: Option<u64>,
    limit: u64,
) -> ApiResult<(crate::store::PayloadRecord, String, String)> {
    let Some(p) = store.find_content(sid, key)? else {
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
            "the archived result is {} bytes, more than one Recall returns ({limit} bytes: limits.read_max_bytes less the reply's framing); Read payload {} in byte ranges of at most {limit} bytes, or Search it",
            p.size, p.id
        )));
    }
    let whole = ReadSpec::Bytes {
        offset: 0,
        length: p.size.max(1),
    };
    let out = store.read(&p, whole, p.size.max(1))?;
    let text = String::from_utf8_lossy(&out.data).into_owned();
    Ok((p, text, key.to_owned()))
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
            kind: crate::inspect::detect(&head.data, "").to_string(),
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
        Ok(context::describe(key, content))
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
            .entry(context::recall_key(&r.content))
            .or_insert_with(RedactCounts::default)
            .add(&counts);
    }
    (total, by_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_redacted_and_counted_by_their_new_recall_key() {
        let r = Redactor::compile(&["builtin:email".to_owned()]).unwrap();
        let result = |content: &str| {
            Block::ToolResult(crate::context::ToolResult {
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
        assert_eq!(by_key[&context::recall_key(&t.content)].total, 2);
        // Only tool output is redacted.
        assert_eq!(
            messages[0].blocks[0],
            Block::Text("mail me at a@b.io".into())
        );
    }
}
