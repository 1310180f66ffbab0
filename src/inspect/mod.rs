//! Looking into payloads: content-type detection (shared by previews,
//! Inspect and history compaction) and, in later work, structure inference
//! and search.

pub mod detect;
pub mod jsonscan;
