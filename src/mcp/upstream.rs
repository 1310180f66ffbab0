//! The proxied MCP server: a child process over stdio (restarted on the next
//! call after it crashed or hung) or a Streamable HTTP URL, and the relay of
//! what it sends back to the client (sampling, elicitation, roots, progress,
//! logging, list-changed notifications, ping). A tools list-changed
//! notification makes the proxy re-read the upstream's tools before it is
//! passed on.
//!
//! Frames from a child pass through [`FrameGuard`], which enforces the
//! message cap and turns a malformed or oversized response into a JSON-RPC
//! error for the request it answers, so the caller learns what happened
//! instead of waiting for a timeout.
//!
//! Sampling, roots and logging are deprecated by SEP-2577 in rmcp, but the
//! revisions before 2026-07-28 use them, and a proxy relays them.
#![allow(deprecated)]

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientConfig, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequestParams, ElicitResult, Implementation, ListRootsResult,
    LoggingMessageNotificationParam, PingRequest, ProgressNotificationParam, ProgressToken,
    ResourceUpdatedNotificationParam, ServerRequest, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService, SubscriptionSink};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, RoleServer, ServiceExt};
use tokio::io::{AsyncRead, ReadBuf};

use super::spool::{Spiller, Spools};

/// Longest the proxy waits for its client to answer a ping the upstream
/// sent, and for the upstream's tools/list after a list-changed notification.
const RELAY_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines up to this size are checked whole before they are passed on.
const CHECKED_LINE: usize = 1 << 20;
/// Bytes kept from each end of a line to find its request id.
const EDGE: usize = 4096;

/// How to reach the upstream server.
#[derive(Debug, Clone)]
pub enum UpstreamSpec {
    /// A child process speaking MCP over stdio.
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// A Streamable HTTP endpoint.
    Url(String),
}

impl std::fmt::Display for UpstreamSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Command { program, .. } => write!(f, "the upstream command {program}"),
            Self::Url(u) => write!(f, "the upstream at {u}"),
        }
    }
}

/// Why the upstream could not serve a request.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// It could not be started.
    #[error(
        "{what} could not be started: {why}. Check the command after `--` (or --upstream-url) and run it alone to see its error"
    )]
    Start {
        /// The upstream.
        what: String,
        /// Why.
        why: String,
    },
    /// It exited or closed the connection.
    #[error(
        "{what} exited or closed the connection (crash) before answering{stderr}. The proxy restarts it on the next call; retry the call"
    )]
    Crashed {
        /// The upstream.
        what: String,
        /// A hint from the exit status.
        stderr: String,
    },
    /// It did not answer in time.
    #[error(
        "{what} did not answer within {secs} s (hang; --call-timeout). The proxy stopped it and restarts it on the next call; retry, or ask for less data{malformed}"
    )]
    Hung {
        /// The upstream.
        what: String,
        /// The timeout.
        secs: u64,
        /// A note about malformed frames seen meanwhile.
        malformed: String,
    },
    /// It answered with an error.
    #[error("{0}")]
    Rpc(String),
}

/// Counters of what the frame guard replaced.
#[derive(Debug, Default)]
pub struct GuardStats {
    /// Lines that were not JSON-RPC messages.
    pub malformed: AtomicU64,
    /// Lines over the message cap.
    pub oversized: AtomicU64,
}

/// An [`AsyncRead`] filter over an upstream's stdout: passes JSON-RPC lines
/// through; replaces a line that is not JSON, or longer than the cap, by a
/// JSON-RPC error for the request id it carries (found at either end of the
/// line), or drops it when no id can be found.
pub struct FrameGuard<R> {
    inner: R,
    cap: usize,
    /// Bytes of the current line not yet passed on (at most CHECKED_LINE).
    line: Vec<u8>,
    /// The current line is longer than CHECKED_LINE and is being streamed.
    streaming: bool,
    /// Bytes of the current line seen so far.
    line_len: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
    /// The current line is over the cap and is being skipped.
    skipping: bool,
    out: Vec<u8>,
    out_at: usize,
    buf: Box<[u8]>,
    stats: Arc<GuardStats>,
    /// Rewrites a streamed line's bulk values into files.
    spiller: Spiller,
}

impl<R> FrameGuard<R> {
    /// Guards `inner` with a cap of `cap` bytes per message.
    pub fn new(inner: R, cap: usize, stats: Arc<GuardStats>, spools: Spools) -> Self {
        Self {
            inner,
            cap,
            line: Vec::new(),
            streaming: false,
            line_len: 0,
            head: Vec::new(),
            tail: Vec::new(),
            skipping: false,
            out: Vec::new(),
            out_at: 0,
            buf: vec![0u8; 64 * 1024].into_boxed_slice(),
            stats,
            spiller: Spiller::new(spools),
        }
    }

    fn keep_edges(&mut self, seg: &[u8]) {
        if self.head.len() < EDGE {
            let n = (EDGE - self.head.len()).min(seg.len());
            self.head.extend_from_slice(&seg[..n]);
        }
        if seg.len() >= EDGE {
            self.tail.clear();
            self.tail.extend_from_slice(&seg[seg.len() - EDGE..]);
        } else {
            self.tail.extend_from_slice(seg);
            if self.tail.len() > EDGE {
                self.tail.drain(..self.tail.len() - EDGE);
            }
        }
    }

    /// Feeds one segment of the current line (no newline in it).
    fn feed(&mut self, seg: &[u8]) {
        self.keep_edges(seg);
        self.line_len += seg.len();
        if self.skipping {
            return;
        }
        if self.line_len > self.cap {
            // Over the cap: stop passing it on. What was already streamed
            // gets a newline so the reader sees one broken frame, then the
            // error for its id.
            self.skipping = true;
            self.line.clear();
            self.spiller.abandon();
            return;
        }
        if self.streaming {
            self.spiller.feed(seg, &mut self.out);
            return;
        }
        self.line.extend_from_slice(seg);
        if self.line.len() > CHECKED_LINE {
            self.streaming = true;
            let line = std::mem::take(&mut self.line);
            self.spiller.feed(&line, &mut self.out);
        }
    }

    /// The current line ended.
    fn end_line(&mut self) {
        if self.skipping {
            self.stats.oversized.fetch_add(1, Ordering::Relaxed);
            if self.streaming {
                self.out.push(b'\n');
            }
            let msg = format!(
                "the upstream's response was {} bytes, over the proxy's message cap of {} bytes (--max-message-bytes). Nothing was stored; ask the tool for less (a narrower query, a page, a range), or raise --max-message-bytes",
                self.line_len, self.cap
            );
            tracing::warn!(
                bytes = self.line_len,
                cap = self.cap,
                "upstream message over the cap"
            );
            self.push_error(msg);
        } else if self.streaming {
            self.out.push(b'\n');
        } else {
            let line = std::mem::take(&mut self.line);
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                // Blank lines carry nothing.
            } else if is_jsonrpc(trimmed) {
                self.out.extend_from_slice(&line);
                self.out.push(b'\n');
            } else {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(bytes = line.len(), "upstream sent a malformed frame");
                self.push_error(
                    "the upstream sent a malformed response (not a JSON-RPC message) for this call; the upstream server is faulty. Retry; if it keeps happening, check the upstream server".into(),
                );
            }
            self.line = line;
            self.line.clear();
        }
        self.spiller.end();
        self.streaming = false;
        self.skipping = false;
        self.line_len = 0;
        self.head.clear();
        self.tail.clear();
    }

    fn push_error(&mut self, message: String) {
        let Some(id) = find_id(&self.head, &self.tail) else {
            tracing::warn!("no request id found in the bad frame; dropped");
            return;
        };
        let err = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32099, "message": message}
        });
        if let Ok(mut v) = serde_json::to_vec(&err) {
            self.out.append(&mut v);
            self.out.push(b'\n');
        }
    }
}

fn is_jsonrpc(line: &[u8]) -> bool {
    match serde_json::from_slice::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(m)) => {
            m.get("jsonrpc").and_then(|v| v.as_str()) == Some("2.0")
                && (m.contains_key("method") || m.contains_key("result") || m.contains_key("error"))
        }
        Ok(serde_json::Value::Array(_)) => true,
        _ => false,
    }
}

/// The request id of a (possibly cut) response line: right after the opening
/// brace (`{"jsonrpc":"2.0","id":7,...` as most SDKs write it) or right before
/// the closing one (`...,"jsonrpc":"2.0","id":7}` as the TypeScript SDK does).
pub fn find_id(head: &[u8], tail: &[u8]) -> Option<serde_json::Value> {
    static HEAD: std::sync::OnceLock<regex::bytes::Regex> = std::sync::OnceLock::new();
    static TAIL: std::sync::OnceLock<regex::bytes::Regex> = std::sync::OnceLock::new();
    let head_re = HEAD.get_or_init(|| {
        regex::bytes::Regex::new(
            r#"^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.){0,200}")"#,
        )
        .expect("valid regex")
    });
    let tail_re = TAIL.get_or_init(|| {
        regex::bytes::Regex::new(r#""id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.){0,200}")\s*\}\s*$"#)
            .expect("valid regex")
    });
    let m = head_re
        .captures(head)
        .or_else(|| tail_re.captures(tail))?
        .get(1)?;
    serde_json::from_slice(m.as_bytes()).ok()
}

impl<R: AsyncRead + Unpin> AsyncRead for FrameGuard<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_at < this.out.len() {
                let n = (this.out.len() - this.out_at).min(dst.remaining());
                dst.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                    if this.out.capacity() > 4 * CHECKED_LINE {
                        this.out.shrink_to(CHECKED_LINE);
                    }
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
            let data = this.buf[..n].to_vec();
            let mut rest = &data[..];
            while !rest.is_empty() {
                match memchr::memchr(b'\n', rest) {
                    Some(i) => {
                        this.feed(&rest[..i]);
                        this.end_line();
                        rest = &rest[i + 1..];
                    }
                    None => {
                        this.feed(rest);
                        rest = &[];
                    }
                }
            }
        }
    }
}

/// Progress tokens of calls in flight: the upstream's token to the client's.
pub type ProgressMap = Arc<StdMutex<HashMap<ProgressToken, ProgressToken>>>;

/// The client half the proxy shows the upstream: relays the upstream's
/// requests and notifications to the MCP client.
#[derive(Clone, Default)]
pub struct Relay {
    /// The client connection, once it initialized.
    pub downstream: Arc<RwLock<Option<Peer<RoleServer>>>>,
    /// Progress token mapping.
    pub progress: ProgressMap,
    /// The client's identity and capabilities, passed on to the upstream.
    pub client: Arc<RwLock<Option<ClientConfig>>>,
    /// Names of the upstream's tools that declare an `outputSchema`, as last
    /// read: at startup, at each tools/list a client makes, and again at each
    /// notifications/tools/list_changed from the upstream.
    pub with_schema: Arc<RwLock<HashSet<String>>>,
    /// How many times the upstream's tools were re-read after it announced
    /// a change.
    pub tool_rereads: Arc<AtomicU64>,
    /// The client's open `subscriptions/listen` streams (revision
    /// 2026-07-28, where list-changed notifications travel only on these).
    pub subscriptions: Arc<StdMutex<Vec<SubscriptionSink>>>,
    /// The client initialized (a revision before 2026-07-28): list-changed
    /// notifications go to it unsolicited.
    pub legacy_client: Arc<std::sync::atomic::AtomicBool>,
}

/// Which list changed.
#[derive(Debug, Clone, Copy)]
enum Changed {
    Tools,
    Prompts,
    Resources,
}

/// What the proxy keeps from an upstream's tool list: the names of the
/// tools that declare an `outputSchema`, or the first tool named like one
/// of Spillway's own.
pub fn read_tools(tools: &[Tool]) -> Result<HashSet<String>, String> {
    if let Some(t) = tools
        .iter()
        .find(|t| super::tools::NAMES.contains(&t.name.as_ref()))
    {
        return Err(t.name.to_string());
    }
    Ok(tools
        .iter()
        .filter(|t| t.output_schema.is_some())
        .map(|t| t.name.to_string())
        .collect())
}

impl Relay {
    /// Re-reads the upstream's tools after it announced a change, so the
    /// proxy treats a new tool's `outputSchema` right even when the client
    /// calls it without listing tools first.
    async fn reread_tools(&self, upstream: &Peer<RoleClient>) {
        self.tool_rereads.fetch_add(1, Ordering::Relaxed);
        let tools = match tokio::time::timeout(RELAY_TIMEOUT, upstream.list_all_tools()).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "tools/list after list_changed failed upstream; keeping the previous tool facts");
                return;
            }
            Err(_) => {
                tracing::warn!(
                    "tools/list after list_changed timed out upstream; keeping the previous tool facts"
                );
                return;
            }
        };
        let set = match read_tools(&tools) {
            Ok(set) => set,
            Err(name) => {
                // Startup refuses such a server; one that grows such a tool
                // later keeps running, with the tool hidden from clients
                // (tools/list) and calls of that name going to Spillway's.
                tracing::warn!(tool = %name, "upstream added a tool named like one of spillway's; it stays hidden");
                tools
                    .iter()
                    .filter(|t| t.output_schema.is_some())
                    .map(|t| t.name.to_string())
                    .collect()
            }
        };
        if let Ok(mut w) = self.with_schema.write() {
            *w = set;
        }
    }

    /// Passes a list-changed notification on: on every open subscription of
    /// a 2026-07-28 client that accepted it, and unsolicited to a client of
    /// an earlier revision.
    async fn list_changed(&self, what: Changed) {
        let sinks = self
            .subscriptions
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        for sink in sinks {
            let sent = match what {
                Changed::Tools => sink.notify_tool_list_changed().await,
                Changed::Prompts => sink.notify_prompt_list_changed().await,
                Changed::Resources => sink.notify_resource_list_changed().await,
            };
            if let Err(rmcp::service::SubscriptionSendError::SubscriptionClosed) = sent {
                self.unsubscribe(sink.id());
            }
        }
        if !self.legacy_client.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(p) = self.peer() {
            let _ = match what {
                Changed::Tools => p.notify_tool_list_changed().await,
                Changed::Prompts => p.notify_prompt_list_changed().await,
                Changed::Resources => p.notify_resource_list_changed().await,
            };
        }
    }

    /// Forgets a subscription that ended.
    pub fn unsubscribe(&self, id: &rmcp::model::RequestId) {
        if let Ok(mut s) = self.subscriptions.lock() {
            s.retain(|x| x.id() != id);
        }
    }

    fn peer(&self) -> Result<Peer<RoleServer>, ErrorData> {
        self.downstream
            .read()
            .ok()
            .and_then(|g| g.clone())
            .ok_or_else(|| {
                ErrorData::internal_error(
                    "the MCP client behind the Spillway proxy is not connected yet",
                    None,
                )
            })
    }
}

fn relay_err(what: &str, e: rmcp::ServiceError) -> ErrorData {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(
            format!("the Spillway proxy could not relay {what} to its client: {other}"),
            None,
        ),
    }
}

/// Client handler methods that pass an upstream's request on to the
/// client as it is, with the client's reply or error.
macro_rules! relay_requests {
    ($($method:ident($params:ty) -> $reply:ty, $what:literal;)+) => {$(
        async fn $method(
            &self,
            params: $params,
            _context: RequestContext<RoleClient>,
        ) -> Result<$reply, ErrorData> {
            self.peer()?
                .$method(params)
                .await
                .map_err(|e| relay_err($what, e))
        }
    )+};
}

/// Client handler methods that pass an upstream's notification on to the
/// client as it is, when one is connected.
macro_rules! relay_notifications {
    ($($method:ident($params:ty) => $notify:ident;)+) => {$(
        async fn $method(&self, params: $params, _context: NotificationContext<RoleClient>) {
            if let Ok(p) = self.peer() {
                let _ = p.$notify(params).await;
            }
        }
    )+};
}

#[allow(deprecated)]
impl ClientHandler for Relay {
    relay_requests! {
        create_message(CreateMessageRequestParams) -> CreateMessageResult, "sampling/createMessage";
        create_elicitation(ElicitRequestParams) -> ElicitResult, "elicitation/create";
    }

    relay_notifications! {
        on_cancelled(CancelledNotificationParam) => notify_cancelled;
        on_logging_message(LoggingMessageNotificationParam) => notify_logging_message;
        on_resource_updated(ResourceUpdatedNotificationParam) => notify_resource_updated;
    }

    fn get_info(&self) -> ClientConfig {
        if let Some(c) = self.client.read().ok().and_then(|g| g.clone()) {
            return c;
        }
        let caps = ClientCapabilities::builder()
            .enable_roots()
            .enable_sampling()
            .enable_elicitation()
            .build();
        ClientConfig::new(
            caps,
            Implementation::new("spillway-mcp-proxy", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.peer()?
            .list_roots()
            .await
            .map_err(|e| relay_err("roots/list", e))
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let client_token = self
            .progress
            .lock()
            .ok()
            .and_then(|m| m.get(&params.progress_token).cloned());
        let Some(token) = client_token else {
            return;
        };
        params.progress_token = token;
        if let Ok(p) = self.peer() {
            let _ = p.notify_progress(params).await;
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(Changed::Resources).await;
    }

    async fn ping(&self, _context: RequestContext<RoleClient>) -> Result<(), ErrorData> {
        // The upstream checks its peer; the proxy's answer is the client's,
        // so a ping tells the upstream whether the whole chain is alive.
        let Ok(peer) = self.peer() else {
            return Ok(());
        };
        let ping = ServerRequest::PingRequest(PingRequest::default());
        match tokio::time::timeout(RELAY_TIMEOUT, peer.send_request(ping)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(relay_err("ping", e)),
            Err(_) => Err(ErrorData::internal_error(
                format!(
                    "the MCP client behind the Spillway proxy did not answer a ping within {} s",
                    RELAY_TIMEOUT.as_secs()
                ),
                None,
            )),
        }
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        // Re-read first, so a client that lists or calls at once finds the
        // proxy's facts up to date.
        self.reread_tools(&context.peer).await;
        self.list_changed(Changed::Tools).await;
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(Changed::Prompts).await;
    }
}

struct Running {
    service: RunningService<RoleClient, Relay>,
    child: Option<tokio::process::Child>,
}

/// The upstream connection, started on demand and restarted after a crash
/// or hang.
pub struct Upstream {
    spec: UpstreamSpec,
    cap: usize,
    relay: Relay,
    running: tokio::sync::Mutex<Option<Running>>,
    /// Frame guard counters of the current child.
    pub stats: RwLock<Arc<GuardStats>>,
    /// Where a child's oversized result values wait for the offloader.
    spools: Spools,
}

impl Upstream {
    /// An upstream that is not started yet.
    /// `spools` receives a child's oversized result values (see
    /// [`super::spool`]); give the connection's offloader the same.
    pub fn new(spec: UpstreamSpec, cap: usize, relay: Relay, spools: Spools) -> Self {
        Self {
            spec,
            cap,
            relay,
            running: tokio::sync::Mutex::new(None),
            stats: RwLock::new(Arc::new(GuardStats::default())),
            spools,
        }
    }

    /// The relay that carries the upstream's requests to the client.
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// How the upstream is reached.
    pub fn spec(&self) -> &UpstreamSpec {
        &self.spec
    }

    /// A live connection, starting (or restarting) the upstream if needed.
    pub async fn peer(&self) -> Result<Peer<RoleClient>, UpstreamError> {
        let mut guard = self.running.lock().await;
        if let Some(r) = guard.as_mut() {
            let exited = r
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if !exited && !r.service.is_closed() && !r.service.peer().is_transport_closed() {
                return Ok(r.service.peer().clone());
            }
            tracing::warn!("upstream is gone; restarting it");
        }
        if let Some(old) = guard.take() {
            stop(old).await;
        }
        let r = self.start().await?;
        let peer = r.service.peer().clone();
        *guard = Some(r);
        Ok(peer)
    }

    /// The upstream's initialize result, from the live connection.
    pub async fn info(&self) -> Result<rmcp::model::InitializeResult, UpstreamError> {
        let _ = self.peer().await?;
        let guard = self.running.lock().await;
        guard
            .as_ref()
            .and_then(|r| r.service.peer_info())
            .map(|i| {
                let mut out = rmcp::model::InitializeResult::new(i.capabilities.clone());
                out.protocol_version = i.protocol_version.clone();
                if let Some(s) = &i.server_info {
                    out.server_info = s.clone();
                }
                out.instructions = i.instructions.clone();
                out
            })
            .ok_or_else(|| UpstreamError::Start {
                what: self.spec.to_string(),
                why: "it did not complete the MCP handshake".into(),
            })
    }

    /// Stops the upstream (after a hang); the next call restarts it.
    pub async fn reset(&self) {
        if let Some(old) = self.running.lock().await.take() {
            stop(old).await;
        }
    }

    /// Whether the child has exited, with its status.
    pub async fn exit_status(&self) -> Option<String> {
        let mut guard = self.running.lock().await;
        let r = guard.as_mut()?;
        let c = r.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(s)) => Some(s.to_string()),
            _ => None,
        }
    }

    /// The MCP handshake with the upstream over `transport`, given 60 s;
    /// or why it failed.
    async fn handshake<T, E, A>(
        &self,
        transport: T,
    ) -> Result<RunningService<RoleClient, Relay>, String>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        tokio::time::timeout(Duration::from_secs(60), self.relay.clone().serve(transport))
            .await
            .map_err(|_| "it did not answer initialize within 60 s".to_owned())?
            .map_err(|e| format!("the MCP handshake failed: {e}"))
    }

    async fn start(&self) -> Result<Running, UpstreamError> {
        let what = self.spec.to_string();
        let fail = |why: String| UpstreamError::Start {
            what: what.clone(),
            why,
        };
        match &self.spec {
            UpstreamSpec::Command { program, args } => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    .kill_on_drop(true);
                let mut child = cmd.spawn().map_err(|e| fail(e.to_string()))?;
                let stdout = child
                    .stdout
                    .take()
                    .ok_or_else(|| fail("no stdout".into()))?;
                let stdin = child.stdin.take().ok_or_else(|| fail("no stdin".into()))?;
                let stats = Arc::new(GuardStats::default());
                if let Ok(mut s) = self.stats.write() {
                    *s = stats.clone();
                }
                let reader = FrameGuard::new(stdout, self.cap, stats, self.spools.clone());
                let transport = rmcp::transport::async_rw::AsyncRwTransport::new(reader, stdin)
                    .with_max_line_length(self.cap.saturating_add(EDGE * 4));
                let service = self.handshake(transport).await.map_err(fail)?;
                tracing::info!(pid = child.id().unwrap_or(0), "upstream started");
                Ok(Running {
                    service,
                    child: Some(child),
                })
            }
            UpstreamSpec::Url(url) => {
                // reqwest's TLS (an https:// upstream) uses the process's
                // rustls provider: ring, as for the gRPC listener.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut config =
                    rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                        url.as_str(),
                    );
                config.max_sse_event_size = self.cap;
                let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
                let service = self.handshake(transport).await.map_err(fail)?;
                Ok(Running {
                    service,
                    child: None,
                })
            }
        }
    }
}

async fn stop(r: Running) {
    let Running { service, child } = r;
    if let Some(mut c) = child {
        let _ = c.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(2), c.wait()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), service.cancel()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn through(input: &[u8], cap: usize) -> String {
        let mut g = FrameGuard::new(
            input,
            cap,
            Arc::new(GuardStats::default()),
            Spools::default(),
        );
        let mut out = String::new();
        g.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn good_frames_pass_unchanged() {
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n";
        assert_eq!(through(input, 1 << 20).await.as_bytes(), input);
    }

    #[tokio::test]
    async fn a_malformed_response_becomes_an_error_for_its_id() {
        let out = through(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{oops\n", 1 << 20).await;
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["id"], 7);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("malformed"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn an_oversized_response_names_the_cap_whichever_end_holds_the_id() {
        let big = "x".repeat(5000);
        let first = format!("{{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{{\"t\":\"{big}\"}}}}\n");
        let last =
            format!("{{\"result\":{{\"t\":\"{big}\"}},\"jsonrpc\":\"2.0\",\"id\":\"abc\"}}\n");
        for (line, id) in [
            (first, serde_json::json!(3)),
            (last, serde_json::json!("abc")),
        ] {
            let out = through(line.as_bytes(), 1000).await;
            let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            assert_eq!(v["id"], id);
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("--max-message-bytes"),
                "{out}"
            );
        }
    }

    #[test]
    fn find_id_ignores_ids_inside_the_payload() {
        assert_eq!(find_id(b"{\"result\":{\"id\":9", b"xx"), None);
    }
}
