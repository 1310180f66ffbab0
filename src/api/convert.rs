//! Records to messages.

use pbjson_types::{Duration, Timestamp};

use crate::clock::Millis;
use crate::config::Config;
use crate::proto;
use crate::store::records::{PayloadRecord, ReceiptRecord, SessionRecord, SessionState};

pub fn timestamp(ms: Millis) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

fn duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// The effective policy of a session: for now the server defaults.
pub fn effective_policy(config: &Config) -> proto::Policy {
    let p = &config.policy;
    proto::Policy {
        retention: Some(duration(p.retention)),
        session_ttl: Some(duration(p.session_ttl)),
        max_session_bytes: 0,
        max_payload_bytes: config.limits.max_payload_bytes,
        max_payloads: 0,
        delete_on_close: false,
        allow_download: p.allow_download,
        allow_exec: p.allow_exec,
        compliance_can_read: false,
        exec_ceiling: Some(exec_limits(&p.exec_ceiling)),
        redact: Vec::new(),
        locked: false,
    }
}

/// Exec limits as a message.
pub fn exec_limits(l: &crate::sandbox::limits::ExecLimits) -> proto::ExecLimits {
    proto::ExecLimits {
        timeout_ms: l.timeout_ms,
        memory_bytes: l.memory_bytes,
        max_stdout_bytes: l.max_stdout_bytes,
        fuel: l.fuel,
    }
}

pub fn session(s: &SessionRecord, config: &Config) -> proto::Session {
    proto::Session {
        id: s.id.to_string(),
        tenant: s.tenant.clone(),
        owner: s.owner.clone(),
        label: s.label.clone(),
        labels: s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        state: match s.state {
            SessionState::Open => proto::SessionState::Open,
            SessionState::Closed => proto::SessionState::Closed,
        } as i32,
        created_at: Some(timestamp(s.created_ms)),
        closed_at: s.closed_ms.map(timestamp),
        expires_at: Some(timestamp(s.expires_ms)),
        policy: Some(effective_policy(config)),
        usage: Some(proto::SessionUsage {
            bytes: s.usage_bytes,
            payloads: s.usage_payloads,
        }),
        legal_hold: s.legal_hold,
        parent_session_id: s.parent.as_ref().map(|p| p.to_string()).unwrap_or_default(),
        share_with: s.share_with.clone(),
    }
}

pub fn payload(p: &PayloadRecord) -> proto::Payload {
    proto::Payload {
        id: p.id.to_string(),
        session_id: p.session_id.to_string(),
        name: p.name.clone(),
        path: p.sandbox_path(),
        size_bytes: p.size,
        line_count: p.line_count,
        estimated_tokens: p.estimated_tokens(),
        sha256: p.sha256.clone(),
        content_type: p.content_type.clone(),
        tool_name: p.tool_name.clone(),
        tool_call_id: p.tool_call_id.clone(),
        is_error: p.is_error,
        created_at: Some(timestamp(p.created_ms)),
        expires_at: Some(timestamp(p.expires_ms)),
        derived_from: p.derived_from.iter().map(ToString::to_string).collect(),
    }
}

pub fn receipt(r: &ReceiptRecord) -> proto::DeletionReceipt {
    proto::DeletionReceipt {
        id: r.id.to_string(),
        target_id: r.target_id.clone(),
        reason: r.reason.clone(),
        requested_by: r.requested_by.clone(),
        deleted_at: Some(timestamp(r.deleted_ms)),
        deleted_payload_ids: r
            .deleted_payload_ids
            .iter()
            .map(ToString::to_string)
            .collect(),
        bytes_deleted: r.bytes_deleted,
        content_sha256: r.content_sha256.clone(),
        signature: r.signature.clone(),
    }
}

pub fn structure(payload_id: &str, s: &crate::inspect::structure::Structure) -> proto::Structure {
    proto::Structure {
        payload_id: payload_id.to_owned(),
        detected_type: s.detected_type.clone(),
        size_bytes: s.size_bytes,
        line_count: s.line_count,
        json: s.json.as_ref().map(|j| proto::JsonStructure {
            top_level: j.top_level.clone(),
            record_count: j.record_count,
            fields: j
                .fields
                .iter()
                .map(|f| proto::FieldInfo {
                    path: f.path.clone(),
                    types: f.types.clone(),
                    present_count: f.present_count,
                    example: f.example.clone(),
                })
                .collect(),
            more_fields: j.more_fields,
            skipped_records: j.skipped_records,
            sampled_records: j.sampled_records,
        }),
        csv: s.csv.as_ref().map(|c| proto::CsvStructure {
            delimiter: c.delimiter.to_string(),
            columns: c.columns.clone(),
            row_count: c.row_count,
        }),
        text: s.text.as_ref().map(|t| proto::TextStructure {
            longest_line: t.longest_line,
            sample_lines: t.sample_lines.clone(),
            longest_line_number: t.longest_line_number,
        }),
        summary: s.summary.clone(),
        invalid_json_at: s.invalid_json_at,
    }
}
