//! The `spillway` command line: `serve`, and client subcommands for every
//! RPC. Human-readable output by default, the proto3 JSON mapping with
//! `--json`. Errors print the status code and message and exit nonzero.

#[macro_use]
mod print;
mod commands;
mod output;
mod policy;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use crate::client::{Bearer, ClientSettings, TlsFiles, connect};
pub use commands::run_client;
pub use output::{escape_controls, event_from_proto};
pub use policy::{HoldArgs, HoldState, PolicyCommand, SetArgs};

/// The parsed command line.
#[derive(Debug, Parser)]
#[command(
    name = "spillway",
    version,
    about = "Offload, store and inspect oversized AI tool results"
)]
pub struct Cli {
    /// Server address, `host:port` or `http://host:port` (`https://` with TLS).
    #[arg(long, global = true, env = "SPILLWAY_ADDR")]
    pub addr: Option<String>,
    /// PEM certificate of the CA that signed the server's certificate:
    /// connect with TLS.
    #[arg(long = "ca", global = true, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that require one (mutual TLS).
    #[arg(long = "cert", global = true, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long = "key", global = true, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Bearer token. Without one, the dev token of a local dev server is used.
    #[arg(long, global = true, env = "SPILLWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the reply as proto3 JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Manage sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Upload a file as a payload.
    Upload {
        /// Target session.
        #[arg(long)]
        session: String,
        /// The file.
        file: PathBuf,
        /// Name to store it under (default: the file's name).
        #[arg(long)]
        name: Option<String>,
        /// Content type, e.g. application/json.
        #[arg(long)]
        content_type: Option<String>,
        /// Tool that produced it.
        #[arg(long, default_value = "")]
        tool_name: String,
        /// Tool call that produced it.
        #[arg(long, default_value = "")]
        tool_call_id: String,
        /// Hex SHA-256 the server must find, or store nothing.
        #[arg(long)]
        sha256: Option<String>,
    },
    /// Send files as one turn of tool results; print what stays inline and what is offloaded.
    Offload {
        /// Target session.
        #[arg(long)]
        session: String,
        /// One tool result per file; the tool name is the file's stem.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Turn number.
        #[arg(long, default_value_t = 0)]
        turn: u32,
        /// Per-call threshold in tokens (server default 6000).
        #[arg(long)]
        per_call_tokens: Option<u64>,
        /// Per-turn threshold in tokens (server default 10000).
        #[arg(long)]
        aggregate_tokens: Option<u64>,
        /// chars4, o200k or cl100k.
        #[arg(long)]
        estimator: Option<String>,
        /// structured, edges or lines.
        #[arg(long)]
        preview_style: Option<String>,
    },
    /// Infer a payload's structure (fields, columns, lines).
    Inspect {
        /// Payload ID.
        payload: String,
        /// The payload's session, if known: only sent as `x-spillway-session`,
        /// so a balancer routes the call to the replica that caches it.
        #[arg(long)]
        session: Option<String>,
    },
    /// Search a session's payloads.
    Grep {
        /// Session to search.
        #[arg(long)]
        session: String,
        /// Regex (or literal with -F).
        pattern: String,
        /// Payloads to search (default: all of the session's).
        payloads: Vec<String>,
        /// Treat the pattern as a literal string.
        #[arg(short = 'F', long)]
        fixed_strings: bool,
        /// Ignore case.
        #[arg(short = 'i', long)]
        ignore_case: bool,
        /// Lines of context around each match.
        #[arg(short = 'C', long, default_value_t = 0)]
        context: u32,
        /// Most matches to return (server default 100).
        #[arg(short = 'm', long, default_value_t = 0)]
        max_matches: u32,
    },
    /// Run a jq, JavaScript, Python or WASM script against a session's
    /// payloads; prints stdout, then stderr and the status on stderr.
    Exec {
        /// Session whose payloads the script reads.
        #[arg(long)]
        session: String,
        /// jq, javascript, python or wasm.
        #[arg(long)]
        runtime: String,
        /// The script text (WAT text for wasm).
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        source: Option<String>,
        /// A file holding the script, or a .wasm module for wasm.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Input payload IDs (default: all of the session's).
        #[arg(long = "input")]
        inputs: Vec<String>,
        /// Wall-clock limit in milliseconds (0: the runtime's default).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u64,
        /// Memory limit in bytes (0: the runtime's default).
        #[arg(long, default_value_t = 0)]
        memory_bytes: u64,
        /// Keep files the script writes to /out as payloads.
        #[arg(long)]
        keep_outputs: bool,
        /// Arguments for the script (for jq: its flags, e.g. -r).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// List the code-mode runtimes and their default limits.
    Runtimes,
    /// Tenant policies and sessions' effective policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Place or lift a legal hold on a session.
    Hold(HoldArgs),
    /// Audit tools.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// History hygiene for OpenAI or Anthropic chat histories.
    #[command(subcommand)]
    Context(ContextCommand),
    /// Show a payload's metadata.
    Stat {
        /// Payload ID.
        payload: String,
        /// The payload's session, if known: only sent as `x-spillway-session`,
        /// so a balancer routes the call to the replica that caches it.
        #[arg(long)]
        session: Option<String>,
    },
    /// List a session's payloads.
    Ls {
        /// Session ID.
        #[arg(long)]
        session: String,
    },
    /// Read part of a payload.
    Read {
        /// Payload ID.
        payload: String,
        /// Line range `A:B` (1-based, inclusive; `A:` to the end).
        #[arg(long, conflicts_with = "bytes")]
        lines: Option<String>,
        /// Byte range `OFFSET:LEN` (`OFFSET:` up to the limit).
        #[arg(long)]
        bytes: Option<String>,
        /// Most bytes to return (server default 64 KiB, ceiling 4 MiB).
        #[arg(long, default_value_t = 0)]
        max_bytes: u64,
        /// The payload's session, if known: only sent as `x-spillway-session`,
        /// so a balancer routes the call to the replica that caches it.
        #[arg(long)]
        session: Option<String>,
    },
    /// Download a whole payload.
    Download {
        /// Payload ID.
        payload: String,
        /// The payload's session, if known: only sent as `x-spillway-session`,
        /// so a balancer routes the call to the replica that caches it.
        #[arg(long)]
        session: Option<String>,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// MCP: serve Spillway's tools, or proxy an MCP server and offload its
    /// large results.
    #[command(subcommand)]
    Mcp(crate::mcp::McpCommand),
    /// Delete a payload.
    Rm {
        /// Payload ID.
        payload: String,
        /// The payload's session, if known: only sent as `x-spillway-session`,
        /// so a balancer routes the call to the replica that caches it.
        #[arg(long)]
        session: Option<String>,
        /// Why, for the receipt.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

impl Command {
    /// The session this command concerns, which every call it makes names
    /// in `x-spillway-session` (none for commands about no one session).
    pub fn session(&self) -> Option<&str> {
        let s = match self {
            Command::Upload { session, .. }
            | Command::Offload { session, .. }
            | Command::Grep { session, .. }
            | Command::Exec { session, .. }
            | Command::Ls { session } => Some(session),
            Command::Inspect { session, .. }
            | Command::Stat { session, .. }
            | Command::Read { session, .. }
            | Command::Download { session, .. }
            | Command::Rm { session, .. } => session.as_ref(),
            Command::Hold(args) => Some(&args.session),
            Command::Policy(PolicyCommand::Get { session, .. }) => session.as_ref(),
            Command::Audit(AuditCommand::Query { session, .. }) => session.as_ref(),
            Command::Context(
                ContextCommand::Compact { session, .. } | ContextCommand::Recall { session, .. },
            ) => Some(session),
            Command::Session(
                SessionCommand::Get { session }
                | SessionCommand::Close { session }
                | SessionCommand::Rm { session, .. },
            ) => Some(session),
            Command::Session(SessionCommand::Create { .. } | SessionCommand::Ls { .. })
            | Command::Context(ContextCommand::Repair { .. })
            | Command::Audit(_)
            | Command::Policy(PolicyCommand::Set(_))
            | Command::Runtimes
            | Command::Serve(_)
            | Command::Mcp(_) => None,
        };
        s.map(String::as_str).filter(|s| !s.is_empty())
    }
}

/// `spillway serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "SPILLWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen address (overrides the file and env).
    #[arg(long)]
    pub listen: Option<String>,
    /// Data directory (overrides the file and env).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Metadata engine: redb, sled or postgres (overrides the file and env).
    #[arg(long, value_parser = ["redb", "sled", "postgres"])]
    pub engine: Option<String>,
}

/// `spillway audit …`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List your tenant's audit events that match every filter given, oldest first.
    Query {
        /// Only events of this session.
        #[arg(long)]
        session: Option<String>,
        /// Only events of this payload.
        #[arg(long)]
        payload: Option<String>,
        /// Only events by this principal.
        #[arg(long)]
        principal: Option<String>,
        /// Only events of this action, e.g. payload.read or access.denied.
        #[arg(long)]
        action: Option<String>,
        /// Only events at or after this RFC 3339 time, e.g. 2026-11-30T09:00:00Z.
        #[arg(long)]
        since: Option<String>,
        /// Only events before this RFC 3339 time.
        #[arg(long)]
        until: Option<String>,
        /// Print at most this many events (default: every match).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Recompute your tenant's audit chain on the server; exits 1 when it is broken.
    Verify,
    /// Write your tenant's whole audit chain, one JSON event per line, as
    /// `python3 scripts/verify_audit.py FILE` verifies it.
    Export {
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Fetch a stored deletion receipt, by receipt ID (rcpt_…) or by the ID of
    /// what was deleted (ses_… or pl_…). With --json it prints the receipt as
    /// `verify-receipt` reads it.
    Receipt {
        /// A receipt ID, or a deleted session's or payload's ID.
        id: String,
    },
    /// Check a deletion receipt's signature against the server's receipt key
    /// (read from the data directory, so run it where the server's data is).
    VerifyReceipt {
        /// The receipt as JSON (as `spillway --json rm` or `session rm` print it).
        file: PathBuf,
        /// The server's data directory (default: $SPILLWAY_DATA_DIR, then ./spillway-data).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

/// A chat-history JSON format.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum HistoryFormat {
    /// OpenAI Chat Completions messages.
    Openai,
    /// OpenAI Responses input items.
    OpenaiResponses,
    /// Anthropic Messages.
    Anthropic,
}

/// `spillway context …`.
#[derive(Debug, Subcommand)]
pub enum ContextCommand {
    /// Repair tool_use/tool_result pairing; the history goes to stdout, the report to stderr.
    Repair {
        /// The history's format.
        #[arg(long, value_enum)]
        format: HistoryFormat,
        /// The history file (an array of messages, or an object with "messages").
        file: PathBuf,
    },
    /// Repair, apply result budgets and compact old results; originals are archived in the session.
    Compact {
        /// The history's format.
        #[arg(long, value_enum)]
        format: HistoryFormat,
        /// Session that keeps the archived originals.
        #[arg(long)]
        session: String,
        /// Current turn (counts assistant messages; default: the last).
        #[arg(long, default_value_t = 0)]
        current_turn: u32,
        /// The history file.
        file: PathBuf,
    },
    /// Print an archived original by its <<ccr:KEY>> key.
    Recall {
        /// Session of the archive.
        #[arg(long)]
        session: String,
        /// The key (16 hex digits, or the whole marker).
        key: String,
    },
}

/// `spillway session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a session.
    Create {
        /// Label.
        #[arg(long, default_value = "")]
        label: String,
        /// Labels as `key=value`.
        #[arg(long = "labels", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Principals to share the session with.
        #[arg(long = "share-with")]
        share_with: Vec<String>,
        /// Parent session of a sub-agent session.
        #[arg(long)]
        parent: Option<String>,
    },
    /// Show a session.
    Get {
        /// Session ID.
        session: String,
    },
    /// List sessions.
    Ls {
        /// Only sessions in this state.
        #[arg(long, value_parser = ["open", "closed"])]
        state: Option<String>,
    },
    /// Close a session (read-only from then on).
    Close {
        /// Session ID.
        session: String,
    },
    /// Delete a session and everything in it.
    Rm {
        /// Session ID.
        session: String,
        /// Why, for the receipt.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session_of(args: &[&str]) -> Option<String> {
        let cli =
            Cli::try_parse_from(std::iter::once("spillway").chain(args.iter().copied())).unwrap();
        cli.command.session().map(str::to_owned)
    }

    #[test]
    fn commands_about_a_session_name_it_for_the_balancer() {
        let s = Some("ses_a".to_owned());
        assert_eq!(session_of(&["ls", "--session", "ses_a"]), s);
        assert_eq!(session_of(&["grep", "--session", "ses_a", "x"]), s);
        assert_eq!(session_of(&["session", "get", "ses_a"]), s);
        assert_eq!(session_of(&["session", "rm", "ses_a"]), s);
        assert_eq!(session_of(&["hold", "on", "--session", "ses_a"]), s);
        assert_eq!(
            session_of(&["context", "recall", "--session", "ses_a", "k"]),
            s
        );
        assert_eq!(session_of(&["stat", "pl_b", "--session", "ses_a"]), s);
        assert_eq!(session_of(&["read", "pl_b", "--session", "ses_a"]), s);
        assert_eq!(session_of(&["policy", "get", "--session", "ses_a"]), s);
    }

    #[test]
    fn commands_about_no_one_session_name_none() {
        assert_eq!(session_of(&["stat", "pl_b"]), None);
        assert_eq!(session_of(&["session", "create"]), None);
        assert_eq!(session_of(&["session", "ls"]), None);
        assert_eq!(session_of(&["runtimes"]), None);
        assert_eq!(session_of(&["audit", "verify"]), None);
        assert_eq!(session_of(&["ls", "--session", ""]), None);
    }
}
