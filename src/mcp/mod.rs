//! MCP: `spillway mcp serve` exposes Spillway's agent-facing operations as
//! MCP tools and resources, and `spillway mcp proxy` sits in front of any MCP
//! server and turns its oversized tool results into governed payloads.
//!
//! Both are gRPC clients of a Spillway server, with the caller's token,
//! exactly like the CLI: they never touch storage themselves, so access,
//! audit, redaction, quotas and retention apply unchanged.
//!
//! - `backend`: the gRPC connection to Spillway.
//! - `tools`: the `spillway_*` tools, their schemas and calls.
//! - `resources`: payloads as `spillway://payloads/{id}` resources.
//! - `session`: the Spillway session of one MCP connection.
//! - `server`: the `mcp serve` handler.
//! - `upstream`: the proxied server (child process or URL), its frame
//!   guard, restarts, and the relay of its requests and notifications.
//! - `offload`: tool results through the Offload RPC, in parallel batches.
//! - `proxy`: the `mcp proxy` handler.
//! - `embedded`: the default local server on the user's data directory.
//! - `run`: the command line entry points and transports.

mod backend;
mod embedded;
mod offload;
mod proxy;
mod resources;
mod run;
mod server;
mod session;
mod spool;
mod tools;
mod upstream;

pub use run::{Connection, McpArgs, McpCommand, run};

/// What can go wrong starting or running an MCP front.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// An upstream tool is named like one of Spillway's.
    #[error(
        "the upstream server has a tool named {0:?}, which is the name of one of Spillway's own tools ({names}); rename it upstream, or run the upstream without the proxy",
        names = tools::NAMES.join(", ")
    )]
    NameCollision(String),
    /// The upstream could not be started or did not initialize.
    #[error("{0}")]
    Upstream(#[from] upstream::UpstreamError),
    /// The Spillway server refused or failed.
    #[error("the Spillway server refused {what} ({code:?}): {message}")]
    Spillway {
        /// What was attempted.
        what: &'static str,
        /// The gRPC code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// The embedded server could not be started.
    #[error("{0}")]
    Embedded(String),
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// The MCP transport failed.
    #[error("MCP transport: {0}")]
    Transport(String),
}

impl McpError {
    /// A refusal by the Spillway server.
    pub fn spillway(what: &'static str, s: &tonic::Status) -> Self {
        Self::Spillway {
            what,
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}
