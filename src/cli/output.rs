//! Human-readable renderings of replies, and the `--json` switch.
//!
//! Everything printed here goes through [`emit`], which shows control
//! characters escaped (`\x1b`, `\u{9b}`): labels, names, content types and
//! messages come from other people, and a terminal would obey their escape
//! sequences. Newlines and tabs pass. A closed pipe ends the process quietly
//! (exit code 0), as `head` expects.

use std::borrow::Cow;
use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

/// An event from the wire, as the chain knows it (for exports and
/// client-side verification).
pub fn event_from_proto(e: proto::AuditEvent) -> crate::audit::AuditEvent {
    crate::audit::AuditEvent {
        action: e.action,
        content_sha256: e.content_sha256,
        detail: e.detail,
        hash: e.hash,
        outcome: e.outcome,
        payload_id: e.payload_id,
        prev_hash: e.prev_hash,
        principal: e.principal,
        seq: e.seq,
        session_id: e.session_id,
        tenant: e.tenant,
        time: e.time,
    }
}

/// `text` with every control character but newline and tab escaped.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    let is_control = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !is_control(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// Writes a script's or payload's text to stdout: as it is into a pipe or
/// a file, with controls escaped on a terminal.
pub fn data(text: &str) {
    use std::io::IsTerminal as _;
    if std::io::stdout().is_terminal() {
        return emit(std::io::stdout(), text);
    }
    if let Err(e) = std::io::stdout().write_all(text.as_bytes()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "spillway: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// Writes `text`, controls escaped, to `to`. A closed pipe (`| head`) ends
/// the process quietly; any other write error is reported once, then the
/// process exits nonzero.
pub fn emit(mut to: impl std::io::Write, text: &str) {
    if let Err(e) = to.write_all(escape_controls(text).as_bytes()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "spillway: cannot write the output: {e}");
        std::process::exit(1);
    }
}

use serde::Serialize;

use crate::proto;

/// Prints `msg` as proto3 JSON.
pub fn json<T: Serialize>(msg: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(msg)?);
    Ok(())
}

/// Prints `msg` as JSON with `--json`, else in its human form.
pub fn show<T: Serialize>(json: bool, msg: &T, human: fn(&T)) -> anyhow::Result<()> {
    if json {
        return self::json(msg);
    }
    human(msg);
    Ok(())
}

fn time(ts: Option<&pbjson_types::Timestamp>) -> String {
    match ts {
        Some(t) if t.seconds > 0 => {
            let at = UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos.max(0) as u32);
            humantime::format_rfc3339_seconds(at).to_string()
        }
        _ => "-".into(),
    }
}

fn state(s: i32) -> &'static str {
    match proto::SessionState::try_from(s) {
        Ok(proto::SessionState::Open) => "open",
        Ok(proto::SessionState::Closed) => "closed",
        Ok(proto::SessionState::Deleted) => "deleted",
        _ => "unknown",
    }
}

/// A session, several lines.
pub fn session(s: &proto::Session) {
    println!("{}  ({})", s.id, state(s.state));
    let label = if s.label.is_empty() {
        String::new()
    } else {
        format!("  label {:?}", s.label)
    };
    println!("  tenant {}  owner {}{label}", s.tenant, s.owner);
    println!(
        "  created {}  expires {}",
        time(s.created_at.as_ref()),
        time(s.expires_at.as_ref())
    );
    if let Some(u) = &s.usage {
        println!("  usage {} payloads, {} bytes", u.payloads, u.bytes);
    }
    if !s.share_with.is_empty() {
        println!("  shared with {}", s.share_with.join(", "));
    }
    if s.legal_hold {
        println!(
            "  legal hold by {}: {:?}",
            s.legal_hold_by, s.legal_hold_reason
        );
    }
}

/// A session, one line.
/// A page of sessions, a line each.
pub fn session_page(page: &proto::ListSessionsResponse) {
    page.sessions.iter().for_each(session_line);
}

pub fn session_line(s: &proto::Session) {
    let usage = s.usage.unwrap_or_default();
    println!(
        "{}  {:<6}  {:>5} payloads  {:>12} bytes  {}",
        s.id,
        state(s.state),
        usage.payloads,
        usage.bytes,
        s.label
    );
}

/// A payload, several lines.
pub fn payload(p: &proto::Payload) {
    println!("{}  {}", p.id, p.name);
    println!(
        "  {} bytes  {} lines  ~{} tokens  {}{}",
        p.size_bytes,
        p.line_count,
        p.estimated_tokens,
        p.content_type,
        if p.is_error { "  (error result)" } else { "" }
    );
    println!("  path {}", p.path);
    println!("  sha256 {}", p.sha256);
    if !p.redactions.is_empty() {
        let mut by_rule: Vec<String> = p
            .redactions
            .iter()
            .map(|(rule, n)| format!("{rule} {n}"))
            .collect();
        by_rule.sort();
        println!("  redacted before storing: {}", by_rule.join(", "));
    }
    println!(
        "  created {}  expires {}",
        time(p.created_at.as_ref()),
        time(p.expires_at.as_ref())
    );
}

/// A payload, one line.
/// A page of payloads, a line each.
pub fn payload_page(page: &proto::ListPayloadsResponse) {
    page.payloads.iter().for_each(payload_line);
}

pub fn payload_line(p: &proto::Payload) {
    println!(
        "{}  {:>12} bytes  {:>8} lines  {}",
        p.id, p.size_bytes, p.line_count, p.name
    );
}

/// A deletion receipt.
pub fn receipt(r: &proto::DeletionReceipt) {
    println!("deleted {}  receipt {}", r.target_id, r.id);
    println!(
        "  {} payloads, {} bytes, at {}",
        r.deleted_payload_ids.len(),
        r.bytes_deleted,
        time(r.deleted_at.as_ref())
    );
    if r.purge_confirmed_at.is_some() {
        println!(
            "  every local copy purged on {} replicas by {}",
            r.purge_replicas,
            time(r.purge_confirmed_at.as_ref())
        );
    }
    for (id, sha) in r.deleted_payload_ids.iter().zip(&r.content_sha256) {
        println!("  {id}  sha256 {sha}");
    }
    if !r.removed.is_empty() {
        println!("  removed:");
        for i in &r.removed {
            let because = if i.because.is_empty() {
                String::new()
            } else {
                format!("  ({})", i.because)
            };
            println!("    {:<16} {}  {} bytes{because}", i.kind, i.id, i.bytes);
        }
    }
}

/// An offload reply: one block per result, then the totals.
pub fn offload(r: &proto::OffloadResponse) {
    for o in &r.outcomes {
        let reason = match proto::OffloadReason::try_from(o.reason) {
            Ok(proto::OffloadReason::PerCall) => "offloaded (per-call limit)",
            Ok(proto::OffloadReason::Aggregate) => "offloaded (turn limit)",
            _ => "inline",
        };
        let bound = if o.estimate_is_lower_bound {
            "≥"
        } else {
            "~"
        };
        match &o.payload {
            Some(p) => {
                println!(
                    "== {}: {reason}, {bound}{} tokens -> {} {}",
                    o.tool_call_id, o.estimated_tokens, p.id, p.path
                );
                println!("{}", o.content);
            }
            None => println!(
                "== {}: {reason}, {bound}{} tokens",
                o.tool_call_id, o.estimated_tokens
            ),
        }
    }
    println!(
        "-- {} tokens reach the model; {} tokens offloaded",
        r.inline_tokens, r.offloaded_tokens
    );
}

/// An Inspect result: the summary, then the details.
pub fn structure(s: &proto::Structure) {
    println!("{}  ({})", s.payload_id, s.detected_type);
    println!("{}", s.summary);
    if let Some(j) = &s.json {
        for f in &j.fields {
            println!(
                "  {:<40} {:<20} {:>10}  {}",
                f.path,
                f.types.join("|"),
                f.present_count,
                f.example
            );
        }
    }
    if let Some(t) = &s.text
        && s.json.is_none()
        && s.csv.is_none()
    {
        for l in &t.sample_lines {
            println!("  | {l}");
        }
    }
}

/// Search matches, grep-style: `payload:line: text`, context with `-`; a
/// window of a long line as `payload:line@match_offset json_path: window`.
pub fn search(r: &proto::SearchResponse) {
    for m in &r.matches {
        let first = m.line_number.saturating_sub(m.before.len() as u64);
        for (i, b) in m.before.iter().enumerate() {
            println!("{}-{}- {b}", m.payload_id, first + i as u64);
        }
        if m.windowed {
            // A window of a long line: where the match is, and its JSON path.
            let path = if m.json_path.is_empty() {
                String::new()
            } else {
                format!(" {}", m.json_path)
            };
            println!(
                "{}:{}@{}{path}: {}",
                m.payload_id, m.line_number, m.match_offset, m.line
            );
        } else {
            println!("{}:{}: {}", m.payload_id, m.line_number, m.line);
        }
        for (i, a) in m.after.iter().enumerate() {
            println!("{}-{}- {a}", m.payload_id, m.line_number + 1 + i as u64);
        }
    }
    eprintln!(
        "-- {} matches shown, {} seen{}{}",
        r.matches.len(),
        r.total_matches_seen,
        if r.truncated { ", truncated" } else { "" },
        if r.note.is_empty() {
            String::new()
        } else {
            format!("; {}", r.note)
        }
    );
}

/// An exec result: stdout on stdout; stderr, status and outputs on stderr.
pub fn exec(r: &proto::ExecResult) {
    // The script's output is data: raw into a pipe or file, escaped on a
    // terminal.
    data(&r.stdout);
    if !r.stdout.is_empty() && !r.stdout.ends_with('\n') {
        println!();
    }
    if !r.stderr.is_empty() {
        eprint!("{}", r.stderr);
        if !r.stderr.ends_with('\n') {
            eprintln!();
        }
    }
    let status = proto::ExecStatus::try_from(r.status)
        .map(|s| s.as_str_name())
        .unwrap_or("EXEC_STATUS_UNKNOWN");
    eprintln!("-- {status} (exit {}): {}", r.exit_code, r.message);
    if let Some(u) = &r.usage {
        eprintln!(
            "-- {} ms, peak memory {} bytes, stdout {} bytes",
            u.wall_ms, u.peak_memory_bytes, u.stdout_bytes
        );
    }
    for c in &r.clamped {
        eprintln!("-- clamped {c}");
    }
    for p in &r.outputs {
        eprintln!("-- output {} {} ({} bytes)", p.id, p.path, p.size_bytes);
    }
}

/// The runtimes on offer.
pub fn runtimes(r: &proto::ListRuntimesResponse) {
    for rt in &r.runtimes {
        let l = rt.default_limits.unwrap_or_default();
        println!(
            "{:<11} {}\n            default: {} ms, {} bytes memory, {} bytes stdout\n            {}",
            rt.name,
            rt.language_version,
            l.timeout_ms,
            l.memory_bytes,
            l.max_stdout_bytes,
            rt.description
        );
    }
}

/// An audit event, one line: seq, time, who, what, outcome, on what, detail.
pub fn audit_event_line(e: &proto::AuditEvent) {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    println!(
        "{:>6}  {}  {}  {}  {}  {}  {}  {}",
        e.seq,
        e.time,
        dash(&e.principal),
        e.action,
        e.outcome,
        dash(&e.session_id),
        dash(&e.payload_id),
        e.detail
    );
}

/// The result of an audit chain verification.
pub fn audit_verify(r: &proto::VerifyAuditResponse) {
    if r.ok {
        println!(
            "ok: {} events verified; head seq {} hash {}",
            r.events_checked, r.head_seq, r.head_hash
        );
    } else {
        println!(
            "BROKEN at seq {}: the event there is missing, altered or out of place ({} events verified before it; head seq {})",
            r.first_bad_seq, r.events_checked, r.head_seq
        );
    }
}

#[cfg(test)]
mod escape_tests {
    use super::escape_controls;

    #[test]
    fn control_characters_are_shown_escaped_and_newlines_pass() {
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            escape_controls("\x1b]0;pwned\x07\x1b[2J"),
            "\\x1b]0;pwned\\x07\\x1b[2J"
        );
        assert_eq!(escape_controls("a\u{9b}31mb"), "a\\u{9b}31mb");
        assert_eq!(escape_controls("\x7f"), "\\x7f");
    }
}
