//! Offload: for one turn of tool results, decide what stays inline and what
//! is stored whole and replaced by a notice (behaviour.md §1 and §2).
//!
//! - `estimate`: token estimators ([`Estimator`]).
//! - `decide`: the per-call and aggregate rules, as a pure function that
//!   gives each result a [`Disposition`].
//! - `preview`: the `structured`, `edges` and `lines` previews
//!   ([`build_preview`]).
//! - `notice`: the text that replaces an offloaded result ([`render_in`]).
//!
//! [`offload_turn`] ties them to the store. It blocks; the API calls it on
//! the blocking pool. The door is what this file defines and re-exports;
//! the four modules are private.

mod decide;
mod estimate;
mod notice;
mod preview;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::SessionId;
use crate::inspect::Kind;
use crate::store::{PayloadRecord, Store, StoreError, UploadMeta, base_name};
use decide::Item;
use estimate::Estimate;

pub use decide::Disposition;
pub use estimate::Estimator;
pub use notice::{Dialect, NoticeFacts, Shape, Why, render_in};
pub use preview::{Preview, Style, build as build_preview};

/// The `[offload]` config section: the server's defaults.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OffloadConfig {
    /// Per-call threshold in tokens (default 6000).
    pub per_call_tokens: u64,
    /// Per-turn threshold in tokens (default 10 000).
    pub aggregate_tokens: u64,
    /// Token estimator (default `chars4`).
    pub estimator: Estimator,
    /// Preview style (default `structured`).
    pub preview_style: Style,
    /// Preview size in chars; 0 means the style's default.
    pub preview_chars: usize,
    /// Per-tool per-call thresholds in tokens, by exact tool name.
    pub per_tool: BTreeMap<String, u64>,
    /// Most results in one Offload call (default 256).
    pub max_results: usize,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        Self {
            per_call_tokens: 6000,
            aggregate_tokens: 10_000,
            estimator: Estimator::Chars4,
            preview_style: Style::Structured,
            preview_chars: 0,
            per_tool: BTreeMap::new(),
            max_results: 256,
        }
    }
}

impl OffloadConfig {
    /// The configured preview size in chars (the style's default when
    /// `preview_chars` is 0). Without `allow_download`, a Read may return at
    /// most this many bytes.
    pub fn preview_size(&self) -> usize {
        if self.preview_chars > 0 {
            self.preview_chars
        } else {
            self.preview_style.default_chars()
        }
    }

    /// Checks the thresholds against each other.
    pub fn validate(&self) -> Result<(), String> {
        if self.per_call_tokens == 0 || self.aggregate_tokens == 0 {
            return Err(
                "offload.per_call_tokens and offload.aggregate_tokens must be greater than zero"
                    .into(),
            );
        }
        if self.per_call_tokens > self.aggregate_tokens {
            return Err(format!(
                "offload.per_call_tokens ({}) is greater than offload.aggregate_tokens ({})",
                self.per_call_tokens, self.aggregate_tokens
            ));
        }
        if let Some((tool, t)) = self
            .per_tool
            .iter()
            .find(|(_, t)| **t == 0 || **t > self.aggregate_tokens)
        {
            return Err(format!(
                "offload.per_tool.{tool} = {t} must be between 1 and offload.aggregate_tokens ({})",
                self.aggregate_tokens
            ));
        }
        Ok(())
    }
}

/// A request's overrides; `None` keeps the server default.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Per-call threshold.
    pub per_call_tokens: Option<u64>,
    /// Aggregate threshold.
    pub aggregate_tokens: Option<u64>,
    /// Estimator name.
    pub estimator: Option<String>,
    /// Preview style name.
    pub preview_style: Option<String>,
    /// Preview size in chars.
    pub preview_chars: Option<u64>,
    /// Whose tool names the notices' next steps use; gRPC when unset.
    pub dialect: Option<notice::Dialect>,
}

/// Largest preview a request may ask for, in chars.
pub const MAX_PREVIEW_CHARS: u64 = 8_000;
/// Largest per-call threshold a request may ask for, in tokens.
pub const MAX_PER_CALL_TOKENS: u64 = 1_000_000;
/// Largest aggregate threshold a request may ask for, in tokens.
pub const MAX_AGGREGATE_TOKENS: u64 = 10_000_000;

/// The settings in force for one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Default per-call threshold.
    pub per_call_tokens: u64,
    /// Aggregate threshold.
    pub aggregate_tokens: u64,
    /// Per-tool thresholds.
    pub per_tool: BTreeMap<String, u64>,
    /// Estimator.
    pub estimator: Estimator,
    /// Preview style.
    pub style: Style,
    /// Preview chars, if set.
    pub preview_chars: Option<usize>,
    /// Whose tool names the notices use (gRPC unless the request asks).
    pub dialect: notice::Dialect,
}

/// Why an offload could not be done.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    /// Bad settings or request.
    #[error("{0}")]
    Invalid(String),
    /// Too many results in one call.
    #[error(
        "this turn has {got} results; offload.max_results is {max}; send the turn in several Offload calls"
    )]
    TooManyResults {
        /// How many came.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// Storing a result failed; nothing is returned for the turn.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Settings {
    /// Applies a request's overrides to the server defaults, and validates.
    pub fn resolve(config: &OffloadConfig, o: &Overrides) -> Result<Self, OffloadError> {
        let per_call_tokens = o.per_call_tokens.unwrap_or(config.per_call_tokens);
        let aggregate_tokens = o.aggregate_tokens.unwrap_or(config.aggregate_tokens);
        if per_call_tokens == 0 || aggregate_tokens == 0 {
            return Err(OffloadError::Invalid(
                "settings.per_call_tokens and settings.aggregate_tokens must be greater than zero"
                    .into(),
            ));
        }
        if per_call_tokens > MAX_PER_CALL_TOKENS || aggregate_tokens > MAX_AGGREGATE_TOKENS {
            return Err(OffloadError::Invalid(format!(
                "settings.per_call_tokens may be at most {MAX_PER_CALL_TOKENS} and settings.aggregate_tokens at most {MAX_AGGREGATE_TOKENS}; got {per_call_tokens} and {aggregate_tokens}"
            )));
        }
        if per_call_tokens > aggregate_tokens {
            return Err(OffloadError::Invalid(format!(
                "settings.per_call_tokens ({per_call_tokens}) is greater than settings.aggregate_tokens ({aggregate_tokens}); a single result could then never trip the per-call rule before the aggregate one. Lower per_call_tokens or raise aggregate_tokens"
            )));
        }
        let estimator = match &o.estimator {
            Some(name) => name.parse().map_err(OffloadError::Invalid)?,
            None => config.estimator,
        };
        let style = match &o.preview_style {
            Some(name) => name.parse().map_err(OffloadError::Invalid)?,
            None => config.preview_style,
        };
        let preview_chars = match o.preview_chars {
            Some(n) if n == 0 || n > MAX_PREVIEW_CHARS => {
                return Err(OffloadError::Invalid(format!(
                    "settings.preview_chars must be between 1 and {MAX_PREVIEW_CHARS}; got {n}"
                )));
            }
            Some(n) => Some(n as usize),
            None => (config.preview_chars > 0).then_some(config.preview_chars),
        };
        // Per-tool thresholds never exceed the aggregate in force.
        let per_tool = config
            .per_tool
            .iter()
            .map(|(k, v)| (k.clone(), (*v).min(aggregate_tokens)))
            .collect();
        Ok(Self {
            per_call_tokens,
            aggregate_tokens,
            per_tool,
            estimator,
            style,
            preview_chars,
            dialect: o.dialect.unwrap_or_default(),
        })
    }

    fn threshold(&self, tool: &str) -> u64 {
        self.per_tool
            .get(tool)
            .copied()
            .unwrap_or(self.per_call_tokens)
    }
}

/// One tool result of a turn.
#[derive(Debug, Clone)]
pub struct ToolResult {
    /// Tool call ID.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Content.
    pub content: bytes::Bytes,
    /// Content-type hint.
    pub content_type: String,
    /// Error result?
    pub is_error: bool,
    /// Payloads this result was computed from (a script's inputs), so that
    /// deleting them deletes it too.
    pub derived_from: Vec<crate::ids::PayloadId>,
    /// Redactions already made to `content` (the API redacts before it
    /// offloads); recorded with the payload when the result is stored.
    pub redactions: crate::redact::RedactCounts,
}

/// What happened to one result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Tool call ID.
    pub tool_call_id: String,
    /// Inline or why offloaded.
    pub disposition: Disposition,
    /// What the model sees.
    pub content: String,
    /// Estimate of the original.
    pub estimate: Estimate,
    /// Estimate of `content`.
    pub content_tokens: u64,
    /// The stored payload, when offloaded.
    pub payload: Option<PayloadRecord>,
    /// The preview, when offloaded.
    pub preview: String,
    /// Redactions made to the result (inline or offloaded).
    pub redactions: crate::redact::RedactCounts,
}

/// A placeholder of a payload ID's length, for notice-size estimates made
/// before the payload exists.
const DRAFT_ID: &str = "pl_00000000000000000000000000000000";

/// Decides and stores one turn. Every offloaded result is stored before any
/// outcome is returned; a storage failure fails the whole call.
pub fn offload_turn(
    store: &Store,
    session: &SessionId,
    results: Vec<ToolResult>,
    settings: &Settings,
    max_results: usize,
    quota: crate::store::Quota,
) -> Result<Vec<Outcome>, OffloadError> {
    if results.len() > max_results {
        return Err(OffloadError::TooManyResults {
            got: results.len(),
            max: max_results,
        });
    }
    let thresholds: Vec<u64> = results
        .iter()
        .map(|r| settings.threshold(&r.tool_name))
        .collect();
    let estimates: Vec<Estimate> = results
        .iter()
        .zip(&thresholds)
        .map(|(r, &t)| estimate::estimate(&r.content, settings.estimator, t))
        .collect();
    let items: Vec<Item> = estimates
        .iter()
        .zip(&thresholds)
        .map(|(e, &threshold)| Item {
            tokens: e.tokens,
            threshold,
        })
        .collect();
    let mut previews: Vec<Option<Preview>> = vec![None; results.len()];
    let dispositions = decide::decide(&items, settings.aggregate_tokens, |i| {
        let r = &results[i];
        let p = previews[i].get_or_insert_with(|| {
            preview::build(
                &r.content,
                &r.content_type,
                settings.style,
                settings.preview_chars,
            )
        });
        let draft_path =
            crate::guest::guest_path(&base_name("", &r.tool_name, &r.tool_call_id, "json"));
        let text = notice::render_in(
            settings.dialect,
            &draft_facts(r, estimates[i], &draft_path, p.kind == Kind::Binary),
            why(Disposition::PerCall, settings, &r.tool_name),
            &p.render(&draft_path, DRAFT_ID),
        );
        estimate::estimate_text(&text, settings.estimator)
    });

    // A closed session takes no turn, even an all-inline one.
    let state = store.session(session)?.state;
    if state != crate::store::SessionState::Open {
        return Err(StoreError::SessionClosed(session.clone()).into());
    }
    let mut stored: Vec<crate::ids::PayloadId> = Vec::new();
    match store_and_describe(
        store,
        session,
        results,
        settings,
        &items,
        &estimates,
        &dispositions,
        &mut previews,
        &mut stored,
        quota,
    ) {
        Ok(outcomes) => Ok(outcomes),
        Err(e) => {
            // Nothing was acknowledged: take back what this call stored.
            for id in stored {
                if let Err(undo) =
                    store.roll_back_payload(&id, "spillway", "offload call failed; rolled back")
                {
                    tracing::warn!(payload_id = %id, error = %undo, "could not roll back a payload of a failed offload");
                }
            }
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn store_and_describe(
    store: &Store,
    session: &SessionId,
    results: Vec<ToolResult>,
    settings: &Settings,
    items: &[Item],
    estimates: &[Estimate],
    dispositions: &[Disposition],
    previews: &mut [Option<Preview>],
    stored: &mut Vec<crate::ids::PayloadId>,
    quota: crate::store::Quota,
) -> Result<Vec<Outcome>, OffloadError> {
    let mut outcomes = Vec::with_capacity(results.len());
    for (i, r) in results.into_iter().enumerate() {
        let d = dispositions[i];
        if !d.offloaded() {
            outcomes.push(Outcome {
                tool_call_id: r.tool_call_id,
                disposition: d,
                content_tokens: items[i].tokens,
                content: String::from_utf8_lossy(&r.content).into_owned(),
                estimate: estimates[i],
                payload: None,
                preview: String::new(),
                redactions: r.redactions,
            });
            continue;
        }
        let record = store_result(store, session, &r, quota)?;
        stored.push(record.id.clone());
        let p = previews[i].take().unwrap_or_else(|| {
            preview::build(
                &r.content,
                &r.content_type,
                settings.style,
                settings.preview_chars,
            )
        });
        let path = record.sandbox_path();
        let preview_text = p.render(&path, record.id.as_str());
        let facts = NoticeFacts {
            tool_name: &r.tool_name,
            tool_call_id: &r.tool_call_id,
            is_error: r.is_error,
            payload_id: record.id.as_str(),
            path: &path,
            size: record.size,
            lines: record.line_count,
            tokens: (estimates[i].tokens, estimates[i].lower_bound),
            content_type: &record.content_type,
            shape: Shape::of(p.kind == Kind::Binary, record.line_count),
        };
        let content = notice::render_in(
            settings.dialect,
            &facts,
            why(d, settings, &r.tool_name),
            &preview_text,
        );
        outcomes.push(Outcome {
            tool_call_id: r.tool_call_id,
            disposition: d,
            content_tokens: estimate::estimate_text(&content, settings.estimator),
            content,
            estimate: estimates[i],
            redactions: record.redactions.clone(),
            payload: Some(record),
            preview: preview_text,
        });
    }
    Ok(outcomes)
}

fn why(d: Disposition, settings: &Settings, tool: &str) -> Why {
    match d {
        Disposition::Aggregate => Why::Aggregate(settings.aggregate_tokens),
        _ => Why::PerCall(settings.threshold(tool)),
    }
}

fn draft_facts<'a>(r: &'a ToolResult, e: Estimate, path: &'a str, binary: bool) -> NoticeFacts<'a> {
    let newlines = memchr::memchr_iter(b'\n', &r.content).count() as u64;
    let lines = newlines + u64::from(!r.content.is_empty() && !r.content.ends_with(b"\n"));
    NoticeFacts {
        tool_name: &r.tool_name,
        tool_call_id: &r.tool_call_id,
        is_error: r.is_error,
        payload_id: DRAFT_ID,
        path,
        size: r.content.len() as u64,
        lines,
        tokens: (e.tokens, e.lower_bound),
        content_type: &r.content_type,
        shape: Shape::of(binary, lines),
    }
}

fn store_result(
    store: &Store,
    session: &SessionId,
    r: &ToolResult,
    quota: crate::store::Quota,
) -> Result<PayloadRecord, StoreError> {
    let mut upload = store.begin_upload(
        session,
        UploadMeta {
            name: String::new(),
            content_type: r.content_type.clone(),
            tool_name: r.tool_name.clone(),
            tool_call_id: r.tool_call_id.clone(),
            is_error: r.is_error,
            expected_sha256: None,
            derived_from: r.derived_from.clone(),
            archive_key: String::new(),
            quota,
            redactions: r.redactions.clone(),
        },
    )?;
    upload.write(&r.content)?;
    upload.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_call_above_aggregate_is_refused_naming_both() {
        let o = Overrides {
            per_call_tokens: Some(20_000),
            ..Default::default()
        };
        let err = Settings::resolve(&OffloadConfig::default(), &o)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("per_call_tokens (20000)") && err.contains("aggregate_tokens (10000)"),
            "{err}"
        );
    }

    #[test]
    fn unknown_estimator_style_and_bad_preview_size_are_refused() {
        let bad = |o: Overrides| {
            Settings::resolve(&OffloadConfig::default(), &o)
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad(Overrides {
                estimator: Some("gpt2".into()),
                ..Default::default()
            })
            .contains("chars4")
        );
        assert!(
            bad(Overrides {
                preview_style: Some("fancy".into()),
                ..Default::default()
            })
            .contains("structured")
        );
        assert!(
            bad(Overrides {
                preview_chars: Some(0),
                ..Default::default()
            })
            .contains("preview_chars")
        );
    }

    #[test]
    fn overrides_replace_defaults() {
        let o = Overrides {
            per_call_tokens: Some(100),
            aggregate_tokens: Some(200),
            estimator: Some("o200k".into()),
            preview_style: Some("edges".into()),
            preview_chars: Some(50),
            dialect: Some(notice::Dialect::Mcp),
        };
        let s = Settings::resolve(&OffloadConfig::default(), &o).unwrap();
        assert_eq!(
            (
                s.per_call_tokens,
                s.aggregate_tokens,
                s.estimator,
                s.style,
                s.preview_chars,
                s.dialect
            ),
            (
                100,
                200,
                Estimator::O200k,
                Style::Edges,
                Some(50),
                notice::Dialect::Mcp
            )
        );
    }

    #[test]
    fn config_validation_refuses_per_tool_above_aggregate() {
        let mut c = OffloadConfig::default();
        c.per_tool.insert("read".into(), 20_000);
        assert!(c.validate().unwrap_err().contains("offload.per_tool.read"));
    }
}
