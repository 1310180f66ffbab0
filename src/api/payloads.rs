//! `spillway.v1.Payloads`: upload, stat, list, read, download, delete.

use std::io::Read as _;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use super::{AppState, blocking, convert, page_size, principal, redact_bytes, redaction_detail};
use crate::audit::{NewEvent, action};
use crate::auth::access::{Access, Rpc, Source};
use crate::error::{ApiError, map_decode_status};
use crate::proto::{self, payloads_server::Payloads, upload_chunk::Chunk};
use crate::store::read::ReadSpec;
use crate::store::{StoreError, UploadMeta};

/// Most payloads one Search may name.
const MAX_SEARCH_PAYLOADS: usize = 1000;
/// Longest search pattern, in bytes.
const MAX_PATTERN_BYTES: usize = 4096;
/// Most context lines around a match.
const MAX_CONTEXT_LINES: u32 = 10;

/// Chunks in flight between the network and the disk writer of one upload.
/// With the message limit, this bounds an upload's memory.
const UPLOAD_QUEUE: usize = 4;
/// Chunks read ahead of a slow download client.
const DOWNLOAD_QUEUE: usize = 2;

/// The Payloads service.
#[derive(Debug, Clone)]
pub struct PayloadsService {
    state: AppState,
}

impl PayloadsService {
    /// Wraps the shared state.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

enum UploadMsg {
    Data(bytes::Bytes),
    Finish,
}

fn header_meta(h: &proto::UploadHeader) -> Result<UploadMeta, ApiError> {
    for (field, value) in [
        ("name", &h.name),
        ("content_type", &h.content_type),
        ("tool_name", &h.tool_name),
        ("tool_call_id", &h.tool_call_id),
    ] {
        if value.len() > 512 {
            return Err(ApiError::BadRequest(format!(
                "header.{field} is {} bytes; at most 512 are allowed",
                value.len()
            )));
        }
    }
    let hash = &h.expected_sha256;
    let is_hex = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    if !hash.is_empty() && !is_hex {
        return Err(ApiError::BadRequest(
            "header.expected_sha256 must be 64 hex digits: the SHA-256 of the bytes sent".into(),
        ));
    }
    Ok(UploadMeta {
        name: h.name.clone(),
        content_type: h.content_type.clone(),
        tool_name: h.tool_name.clone(),
        tool_call_id: h.tool_call_id.clone(),
        is_error: h.is_error,
        expected_sha256: (!h.expected_sha256.is_empty()).then(|| h.expected_sha256.clone()),
        derived_from: Vec::new(),
        archive_key: String::new(),
        quota: crate::store::Quota::default(),
        redactions: Default::default(),
    })
}

fn to_proto_outcome(o: crate::offload::Outcome) -> proto::OffloadOutcome {
    use crate::offload::decide::Disposition as D;
    let (disposition, reason) = match o.disposition {
        D::Inline => (proto::Disposition::Inline, proto::OffloadReason::None),
        D::PerCall => (proto::Disposition::Offloaded, proto::OffloadReason::PerCall),
        D::Aggregate => (
            proto::Disposition::Offloaded,
            proto::OffloadReason::Aggregate,
        ),
    };
    proto::OffloadOutcome {
        tool_call_id: o.tool_call_id,
        disposition: disposition as i32,
        reason: reason as i32,
        content: o.content,
        estimated_tokens: o.estimate.tokens,
        payload: o.payload.as_ref().map(convert::payload),
        preview: o.preview,
        content_tokens: o.content_tokens,
        estimate_is_lower_bound: o.estimate.lower_bound,
        redactions: convert::redaction_map(&o.redactions),
    }
}

#[tonic::async_trait]
impl Payloads for PayloadsService {
    #[instrument(
        name = "payloads.offload",
        skip_all,
        fields(session_id, results),
        err(level = "info")
    )]
    async fn offload(
        &self,
        req: Request<proto::OffloadRequest>,
    ) -> Result<Response<proto::OffloadResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let session = self
            .state
            .session_for(&p, Rpc::Offload, &r.session_id)
            .await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        tracing::Span::current().record("results", r.results.len());
        let (policy, redactor) = self.state.session_redactor(&session).await?;
        let mcp_dialect =
            r.settings.as_ref().and_then(|s| s.dialect) == Some(proto::NoticeDialect::Mcp as i32);
        let overrides = r.settings.map(|s| crate::offload::Overrides {
            per_call_tokens: s.per_call_tokens,
            aggregate_tokens: s.aggregate_tokens,
            estimator: s.estimator,
            preview_style: s.preview_style,
            preview_chars: s.preview_chars,
        });
        let config = &self.state.config.offload;
        let mut settings =
            crate::offload::Settings::resolve(config, &overrides.unwrap_or_default())
                .map_err(ApiError::from)?;
        if mcp_dialect {
            settings.dialect = crate::offload::notice::Dialect::Mcp;
        }
        for (i, t) in r.results.iter().enumerate() {
            for (field, value) in [
                ("tool_call_id", &t.tool_call_id),
                ("tool_name", &t.tool_name),
                ("content_type", &t.content_type),
            ] {
                if value.len() > 512 {
                    return Err(ApiError::BadRequest(format!(
                        "results[{i}].{field} is {} bytes; at most 512 are allowed",
                        value.len()
                    ))
                    .into());
                }
            }
        }
        let results: Vec<_> = r
            .results
            .into_iter()
            .map(|t| crate::offload::ToolResult {
                tool_call_id: t.tool_call_id,
                tool_name: t.tool_name,
                content: t.content,
                content_type: t.content_type,
                is_error: t.is_error,
                derived_from: Vec::new(),
                redactions: Default::default(),
            })
            .collect();
        let store = self.state.store.clone();
        let max_results = config.max_results;
        let sid = session.id.clone();
        let quota = AppState::quota(&policy);
        let outcomes = blocking(move || {
            // Redaction comes first: the estimate, the decision, the inline
            // content, the preview and the stored bytes all see its output.
            let mut results = results;
            for t in &mut results {
                let (content, counts) = redact_bytes(&redactor, std::mem::take(&mut t.content));
                t.content = content;
                t.redactions = counts;
            }
            crate::offload::offload_turn(&store, &sid, results, &settings, max_results, quota)
        })
        .await;
        let outcomes = self
            .state
            .audit_failure(
                &p,
                NewEvent::new(action::PAYLOAD_OFFLOAD).session(&session.id),
                outcomes,
            )
            .await?;
        let mut reply = proto::OffloadResponse::default();
        let mut events = Vec::new();
        for o in outcomes {
            if o.disposition.offloaded() {
                reply.offloaded_tokens += o.estimate.tokens;
            }
            reply.inline_tokens += o.content_tokens;
            if let Some(stored) = &o.payload {
                tracing::info!(payload_id = %stored.id, bytes = stored.size, sha256 = %stored.sha256, redactions = stored.redactions.total, "result offloaded");
                let reason = match o.disposition {
                    crate::offload::decide::Disposition::Aggregate => "aggregate",
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
            reply.outcomes.push(to_proto_outcome(o));
        }
        self.state.audit_all(&p, events).await?;
        Ok(Response::new(reply))
    }

    #[instrument(
        name = "payloads.upload",
        skip_all,
        fields(session_id, payload_id),
        err(level = "info")
    )]
    async fn upload(
        &self,
        req: Request<Streaming<proto::UploadChunk>>,
    ) -> Result<Response<proto::Payload>, Status> {
        let p = principal(&req)?;
        self.state.authorize(&p, Rpc::Upload).await?;
        let limits = &self.state.config.limits;
        let _slot = self.state.upload_slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::Limit(format!(
                "limits.max_concurrent_uploads ({}) uploads are already in progress; retry shortly",
                limits.max_concurrent_uploads
            ))
        })?;
        let decode_limit = limits.max_request_message_bytes;
        let limits = limits.clone();
        let mut stream = req.into_inner();
        let idle = limits.upload_idle_timeout;
        let first = tokio::time::timeout(idle, stream.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no upload header arrived for {} s (limits.upload_idle_timeout); send the header chunk first",
                    idle.as_secs_f32()
                ))
            })?
            .map_err(|s| map_decode_status(s, &limits))?
            .ok_or_else(|| {
                ApiError::BadRequest("empty upload: the first chunk must carry the header".into())
            })?;
        let Some(Chunk::Header(header)) = first.chunk else {
            return Err(ApiError::BadRequest(
                "the first upload chunk must carry the header, not data".into(),
            )
            .into());
        };
        let mut meta = header_meta(&header)?;
        let session = self
            .state
            .session_for(&p, Rpc::Upload, &header.session_id)
            .await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        let (policy, redactor) = self.state.session_redactor(&session).await?;
        meta.quota = AppState::quota(&policy);

        let (tx, rx) = mpsc::channel::<UploadMsg>(UPLOAD_QUEUE);
        let store = self.state.store.clone();
        let session_id = session.id.clone();
        let writer = tokio::task::spawn_blocking(move || {
            write_upload(&store, &session_id, meta, &redactor, rx)
        });

        let mut client_error: Option<Status> = None;
        loop {
            let next = match tokio::time::timeout(idle, stream.message()).await {
                Ok(next) => next,
                Err(_) => {
                    client_error = Some(Status::deadline_exceeded(format!(
                        "no upload chunk arrived for {} s (limits.upload_idle_timeout); the upload was abandoned and nothing was stored. Send chunks continuously, or retry",
                        idle.as_secs_f32()
                    )));
                    break;
                }
            };
            match next {
                Ok(Some(proto::UploadChunk {
                    chunk: Some(Chunk::Data(d)),
                })) => {
                    // The service accepts Offload-sized messages; upload
                    // chunks keep the smaller per-message limit.
                    if d.len() > decode_limit {
                        client_error = Some(
                            ApiError::Limit(crate::error::oversize_message(
                                "limits.max_request_message_bytes",
                                decode_limit,
                            ))
                            .into(),
                        );
                        break;
                    }
                    if tx.send(UploadMsg::Data(d)).await.is_err() {
                        break; // the writer failed; its error is reported below
                    }
                }
                Ok(Some(proto::UploadChunk {
                    chunk: Some(Chunk::Header(_)),
                })) => {
                    client_error = Some(
                        ApiError::BadRequest(
                            "a second header arrived; send the header once, in the first chunk"
                                .into(),
                        )
                        .into(),
                    );
                    break;
                }
                Ok(Some(proto::UploadChunk { chunk: None })) => {}
                Ok(None) => {
                    let _ = tx.send(UploadMsg::Finish).await;
                    break;
                }
                Err(s) => {
                    client_error = Some(map_decode_status(s, &limits));
                    break;
                }
            }
        }
        drop(tx);
        let outcome = writer
            .await
            .map_err(|e| ApiError::Internal(format!("upload writer failed: {e}")))?;
        if let Some(status) = client_error {
            return Err(status);
        }
        match outcome {
            Ok(Some(record)) => {
                tracing::Span::current().record("payload_id", tracing::field::display(&record.id));
                tracing::info!(bytes = record.size, sha256 = %record.sha256, redactions = record.redactions.total, "payload stored");
                self.state
                    .audit(
                        &p,
                        NewEvent::new(action::PAYLOAD_UPLOAD)
                            .session(&record.session_id)
                            .payload(&record.id)
                            .sha256(record.sha256.clone())
                            .detail(format!(
                                "bytes={}{}",
                                record.size,
                                redaction_detail(&record.redactions)
                            )),
                    )
                    .await?;
                Ok(Response::new(convert::payload(&record)))
            }
            Ok(None) => Err(Status::cancelled(
                "the upload stream ended early; nothing was stored",
            )),
            Err(e) => {
                let event = NewEvent::new(action::PAYLOAD_UPLOAD).session(&session.id);
                let failed: crate::error::ApiResult<()> = Err(ApiError::from(e));
                Err(self
                    .state
                    .audit_failure(&p, event, failed)
                    .await
                    .unwrap_err()
                    .into())
            }
        }
    }

    #[instrument(name = "payloads.inspect", skip_all, err(level = "info"))]
    async fn inspect(
        &self,
        req: Request<proto::PayloadRequest>,
    ) -> Result<Response<proto::Structure>, Status> {
        let p = principal(&req)?;
        let (_, payload) = self
            .state
            .payload_for(&p, Rpc::Inspect, &req.get_ref().payload_id)
            .await?;
        let store = self.state.store.clone();
        let record = payload.clone();
        let structure = blocking(move || store.inspect(&record)).await?;
        tracing::info!(payload_id = %payload.id, detected = %structure.detected_type, "inspected");
        self.state
            .audit(
                &p,
                NewEvent::new(action::PAYLOAD_INSPECT)
                    .session(&payload.session_id)
                    .payload(&payload.id)
                    .sha256(payload.sha256.clone())
                    .detail(format!("type={}", structure.detected_type)),
            )
            .await?;
        Ok(Response::new(convert::structure(
            payload.id.as_str(),
            &structure,
        )))
    }

    #[instrument(
        name = "payloads.search",
        skip_all,
        fields(session_id),
        err(level = "info")
    )]
    async fn search(
        &self,
        req: Request<proto::SearchRequest>,
    ) -> Result<Response<proto::SearchResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let session = self
            .state
            .session_for(&p, Rpc::Search, &r.session_id)
            .await?;
        tracing::Span::current().record("session_id", tracing::field::display(&session.id));
        if r.pattern.is_empty() {
            return Err(ApiError::BadRequest(
                "pattern is empty; give a regex, or a literal with fixed_string = true".into(),
            )
            .into());
        }
        if r.pattern.len() > MAX_PATTERN_BYTES {
            return Err(ApiError::BadRequest(format!(
                "pattern is {} bytes; at most {MAX_PATTERN_BYTES} are allowed",
                r.pattern.len()
            ))
            .into());
        }
        if r.context_lines > MAX_CONTEXT_LINES {
            return Err(ApiError::BadRequest(format!(
                "context_lines is {}; at most {MAX_CONTEXT_LINES} are allowed",
                r.context_lines
            ))
            .into());
        }
        if r.payload_ids.len() > MAX_SEARCH_PAYLOADS {
            return Err(ApiError::BadRequest(format!("{} payload_ids given; at most {MAX_SEARCH_PAYLOADS} are allowed; leave it empty to search the whole session", r.payload_ids.len())).into());
        }
        let limits = &self.state.config.limits;
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
            .map(|id| crate::ids::PayloadId::parse(id))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ApiError::from)?;
        let named = if ids.is_empty() {
            "all".to_owned()
        } else {
            ids.len().to_string()
        };
        let store = self.state.store.clone();
        let timeout = limits.search_timeout;
        let ceiling = limits.max_search_matches;
        let (session_id, parent) = (session.id.clone(), session.parent.clone());
        let searched = blocking(move || {
            search_session(
                &store,
                (&session_id, parent.as_ref()),
                ids,
                &compiled,
                max_matches,
                ceiling,
                timeout,
            )
        })
        .await;
        let sid = session.id.as_str();
        let reply = self
            .state
            .refusal(&p, Rpc::Search, searched, sid, "")
            .await?;
        self.state
            .audit(
                &p,
                NewEvent::new(action::PAYLOAD_SEARCH)
                    .session(sid)
                    .detail(format!(
                        "payloads={named} matches={} truncated={}",
                        reply.matches.len(),
                        reply.truncated
                    )),
            )
            .await?;
        Ok(Response::new(reply))
    }

    #[instrument(name = "payloads.stat", skip_all, err(level = "info"))]
    async fn stat(
        &self,
        req: Request<proto::PayloadRequest>,
    ) -> Result<Response<proto::Payload>, Status> {
        let p = principal(&req)?;
        let (_, payload) = self
            .state
            .payload_for(&p, Rpc::Stat, &req.get_ref().payload_id)
            .await?;
        Ok(Response::new(convert::payload(&payload)))
    }

    #[instrument(name = "payloads.list", skip_all, err(level = "info"))]
    async fn list_payloads(
        &self,
        req: Request<proto::ListPayloadsRequest>,
    ) -> Result<Response<proto::ListPayloadsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let session = self
            .state
            .session_for(&p, Rpc::ListPayloads, &r.session_id)
            .await?;
        let size = page_size(r.page_size, self.state.config.limits.max_page_size);
        let store = self.state.store.clone();
        let page = blocking(move || store.list_payloads(&session.id, &r.page_token, size)).await?;
        Ok(Response::new(proto::ListPayloadsResponse {
            payloads: page.items.iter().map(convert::payload).collect(),
            next_page_token: page.next_token,
        }))
    }

    #[instrument(name = "payloads.read", skip_all, err(level = "info"))]
    async fn read(
        &self,
        req: Request<proto::ReadRequest>,
    ) -> Result<Response<proto::ReadResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let (session, payload) = self.state.payload_for(&p, Rpc::Read, &r.payload_id).await?;
        let allow_download = self.state.effective_policy(&session).await?.allow_download;
        let limits = &self.state.config.limits;
        let max_bytes = match r.max_bytes {
            0 => limits.read_default_bytes,
            n => n.min(limits.read_max_bytes),
        };
        let spec = match r.range {
            None => ReadSpec::Bytes {
                offset: 0,
                length: 0,
            },
            Some(proto::read_request::Range::ByteRange(b)) => ReadSpec::Bytes {
                offset: b.offset,
                length: b.length,
            },
            Some(proto::read_request::Range::LineRange(l)) => ReadSpec::Lines {
                start: l.start_line,
                end: l.end_line,
            },
        };
        let store = self.state.store.clone();
        let (size, lines) = (payload.size, payload.line_count);
        let event = NewEvent::new(action::PAYLOAD_READ)
            .session(&payload.session_id)
            .payload(&payload.id)
            .sha256(payload.sha256.clone());
        let (sid, pid) = (payload.session_id.to_string(), payload.id.to_string());
        let out = blocking(move || store.read(&payload, spec, max_bytes)).await?;
        // Without allow_download, a Read may return at most a preview's worth
        // (the contract's "byte Reads beyond the preview size"). Many small
        // Reads can still page through a payload; each one is a separate,
        // audited call.
        let preview = self.state.config.offload.preview_size();
        if !allow_download && out.data.len() > preview {
            let denied = ApiError::Denied(format!(
                "this session's policy has allow_download = false, so a Read may return at most {preview} bytes (the preview size) and this one would return {}; read a smaller range (max_bytes <= {preview}), or use Search, Inspect or Exec to narrow the payload down, or ask compliance to allow downloads",
                out.data.len()
            ));
            self.state
                .refusal::<()>(&p, Rpc::Read, Err(denied), &sid, &pid)
                .await?;
        }
        let event = event.detail(format!(
            "bytes={}-{} lines={}-{}",
            out.start_offset, out.end_offset, out.first_line, out.last_line
        ));
        self.state.audit(&p, event).await?;
        Ok(Response::new(proto::ReadResponse {
            data: out.data,
            start_offset: out.start_offset,
            end_offset: out.end_offset,
            first_line: out.first_line,
            last_line: out.last_line,
            total_bytes: size,
            total_lines: lines,
            eof: out.eof,
        }))
    }

    type DownloadStream = ReceiverStream<Result<proto::DataChunk, Status>>;

    #[instrument(name = "payloads.download", skip_all, err(level = "info"))]
    async fn download(
        &self,
        req: Request<proto::PayloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let p = principal(&req)?;
        let (session, payload) = self
            .state
            .payload_for(&p, Rpc::Download, &req.get_ref().payload_id)
            .await?;
        if !self.state.effective_policy(&session).await?.allow_download {
            let denied = ApiError::Denied(format!(
                "downloads are disabled by this session's policy (allow_download = false); use Search, Inspect or Exec to narrow the payload down, Read for ranges up to {} bytes, or ask compliance to allow downloads",
                self.state.config.offload.preview_size()
            ));
            let (sid, pid) = (payload.session_id.as_str(), payload.id.as_str());
            self.state
                .refusal::<()>(&p, Rpc::Download, Err(denied), sid, pid)
                .await?;
        }
        let store = self.state.store.clone();
        let record = payload.clone();
        let mut file = blocking(move || store.open_payload(&record)).await?;
        let chunk = self.state.config.limits.download_chunk_bytes;
        let (tx, rx) = mpsc::channel(DOWNLOAD_QUEUE);
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; chunk];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(ApiError::from(StoreError::from(e)).into()));
                        return;
                    }
                };
                let data = bytes::Bytes::copy_from_slice(&buf[..n]);
                if tx.blocking_send(Ok(proto::DataChunk { data })).is_err() {
                    return; // the client went away
                }
            }
        });
        self.state
            .audit(
                &p,
                NewEvent::new(action::PAYLOAD_DOWNLOAD)
                    .session(&payload.session_id)
                    .payload(&payload.id)
                    .sha256(payload.sha256.clone())
                    .detail(format!("bytes={}", payload.size)),
            )
            .await?;
        tracing::info!(payload_id = %payload.id, bytes = payload.size, "download started");
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    #[instrument(name = "payloads.delete", skip_all, err(level = "info"))]
    async fn delete_payload(
        &self,
        req: Request<proto::DeletePayloadRequest>,
    ) -> Result<Response<proto::DeletionReceipt>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let (_, payload) = self
            .state
            .payload_for(&p, Rpc::DeletePayload, &r.payload_id)
            .await?;
        if r.reason.len() > 1024 {
            return Err(ApiError::BadRequest("reason is longer than 1024 bytes".into()).into());
        }
        let store = self.state.store.clone();
        let by = p.id.clone();
        let event = NewEvent::new(action::PAYLOAD_DELETE)
            .session(&payload.session_id)
            .payload(&payload.id)
            .sha256(payload.sha256.clone());
        let deleted = blocking(move || store.delete_payload(&payload.id, &by, &r.reason)).await;
        let receipt = self.state.audit_failure(&p, event.clone(), deleted).await?;
        self.state
            .audit(
                &p,
                event.detail(format!(
                    "receipt={} payloads={} bytes={} items={}",
                    receipt.id,
                    receipt.deleted_payload_ids.len(),
                    receipt.bytes_deleted,
                    receipt.removed.len()
                )),
            )
            .await?;
        tracing::info!(receipt_id = %receipt.id, bytes = receipt.bytes_deleted, "payload deleted");
        Ok(Response::new(convert::receipt(&receipt)))
    }
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
    session: &crate::ids::SessionId,
    mut meta: UploadMeta,
    redactor: &crate::redact::Redactor,
    mut rx: mpsc::Receiver<UploadMsg>,
) -> Result<Option<crate::store::records::PayloadRecord>, StoreError> {
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
            UploadMsg::Data(d) if redactor.is_empty() => upload.write(&d)?,
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
    (session, parent): (&crate::ids::SessionId, Option<&crate::ids::SessionId>),
    ids: Vec<crate::ids::PayloadId>,
    compiled: &crate::inspect::search::Compiled,
    max_matches: usize,
    ceiling: u32,
    timeout: std::time::Duration,
) -> Result<proto::SearchResponse, ApiError> {
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
    let mut reply = proto::SearchResponse::default();
    let mut skipped_binary = Vec::new();
    let mut skipped_missing = Vec::new();
    for p in &payloads {
        if p.missing {
            skipped_missing.push(p.id.to_string());
            continue;
        }
        if std::time::Instant::now() >= deadline {
            reply.truncated = true;
            reply.note = format!(
                "stopped at the {} s search time limit (limits.search_timeout) before {}; narrow the pattern or name fewer payloads",
                timeout.as_secs_f32(),
                p.id
            );
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
        reply.matches.extend(hits.into_iter().map(|h| proto::Match {
            payload_id: p.id.to_string(),
            line_number: h.line_number,
            byte_offset: h.byte_offset,
            line: h.line,
            before: h.before,
            after: h.after,
        }));
        match stop {
            Stop::Done => {}
            Stop::Binary => skipped_binary.push(p.id.to_string()),
            Stop::Cap => {
                reply.truncated = true;
                reply.note = format!(
                    "stopped at max_matches ({max_matches}); narrow the pattern, name fewer payloads, or raise max_matches (ceiling {})",
                    ceiling
                );
                break;
            }
            Stop::Bytes => {
                reply.truncated = true;
                reply.note = format!(
                    "stopped at {} MiB of matched lines, the most one reply carries; narrow the pattern, lower context_lines, or Read line ranges around the matches",
                    crate::inspect::search::MAX_REPLY_BYTES >> 20
                );
                break;
            }
            Stop::Deadline => {
                reply.truncated = true;
                reply.note = format!(
                    "stopped at the {} s search time limit (limits.search_timeout) while searching {}; narrow the pattern or name fewer payloads",
                    timeout.as_secs_f32(),
                    p.id
                );
                break;
            }
        }
    }
    let mut notes = Vec::new();
    if !reply.note.is_empty() {
        notes.push(std::mem::take(&mut reply.note));
    }
    if !skipped_binary.is_empty() {
        notes.push(format!(
            "skipped binary payloads (Read byte ranges instead): {}",
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
