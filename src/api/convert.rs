//! Records to messages.

use pbjson_types::{Duration, Timestamp};

use crate::clock::{self, Millis};
use crate::error::ApiError;
use crate::policy::{ExecCeiling, Policy, PolicyOverrides};
use crate::proto;
use crate::sandbox::limits::ExecLimits;
use crate::sandbox::outcome::Status as ExecStatus;
use crate::store::{PayloadRecord, ReceiptRecord, SessionRecord, SessionState};

/// Milliseconds since the epoch as a protobuf timestamp.
pub fn timestamp(ms: Millis) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf timestamp as milliseconds since the epoch, saturating.
pub fn millis(t: &Timestamp) -> Millis {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

fn duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// A complete (effective or default) policy as a message: every field set.
pub fn policy(p: &Policy) -> proto::Policy {
    proto::Policy {
        retention: Some(duration(p.retention)),
        session_ttl: Some(duration(p.session_ttl)),
        max_session_bytes: p.max_session_bytes,
        max_payload_bytes: p.max_payload_bytes,
        max_payloads: p.max_payloads,
        delete_on_close: Some(p.delete_on_close),
        allow_download: Some(p.allow_download),
        allow_exec: Some(p.allow_exec),
        compliance_can_read: Some(p.compliance_can_read),
        exec_ceiling: Some(exec_limits(&p.exec_ceiling)),
        redact: p.redact.clone(),
        locked: p.locked,
    }
}

/// One level (a tenant policy as set, or session overrides) as a message:
/// what the level leaves to the others stays unset or zero.
pub fn policy_level(l: &PolicyOverrides) -> proto::Policy {
    let ms = |v: Option<u64>| v.map(|ms| duration(std::time::Duration::from_millis(ms)));
    proto::Policy {
        retention: ms(l.retention_ms),
        session_ttl: ms(l.session_ttl_ms),
        max_session_bytes: l.max_session_bytes.unwrap_or(0),
        max_payload_bytes: l.max_payload_bytes.unwrap_or(0),
        max_payloads: l.max_payloads.unwrap_or(0),
        delete_on_close: l.delete_on_close,
        allow_download: l.allow_download,
        allow_exec: l.allow_exec,
        compliance_can_read: l.compliance_can_read,
        exec_ceiling: l.exec_ceiling.as_ref().map(exec_limits),
        redact: l.redact.clone(),
        locked: l.locked,
    }
}

/// A policy message as one level. Zero quotas and an all-zero exec ceiling
/// mean "nothing at this level".
pub fn policy_level_from(p: &proto::Policy) -> Result<PolicyOverrides, ApiError> {
    let ms = |field: &str, d: &Option<Duration>| -> Result<Option<u64>, ApiError> {
        let Some(d) = d else { return Ok(None) };
        if d.seconds < 0 || d.nanos < 0 {
            return Err(ApiError::BadRequest(format!(
                "{field} is negative; give a positive duration, or leave it unset"
            )));
        }
        let ms = (d.seconds as u64)
            .saturating_mul(1000)
            .saturating_add(d.nanos as u64 / 1_000_000);
        Ok(Some(ms))
    };
    let nonzero = |v: u64| (v != 0).then_some(v);
    let exec_ceiling = p
        .exec_ceiling
        .as_ref()
        .map(limits_of)
        .filter(|l| *l != ExecCeiling::ZERO);
    Ok(PolicyOverrides {
        retention_ms: ms("policy.retention", &p.retention)?,
        session_ttl_ms: ms("policy.session_ttl", &p.session_ttl)?,
        max_session_bytes: nonzero(p.max_session_bytes),
        max_payload_bytes: nonzero(p.max_payload_bytes),
        max_payloads: nonzero(p.max_payloads),
        delete_on_close: p.delete_on_close,
        allow_download: p.allow_download,
        allow_exec: p.allow_exec,
        compliance_can_read: p.compliance_can_read,
        exec_ceiling,
        redact: p.redact.clone(),
        locked: p.locked,
    })
}

/// Exec limits as a message.
pub fn exec_limits(l: &ExecLimits) -> proto::ExecLimits {
    proto::ExecLimits {
        timeout_ms: l.timeout_ms,
        memory_bytes: l.memory_bytes,
        max_stdout_bytes: l.max_stdout_bytes,
        fuel: l.fuel,
    }
}

/// A session with its effective policy. Its expiry is the stored one or the
/// effective TTL from its creation, whichever is earlier, so a tightened
/// tenant TTL shows at once.
pub fn session(s: &SessionRecord, effective: &Policy) -> proto::Session {
    let expires_ms = s
        .expires_ms
        .min(clock::add(s.created_ms, effective.session_ttl));
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
        expires_at: Some(timestamp(expires_ms)),
        policy: Some(policy(effective)),
        usage: Some(proto::SessionUsage {
            bytes: s.usage_bytes,
            payloads: s.usage_payloads,
        }),
        legal_hold: s.legal_hold,
        parent_session_id: s.parent.as_ref().map(|p| p.to_string()).unwrap_or_default(),
        share_with: s.share_with.clone(),
        legal_hold_reason: s
            .hold
            .as_ref()
            .map(|h| h.reason.clone())
            .unwrap_or_default(),
        legal_hold_by: s.hold.as_ref().map(|h| h.by.clone()).unwrap_or_default(),
    }
}

/// A payload record as a message.
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
        redactions: redaction_map(&p.redactions),
    }
}

/// Redaction counts as the messages carry them: per rule name.
pub fn redaction_map(c: &crate::redact::RedactCounts) -> std::collections::HashMap<String, u64> {
    c.by_rule.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

/// A deletion receipt as a message.
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
        purge_confirmed_at: r.purge_confirmed.map(|p| timestamp(p.at_ms)),
        purge_replicas: r.purge_confirmed.map_or(0, |p| p.replicas),
        removed: r.removed.iter().map(proto::RemovedItem::from).collect(),
    }
}

/// An inferred structure as the Inspect reply.
pub fn structure(payload_id: &str, s: &crate::inspect::Structure) -> proto::Structure {
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

/// One result's offload outcome as a message.
pub fn outcome(o: crate::offload::Outcome) -> proto::OffloadOutcome {
    use crate::offload::Disposition as D;
    let (disposition, reason) = match o.disposition {
        D::Inline => (proto::Disposition::Inline, proto::OffloadReason::None),
        D::PerCall => (proto::Disposition::Offloaded, proto::OffloadReason::PerCall),
        D::Aggregate => (
            proto::Disposition::Offloaded,
            proto::OffloadReason::Aggregate,
        ),
    };
    proto::OffloadOutcome {
        tool_call_id: o.tool_call_id,
        disposition: disposition as i32,
        reason: reason as i32,
        content: o.content,
        estimated_tokens: o.estimate.tokens,
        payload: o.payload.as_ref().map(payload),
        preview: o.preview,
        content_tokens: o.content_tokens,
        estimate_is_lower_bound: o.estimate.lower_bound,
        redactions: redaction_map(&o.redactions),
    }
}

/// What a Search found, as a message.
pub fn search(r: crate::service::SearchReply) -> proto::SearchResponse {
    proto::SearchResponse {
        matches: r
            .matches
            .into_iter()
            .map(|m| proto::Match {
                payload_id: m.payload_id.to_string(),
                line_number: m.hit.line_number,
                byte_offset: m.hit.byte_offset,
                line: m.hit.line,
                before: m.hit.before,
                after: m.hit.after,
                match_offset: m.hit.match_offset,
                match_length: m.hit.match_length,
                column: m.hit.match_offset - m.hit.byte_offset,
                windowed: m.hit.window.is_some(),
                window_start: m.hit.window.map_or(0, |w| w.0),
                window_end: m.hit.window.map_or(0, |w| w.1),
                json_path: m.hit.json_path,
            })
            .collect(),
        total_matches_seen: r.total_matches_seen,
        truncated: r.truncated,
        note: r.note,
    }
}

/// An exec's status as a message.
pub fn exec_status(s: ExecStatus) -> proto::ExecStatus {
    match s {
        ExecStatus::Ok => proto::ExecStatus::Ok,
        ExecStatus::ExitNonzero => proto::ExecStatus::ExitNonzero,
        ExecStatus::Timeout => proto::ExecStatus::Timeout,
        ExecStatus::MemoryLimit => proto::ExecStatus::MemoryLimit,
        ExecStatus::OutputLimit => proto::ExecStatus::OutputLimit,
        ExecStatus::Trap => proto::ExecStatus::Trap,
        ExecStatus::InvalidScript => proto::ExecStatus::InvalidScript,
    }
}

/// A notice dialect from its wire value; unknown values are gRPC's.
pub fn notice_dialect(d: i32) -> crate::offload::Dialect {
    match proto::NoticeDialect::try_from(d) {
        Ok(proto::NoticeDialect::Mcp) => crate::offload::Dialect::Mcp,
        _ => crate::offload::Dialect::Grpc,
    }
}

/// Exec limits from a message; absent: every field the default.
pub fn exec_limits_from(l: Option<proto::ExecLimits>) -> ExecLimits {
    l.as_ref().map_or(ExecLimits::ZERO, limits_of)
}

/// The limits a message names, field for field (a policy's ceiling or an
/// exec's request).
fn limits_of(l: &proto::ExecLimits) -> ExecLimits {
    ExecLimits {
        timeout_ms: l.timeout_ms,
        memory_bytes: l.memory_bytes,
        max_stdout_bytes: l.max_stdout_bytes,
        fuel: l.fuel,
    }
}

/// An exec's outcome as a message.
pub fn exec_result(r: crate::service::ExecReply) -> proto::ExecResult {
    let u = r.usage;
    proto::ExecResult {
        status: exec_status(r.status) as i32,
        exit_code: r.exit_code,
        stdout: r.stdout,
        stderr: r.stderr,
        stdout_payload: r.stdout_payload.as_ref().map(payload),
        outputs: r.outputs.iter().map(payload).collect(),
        message: r.message,
        usage: Some(proto::ExecUsage {
            wall_ms: u.wall_ms,
            fuel_consumed: u.fuel_consumed,
            peak_memory_bytes: u.peak_memory_bytes,
            stdout_bytes: u.stdout_bytes,
            stderr_bytes: u.stderr_bytes,
            scratch_bytes: u.scratch_bytes,
            queue_ms: u.queue_ms,
            setup_us: u.setup_us,
            instantiate_us: u.instantiate_us,
            run_us: u.run_us,
            compile_us: u.compile_us,
            denied_calls: u.denied_calls,
            scratch_entries: u.scratch_entries,
            cpu_wait_us: u.cpu_wait_us,
            server_us: u.server_us,
            prepare_us: u.prepare_us,
            queue_us: u.queue_us,
            module_us: u.module_us,
            output_us: u.output_us,
            audit_us: u.audit_us,
            cleanup_us: u.cleanup_us,
        }),
        clamped: r.clamped,
        effective_limits: Some(exec_limits(&r.effective_limits)),
        redactions: redaction_map(&r.redactions),
    }
}

/// A runtime as a message.
pub fn runtime(r: crate::service::RuntimeInfo) -> proto::Runtime {
    proto::Runtime {
        name: r.name,
        language_version: r.language_version,
        description: r.description,
        default_limits: Some(exec_limits(&r.default_limits)),
        image_sha256: r.sha256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exec_status_maps_to_its_proto_value() {
        for (ours, theirs) in [
            (ExecStatus::Ok, proto::ExecStatus::Ok),
            (ExecStatus::Timeout, proto::ExecStatus::Timeout),
            (ExecStatus::InvalidScript, proto::ExecStatus::InvalidScript),
        ] {
            assert_eq!(exec_status(ours), theirs);
        }
    }
}
