//! Tool results through the Offload RPC, as the proxy relays them.
//!
//! A `tools/call` result is split into parts, each offloaded on its own
//! merits: its text (every text block, joined by newlines), its
//! `structuredContent` (stored as JSON), and each image, audio or embedded
//! resource block (stored as bytes; base64 is decoded). Parts of up to 1 MiB
//! go to the Offload RPC, which applies the per-call threshold (with the
//! per-tool table) and renders the notice in the MCP dialect. Larger parts
//! are over every default threshold many times over: they are streamed into
//! Upload in 1 MiB chunks, and their notice is rendered from what the server
//! stored (its Inspect summary and first bytes, after redaction).
//!
//! **The aggregate rule.** Calls that are in flight together form one turn:
//! a finished call's parts wait until no call of the same connection is
//! still running (or at most `--batch-wait`, 2 s by default), then every
//! waiting part goes to one Offload call, whose aggregate rule offloads the
//! largest parts first. A call that runs alone is a turn of its own.
//!
//! **The replacement result.** An offloaded part is replaced by the notice
//! text and a `resource_link` to `spillway://payloads/{id}`; the handles are
//! in `structuredContent.spillway` and in `_meta["spillway/offloaded"]`.
//! `outputSchema`: the proxy relays each upstream tool's `outputSchema` as
//! `{"type": "object", "anyOf": [<the original>, <the Spillway handle>]}`,
//! so a result whose `structuredContent` was offloaded (replaced by
//! `{"spillway": {...}}`) still validates. When `structuredContent` stays
//! inline it is passed on untouched; the `spillway` key is added to it only
//! when the tool declares no `outputSchema`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ResourceContents};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::backend::Backend;
use super::session::SessionSlot;
use super::spool::{Piece, Spooled, Spools};
use super::tools::payload_uri;
use crate::offload::{Dialect, NoticeFacts, Shape, Why, render_in};
use crate::proto;

/// Parts above this size skip the Offload RPC and are streamed into Upload.
pub const UPLOAD_ABOVE: usize = 1 << 20;
/// Most bytes of parts in one Offload request (the server takes 4 MiB).
const OFFLOAD_REQUEST_BYTES: usize = 3 << 20;

/// The proxy's offload settings.
#[derive(Debug, Clone)]
pub struct OffloadSettings {
    /// Per-call threshold override, in tokens.
    pub per_call_tokens: Option<u64>,
    /// Aggregate threshold override, in tokens.
    pub aggregate_tokens: Option<u64>,
    /// Longest a finished call waits for the calls in flight with it.
    pub batch_wait: Duration,
}

impl Default for OffloadSettings {
    fn default() -> Self {
        Self {
            per_call_tokens: None,
            aggregate_tokens: None,
            batch_wait: Duration::from_secs(2),
        }
    }
}

type Reply = Result<proto::OffloadOutcome, String>;

struct Pending {
    result: proto::ToolResult,
    tx: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct BatchState {
    in_flight: usize,
    pending: Vec<Pending>,
}

impl BatchState {
    /// One call in flight is done; the last one out takes the pending
    /// results, to flush them.
    fn leave(&mut self) -> Vec<Pending> {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            std::mem::take(&mut self.pending)
        } else {
            Vec::new()
        }
    }
}

/// One connection's offloader.
pub struct Offloader {
    backend: Backend,
    session: Arc<SessionSlot>,
    settings: OffloadSettings,
    state: Mutex<BatchState>,
    turn: std::sync::atomic::AtomicU32,
    /// The files the upstream's frame guard kept this connection's bulk
    /// values in.
    spools: Spools,
}

/// A call in flight; dropping it unfinished (an error, a cancellation) lets
/// the others of its turn go on.
pub struct InFlight {
    off: Arc<Offloader>,
    done: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let batch = {
            let Ok(mut s) = self.off.state.lock() else {
                return;
            };
            s.leave()
        };
        if !batch.is_empty() {
            let off = self.off.clone();
            tokio::spawn(async move { off.flush(batch).await });
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum PartKind {
    Text,
    Structured,
    Block(usize),
}

impl PartKind {
    fn label(self) -> String {
        match self {
            Self::Text => "text".into(),
            Self::Structured => "structuredContent".into(),
            Self::Block(i) => format!("content[{i}]"),
        }
    }
}

/// A part small enough for the Offload RPC.
struct Part {
    kind: PartKind,
    bytes: Bytes,
    content_type: String,
}

/// A part streamed into Upload, from memory or from the frame guard's files.
struct BigPart {
    kind: PartKind,
    pieces: Vec<Piece>,
    content_type: String,
}

/// What became of one part.
struct Stored {
    kind: PartKind,
    notice: String,
    payload: proto::Payload,
}

impl Offloader {
    /// An offloader for one connection.
    pub fn new(
        backend: Backend,
        session: Arc<SessionSlot>,
        settings: OffloadSettings,
        spools: Spools,
    ) -> Arc<Self> {
        Arc::new(Self {
            backend,
            session,
            settings,
            state: Mutex::new(BatchState::default()),
            turn: std::sync::atomic::AtomicU32::new(0),
            spools,
        })
    }

    /// Marks a call as in flight.
    pub fn enter(self: &Arc<Self>) -> InFlight {
        if let Ok(mut s) = self.state.lock() {
            s.in_flight += 1;
        }
        InFlight {
            off: self.clone(),
            done: false,
        }
    }

    /// Runs one finished call's result through the offload decision and
    /// returns what the client gets.
    pub async fn process(
        self: &Arc<Self>,
        mut guard: InFlight,
        tool: &str,
        call_id: &str,
        mut result: CallToolResult,
        has_output_schema: bool,
    ) -> CallToolResult {
        let is_error = result.is_error.unwrap_or(false);
        let (small, big) = match split(&mut result, &self.spools) {
            Ok(parts) => parts,
            Err(msg) => return store_failed(tool, &msg),
        };
        let small_kinds: Vec<PartKind> = small.iter().map(|p| p.kind).collect();
        let requests: Vec<proto::ToolResult> = small
            .into_iter()
            .map(|p| proto::ToolResult {
                tool_call_id: call_part_id(call_id, p.kind),
                tool_name: tool.to_owned(),
                content: p.bytes,
                content_type: p.content_type,
                is_error,
            })
            .collect();
        guard.done = true;
        let replies = self.submit(requests).await;
        drop(guard);
        let mut stored = Vec::new();
        for (kind, reply) in small_kinds.into_iter().zip(replies) {
            match reply {
                Ok(o) if o.disposition == proto::Disposition::Offloaded as i32 => {
                    if let Some(payload) = o.payload {
                        stored.push(Stored {
                            kind,
                            notice: o.content,
                            payload,
                        });
                    }
                }
                Ok(_) => {}
                Err(msg) => return store_failed(tool, &msg),
            }
        }
        for p in big {
            match self.upload(tool, call_id, is_error, p).await {
                Ok(s) => stored.push(s),
                Err(msg) => return store_failed(tool, &msg),
            }
        }
        if stored.is_empty() {
            return result;
        }
        let session = self.session.existing().unwrap_or_default();
        rebuild(result, stored, &session, has_output_schema)
    }

    async fn submit(self: &Arc<Self>, parts: Vec<proto::ToolResult>) -> Vec<Reply> {
        let mut rxs = Vec::with_capacity(parts.len());
        let now = {
            let Ok(mut s) = self.state.lock() else {
                return parts
                    .iter()
                    .map(|_| Err("internal lock poisoned".into()))
                    .collect();
            };
            for result in parts {
                let (tx, rx) = oneshot::channel();
                s.pending.push(Pending { result, tx });
                rxs.push(rx);
            }
            s.leave()
        };
        if !now.is_empty() {
            self.flush(now).await;
        }
        let deadline = tokio::time::Instant::now() + self.settings.batch_wait;
        let mut out = Vec::with_capacity(rxs.len());
        for mut rx in rxs {
            let reply = match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(r) => r,
                Err(_) => {
                    // The others of the turn are slow: go without them.
                    let batch = self
                        .state
                        .lock()
                        .map(|mut s| std::mem::take(&mut s.pending))
                        .unwrap_or_default();
                    self.flush(batch).await;
                    rx.await
                }
            };
            out.push(reply.unwrap_or_else(|_| Err("the offload of this turn was lost".into())));
        }
        out
    }

    async fn flush(&self, batch: Vec<Pending>) {
        if batch.is_empty() {
            return;
        }
        let session = match self.session.id().await {
            Ok(s) => s,
            Err(s) => {
                let msg = format!("no Spillway session ({:?}): {}", s.code(), s.message());
                for p in batch {
                    let _ = p.tx.send(Err(msg.clone()));
                }
                return;
            }
        };
        // Keep each request under the server's message limit.
        let mut groups: Vec<Vec<Pending>> = vec![Vec::new()];
        let mut bytes = 0;
        for p in batch {
            let n = p.result.content.len();
            if bytes + n > OFFLOAD_REQUEST_BYTES && !groups.last().is_none_or(Vec::is_empty) {
                groups.push(Vec::new());
                bytes = 0;
            }
            bytes += n;
            if let Some(g) = groups.last_mut() {
                g.push(p);
            }
        }
        for group in groups {
            let (results, txs): (Vec<_>, Vec<_>) =
                group.into_iter().map(|p| (p.result, p.tx)).unzip();
            let req = proto::OffloadRequest {
                session_id: session.clone(),
                turn: self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                results,
                settings: Some(proto::OffloadSettings {
                    per_call_tokens: self.settings.per_call_tokens,
                    aggregate_tokens: self.settings.aggregate_tokens,
                    dialect: Some(proto::NoticeDialect::Mcp as i32),
                    ..Default::default()
                }),
            };
            match self.backend.offload(req).await {
                Ok(r) => {
                    for (tx, o) in txs.into_iter().zip(r.outcomes) {
                        let _ = tx.send(Ok(o));
                    }
                }
                Err(s) => {
                    let msg = format!("Offload was refused ({:?}): {}", s.code(), s.message());
                    for tx in txs {
                        let _ = tx.send(Err(msg.clone()));
                    }
                }
            }
        }
    }

    async fn upload(
        &self,
        tool: &str,
        call_id: &str,
        is_error: bool,
        p: BigPart,
    ) -> Result<Stored, String> {
        let session = self
            .session
            .id()
            .await
            .map_err(|s| format!("no Spillway session ({:?}): {}", s.code(), s.message()))?;
        let header = proto::UploadHeader {
            session_id: session,
            content_type: p.content_type.clone(),
            tool_name: tool.to_owned(),
            tool_call_id: call_part_id(call_id, p.kind),
            is_error,
            ..Default::default()
        };
        let payload = self
            .backend
            .upload(header, p.pieces)
            .await
            .map_err(|s| format!("Upload was refused ({:?}): {}", s.code(), s.message()))?;
        let notice = self.big_notice(tool, call_id, is_error, &payload).await;
        Ok(Stored {
            kind: p.kind,
            notice,
            payload,
        })
    }

    /// The notice of an uploaded part, from what the server stored.
    async fn big_notice(
        &self,
        tool: &str,
        call_id: &str,
        is_error: bool,
        p: &proto::Payload,
    ) -> String {
        let summary = match self.backend.inspect(&p.id).await {
            Ok(s) => s.summary,
            Err(_) => String::new(),
        };
        let head = self
            .backend
            .read(proto::ReadRequest {
                payload_id: p.id.clone(),
                max_bytes: 600,
                range: Some(proto::read_request::Range::ByteRange(proto::ByteRange {
                    offset: 0,
                    length: 600,
                })),
            })
            .await
            .map(|r| r.data)
            .unwrap_or_default();
        let binary = crate::inspect::detect(&head, &p.content_type) == crate::inspect::Kind::Binary;
        let head = String::from_utf8_lossy(&head);
        let head: String = head.chars().take(500).collect();
        let omitted = p.size_bytes.saturating_sub(head.len() as u64);
        let preview = format!(
            "Structure: {summary}\n{head}\n[... {omitted} bytes omitted — full payload: {} ({})]",
            p.path, p.id
        );
        let facts = NoticeFacts {
            tool_name: tool,
            tool_call_id: call_id,
            is_error,
            payload_id: &p.id,
            path: &p.path,
            size: p.size_bytes,
            lines: p.line_count,
            tokens: (p.estimated_tokens, false),
            content_type: &p.content_type,
            shape: Shape::of(binary, p.line_count),
        };
        let threshold = self.settings.per_call_tokens.unwrap_or(6000);
        render_in(Dialect::Mcp, &facts, Why::PerCall(threshold), &preview)
    }
}

fn call_part_id(call_id: &str, kind: PartKind) -> String {
    match kind {
        PartKind::Text => call_id.to_owned(),
        other => format!("{call_id}.{}", other.label()),
    }
}

fn store_failed(tool: &str, msg: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "The result of {tool} was too large to pass on and Spillway could not store it: {msg}. \
Nothing of it was kept. Free space or raise the quota (spillway_list shows what the session holds), then call {tool} again, or ask it for less."
    ))])
}

/// Splits a result into parts: those that may go to the Offload RPC, and
/// those too large for it (whose bytes are taken out of `result`).
fn split(
    result: &mut CallToolResult,
    spools: &Spools,
) -> Result<(Vec<Part>, Vec<BigPart>), String> {
    let mut small = Vec::new();
    let mut big = Vec::new();
    let mut failed = None;
    let mut kept = |k: Result<Spooled, String>| match k {
        Ok(s) => Some(s),
        Err(e) => {
            failed.get_or_insert(format!(
                "the proxy could not keep the result on its disk while it passed ({e})"
            ));
            None
        }
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    // Text blocks that the frame guard kept on disk, by index.
    let mut spooled = std::collections::HashMap::new();
    let mut text_len = 0u64;
    let mut text_blocks = 0;
    for (i, c) in result.content.iter().enumerate() {
        if let ContentBlock::Text(t) = c {
            text_blocks += 1;
            match spools.take(&t.text) {
                Some(k) => {
                    if let Some(s) = kept(k) {
                        text_len += s.len();
                        spooled.insert(i, s);
                    }
                }
                None => text_len += t.text.len() as u64,
            }
        }
    }
    if text_blocks > 0 {
        if !spooled.is_empty() || text_len > UPLOAD_ABOVE as u64 {
            // Every text block, joined by newlines, without a copy: each is
            // moved out of the result or read from its file.
            let mut pieces = Vec::new();
            for (i, c) in result.content.iter_mut().enumerate() {
                if let ContentBlock::Text(t) = c {
                    if !pieces.is_empty() {
                        pieces.push(Piece::Bytes(Bytes::from_static(b"\n")));
                    }
                    pieces.push(match spooled.remove(&i) {
                        Some(s) => {
                            t.text.clear();
                            Piece::File {
                                spooled: s,
                                base64: false,
                            }
                        }
                        None => Piece::Bytes(Bytes::from(std::mem::take(&mut t.text))),
                    });
                }
            }
            big.push(BigPart {
                kind: PartKind::Text,
                pieces,
                content_type: String::new(),
            });
        } else {
            let joined: Vec<&str> = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .collect();
            small.push(Part {
                kind: PartKind::Text,
                bytes: Bytes::from(joined.join("\n")),
                content_type: String::new(),
            });
        }
    }
    if let Some(sc) = &result.structured_content {
        let json = "application/json".to_owned();
        if let Some(k) = sc.as_str().and_then(|s| spools.take(s)) {
            result.structured_content = None;
            if let Some(s) = kept(k) {
                big.push(BigPart {
                    kind: PartKind::Structured,
                    pieces: vec![Piece::File {
                        spooled: s,
                        base64: false,
                    }],
                    content_type: json,
                });
            }
        } else {
            let bytes = Bytes::from(serde_json::to_vec(sc).unwrap_or_default());
            if bytes.len() > UPLOAD_ABOVE {
                result.structured_content = None;
                big.push(BigPart {
                    kind: PartKind::Structured,
                    pieces: vec![Piece::Bytes(bytes)],
                    content_type: json,
                });
            } else {
                small.push(Part {
                    kind: PartKind::Structured,
                    bytes,
                    content_type: json,
                });
            }
        }
    }
    for (i, c) in result.content.iter_mut().enumerate() {
        let (data, mime, is_b64): (&mut String, String, bool) = match c {
            ContentBlock::Image(img) => (&mut img.data, img.mime_type.clone(), true),
            ContentBlock::Audio(a) => (&mut a.data, a.mime_type.clone(), true),
            ContentBlock::Resource(r) => match &mut r.resource {
                ResourceContents::TextResourceContents {
                    text, mime_type, ..
                } => {
                    let m = mime_type.clone().unwrap_or_else(|| "text/plain".into());
                    (text, m, false)
                }
                ResourceContents::BlobResourceContents {
                    blob, mime_type, ..
                } => {
                    let m = mime_type
                        .clone()
                        .unwrap_or_else(|| "application/octet-stream".into());
                    (blob, m, true)
                }
                _ => continue,
            },
            _ => continue,
        };
        if let Some(k) = spools.take(data) {
            data.clear();
            if let Some(s) = kept(k) {
                big.push(BigPart {
                    kind: PartKind::Block(i),
                    pieces: vec![Piece::File {
                        spooled: s,
                        base64: is_b64,
                    }],
                    content_type: mime,
                });
            }
            continue;
        }
        let bytes = if is_b64 {
            match b64.decode(data.as_bytes()) {
                Ok(b) => Bytes::from(b),
                // Not valid base64: keep what was sent, as text.
                Err(_) => Bytes::from(data.clone()),
            }
        } else {
            Bytes::from(data.clone())
        };
        if bytes.len() > UPLOAD_ABOVE {
            data.clear();
            data.shrink_to_fit();
            big.push(BigPart {
                kind: PartKind::Block(i),
                pieces: vec![Piece::Bytes(bytes)],
                content_type: mime,
            });
        } else {
            small.push(Part {
                kind: PartKind::Block(i),
                bytes,
                content_type: mime,
            });
        }
    }
    match failed {
        Some(msg) => Err(msg),
        None => Ok((small, big)),
    }
}

fn link(p: &proto::Payload) -> ContentBlock {
    let mut r = Resource::new(payload_uri(&p.id), p.name.clone())
        .with_description(format!(
            "Spillway payload {}: {} bytes, {} lines",
            p.id, p.size_bytes, p.line_count
        ))
        .with_size(p.size_bytes);
    if !p.content_type.is_empty() {
        r = r.with_mime_type(p.content_type.clone());
    }
    ContentBlock::resource_link(r)
}

/// The JSON Schema of the handle object a replacement result carries.
pub fn handle_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spillway": {
                "type": "object",
                "description": "Parts of this result saved by Spillway; read them with spillway_inspect, spillway_search, spillway_read or spillway_exec",
                "properties": {
                    "session_id": {"type": "string"},
                    "offloaded": {"type": "array", "items": {"type": "object", "properties": {
                        "part": {"type": "string"}, "payload_id": {"type": "string"}, "uri": {"type": "string"},
                        "path": {"type": "string"}, "size_bytes": {"type": "integer"}, "estimated_tokens": {"type": "integer"},
                        "content_type": {"type": "string"}
                    }, "required": ["part", "payload_id", "uri"]}}
                },
                "required": ["offloaded"]
            }
        },
        "required": ["spillway"]
    })
}

/// An upstream `outputSchema`, widened so a replacement result validates.
pub fn relax_output_schema(
    original: &serde_json::Map<String, Value>,
) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), Value::String("object".into()));
    m.insert(
        "anyOf".into(),
        Value::Array(vec![Value::Object(original.clone()), handle_schema()]),
    );
    m
}

fn rebuild(
    mut result: CallToolResult,
    stored: Vec<Stored>,
    session: &str,
    has_output_schema: bool,
) -> CallToolResult {
    let handles: Vec<Value> = stored
        .iter()
        .map(|s| {
            json!({
                "part": s.kind.label(), "payload_id": s.payload.id, "uri": payload_uri(&s.payload.id),
                "path": s.payload.path, "size_bytes": s.payload.size_bytes,
                "estimated_tokens": s.payload.estimated_tokens, "content_type": s.payload.content_type
            })
        })
        .collect();
    let spillway = json!({"session_id": session, "offloaded": handles});
    let find = |k: PartKind| stored.iter().find(|s| s.kind == k);
    let mut content = Vec::with_capacity(result.content.len() + 2);
    let mut text_done = false;
    for (i, c) in std::mem::take(&mut result.content).into_iter().enumerate() {
        match (&c, find(PartKind::Block(i))) {
            (ContentBlock::Text(_), _) => {
                if let Some(s) = find(PartKind::Text) {
                    if !text_done {
                        text_done = true;
                        content.push(ContentBlock::text(s.notice.clone()));
                        content.push(link(&s.payload));
                    }
                } else {
                    content.push(c);
                }
            }
            (_, Some(s)) => {
                content.push(ContentBlock::text(s.notice.clone()));
                content.push(link(&s.payload));
            }
            _ => content.push(c),
        }
    }
    if let Some(s) = find(PartKind::Structured) {
        content.push(ContentBlock::text(format!(
            "structuredContent: {}",
            s.notice
        )));
        content.push(link(&s.payload));
        result.structured_content = Some(json!({"spillway": spillway.clone()}));
    } else {
        match &mut result.structured_content {
            Some(Value::Object(m)) if !has_output_schema => {
                m.insert("spillway".into(), spillway.clone());
            }
            Some(_) => {}
            None => result.structured_content = Some(json!({"spillway": spillway.clone()})),
        }
    }
    result.content = content;
    let meta = result.meta.get_or_insert_with(Default::default);
    meta.insert("spillway/offloaded".into(), spillway);
    result
}
