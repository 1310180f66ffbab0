//! Spillway: a gRPC service that takes oversized tool results off an AI
//! agent's hands, stores them durably in per-session sandboxes, and lets the
//! agent reach into them step by step.
//!
//! # Layout
//!
//! - [`config`]: the configuration tree, its defaults and its loader.
//! - [`telemetry`]: `tracing` setup.
//! - [`shutdown`]: the shutdown signal shared by the server's tasks.
//! - [`server`]: builds the tonic server, health and reflection, and runs it.
//! - [`tls`]: optional TLS and mutual TLS (rustls) for the server and CLI.
//! - [`error`]: every layer's error mapped to a `tonic::Status`, in one place.
//! - [`ids`]: typed, unguessable IDs (`ses_`, `pl_`, `rcpt_`).
//! - [`clock`]: the time source, replaceable in tests.
//! - [`faults`]: named crash points for crash tests of the real binary.
//! - [`reaper`]: the background task that deletes what has expired, paced,
//!   driven by the expiry index.
//! - [`auth`]: bearer tokens to principals, and the access table.
//! - [`store`]: metadata trees over one engine interface (redb, sled) and
//!   the cap-std payload directories; crash-safe writes, reconciliation,
//!   ranged reads.
//! - [`inspect`]: content-type detection and bounded JSON scanning.
//! - [`offload`]: token estimates, the per-turn offload decision, previews and
//!   notices.
//! - [`policy`]: the effective policy (server default, tenant policy and
//!   session overrides, strictest wins) and the tighten-only checks.
//! - [`redact`]: policy redaction rules (built-ins and regexes) applied to
//!   bytes, one-shot or streaming in bounded memory.
//! - [`context`]: history repair, budgets, microcompaction, recall keys and
//!   the chat-history JSON adapters.
//! - [`sandbox`]: code mode; wasmtime engines, runtime images, per-exec
//!   directories and limits. The only module that names wasmtime.
//! - [`audit`]: audit events in a tamper-evident hash chain: canonical
//!   form, sealing, streaming verification, export lines; and the stored
//!   log, one chain per tenant, with durable appends and queries.
//! - [`api`]: the tonic services; the only code that sees prost types.
//! - [`console`]: the compliance console, a web front door that is a gRPC
//!   client of the server it runs in (axum, maud, plotters).
//! - [`cli`]: the client subcommands of the `spillway` binary.
//! - [`proto`]: the generated `spillway.v1` types.

pub mod api;
pub mod audit;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod context;
pub mod error;
pub mod faults;
pub mod ids;
pub mod inspect;
pub mod offload;
pub mod policy;
pub mod reaper;
pub mod redact;
pub mod sandbox;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod tls;

/// The generated `spillway.v1` messages, services and JSON mappings.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/spillway.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/spillway.v1.serde.rs"));

    /// The encoded descriptor set of every served proto, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/spillway_descriptor.bin"));
}
