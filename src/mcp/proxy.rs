//! `spillway mcp proxy`: relays an MCP client to one upstream MCP server,
//! unchanged except for `tools/call` results, which pass through the
//! offload decision ([`super::offload`]), and Spillway's own tools and
//! payload resources, which are added.
//!
//! A client's ping is relayed to the upstream (a hung or lost upstream
//! fails it with the reason), and a call the client cancels is cancelled
//! upstream with the upstream's own request id.
//!
//! Logging, sampling, roots and resources/subscribe are deprecated by
//! SEP-2577 in rmcp, but clients of the revisions before 2026-07-28 use
//! them, and a proxy relays what its peers speak.
#![allow(deprecated)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig,
    ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, ContentBlock,
    GetPromptRequest, GetPromptRequestParams, GetPromptResponse, InitializeRequestParams,
    InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, PingRequest, ReadResourceRequest,
    ReadResourceRequestParams, ReadResourceResponse, RequestMetaObject, ServerCapabilities,
    ServerConfig, ServerResult, SetLevelRequest, SetLevelRequestParams, SubscribeRequest,
    SubscribeRequestParams, UnsubscribeRequest, UnsubscribeRequestParams,
};
use rmcp::model::{ResultType, SubscriptionFilter};
use rmcp::service::{PeerRequestOptions, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceError};

use super::McpError;
use super::backend::Backend;
use super::offload::{Offloader, relax_output_schema};
use super::session::SessionSlot;
use super::upstream::{Upstream, UpstreamError, read_tools};
use super::{resources, tools};

/// Timeouts of the proxy.
#[derive(Debug, Clone)]
pub struct ProxyTimeouts {
    /// A `tools/call` without an answer (or progress) for this long is a hang.
    pub call: Duration,
    /// Any other request.
    pub other: Duration,
}

struct Inner {
    backend: Backend,
    session: Arc<SessionSlot>,
    upstream: Arc<Upstream>,
    offloader: Arc<Offloader>,
    info: InitializeResult,
    timeouts: ProxyTimeouts,
}

/// The handler of one proxied client connection.
#[derive(Clone)]
pub struct Proxy(Arc<Inner>);

/// Checks the upstream's tools for names of Spillway's own, and returns the
/// names of those that declare an `outputSchema`.
pub async fn check_tools(upstream: &Upstream) -> Result<HashSet<String>, McpError> {
    let peer = upstream.peer().await?;
    let tools = match peer.list_all_tools().await {
        Ok(t) => t,
        // A server without tools has nothing to collide with.
        Err(ServiceError::McpError(e)) if e.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND => {
            Vec::new()
        }
        Err(e) => {
            return Err(UpstreamError::Rpc(format!("tools/list failed upstream: {e}")).into());
        }
    };
    read_tools(&tools).map_err(McpError::NameCollision)
}

impl Proxy {
    /// A handler for one connection over a started upstream.
    pub fn new(
        backend: Backend,
        session: Arc<SessionSlot>,
        upstream: Arc<Upstream>,
        offloader: Arc<Offloader>,
        upstream_info: InitializeResult,
        timeouts: ProxyTimeouts,
        with_schema: HashSet<String>,
    ) -> Self {
        let mut info = upstream_info;
        let mut caps: ServerCapabilities = info.capabilities.clone();
        if caps.tools.is_none() {
            caps.tools = ServerCapabilities::builder().enable_tools().build().tools;
        }
        if caps.resources.is_none() {
            caps.resources = ServerCapabilities::builder()
                .enable_resources()
                .build()
                .resources;
        }
        // The proxy passes on whatever list changes the upstream announces
        // (some servers send them without advertising it), and a 2026-07-28
        // client only gets them on a subscription to what is advertised.
        if let Some(t) = caps.tools.as_mut() {
            t.list_changed = Some(true);
        }
        if let Some(p) = caps.prompts.as_mut() {
            p.list_changed = Some(true);
        }
        if let Some(r) = caps.resources.as_mut() {
            r.list_changed = Some(true);
        }
        info.capabilities = caps;
        if let Ok(mut w) = upstream.relay().with_schema.write() {
            *w = with_schema;
        }
        let note = "Large tool results are saved by Spillway and replaced by a notice with a payload_id; \
use spillway_inspect, spillway_search, spillway_read and spillway_exec on it.";
        info.instructions = Some(match info.instructions.take() {
            Some(i) if !i.is_empty() => format!("{i}\n\n{note}"),
            _ => note.to_owned(),
        });
        Self(Arc::new(Inner {
            backend,
            session,
            upstream,
            offloader,
            info,
            timeouts,
        }))
    }

    async fn forward(
        &self,
        req: ClientRequest,
        ctx: &RequestContext<RoleServer>,
        timeout: Duration,
    ) -> Result<ServerResult, Failure> {
        let peer = self.0.upstream.peer().await.map_err(Failure::Upstream)?;
        let client_token = ctx.meta.get_progress_token();
        let mut meta = RequestMetaObject::default();
        for (k, v) in ctx.meta.0.iter() {
            if k != "progressToken" && !k.starts_with("io.modelcontextprotocol/") {
                meta.0.insert(k.clone(), v.clone());
            }
        }
        let opts = PeerRequestOptions::with_timeout(timeout)
            .with_meta(meta)
            .reset_timeout_on_progress();
        let handle = peer
            .send_request_with_option(req, opts)
            .await
            .map_err(Failure::Service)?;
        let up_token = handle.progress_token.clone();
        let id = handle.id.clone();
        let progress = self.0.upstream.relay().progress.clone();
        if let Some(t) = client_token
            && let Ok(mut m) = progress.lock()
        {
            m.insert(up_token.clone(), t);
        }
        let result = tokio::select! {
            r = handle.await_response() => r.map(mark_complete).map_err(Failure::Service),
            () = ctx.ct.cancelled() => {
                let _ = peer
                    .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
                        Some(id),
                        Some("cancelled by the client of the Spillway proxy".into()),
                    ))
                    .await;
                Err(Failure::Cancelled)
            }
        };
        if let Ok(mut m) = progress.lock() {
            m.remove(&up_token);
        }
        result
    }

    async fn forward_plain(
        &self,
        req: ClientRequest,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        match self.forward(req, ctx, self.0.timeouts.other).await {
            Ok(r) => Ok(r),
            Err(f) => Err(self.failure_error(f).await),
        }
    }

    async fn failure_text(&self, f: Failure) -> String {
        let what = self.0.upstream.spec().to_string();
        match f {
            Failure::Upstream(e) => e.to_string(),
            Failure::Service(ServiceError::Timeout { timeout }) => {
                let stats = self.0.upstream.stats.read().map(|s| s.clone()).ok();
                let malformed = stats
                    .map(|s| s.malformed.load(std::sync::atomic::Ordering::Relaxed))
                    .unwrap_or(0);
                self.0.upstream.reset().await;
                UpstreamError::Hung {
                    what,
                    secs: timeout.as_secs(),
                    malformed: if malformed > 0 {
                        format!(
                            ". It also sent {malformed} malformed frame(s) (not JSON-RPC) on stdout"
                        )
                    } else {
                        String::new()
                    },
                }
                .to_string()
            }
            Failure::Service(ServiceError::TransportClosed)
            | Failure::Service(ServiceError::TransportSend(_)) => {
                let status = self.0.upstream.exit_status().await;
                UpstreamError::Crashed {
                    what,
                    stderr: status.map(|s| format!(" ({s})")).unwrap_or_default(),
                }
                .to_string()
            }
            Failure::Service(ServiceError::McpError(e)) => e.message.to_string(),
            Failure::Service(e) => format!("{what} failed: {e}"),
            Failure::Cancelled => "the call was cancelled by the client".into(),
        }
    }

    async fn failure_error(&self, f: Failure) -> ErrorData {
        if let Failure::Service(ServiceError::McpError(e)) = f {
            return e;
        }
        ErrorData::internal_error(self.failure_text(f).await, None)
    }

    fn note_tools(&self, r: &mut ListToolsResult) {
        let mut with_schema = self.0.upstream.relay().with_schema.write().ok();
        r.tools.retain(|t| {
            let ours = tools::NAMES.contains(&t.name.as_ref());
            if ours {
                tracing::warn!(tool = %t.name, "upstream tool named like one of spillway's; hidden");
            }
            !ours
        });
        for t in &mut r.tools {
            if let Some(schema) = &t.output_schema {
                t.output_schema = Some(Arc::new(relax_output_schema(schema)));
                if let Some(w) = with_schema.as_mut() {
                    w.insert(t.name.to_string());
                }
            }
        }
        if r.next_cursor.is_none() {
            r.tools.extend(tools::list());
        }
    }
}

enum Failure {
    Upstream(UpstreamError),
    Service(ServiceError),
    Cancelled,
}

fn unexpected(method: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("the upstream answered {method} with a result of the wrong kind"),
        None,
    )
}

/// Server handler methods that pass a client's request on to the
/// upstream as it is, when its reply carries nothing.
macro_rules! relay_unit {
    ($($method:ident($params:ty) => $request:ident;)+) => {$(
        async fn $method(
            &self,
            request: $params,
            context: RequestContext<RoleServer>,
        ) -> Result<(), ErrorData> {
            let req = ClientRequest::$request($request::new(request));
            self.forward_plain(req, &context).await.map(|_| ())
        }
    )+};
}

/// Server handler methods that pass a client's request on to the
/// upstream as it is (`$build` makes the request of the parameters), with
/// the one reply each expects.
macro_rules! relay_replies {
    ($($method:ident($params:ty) -> $reply:ident via $request:ident($build:path), $what:literal;)+) => {$(
        async fn $method(
            &self,
            request: $params,
            context: RequestContext<RoleServer>,
        ) -> Result<$reply, ErrorData> {
            let req = ClientRequest::$request($build(request));
            match self.forward_plain(req, &context).await? {
                ServerResult::$reply(r) => Ok(r),
                _ => Err(unexpected($what)),
            }
        }
    )+};
}

#[allow(deprecated)]
impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        self.0.info.clone()
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.0
            .session
            .set_client(&request.client_info.name, &request.client_info.version);
        let relay = self.0.upstream.relay();
        if let Ok(mut d) = relay.downstream.write() {
            *d = Some(context.peer.clone());
        }
        if let Ok(mut c) = relay.client.write() {
            let mut caps = request.capabilities.clone();
            caps.experimental = None;
            *c = Some(ClientConfig::new(
                caps,
                rmcp::model::Implementation::new(
                    format!("{} via spillway", request.client_info.name),
                    request.client_info.version.clone(),
                ),
            ));
        }
        relay
            .legacy_client
            .store(true, std::sync::atomic::Ordering::Relaxed);
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    relay_unit! {
        subscribe(SubscribeRequestParams) => SubscribeRequest;
        unsubscribe(UnsubscribeRequestParams) => UnsubscribeRequest;
        set_level(SetLevelRequestParams) => SetLevelRequest;
    }

    relay_replies! {
        list_prompts(Option<PaginatedRequestParams>) -> ListPromptsResult
            via ListPromptsRequest(opt), "prompts/list";
        complete(CompleteRequestParams) -> CompleteResult
            via CompleteRequest(CompleteRequest::new), "completion/complete";
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let req = ClientRequest::ListToolsRequest(opt(request));
        match self.forward_plain(req, &context).await? {
            ServerResult::ListToolsResult(mut r) => {
                self.note_tools(&mut r);
                Ok(r)
            }
            _ => Err(unexpected("tools/list")),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if tools::NAMES.contains(&name.as_str()) {
            let args = request.arguments.clone().unwrap_or_default();
            let session = match self.0.session.id().await {
                Ok(s) => s,
                Err(s) => return Ok(tools::refusal(&name, &s).into()),
            };
            return Ok(tools::call(&self.0.backend, &session, &name, &args)
                .await
                .into());
        }
        let guard = self.0.offloader.enter();
        let call_id = format!("mcp-{}", request_id_text(&context.id));
        let req = ClientRequest::CallToolRequest(CallToolRequest::new(request));
        let result = self.forward(req, &context, self.0.timeouts.call).await;
        match result {
            Ok(ServerResult::CallToolResult(r)) => {
                let has_schema = self
                    .0
                    .upstream
                    .relay()
                    .with_schema
                    .read()
                    .map(|w| w.contains(&name))
                    .unwrap_or(false);
                let r = self
                    .0
                    .offloader
                    .process(guard, &name, &call_id, r, has_schema)
                    .await;
                Ok(r.into())
            }
            Ok(ServerResult::InputRequiredResult(r)) => Ok(CallToolResponse::InputRequired(r)),
            Ok(ServerResult::CreateTaskResult(r)) => Ok(CallToolResponse::Task(r)),
            Ok(_) => Err(unexpected("tools/call")),
            Err(Failure::Service(ServiceError::McpError(e))) if e.code.0 != -32099 => Err(e),
            Err(f) => {
                let text = self.failure_text(f).await;
                Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "{name} failed in the upstream MCP server behind the Spillway proxy: {text}"
                ))])
                .into())
            }
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let upstream_has = self.0.info.capabilities.resources.is_some()
            && self.0.upstream.relay().downstream.read().is_ok();
        let mut r = if upstream_has {
            let req = ClientRequest::ListResourcesRequest(opt(request));
            match self.forward_plain(req, &context).await {
                Ok(ServerResult::ListResourcesResult(r)) => r,
                Ok(_) => return Err(unexpected("resources/list")),
                Err(e) if e.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND => {
                    ListResourcesResult::with_all_items(Vec::new())
                }
                Err(e) => return Err(e),
            }
        } else {
            ListResourcesResult::with_all_items(Vec::new())
        };
        if r.next_cursor.is_none()
            && let Some(session) = self.0.session.existing()
        {
            r.resources
                .extend(resources::list(&self.0.backend, &session).await?);
        }
        Ok(r)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let req = ClientRequest::ListResourceTemplatesRequest(opt(request));
        let mut r = match self.forward_plain(req, &context).await {
            Ok(ServerResult::ListResourceTemplatesResult(r)) => r,
            Ok(_) => return Err(unexpected("resources/templates/list")),
            Err(e) if e.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND => {
                ListResourceTemplatesResult::with_all_items(Vec::new())
            }
            Err(e) => return Err(e),
        };
        if r.next_cursor.is_none() {
            r.resource_templates.push(resources::template());
        }
        Ok(r)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri.starts_with(resources::PREFIX) {
            return Ok(resources::read(&self.0.backend, &request.uri).await?.into());
        }
        let req = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request));
        match self.forward_plain(req, &context).await? {
            ServerResult::ReadResourceResult(r) => Ok(r.into()),
            ServerResult::InputRequiredResult(r) => Ok(ReadResourceResponse::InputRequired(r)),
            _ => Err(unexpected("resources/read")),
        }
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let req = ClientRequest::GetPromptRequest(GetPromptRequest::new(request));
        match self.forward_plain(req, &context).await? {
            ServerResult::GetPromptResult(r) => Ok(r.into()),
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            _ => Err(unexpected("prompts/get")),
        }
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        // Relayed: the client's ping checks the whole chain, so an upstream
        // that hangs or is gone shows up here with what happened to it.
        let req = ClientRequest::PingRequest(PingRequest::default());
        self.forward_plain(req, &context).await.map(|_| ())
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // List changes are relayed. Resource updates are not offered on a
        // subscription: the upstream is reached on an earlier revision,
        // where they need resources/subscribe per URI.
        Some(
            SubscriptionFilter::builder()
                .tools_list_changed()
                .prompts_list_changed()
                .resources_list_changed()
                .build(),
        )
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let relay = self.0.upstream.relay();
        let sink = context.sink().clone();
        let id = sink.id().clone();
        if let Ok(mut s) = relay.subscriptions.lock() {
            s.push(sink);
        }
        context.cancelled().await;
        relay.unsubscribe(&id);
        Ok(())
    }

    async fn on_roots_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleServer>,
    ) {
        if let Ok(peer) = self.0.upstream.peer().await {
            let _ = peer.notify_roots_list_changed().await;
        }
    }
}

/// A result from an upstream on a revision before 2026-07-28 has no
/// `resultType`, which a 2026-07-28 client requires; rmcp strips it again for
/// clients of earlier revisions.
fn mark_complete(mut r: ServerResult) -> ServerResult {
    let t = match &mut r {
        ServerResult::CompleteResult(r) => &mut r.result_type,
        ServerResult::GetPromptResult(r) => &mut r.result_type,
        ServerResult::ListPromptsResult(r) => &mut r.result_type,
        ServerResult::ListResourcesResult(r) => &mut r.result_type,
        ServerResult::ListResourceTemplatesResult(r) => &mut r.result_type,
        ServerResult::ReadResourceResult(r) => &mut r.result_type,
        ServerResult::ListToolsResult(r) => &mut r.result_type,
        ServerResult::CallToolResult(r) => &mut r.result_type,
        _ => return r,
    };
    if t.is_none() {
        *t = Some(ResultType::COMPLETE);
    }
    r
}

fn opt<M: Default, P>(params: Option<P>) -> rmcp::model::RequestOptionalParam<M, P> {
    rmcp::model::RequestOptionalParam {
        method: M::default(),
        params,
        extensions: Default::default(),
    }
}

fn request_id_text(id: &rmcp::model::RequestId) -> String {
    match serde_json::to_value(id) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => "call".into(),
    }
}
