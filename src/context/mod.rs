//! History hygiene: pairing repair, result budgets, lossless
//! microcompaction with recall, and the OpenAI and Anthropic JSON adapters.

pub mod adapters;
pub mod compact;
pub mod model;
pub mod repair;
