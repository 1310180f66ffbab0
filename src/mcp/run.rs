//! The `spillway mcp` subcommands: arguments, connecting to Spillway, and
//! the stdio and Streamable HTTP transports.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use rmcp::ServiceExt;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::McpError;
use super::backend::Backend;
use super::offload::{OffloadSettings, Offloader};
use super::proxy::{Proxy, ProxyTimeouts, check_tools};
use super::server::SpillwayServer;
use super::session::SessionSlot;
use super::spool::Spools;
use super::upstream::{Relay, Upstream, UpstreamSpec};
use crate::client::{ClientSettings, TlsFiles};

/// Default cap on one JSON-RPC message, either side: 256 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 << 20;

/// `spillway mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Serve Spillway's tools (spillway_list, _inspect, _search, _read,
    /// _exec, _recall) and payload resources over MCP.
    Serve(ServeArgs),
    /// Proxy an MCP server, offloading its oversized tool results:
    /// `spillway mcp proxy -- npx -y @modelcontextprotocol/server-filesystem /data`.
    Proxy(ProxyArgs),
}

/// What every `spillway mcp` command takes.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Spillway server, `host:port` or `http(s)://host:port` (with --token,
    /// --ca). Default: the embedded local server on --data-dir, started if
    /// none is running.
    #[arg(long)]
    pub server: Option<String>,
    /// Data directory of the embedded server (default
    /// $XDG_DATA_HOME/spillway, or ~/.local/share/spillway).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Work in this existing Spillway session instead of opening one per
    /// client connection.
    #[arg(long)]
    pub session: Option<String>,
    /// Serve MCP over Streamable HTTP on this address (path /mcp) instead
    /// of stdio.
    #[arg(long)]
    pub listen: Option<String>,
    /// Largest JSON-RPC message accepted from either side, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
}

/// `spillway mcp serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Connection and transport.
    #[command(flatten)]
    pub common: McpArgs,
}

/// `spillway mcp proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Connection and transport.
    #[command(flatten)]
    pub common: McpArgs,
    /// The upstream MCP server's Streamable HTTP URL (instead of a command).
    #[arg(long, conflicts_with = "command")]
    pub upstream_url: Option<String>,
    /// A tools/call with no answer or progress for this many seconds is a
    /// hang: the client gets an error and the upstream is restarted.
    #[arg(long, default_value_t = 300)]
    pub call_timeout: u64,
    /// Per-call offload threshold in tokens (default: the server's).
    #[arg(long)]
    pub per_call_tokens: Option<u64>,
    /// Aggregate threshold over calls in flight together (default: the server's).
    #[arg(long)]
    pub aggregate_tokens: Option<u64>,
    /// Longest a finished call waits for the calls in flight with it, in ms.
    #[arg(long, default_value_t = 2000)]
    pub batch_wait_ms: u64,
    /// The upstream command and its arguments, after `--`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// The command line's global connection flags (`--addr`, `--token`,
/// `--ca`, `--cert`, `--key`).
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// `--addr`: the Spillway server, when `--server` is not given.
    pub addr: Option<String>,
    /// `--token`.
    pub token: Option<String>,
    /// `--ca`, `--cert`, `--key`.
    pub tls: TlsFiles,
}

/// Runs `spillway mcp …`.
pub async fn run(cmd: McpCommand, conn: Connection) -> anyhow::Result<()> {
    crate::telemetry::init();
    let cmd = &cmd;
    let common = match cmd {
        McpCommand::Serve(a) => &a.common,
        McpCommand::Proxy(a) => &a.common,
    };
    let settings = resolve(&conn, common).await?;
    let backend = Backend::connect(&settings).await?;
    if let Some(s) = &common.session {
        backend
            .get_session(s)
            .await
            .map_err(|st| McpError::spillway("the --session given", &st))?;
    }
    match cmd {
        McpCommand::Serve(a) => serve(backend, &a.common).await,
        McpCommand::Proxy(a) => proxy(backend, a).await,
    }
}

async fn resolve(cli: &Connection, common: &McpArgs) -> anyhow::Result<ClientSettings> {
    let tls = cli.tls.clone();
    let server = common.server.clone().or_else(|| cli.addr.clone());
    if let Some(addr) = server {
        let data_dir = std::env::var_os("SPILLWAY_DATA_DIR").map(PathBuf::from);
        return ClientSettings::resolve(
            Some(&addr),
            cli.token.as_deref(),
            data_dir.as_deref(),
            tls,
        );
    }
    let dir = match &common.data_dir {
        Some(d) => d.clone(),
        None => super::embedded::default_data_dir()?,
    };
    let addr = super::embedded::ensure_server(&dir).await?;
    ClientSettings::resolve(Some(&addr), cli.token.as_deref(), Some(&dir), tls)
}

fn http_config() -> StreamableHttpServerConfig {
    StreamableHttpServerConfig::default()
}

async fn serve_http<S, F>(listen: &str, factory: F) -> anyhow::Result<()>
where
    S: rmcp::ServerHandler,
    F: Fn() -> Result<S, std::io::Error> + Send + Sync + 'static,
{
    let service = StreamableHttpService::new(
        factory,
        Arc::new(LocalSessionManager::default()),
        http_config(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!(
        "spillway mcp: Streamable HTTP on http://{}/mcp",
        listener.local_addr()?
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(crate::shutdown::signal())
        .await?;
    Ok(())
}

fn stdio_transport(
    cap: usize,
) -> AsyncRwTransport<rmcp::RoleServer, rmcp::transport::StdioReader, rmcp::transport::StdioWriter>
{
    let (r, w) = rmcp::transport::stdio_pipes();
    AsyncRwTransport::new(r, w).with_max_line_length(cap)
}

async fn serve(backend: Backend, a: &McpArgs) -> anyhow::Result<()> {
    if let Some(listen) = &a.listen {
        let session = a.session.clone();
        return serve_http(listen, move || {
            Ok(SpillwayServer::new(backend.clone(), session.clone()))
        })
        .await;
    }
    let server = SpillwayServer::new(backend, a.session.clone());
    let slot = server.session().clone();
    let running = server
        .serve(stdio_transport(a.max_message_bytes))
        .await
        .map_err(|e| McpError::Transport(e.to_string()))?;
    let _ = running.waiting().await;
    slot.close().await;
    Ok(())
}

async fn proxy(backend: Backend, a: &ProxyArgs) -> anyhow::Result<()> {
    let spec = match (&a.upstream_url, a.command.split_first()) {
        (Some(url), _) => UpstreamSpec::Url(url.clone()),
        (None, Some((program, args))) => UpstreamSpec::Command {
            program: program.clone(),
            args: args.to_vec(),
        },
        (None, None) => {
            return Err(McpError::Usage(
                "give the upstream MCP server: `spillway mcp proxy -- <command> [args...]`, or --upstream-url URL".into(),
            )
            .into());
        }
    };
    let cap = a.common.max_message_bytes;
    let timeouts = ProxyTimeouts {
        call: Duration::from_secs(a.call_timeout.max(1)),
        other: Duration::from_secs(a.call_timeout.clamp(1, 120)),
    };
    let settings = OffloadSettings {
        per_call_tokens: a.per_call_tokens,
        aggregate_tokens: a.aggregate_tokens,
        batch_wait: Duration::from_millis(a.batch_wait_ms),
    };
    let spools = Spools::default();
    let first = Arc::new(Upstream::new(
        spec.clone(),
        cap,
        Relay::default(),
        spools.clone(),
    ));
    let with_schema = check_tools(&first).await?;
    let info = first.info().await?;
    let session = a.common.session.clone();
    if let Some(listen) = &a.common.listen {
        first.reset().await;
        let listen = listen.clone();
        return serve_http(&listen, move || {
            let slot = Arc::new(SessionSlot::new(backend.clone(), session.clone()));
            // Each connection has its own upstream, and its spools with it.
            let spools = Spools::default();
            let off = Offloader::new(
                backend.clone(),
                slot.clone(),
                settings.clone(),
                spools.clone(),
            );
            let upstream = Arc::new(Upstream::new(spec.clone(), cap, Relay::default(), spools));
            Ok(Proxy::new(
                backend.clone(),
                slot,
                upstream,
                off,
                info.clone(),
                timeouts.clone(),
                with_schema.clone(),
            ))
        })
        .await;
    }
    let slot = Arc::new(SessionSlot::new(backend.clone(), session));
    let off = Offloader::new(backend.clone(), slot.clone(), settings, spools);
    let proxy = Proxy::new(
        backend,
        slot.clone(),
        first.clone(),
        off,
        info,
        timeouts,
        with_schema,
    );
    let running = proxy
        .serve(stdio_transport(cap))
        .await
        .map_err(|e| McpError::Transport(e.to_string()))?;
    let _ = running.waiting().await;
    slot.close().await;
    first.reset().await;
    Ok(())
}
