//! Looking into payloads without reading them whole.
//!
//! - [`detect`]: content-type detection, shared by previews, Inspect and
//!   history compaction.
//! - [`jsonscan`]: a bounded structural scan of JSON for previews.
//! - [`structure`]: streaming structure inference (Inspect).
//! - [`cache`]: inferred structures by content hash, so the same bytes are
//!   inferred once.
//! - [`search`]: regex and literal search on ripgrep's crates (Search).

pub mod cache;
pub mod detect;
pub mod jsonscan;
pub mod search;
pub mod structure;
