//! Looking into payloads without reading them whole.
//!
//! - `detect`: content-type detection, shared by previews, Inspect and
//!   history compaction.
//! - `jsonscan`: a bounded structural scan of JSON for previews.
//! - `jsonpath`: the JSON path of an offset in a one-line document, for
//!   search hits.
//! - `structure`: streaming structure inference (Inspect).
//! - `cache`: inferred structures by content hash, so the same bytes are
//!   inferred once.
//! - [`search`]: regex and literal search on ripgrep's crates (Search).

mod cache;
mod detect;
mod jsonpath;
mod jsonscan;
pub mod search;
mod structure;

pub use cache::{Content, StructureCache};
pub use detect::{Kind, detect};
pub use jsonscan::{Top, scan as scan_json, string_end};
pub use structure::{Structure, infer};
