//! History hygiene: pairing repair, result budgets, lossless
//! microcompaction with recall, and the OpenAI (Chat Completions and
//! Responses) and Anthropic JSON adapters behind the Context API's format
//! field.
//!
//! - `model`: the provider-neutral history ([`Message`], [`Block`]).
//! - `repair`: pairing repair ([`repair`], [`needs_repair`]).
//! - `compact`: microcompaction over an [`Archive`] ([`compact`],
//!   [`recall_key`]); pure rules, the caller owns the storage.
//! - `adapters` and `formats`: provider JSON to and from the model
//!   ([`import_history`], [`decode_history`], [`encode_history`]).
//!
//! The door is the names re-exported here; the modules are private.

mod adapters;
mod compact;
mod formats;
mod model;
mod repair;

pub use adapters::{
    AdapterError, Format, History, export as export_history, import as import_history,
};
pub use compact::{
    Archive, ArchiveInfo, CompactReport, CompactSettings, cleared_stub, compact, describe,
    recall_key,
};
pub use formats::{
    FormatError, MAX_HISTORY_JSON_BYTES, Shape as HistoryShape, decode as decode_history,
    encode as encode_history, requested as requested_format,
};
pub use model::{Block, Message, Part, Role, ToolResult, ToolUse};
pub use repair::{RepairReport, needs_repair, repair};
