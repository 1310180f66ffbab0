//! Payload operations: offload, upload, inspect, search, stat, list, read,
//! download and delete.

use std::io::Read as _;

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::StreamExt as _;

use super::{Service, blocking, page_size, redact_bytes, redaction_detail};
use crate::audit::{NewEvent, action};
use crate::auth::Principal;
use crate::auth::access::{Access, Rpc, Source};
use crate::error::{ApiError, ApiResult};
use crate::ids::{PayloadId, SessionId};
use crate::inspect::Structure;
use crate::inspect::search::Hit;
use crate::offload::{Outcome, Overrides, ToolResult};
use crate::store::{Page, PayloadRecord, ReadOut, ReadSpec, ReceiptRecord, StoreError, UploadMeta};

/// Most payloads one Search may name.
const MAX_SEARCH_PAYLOADS: usize = 1000;
/// Longest search pattern, in bytes.
const MAX_PATTERN_BYTES: usize = 4096;
/// Most context lines around a match.
const MAX_CONTEXT_LINES: u32 = 10;
/// Longest name, content type, tool name or call ID accepted.
const MAX_FIELD: usize = 512;
/// Longest deletion reason accepted.
const MAX_REASON: usize = 1024;

/// Chunks in flight between the network and the disk writer of one upload.
/// With the message limit, this bounds an upload's memory.
const UPLOAD_QUEUE: usize = 4;
/// Chunks read ahead of a slow download client.
const DOWNLOAD_QUEUE: usize = 2;

/// One turn of tool results to offload.
#[derive(Debug, Default)]
pub struct OffloadTurn {
    /// The session that stores what is offloaded.
    pub session_id: String,
    /// The turn's results, in order.
    pub results: Vec<ToolResult>,
    /// Per-call settings over the server's offload defaults.
    pub overrides: Overrides,
}

/// What one turn's offload decided.
#[derive(Debug)]
pub struct OffloadReply {
    /// One outcome per result, in order.
    pub outcomes: Vec<Outcome>,
    /// Tokens that reach the model (inline results and notices).
    pub inline_tokens: u64,
    /// Tokens of the results that were offloaded.
    pub offloaded_tokens: u64,
}

/// One message of an upload stream.
#[derive(Debug)]
pub enum UploadPart {
    /// The header: which session, and what the bytes are. First, and once.
    Header {
        /// The session to store into.
        session_id: String,
        /// The payload's metadata (its quota is filled in here).
        meta: Box<UploadMeta>,
    },
    /// The next bytes.
    Data(bytes::Bytes),
    /// A message that carried neither.
    Empty,
}

/// A Search over one session's payloads.
#[derive(Debug, Default)]
pub struct SearchRequest {
    /// The session searched.
    pub session_id: String,
    /// The regex, or a literal with `fixed_string`.
    pub pattern: String,
    /// Treat the pattern as a literal.
    pub fixed_string: bool,
    /// Match without regard to case.
    pub case_insensitive: bool,
    /// Lines of context before and after each match.
    pub context_lines: u32,
    /// Most matches returned (0: 100).
    pub max_matches: u32,
    /// The payloads to search; empty: all of the session's.
    pub payload_ids: Vec<String>,
}

/// One match, in one payload.
#[derive(Debug)]
pub struct SearchHit {
    /// The payload it is in.
    pub payload_id: PayloadId,
    /// Where, and its lines.
    pub hit: Hit,
}

/// What a Search found.
#[derive(Debug, Default)]
pub struct SearchReply {
    /// The matches, in payload then file order.
    pub matches: Vec<SearchHit>,
    /// Every match seen, including those past the cap.
    pub total_matches_seen: u64,
    /// Whether the search stopped early (the note says why).
    pub truncated: bool,
    /// Why it stopped, and what was skipped.
    pub note: String,
}

/// An audit event of `action` on `payload`: its session, ID and content
/// hash.
fn payload_event(action: &'static str, payload: &PayloadRecord) -> NewEvent {
    NewEvent::new(action)
        .session(&payload.session_id)
        .payload(&payload.id)
        .sha256(payload.sha256.clone())
}

impl SearchReply {
    /// Marks the search as stopped early, for `why`.
    fn stop_short(&mut self, why: String) {
        self.truncated = true;
        self.note = why;
    }
}

/// A Read of one range.
#[derive(Debug, Clone, Default)]
pub struct ReadRequest {
    /// The payload.
    pub payload_id: String,
    /// The range.
    pub spec: Option<ReadSpec>,
    /// Most bytes returned (0: the default).
    pub max_bytes: u64,
}

/// The bytes of a Read, and where they are.
#[derive(Debug)]
pub struct ReadReply {
    /// The range read.
    pub out: ReadOut,
    /// The payload's size.
    pub total_bytes: u64,
    /// The payload's line count.
    pub total_lines: u64,
}

/// A download's chunks, in order; an error ends it.
pub type DownloadStream = mpsc::Receiver<ApiResult<bytes::Bytes>>;

/// Checks that none of `fields` is longer than [`MAX_FIELD`].
fn check_fields(prefix: &str, fields: [(&str, &str); 4]) -> ApiResult<()> {
    for (field, value) in fields {
        if value.len() > MAX_FIELD {
            return Err(ApiError::BadRequest(format!(
                "{prefix}{field} is {} bytes; at most {MAX_FIELD} are allowed",
                value.len()
            )));
        }
    }
    Ok(())
}

impl Service {
    /// Decides one turn: what stays inline and what is stored whole, behind
    /// a notice. Results are redacted first, so the estimate, the decision,
    /// the inline content, the preview and the stored bytes all see the
    /// redacted text.
    pub async fn offload(&self, p: &Principal, turn: OffloadTurn) -> ApiResult<OffloadReply> {
        let session = self.session_for(p, Rpc::Offload, &turn.session_id).await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        let (policy, redactor) = self.session_redactor(&session).await?;
        let config = &self.config.offload;
        let settings = crate::offload::Settings::resolve(config, &turn.overrides)?;
        for (i, t) in turn.results.iter().enumerate() {
            check_fields(
                &format!("results[{i}]."),
                [
                    ("tool_call_id", &t.tool_call_id),
                    ("tool_name", &t.tool_name),
                    ("content_type", &t.content_type),
                    ("", ""),
                ],
            )?;
        }
        let (store, max_results) = (self.store.clone(), config.max_results);
        let (sid, quota) = (session.id.clone(), Service::quota(&policy));
        let mut results = turn.results;
        let outcomes = blocking(move || {
            for t in &mut results {
                let (content, counts) = redact_bytes(&redactor, std::mem::take(&mut t.content));
                t.content = content;
                t.redactions = counts;
            }
            crate::offload::offload_turn(&store, &sid, results, &settings, max_results, quota)
        })
        .await;
        let event = NewEvent::new(action::PAYLOAD_OFFLOAD).session(&session.id);
        let outcomes = self.audit_failure(p, event, outcomes).await?;
        let mut reply = OffloadReply {
            outcomes: Vec::with_capacity(outcomes.len()),
            inline_tokens: 0,
            offloaded_tokens: 0,
        };
        let mut events = Vec::new();
        for o in outcomes {
            if o.disposition.offloaded() {
                reply.offloaded_tokens += o.estimate.tokens;
            }
            reply.inline_tokens += o.content_tokens;
            if let Some(stored) = &o.payload {
                tracing::info!(payload_id = %stored.id, bytes = stored.size, sha256 = %stored.sha256, redactions = stored.redactions.total, "result offloaded");
                let reason = match o.disposition {
                    crate::offload::Disposition::Aggregate => "aggregate",
                    _ => "per_call",
                };
                events.push(
                    NewEvent::new(action::PAYLOAD_OFFLOAD)
                        .session(&session.id)
                        .payload(&stored.id)
                        .sha256(stored.sha256.clone())
                        .detail(format!(
                            "bytes={} tokens={} reason={reason}{}",
                            stored.size,
                            o.estimate.tokens,
                            redaction_detail(&stored.redactions)
                        )),
                );
            }
            reply.outcomes.push(o);
        }
        self.audit_all(p, events).await?;
        Ok(reply)
    }

    /// Stores one payload from a stream: a header, then data. Nothing is
    /// kept unless the stream ends cleanly and every check passes; a
    /// stream idle for `limits.upload_idle_timeout` is abandoned.
    pub async fn upload<S>(&self, p: &Principal, parts: S) -> ApiResult<PayloadRecord>
    where
        S: Stream<Item = ApiResult<UploadPart>> + Unpin,
    {
        self.authorize(p, Rpc::Upload).await?;
        let limits = &self.config.limits;
        let _slot = self
            .upload_slots
            .try_acquire(&p.tenant)
            .map_err(|r| super::slot_refused(r, "uploads", "Finish or cancel one, then retry"))?;
        let (decode_limit, idle) = (limits.max_request_message_bytes, limits.upload_idle_timeout);
        let mut parts = std::pin::pin!(parts);
        let first = match tokio::time::timeout(idle, parts.next()).await {
            Ok(None) => Err(ApiError::BadRequest(
                "empty upload: the first chunk must carry the header".into(),
            )),
            Err(_) => Err(ApiError::Timeout(format!(
                "no upload header arrived for {} s (limits.upload_idle_timeout); send the header chunk first",
                idle.as_secs_f32()
            ))),
            Ok(Some(part)) => part,
        }?;
        let UploadPart::Header { session_id, meta } = first else {
            return Err(ApiError::BadRequest(
                "the first upload chunk must carry the header, not data".into(),
            ));
        };
        let mut meta = *meta;
        check_header(&meta)?;
        let session = self.session_for(p, Rpc::Upload, &session_id).await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        let (policy, redactor) = self.session_redactor(&session).await?;
        meta.quota = Service::quota(&policy);

        let (tx, rx) = mpsc::channel::<UploadMsg>(UPLOAD_QUEUE);
        let store = self.store.clone();
        let sid = session.id.clone();
        let writer =
            tokio::task::spawn_blocking(move || write_upload(&store, &sid, meta, &redactor, rx));
        let mut client_error: Option<ApiError> = None;
        let mut rate = crate::fairness::RateCheck::start(crate::fairness::RateFloor {
            min_per_sec: limits.upload_min_bytes_per_sec,
            grace: limits.upload_rate_grace,
        });
        loop {
            // The next chunk is due by the idle timeout, and by the time
            // the bytes so far stop covering the minimum rate.
            let idle_at = tokio::time::Instant::now() + idle;
            let due = rate.deadline().map_or(idle_at, |d| idle_at.min(d.into()));
            let error = match tokio::time::timeout_at(due, parts.next()).await {
                Err(_) => match rate.check() {
                    Err(slow) => ApiError::Timeout(format!(
                        "the upload was too slow: {slow} (limits.upload_min_bytes_per_sec, limits.upload_rate_grace); it was abandoned and nothing was stored. Send faster, or upload smaller parts"
                    )),
                    Ok(()) => ApiError::Timeout(format!(
                        "no upload chunk arrived for {} s (limits.upload_idle_timeout); the upload was abandoned and nothing was stored. Send chunks continuously, or retry",
                        idle.as_secs_f32()
                    )),
                },
                Ok(next) => match next {
                    // The service accepts Offload-sized messages; upload chunks
                    // keep the smaller per-message limit.
                    Some(Ok(UploadPart::Data(d))) if d.len() > decode_limit => {
                        ApiError::Limit(crate::error::oversize_message(
                            "limits.max_request_message_bytes",
                            decode_limit,
                        ))
                    }
                    Some(Ok(UploadPart::Data(d))) => {
                        rate.record(d.len() as u64);
                        if tx.send(UploadMsg::Data(d)).await.is_err() {
                            break; // the writer failed; its error is reported below
                        }
                        continue;
                    }
                    Some(Ok(UploadPart::Header { .. })) => ApiError::BadRequest(
                        "a second header arrived; send the header once, in the first chunk".into(),
                    ),
                    Some(Ok(UploadPart::Empty)) => continue,
                    Some(Err(e)) => e,
                    None => {
                        let _ = tx.send(UploadMsg::Finish).await;
                        break;
                    }
                },
            };
            client_error = Some(error);
            break;
        }
        drop(tx);
        let outcome = super::joined(writer).await;
        if let Some(e) = client_error {
            return Err(e);
        }
        let event = NewEvent::new(action::PAYLOAD_UPLOAD).session(&session.id);
        let record = match self.audit_failure(p, event.clone(), outcome).await? {
            Some(record) => record,
            None => {
                return Err(ApiError::Cancelled(
                    "the upload stream ended early; nothing was stored".into(),
                ));
            }
        };
        tracing::Span::current().record("payload_id", tracing::field::display(&record.id));
        tracing::info!(bytes = record.size, sha256 = %record.sha256, redactions = record.redactions.total, "payload stored");
        let detail = format!(
            "bytes={}{}",
            record.size,
            redaction_detail(&record.redactions)
        );
        let event = event
            .payload(&record.id)
            .sha256(record.sha256.clone())
            .detail(detail);
        self.audit(p, event).await?;
        Ok(record)
    }

    /// Infers a payload's structure (cached by content).
    pub async fn inspect(
        &self,
        p: &Principal,
        payload_id: &str,
    ) -> ApiResult<(PayloadRecord, std::sync::Arc<Structure>)> {
        let (_, payload) = self.payload_for(p, Rpc::Inspect, payload_id).await?;
        let _slot = self
            .inspect_slots
            .acquire_within(&p.tenant, self.config.limits.slot_wait)
            .await
            .map_err(|r| {
                super::slot_refused(r, "inspects", "Wait for one to finish, then retry")
            })?;
        let (store, cache) = (self.store.clone(), self.inspect_cache.clone());
        let record = payload.clone();
        let structure = blocking(move || {
            let content = crate::inspect::Content {
                sha256: &record.sha256,
                content_type: &record.content_type,
                size: record.size,
                line_count: record.line_count,
            };
            cache.get_or_infer(content, || store.open_payload(&record))
        })
        .await?;
        tracing::info!(payload_id = %payload.id, detected = %structure.detected_type, "inspected");
        let event = payload_event(action::PAYLOAD_INSPECT, &payload)
            .detail(format!("type={}", structure.detected_type));
        self.audit(p, event).await?;
        Ok((payload, structure))
    }

    /// Searches a session's payloads (or the named ones, which may be its
    /// parent's) within the match cap, the reply bound and the time limit.
    pub async fn search(&self, p: &Principal, r: SearchRequest) -> ApiResult<SearchReply> {
        let session = self.session_for(p, Rpc::Search, &r.session_id).await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        check_search(&r)?;
        let _slot = self
            .search_slots
            .acquire_within(&p.tenant, self.config.limits.slot_wait)
            .await
            .map_err(|r| {
                super::slot_refused(
                    r,
                    "searches",
                    "Wait for one to finish (each ends by limits.search_timeout), then retry",
                )
            })?;
        let limits = &self.config.limits;
        let max_matches = match r.max_matches {
            0 => 100,
            n => n.min(limits.max_search_matches),
        } as usize;
        let query = crate::inspect::search::Query {
            pattern: r.pattern,
            fixed_string: r.fixed_string,
            case_insensitive: r.case_insensitive,
            context_lines: r.context_lines as usize,
        };
        let compiled = crate::inspect::search::compile(&query)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let ids = r
            .payload_ids
            .iter()
            .map(|id| PayloadId::parse(id))
            .collect::<Result<Vec<_>, _>>()?;
        let named = if ids.is_empty() {
            "all".to_owned()
        } else {
            ids.len().to_string()
        };
        let store = self.store.clone();
        let (timeout, ceiling) = (limits.search_timeout, limits.max_search_matches);
        let parent = self.readable_parent(p, &session).await?;
        let session_id = session.id.clone();
        let searched = blocking(move || {
            let scope = (&session_id, parent.as_ref());
            let bounds = (max_matches, ceiling, timeout);
            search_session(&store, scope, ids, &compiled, bounds)
        })
        .await;
        let sid = session.id.as_str();
        let reply = self.refusal(p, Rpc::Search, searched, sid, "").await?;
        let detail = format!(
            "payloads={named} matches={} truncated={}",
            reply.matches.len(),
            reply.truncated
        );
        let event = NewEvent::new(action::PAYLOAD_SEARCH)
            .session(sid)
            .detail(detail);
        self.audit(p, event).await?;
        Ok(reply)
    }

    /// A payload's metadata.
    pub async fn stat(&self, p: &Principal, payload_id: &str) -> ApiResult<PayloadRecord> {
        Ok(self.payload_for(p, Rpc::Stat, payload_id).await?.1)
    }

    /// One page of a session's payloads.
    pub async fn list_payloads(
        &self,
        p: &Principal,
        session_id: &str,
        page_token: &str,
        page: u32,
    ) -> ApiResult<Page<PayloadRecord>> {
        let session = self.session_for(p, Rpc::ListPayloads, session_id).await?;
        let size = page_size(page, self.config.limits.max_page_size);
        let (store, token) = (self.store.clone(), page_token.to_owned());
        blocking(move || store.list_payloads(&session.id, &token, size)).await
    }

    /// Reads a byte or line range. Without `allow_download`, a Read returns
    /// at most a preview's worth (the contract's "byte Reads beyond the
    /// preview size"). Many small Reads can still page through a payload;
    /// each one is a separate, audited call.
    pub async fn read(&self, p: &Principal, r: ReadRequest) -> ApiResult<ReadReply> {
        let (session, payload) = self.payload_for(p, Rpc::Read, &r.payload_id).await?;
        let allow_download = self.effective_policy(&session).await?.allow_download;
        let limits = &self.config.limits;
        let max_bytes = match r.max_bytes {
            0 => limits.read_default_bytes,
            n => n,
        }
        .min(read_data_ceiling(limits.read_max_bytes));
        let spec = r.spec.unwrap_or(ReadSpec::Bytes {
            offset: 0,
            length: 0,
        });
        let store = self.store.clone();
        let (total_bytes, total_lines) = (payload.size, payload.line_count);
        let event = payload_event(action::PAYLOAD_READ, &payload);
        let (sid, pid) = (payload.session_id.to_string(), payload.id.to_string());
        let out = blocking(move || store.read(&payload, spec, max_bytes)).await?;
        let preview = self.config.offload.preview_size();
        if !allow_download && out.data.len() > preview {
            let denied = ApiError::Denied(format!(
                "this session's policy has allow_download = false, so a Read may return at most {preview} bytes (the preview size) and this one would return {}; read a smaller range (max_bytes <= {preview}), or use Search, Inspect or Exec to narrow the payload down, or ask compliance to allow downloads",
                out.data.len()
            ));
            self.refusal::<()>(p, Rpc::Read, Err(denied), &sid, &pid)
                .await?;
        }
        let event = event.detail(format!(
            "bytes={}-{} lines={}-{}",
            out.start_offset, out.end_offset, out.first_line, out.last_line
        ));
        self.audit(p, event).await?;
        Ok(ReadReply {
            out,
            total_bytes,
            total_lines,
        })
    }

    /// Streams a whole payload, in `limits.download_chunk_bytes` chunks,
    /// when the session's policy allows downloads.
    pub async fn download(&self, p: &Principal, payload_id: &str) -> ApiResult<DownloadStream> {
        let (session, payload) = self.payload_for(p, Rpc::Download, payload_id).await?;
        if !self.effective_policy(&session).await?.allow_download {
            let denied = ApiError::Denied(format!(
                "downloads are disabled by this session's policy (allow_download = false); use Search, Inspect or Exec to narrow the payload down, Read for ranges up to {} bytes, or ask compliance to allow downloads",
                self.config.offload.preview_size()
            ));
            let (sid, pid) = (payload.session_id.as_str(), payload.id.as_str());
            self.refusal::<()>(p, Rpc::Download, Err(denied), sid, pid)
                .await?;
        }
        let store = self.store.clone();
        let record = payload.clone();
        let mut file = blocking(move || store.open_payload(&record)).await?;
        let chunk = self.config.limits.download_chunk_bytes;
        let (tx, rx) = mpsc::channel(DOWNLOAD_QUEUE);
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; chunk];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(ApiError::from(StoreError::from(e))));
                        return;
                    }
                };
                let data = bytes::Bytes::copy_from_slice(&buf[..n]);
                if tx.blocking_send(Ok(data)).is_err() {
                    return; // the client went away
                }
            }
        });
        let event = payload_event(action::PAYLOAD_DOWNLOAD, &payload)
            .detail(format!("bytes={}", payload.size));
        self.audit(p, event).await?;
        tracing::info!(payload_id = %payload.id, bytes = payload.size, "download started");
        Ok(rx)
    }

    /// Deletes a payload and everything derived from it; returns the signed
    /// receipt.
    pub async fn delete_payload(
        &self,
        p: &Principal,
        payload_id: &str,
        reason: &str,
    ) -> ApiResult<ReceiptRecord> {
        let (_, payload) = self.payload_for(p, Rpc::DeletePayload, payload_id).await?;
        if reason.len() > MAX_REASON {
            return Err(ApiError::BadRequest(format!(
                "reason is longer than {MAX_REASON} bytes"
            )));
        }
        let store = self.store.clone();
        let (by, reason) = (p.id.clone(), reason.to_owned());
        let event = payload_event(action::PAYLOAD_DELETE, &payload);
        let deleted = blocking(move || store.delete_payload(&payload.id, &by, &reason)).await;
        let receipt = self.audit_failure(p, event.clone(), deleted).await?;
        self.audit(p, event.detail(super::receipt_detail(&receipt)))
            .await?;
        tracing::info!(receipt_id = %receipt.id, bytes = receipt.bytes_deleted, "payload deleted");
        Ok(receipt)
    }
}

/// Checks an upload header's fields.
fn check_header(meta: &UploadMeta) -> ApiResult<()> {
    check_fields(
        "header.",
        [
            ("name", &meta.name),
            ("content_type", &meta.content_type),
            ("tool_name", &meta.tool_name),
            ("tool_call_id", &meta.tool_call_id),
        ],
    )?;
    if let Some(hash) = &meta.expected_sha256
        && !(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(ApiError::BadRequest(
            "header.expected_sha256 must be 64 hex digits: the SHA-256 of the bytes sent".into(),
        ));
    }
    Ok(())
}

/// Bytes of a unary reply kept for everything but its data: the other
/// fields of a ReadResponse or RecallResponse and their tags and lengths
/// (at most 73 bytes for a Read), so a reply of `limits.read_max_bytes`
/// (4 MiB by default) fits a stock client's 4 194 304-byte receive limit.
pub const REPLY_FRAMING_BYTES: u64 = 256;

/// The most data one Read or Recall returns: `limits.read_max_bytes` less
/// the reply's framing.
pub fn read_data_ceiling(read_max_bytes: u64) -> u64 {
    read_max_bytes.saturating_sub(REPLY_FRAMING_BYTES).max(1)
}

/// Checks a Search's bounds.
fn check_search(r: &SearchRequest) -> ApiResult<()> {
    if r.pattern.is_empty() {
        return Err(ApiError::BadRequest(
            "pattern is empty; give a regex, or a literal with fixed_string = true".into(),
        ));
    }
    if r.pattern.len() > MAX_PATTERN_BYTES {
        return Err(ApiError::BadRequest(format!(
            "pattern is {} bytes; at most {MAX_PATTERN_BYTES} are allowed",
            r.pattern.len()
        )));
    }
    if r.context_lines > MAX_CONTEXT_LINES {
        return Err(ApiError::BadRequest(format!(
            "context_lines is {}; at most {MAX_CONTEXT_LINES} are allowed",
            r.context_lines
        )));
    }
    if r.payload_ids.len() > MAX_SEARCH_PAYLOADS {
        return Err(ApiError::BadRequest(format!(
            "{} payload_ids given; at most {MAX_SEARCH_PAYLOADS} are allowed; leave it empty to search the whole session",
            r.payload_ids.len()
        )));
    }
    Ok(())
}

enum UploadMsg {
    Data(bytes::Bytes),
    Finish,
}

/// The disk side of an upload: redacts the chunks as they come (in bounded
/// memory: the stream holds at most a window), writes what is decided, and
/// commits on `Finish`. `expected_sha256` describes the bytes the client
/// sent, so with redaction rules it is checked here, against the received
/// bytes, and the store checks nothing; the record's sha256 is that of the
/// stored bytes. On a mismatch, an error or a broken stream, dropping the
/// upload removes its file: nothing partial is kept. `Ok(None)`: the stream
/// broke off.
fn write_upload(
    store: &crate::store::Store,
    session: &SessionId,
    mut meta: UploadMeta,
    redactor: &crate::redact::Redactor,
    mut rx: mpsc::Receiver<UploadMsg>,
) -> Result<Option<PayloadRecord>, StoreError> {
    use sha2::{Digest, Sha256};
    // Without rules the stored bytes are the received ones: the store checks.
    let expected = if redactor.is_empty() {
        None
    } else {
        meta.expected_sha256.take()
    };
    let mut received = expected.as_ref().map(|_| Sha256::new());
    let mut upload = store.begin_upload(session, meta)?;
    let mut stream = redactor.stream();
    let mut out = Vec::new();
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            UploadMsg::Data(d) if redactor.is_empty() => upload.write_shared(d)?,
            UploadMsg::Data(d) => {
                if let Some(h) = &mut received {
                    h.update(&d);
                }
                out.clear();
                stream.push(&d, &mut out);
                upload.write(&out)?;
            }
            UploadMsg::Finish => {
                out.clear();
                let counts = stream.finish(&mut out);
                upload.write(&out)?;
                if let (Some(expected), Some(h)) = (expected, received) {
                    let actual = hex::encode(h.finalize());
                    if !expected.eq_ignore_ascii_case(&actual) {
                        return Err(StoreError::ChecksumMismatch {
                            expected: expected.to_ascii_lowercase(),
                            actual,
                        });
                    }
                }
                upload.set_redactions(counts);
                return upload.finish().map(Some);
            }
        }
    }
    Ok(None)
}

/// Runs a compiled search over the named payloads of a session, or of its
/// parent (all of the session's when none are named), within the match cap
/// and the time limit.
fn search_session(
    store: &crate::store::Store,
    (session, parent): (&SessionId, Option<&SessionId>),
    ids: Vec<PayloadId>,
    compiled: &crate::inspect::search::Compiled,
    (max_matches, ceiling, timeout): (usize, u32, std::time::Duration),
) -> Result<SearchReply, ApiError> {
    use crate::inspect::search::{Stop, search_file};
    let mut payloads = Vec::new();
    if ids.is_empty() {
        let mut token = String::new();
        loop {
            let page = store.list_payloads(session, &token, 1000)?;
            payloads.extend(page.items);
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
    } else {
        for id in ids {
            let hidden = || ApiError::Hidden {
                kind: "payload",
                id: id.to_string(),
            };
            let p = match store.payload(&id) {
                Ok(p) => p,
                Err(crate::store::StoreError::NotFound { .. }) => return Err(hidden()),
                Err(e) => return Err(e.into()),
            };
            let source = Source::of(session, parent, &p.session_id);
            if source.access() != Access::Allowed {
                return Err(hidden());
            }
            payloads.push(p);
        }
    }
    let deadline = std::time::Instant::now() + timeout;
    let mut bytes_left = crate::inspect::search::MAX_REPLY_BYTES;
    let mut reply = SearchReply::default();
    let mut skipped_binary = Vec::new();
    let mut skipped_missing = Vec::new();
    for p in &payloads {
        if p.missing {
            skipped_missing.push(p.id.to_string());
            continue;
        }
        if std::time::Instant::now() >= deadline {
            reply.stop_short(format!(
                "stopped at the {} s search time limit (limits.search_timeout) before {}; narrow the pattern or name fewer payloads",
                timeout.as_secs_f32(),
                p.id
            ));
            break;
        }
        let file = store.open_payload(p)?.into_std();
        let mut hits = Vec::new();
        let (stop, seen) = search_file(
            compiled,
            &file,
            max_matches - reply.matches.len(),
            &mut bytes_left,
            deadline,
            &mut hits,
        )
        .map_err(|e| ApiError::Internal(e.to_string()))?;
        reply.total_matches_seen += seen;
        reply.matches.extend(hits.into_iter().map(|hit| SearchHit {
            payload_id: p.id.clone(),
            hit,
        }));
        let why = match stop {
            Stop::Done => continue,
            Stop::Binary => {
                skipped_binary.push(p.id.to_string());
                continue;
            }
            Stop::Cap => format!(
                "stopped at max_matches ({max_matches}); narrow the pattern, name fewer payloads, or raise max_matches (ceiling {})",
                ceiling
            ),
            Stop::Bytes => format!(
                "stopped at {} MiB of matched lines, the most one reply carries; narrow the pattern, lower context_lines or max_matches, or Read byte ranges around the matches' match_offset",
                crate::inspect::search::MAX_REPLY_BYTES >> 20
            ),
            Stop::Deadline => format!(
                "stopped at the {} s search time limit (limits.search_timeout) while searching {}; narrow the pattern or name fewer payloads",
                timeout.as_secs_f32(),
                p.id
            ),
        };
        reply.stop_short(why);
        break;
    }
    let mut notes = Vec::new();
    if !reply.note.is_empty() {
        notes.push(std::mem::take(&mut reply.note));
    }
    let windowed = reply
        .matches
        .iter()
        .filter(|m| m.hit.window.is_some())
        .count();
    if windowed > 0 {
        notes.push(format!(
            "{windowed} of the {} matches shown are in lines over {} chars, so each shows a window of its line around the match, not the whole line; to see more, Read a byte range centred on its match_offset (for example offset match_offset-2048, length 4096), or Exec jq on its json_path",
            reply.matches.len(),
            crate::inspect::search::MAX_LINE_CHARS
        ));
    }
    if !skipped_binary.is_empty() {
        notes.push(format!(
            "skipped binary payloads, which Search does not look into (Read byte ranges of them, or Exec a python script to decode them): {}",
            skipped_binary.join(", ")
        ));
    }
    if !skipped_missing.is_empty() {
        notes.push(format!(
            "skipped payloads whose bytes are missing: {}",
            skipped_missing.join(", ")
        ));
    }
    reply.note = notes.join("; ");
    Ok(reply)
}
