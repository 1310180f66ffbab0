//! `spillway mcp serve`: Spillway's tools and payload resources over MCP,
//! one Spillway session per client connection (or `--session ID`).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::backend::Backend;
use super::session::SessionSlot;
use super::{resources, tools};

/// What `spillway mcp serve` tells a client about itself.
pub const INSTRUCTIONS: &str = "Spillway keeps tool results that are too large for your context as payloads, \
and lets you work on them step by step: spillway_list to see them, spillway_inspect for a payload's structure, \
spillway_search to find lines, spillway_read for line or byte ranges, spillway_exec to run jq, JavaScript or Python \
over them and print only the answer. Payloads are also resources at spillway://payloads/{payload_id}.";

/// The handler of one `mcp serve` connection.
#[derive(Clone)]
pub struct SpillwayServer {
    backend: Backend,
    session: Arc<SessionSlot>,
}

impl SpillwayServer {
    /// A handler for one connection.
    pub fn new(backend: Backend, session: Option<String>) -> Self {
        Self {
            session: Arc::new(SessionSlot::new(backend.clone(), session)),
            backend,
        }
    }

    /// The connection's session slot.
    pub fn session(&self) -> &Arc<SessionSlot> {
        &self.session
    }
}

/// The server's name and version as MCP sees them.
pub fn implementation() -> Implementation {
    let mut i = Implementation::new("spillway", env!("CARGO_PKG_VERSION"));
    i.title = Some("Spillway".into());
    i
}

impl ServerHandler for SpillwayServer {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .build();
        let mut info = InitializeResult::new(caps).with_instructions(INSTRUCTIONS);
        info.server_info = implementation();
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.session
            .set_client(&request.client_info.name, &request.client_info.version);
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        tools::list().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let session = match self.session.id().await {
            Ok(s) => s,
            Err(s) => return Ok(tools::refusal(&request.name, &s).into()),
        };
        Ok(tools::call(&self.backend, &session, &request.name, &args)
            .await
            .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let session = self.session.id().await.map_err(|s| {
            ErrorData::internal_error(
                format!("no Spillway session ({:?}): {}", s.code(), s.message()),
                None,
            )
        })?;
        resources::list_result(&self.backend, &session).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates_result())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        Ok(resources::read(&self.backend, &request.uri).await?.into())
    }
}
