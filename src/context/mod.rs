//! History hygiene: pairing repair, result budgets, lossless
//! microcompaction with recall, and the OpenAI (Chat Completions and
//! Responses) and Anthropic JSON adapters behind the Context API's format
//! field.

pub mod adapters;
pub mod compact;
pub mod formats;
pub mod model;
pub mod repair;
