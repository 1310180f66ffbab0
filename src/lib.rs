//! Spillway: a gRPC service that takes oversized tool results off an AI
//! agent's hands, stores them durably in per-session sandboxes, and lets the
//! agent reach into them step by step.
//!
//! # Layout
//!
//! A request runs one way: a front door ([`api`]) converts it, the
//! [`service`] layer decides access ([`auth`]), resolves the policy
//! ([`policy`]) and redacts ([`redact`]), the domain rooms do the work
//! ([`offload`], [`inspect`], [`sandbox`], [`context`], over [`store`]), and
//! the service appends the [`audit`] event before it replies. No module
//! imports one above it.
//!
//! - [`config`]: the configuration tree, its defaults and its loader; it
//!   assembles the sections the rooms own (`[auth]` tokens, `[tls]`,
//!   `[store]`, `[policy]`, `[offload]`, `[sandbox]`, `[reaper]`).
//! - [`telemetry`]: `tracing` setup.
//! - [`metrics`]: the Prometheus registry the rooms feed, and its
//!   `/metrics` endpoint.
//! - [`shutdown`]: the shutdown signal shared by the server's tasks.
//! - [`server`]: builds the tonic server, health and reflection, and runs it.
//! - [`tls`]: optional TLS and mutual TLS (rustls) for the server and CLI.
//! - [`error`]: every layer's error mapped to a `tonic::Status`, in one place.
//! - [`ids`]: typed, unguessable IDs (`ses_`, `pl_`, `rcpt_`).
//! - [`clock`]: the time source, replaceable in tests.
//! - [`fairness`]: fair shares of bounded resources: slots with a global
//!   and a per-key (tenant) bound, and a minimum rate for streams.
//! - [`guest`]: where payloads appear to scripts (`/payloads/…`), in one
//!   place.
//! - [`faults`]: named crash points for crash tests of the real binary.
//! - [`fsutil`]: owner-only durable file writes (dev token, receipt key).
//! - [`text`]: numbers in words (grouped digits, counted nouns), and cuts
//!   that keep a head and a tail without splitting a character.
//! - [`receipt`]: deletion receipts' canonical bytes and HMAC-SHA256
//!   signatures, pure; the server signs with it, the CLI verifies.
//! - [`reaper`]: the background task that deletes what has expired, paced,
//!   driven by the expiry index.
//! - [`auth`]: bearer tokens to principals, and the access table.
//! - [`store`]: metadata trees over one engine interface (redb, sled) and
//!   the cap-std payload directories; crash-safe writes, reconciliation,
//!   ranged reads. It only stores: deletions return their receipts and the
//!   caller audits them; it imports no room above it.
//! - [`inspect`]: content-type detection, bounded JSON scanning, structure
//!   inference and its cache by content hash, search.
//! - [`offload`]: token estimates, the per-turn offload decision, previews and
//!   notices.
//! - [`policy`]: the policy fields (one list, generated into the complete
//!   policy, the stored level and the `[policy]` section), the effective
//!   policy (server default, tenant policy and session overrides,
//!   strictest wins) and the tighten-only checks.
//! - [`redact`]: policy redaction rules (built-ins and regexes) applied to
//!   bytes, one-shot or streaming in bounded memory.
//! - [`context`]: history repair, budgets, microcompaction, recall keys and
//!   the chat-history JSON adapters.
//! - [`sandbox`]: code mode; wasmtime engines, runtime images, per-exec
//!   directories and limits. The only module that names wasmtime.
//! - [`audit`]: audit events in a tamper-evident hash chain: canonical
//!   form, sealing, streaming verification, export lines; and the stored
//!   log, one chain per tenant, with durable appends (group-committed; the
//!   service's go through the audit writer's thread; on a local engine
//!   made durable by the audit journal) and queries. A room
//!   beside the store, over the same engine handle
//!   ([`store::open_engine`]).
//! - [`service`]: one function per operation, taking a principal and domain
//!   types: access decisions, policy resolution, redaction and auditing
//!   happen here, once, for every front door.
//! - [`api`]: the tonic services; the only code that sees prost types. Each
//!   RPC converts its message and calls one [`service`] operation.
//! - [`client`]: connecting to a Spillway server (address, token, TLS), for
//!   the CLI and the MCP fronts.
//! - [`console`]: the compliance console, a web front door (axum, maud,
//!   plotters) that calls the same [`service`] operations as gRPC.
//! - [`cli`]: the client subcommands of the `spillway` binary.
//! - [`mcp`]: `spillway mcp serve` and `spillway mcp proxy`, MCP fronts that
//!   are gRPC clients of a Spillway server.
//! - [`proto`]: the generated `spillway.v1` types.
//! - `testing` (hidden): real servers for the project's own tests (a
//!   throwaway Postgres cluster).

pub mod api;
pub mod audit;
pub mod auth;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod console;
pub mod context;
pub mod error;
pub mod fairness;
pub mod faults;
pub mod fsutil;
pub mod guest;
pub mod ids;
pub mod inspect;
pub mod mcp;
pub mod metrics;
pub mod offload;
pub mod policy;
pub mod reaper;
pub mod receipt;
pub mod redact;
pub mod sandbox;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod store;
pub mod telemetry;
#[doc(hidden)]
pub mod testing;
pub mod text;
pub mod tls;

/// The generated `spillway.v1` messages, services and JSON mappings.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/spillway.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/spillway.v1.serde.rs"));

    /// The encoded descriptor set of every served proto, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/spillway_descriptor.bin"));

    mod read_response;
    mod removed_item;
}
