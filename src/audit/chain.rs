//! The tamper-evident hash chain, exactly as api.md ("Audit") defines it.
//!
//! - An event's **canonical bytes** are its JSON object without `hash`: keys
//!   sorted, compact, UTF-8, only the escapes JSON requires (serde_json's
//!   compact output; Python's `json.dumps(e, sort_keys=True,
//!   separators=(',', ':'), ensure_ascii=False)`). `seq` is a number, every
//!   other field a string, empty ones present as `""`.
//! - `hash = hex(SHA-256(prev_hash + canonical_bytes))`, where `prev_hash` is
//!   the previous event's `hash` as its 64 lowercase hex characters.
//! - The first event has `seq` 1 and `prev_hash` [`GENESIS_HASH`]; `seq`
//!   has no gaps.
//! - An **export line** is the event's JSON with `hash`, keys sorted, compact,
//!   one event per line.
//!
//! Keys come out sorted because [`AuditEvent`] (and its canonical view)
//! declare their fields in sorted order: the crate's serde_json keeps
//! insertion order (`preserve_order`), so nothing would sort them otherwise.
//! A test fails if the declarations are reordered.
//!
//! Times are RFC 3339 UTC with milliseconds ([`event_time`]), like every
//! stored time ([`crate::clock::Millis`]) and deletion receipts.

use std::io::BufRead;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::AuditError;
use crate::clock::Millis;

/// The `prev_hash` of the first event: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One audit event. Fields are declared in sorted key order (see the module
/// docs); keep them so.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditEvent {
    /// What was done: one of [`super::action`].
    pub action: String,
    /// SHA-256 (hex) of the content involved, if any.
    pub content_sha256: String,
    /// What else matters: IDs, sizes, counts, reasons. Never content.
    pub detail: String,
    /// This event's hash (hex).
    pub hash: String,
    /// One of [`super::outcome`].
    pub outcome: String,
    /// The payload involved, if any.
    pub payload_id: String,
    /// The previous event's hash, or [`GENESIS_HASH`].
    pub prev_hash: String,
    /// Who acted.
    pub principal: String,
    /// Position in the chain, from 1, without gaps.
    pub seq: u64,
    /// The session involved, if any.
    pub session_id: String,
    /// The principal's tenant.
    pub tenant: String,
    /// When, RFC 3339 UTC with milliseconds ([`event_time`]).
    pub time: String,
}

/// The event without `hash`, fields in sorted key order.
#[derive(Serialize)]
struct Canonical<'a> {
    action: &'a str,
    content_sha256: &'a str,
    detail: &'a str,
    outcome: &'a str,
    payload_id: &'a str,
    prev_hash: &'a str,
    principal: &'a str,
    seq: u64,
    session_id: &'a str,
    tenant: &'a str,
    time: &'a str,
}

impl AuditEvent {
    /// The canonical bytes: the JSON object without `hash`.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let c = Canonical {
            action: &self.action,
            content_sha256: &self.content_sha256,
            detail: &self.detail,
            outcome: &self.outcome,
            payload_id: &self.payload_id,
            prev_hash: &self.prev_hash,
            principal: &self.principal,
            seq: self.seq,
            session_id: &self.session_id,
            tenant: &self.tenant,
            time: &self.time,
        };
        serde_json::to_vec(&c).expect("strings and a number serialize")
    }

    /// The hash this event should carry, from its `prev_hash` and its other
    /// fields.
    pub fn expected_hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.prev_hash.as_bytes());
        h.update(self.canonical_bytes());
        hex::encode(h.finalize())
    }

    /// The export line: the event's JSON with `hash`, keys sorted, compact,
    /// without a line break.
    pub fn to_export_line(&self) -> String {
        serde_json::to_string(self).expect("strings and a number serialize")
    }

    /// Parses an export line. Unknown and missing fields are errors.
    pub fn from_export_line(line: &[u8]) -> Result<AuditEvent, AuditError> {
        serde_json::from_slice(line).map_err(|e| AuditError::Malformed {
            message: e.to_string(),
        })
    }
}

/// An event's time: RFC 3339 UTC with milliseconds, e.g.
/// `2026-11-30T09:31:46.334Z` (always three fractional digits). Times before
/// the epoch are clamped to it.
pub fn event_time(ms: Millis) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// Links `event` after `prev_hash`: sets its `prev_hash` and its `hash`.
/// `seq` is left as given.
pub fn seal(prev_hash: &str, mut event: AuditEvent) -> AuditEvent {
    event.prev_hash = prev_hash.to_owned();
    event.hash = event.expected_hash();
    event
}

/// Appends events to a chain: numbers, links and hashes them. One builder
/// per chain, used by one writer at a time, and resumed from the stored
/// head after a restart.
#[derive(Debug, Clone)]
pub struct ChainBuilder {
    next_seq: u64,
    last_hash: String,
}

impl Default for ChainBuilder {
    fn default() -> Self {
        ChainBuilder::new()
    }
}

impl ChainBuilder {
    /// A builder for an empty chain.
    pub fn new() -> Self {
        ChainBuilder {
            next_seq: 1,
            last_hash: GENESIS_HASH.to_owned(),
        }
    }

    /// A builder that continues after the event `last_seq` with hash
    /// `last_hash`.
    pub fn resume(last_seq: u64, last_hash: impl Into<String>) -> Self {
        ChainBuilder {
            next_seq: last_seq + 1,
            last_hash: last_hash.into(),
        }
    }

    /// The `seq` the next event gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The hash of the last event, or [`GENESIS_HASH`].
    pub fn last_hash(&self) -> &str {
        &self.last_hash
    }

    /// Sets `event`'s `seq`, `prev_hash` and `hash` (replacing whatever they
    /// held) and advances the chain.
    pub fn append(&mut self, mut event: AuditEvent) -> AuditEvent {
        event.seq = self.next_seq;
        let event = seal(&self.last_hash, event);
        self.next_seq += 1;
        self.last_hash.clone_from(&event.hash);
        event
    }
}

/// The result of a verification (VerifyAuditResponse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerifyOutcome {
    /// Whether every event checked out.
    pub ok: bool,
    /// Events that verified, before the first bad one.
    pub events_checked: u64,
    /// When not ok: the `seq` expected where the chain broke, so the first
    /// event that is missing, altered or out of place. 0 when ok.
    pub first_bad_seq: u64,
}

/// Streaming verification, one event at a time, in constant memory. An event
/// is good when its `seq` is the next one, its `prev_hash` is the previous
/// event's `hash`, and its `hash` is [`AuditEvent::expected_hash`]. This
/// catches altered fields or hashes, deleted, duplicated or reordered events
/// and broken links. Events cut off the end of the chain leave a shorter,
/// valid chain: compare [`Verifier::head`] with the stored head to catch
/// that.
#[derive(Debug, Clone)]
pub struct Verifier {
    next_seq: u64,
    prev_hash: String,
    checked: u64,
    bad: bool,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier::new()
    }
}

impl Verifier {
    /// Verifies a chain from its first event.
    pub fn new() -> Self {
        Verifier::resume(0, GENESIS_HASH)
    }

    /// Verifies the events that follow a trusted event `last_seq` with hash
    /// `last_hash` (`0` and [`GENESIS_HASH`] for a whole chain).
    pub fn resume(last_seq: u64, last_hash: &str) -> Self {
        Verifier {
            next_seq: last_seq + 1,
            prev_hash: last_hash.to_owned(),
            checked: 0,
            bad: false,
        }
    }

    /// Checks the next event. Once one fails, every later call returns
    /// false and changes nothing.
    pub fn check(&mut self, event: &AuditEvent) -> bool {
        if self.bad {
            return false;
        }
        let good = event.seq == self.next_seq
            && event.prev_hash == self.prev_hash
            && event.hash == event.expected_hash();
        if !good {
            self.bad = true;
            return false;
        }
        self.next_seq += 1;
        self.prev_hash.clone_from(&event.hash);
        self.checked += 1;
        true
    }

    /// Records that the next event could not even be read.
    pub fn fail(&mut self) {
        self.bad = true;
    }

    /// The last good event's `seq` and `hash` (or where verification
    /// resumed).
    pub fn head(&self) -> (u64, &str) {
        (self.next_seq - 1, &self.prev_hash)
    }

    /// The outcome so far.
    pub fn outcome(&self) -> VerifyOutcome {
        VerifyOutcome {
            ok: !self.bad,
            events_checked: self.checked,
            first_bad_seq: if self.bad { self.next_seq } else { 0 },
        }
    }
}

/// Verifies a whole chain, stopping at the first bad event (later events
/// are not consumed).
pub fn verify<I: IntoIterator<Item = AuditEvent>>(events: I) -> VerifyOutcome {
    let mut v = Verifier::new();
    for event in events {
        if !v.check(&event) {
            break;
        }
    }
    v.outcome()
}

/// Verifies an export (one event per line; blank lines are skipped), as
/// `scripts/verify_audit.py` does. A line that is not an event is bad at the
/// `seq` expected there. Holds one line at a time.
pub fn verify_export(mut export: impl BufRead) -> Result<VerifyOutcome, AuditError> {
    let mut v = Verifier::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if export.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let good = match AuditEvent::from_export_line(&line) {
            Ok(event) => v.check(&event),
            Err(_) => {
                v.fail();
                false
            }
        };
        if !good {
            break;
        }
    }
    Ok(v.outcome())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::process::Command;

    use super::*;
    use crate::audit::{action, outcome};

    /// A string with every kind of character the canonical form must get
    /// right: quotes, backslashes, control characters, non-ASCII, an emoji,
    /// U+2028 and DEL.
    const TRICKY: &str = "q\"b\\s\u{1}n\nt\té😀\u{2028}\u{7f}";

    fn event(n: u64) -> AuditEvent {
        AuditEvent {
            time: event_time(1_796_031_106_334 + n as i64),
            principal: format!("agent-{}", n % 3),
            tenant: "acme".into(),
            action: action::ALL[n as usize % action::ALL.len()].into(),
            session_id: format!("ses_{n:032x}"),
            payload_id: if n.is_multiple_of(2) {
                String::new()
            } else {
                format!("pl_{n:032x}")
            },
            outcome: outcome::ALL[n as usize % 3].into(),
            detail: format!("event {n}: {TRICKY} \u{0}\u{1f} \"{n}\""),
            content_sha256: if n.is_multiple_of(4) {
                String::new()
            } else {
                "ab".repeat(32)
            },
            ..AuditEvent::default()
        }
    }

    fn chain(n: u64) -> Vec<AuditEvent> {
        let mut b = ChainBuilder::new();
        (1..=n).map(|i| b.append(event(i))).collect()
    }

    fn keys(json: &[u8]) -> Vec<String> {
        // serde_json keeps document order here (preserve_order).
        let v: serde_json::Value = serde_json::from_slice(json).unwrap();
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn canonical_bytes_and_hash_match_the_contract_for_a_fixed_event() {
        // Expected values from Python: json.dumps(e, sort_keys=True,
        // separators=(',', ':'), ensure_ascii=False) and hashlib.sha256.
        let e = seal(
            GENESIS_HASH,
            AuditEvent {
                seq: 1,
                time: "2026-11-30T09:31:46.334Z".into(),
                principal: "alice".into(),
                tenant: "acme".into(),
                action: "payload.read".into(),
                session_id: "ses_1".into(),
                payload_id: "pl_2".into(),
                outcome: "ok".into(),
                detail: TRICKY.into(),
                ..AuditEvent::default()
            },
        );
        assert_eq!(
            String::from_utf8(e.canonical_bytes()).unwrap(),
            "{\"action\":\"payload.read\",\"content_sha256\":\"\",\"detail\":\"q\\\"b\\\\s\\u0001n\\nt\\té😀\u{2028}\u{7f}\",\"outcome\":\"ok\",\"payload_id\":\"pl_2\",\"prev_hash\":\"0000000000000000000000000000000000000000000000000000000000000000\",\"principal\":\"alice\",\"seq\":1,\"session_id\":\"ses_1\",\"tenant\":\"acme\",\"time\":\"2026-11-30T09:31:46.334Z\"}"
        );
        assert_eq!(
            e.hash,
            "257afaa4620f6d6df4be632bf30a88bf7c44d7b2e2b69a7bb32a1fab75709a7b"
        );
    }

    #[test]
    fn canonical_and_export_keys_come_out_sorted() {
        let e = chain(1).remove(0);
        let canonical = keys(&e.canonical_bytes());
        let mut sorted = canonical.clone();
        sorted.sort();
        assert_eq!(canonical, sorted);
        assert!(!canonical.contains(&"hash".to_owned()));
        assert_eq!(canonical.len(), 11);
        let export = keys(e.to_export_line().as_bytes());
        let mut sorted = export.clone();
        sorted.sort();
        assert_eq!(export, sorted);
        assert_eq!(export.len(), 12);
    }

    #[test]
    fn the_export_line_is_the_canonical_form_plus_the_hash() {
        let e = chain(1).remove(0);
        let mut with_hash: serde_json::Value =
            serde_json::from_slice(&e.canonical_bytes()).unwrap();
        with_hash["hash"] = e.hash.clone().into();
        // Re-sorting through a BTreeMap gives the same line.
        let sorted: std::collections::BTreeMap<String, serde_json::Value> =
            serde_json::from_value(with_hash).unwrap();
        assert_eq!(serde_json::to_string(&sorted).unwrap(), e.to_export_line());
        assert!(!e.to_export_line().contains('\n'));
    }

    #[test]
    fn events_link_from_64_zeros_and_number_from_one() {
        let c = chain(3);
        assert_eq!(GENESIS_HASH.len(), 64);
        assert!(GENESIS_HASH.bytes().all(|b| b == b'0'));
        assert_eq!(c[0].prev_hash, GENESIS_HASH);
        assert_eq!(c.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(c[1].prev_hash, c[0].hash);
        assert_eq!(c[2].prev_hash, c[1].hash);
        let mut resumed = ChainBuilder::resume(2, c[1].hash.clone());
        assert_eq!(resumed.append(event(3)), c[2]);
    }

    #[test]
    fn an_intact_chain_verifies() {
        assert_eq!(
            verify(chain(20)),
            VerifyOutcome {
                ok: true,
                events_checked: 20,
                first_bad_seq: 0
            }
        );
        assert!(verify(Vec::new()).ok);
    }

    #[test]
    fn verify_names_the_first_bad_seq_for_each_kind_of_tampering() {
        let bad_at = |seq: u64| VerifyOutcome {
            ok: false,
            events_checked: seq - 1,
            first_bad_seq: seq,
        };
        let tamper = |f: &dyn Fn(&mut Vec<AuditEvent>)| {
            let mut c = chain(10);
            f(&mut c);
            verify(c)
        };
        assert_eq!(tamper(&|c| c[4].detail.push('!')), bad_at(5), "field");
        assert_eq!(tamper(&|c| c[4].time = event_time(0)), bad_at(5), "time");
        assert_eq!(tamper(&|c| c[6].hash = "ab".repeat(32)), bad_at(7), "hash");
        assert_eq!(tamper(&|c| drop(c.remove(3))), bad_at(4), "deleted");
        assert_eq!(tamper(&|c| c.swap(2, 3)), bad_at(3), "reordered");
        assert_eq!(
            tamper(&|c| c.insert(5, c[4].clone())),
            bad_at(6),
            "duplicated"
        );
        assert_eq!(tamper(&|c| c[0].seq = 0), bad_at(1), "seq");
        // A resealed event with a wrong link: its own hash is right.
        assert_eq!(
            tamper(&|c| c[5] = seal(&"cd".repeat(32), c[5].clone())),
            bad_at(6),
            "link"
        );
        // A gap left by a writer that skipped a seq, every link and hash right.
        assert_eq!(
            tamper(&|c| {
                let mut skip = ChainBuilder::resume(c[1].seq + 1, c[1].hash.clone());
                c[2] = skip.append(c[2].clone());
                c.truncate(3);
            }),
            bad_at(3),
            "gap"
        );
        // Rewriting one event and resealing it breaks the next link.
        assert_eq!(
            tamper(&|c| {
                c[5].detail = "rewritten".into();
                c[5] = seal(&c[4].hash, c[5].clone());
            }),
            bad_at(7),
            "resealed"
        );
    }

    #[test]
    fn verify_stops_consuming_at_the_first_bad_event() {
        let mut c = chain(10);
        c[2].outcome = outcome::DENIED.into();
        let mut consumed = 0;
        let out = verify(c.into_iter().inspect(|_| consumed += 1));
        assert_eq!((out.first_bad_seq, consumed), (3, 3));
    }

    #[test]
    fn a_resumed_verifier_checks_a_segment_after_a_trusted_head() {
        let c = chain(10);
        let mut v = Verifier::resume(6, &c[5].hash);
        assert!(c[6..].iter().all(|e| v.check(e)));
        assert_eq!(v.head(), (10, c[9].hash.as_str()));
        assert_eq!(v.outcome().events_checked, 4);
        let mut wrong = Verifier::resume(5, &c[5].hash);
        assert!(!wrong.check(&c[6]));
        assert_eq!(wrong.outcome().first_bad_seq, 6);
    }

    #[test]
    fn export_lines_round_trip_and_refuse_unknown_or_missing_fields() {
        let e = chain(1).remove(0);
        let line = e.to_export_line();
        assert_eq!(AuditEvent::from_export_line(line.as_bytes()).unwrap(), e);
        let extra = line.replacen('{', "{\"extra\":\"\",", 1);
        assert!(AuditEvent::from_export_line(extra.as_bytes()).is_err());
        let missing = line.replacen("\"tenant\":\"acme\",", "", 1);
        assert_ne!(missing, line);
        assert!(AuditEvent::from_export_line(missing.as_bytes()).is_err());
    }

    #[test]
    fn verify_export_skips_blank_lines_and_reports_unreadable_ones_as_bad() {
        let lines: Vec<String> = chain(5).iter().map(AuditEvent::to_export_line).collect();
        let good = format!("{}\n\n", lines.join("\n"));
        assert_eq!(verify_export(good.as_bytes()).unwrap().events_checked, 5);
        let broken = good.replacen(&lines[3], "{not json", 1);
        let out = verify_export(broken.as_bytes()).unwrap();
        assert_eq!(
            (out.ok, out.first_bad_seq, out.events_checked),
            (false, 4, 3)
        );
    }

    #[test]
    fn event_times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(event_time(1_796_031_106_334), "2026-11-30T09:31:46.334Z");
        assert_eq!(event_time(1_796_031_106_000), "2026-11-30T09:31:46.000Z");
        assert_eq!(event_time(-5), "1970-01-01T00:00:00.000Z");
    }

    /// Runs `scripts/verify_audit.py` on an export, from a file and from
    /// stdin; returns its output and exit code (the same both ways).
    fn python_verify(export: &[u8]) -> (String, Option<i32>) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/verify_audit.py");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, export).unwrap();
        let from_file = Command::new("python3")
            .arg(script)
            .arg(&path)
            .output()
            .expect("python3 runs");
        let from_stdin = Command::new("python3")
            .arg(script)
            .stdin(std::fs::File::open(&path).unwrap())
            .output()
            .expect("python3 runs");
        assert!(
            from_file.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&from_file.stderr)
        );
        assert_eq!(from_file.stdout, from_stdin.stdout);
        assert_eq!(from_file.status.code(), from_stdin.status.code());
        (
            String::from_utf8(from_file.stdout).unwrap(),
            from_file.status.code(),
        )
    }

    fn export(events: &[AuditEvent]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            writeln!(out, "{}", e.to_export_line()).unwrap();
        }
        out
    }

    #[test]
    fn the_python_verifier_accepts_an_export_and_names_a_tampered_seq() {
        let events = chain(50);
        let mut bytes = export(&events);
        assert_eq!(python_verify(&bytes), ("ok 50\n".into(), Some(0)));
        assert_eq!(verify_export(&bytes[..]).unwrap().events_checked, 50);

        // One byte of event 23's detail: "event 23:" becomes "event 24:".
        let at = bytes.windows(9).position(|w| w == b"event 23:").unwrap();
        bytes[at + 7] = b'4';
        assert_eq!(python_verify(&bytes), ("bad at seq 23\n".into(), Some(1)));
        assert_eq!(verify_export(&bytes[..]).unwrap().first_bad_seq, 23);
    }

    #[test]
    fn the_python_verifier_catches_deleted_events_and_forged_links() {
        let mut deleted = chain(50);
        deleted.remove(9);
        assert_eq!(
            python_verify(&export(&deleted)),
            ("bad at seq 10\n".into(), Some(1))
        );
        // Event 30 names a wrong prev_hash, yet its hash is over the true one.
        let mut forged = chain(50);
        let e = &mut forged[29];
        e.prev_hash = "cd".repeat(32);
        let mut h = Sha256::new();
        h.update(forged[28].hash.as_bytes());
        h.update(forged[29].canonical_bytes());
        forged[29].hash = hex::encode(h.finalize());
        assert_eq!(verify(forged.clone()).first_bad_seq, 30);
        assert_eq!(
            python_verify(&export(&forged)),
            ("bad at seq 30\n".into(), Some(1))
        );
    }
}
