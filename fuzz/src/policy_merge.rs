//! Policy merge: the effective policy is never looser than any level, and
//! combining two levels is the same as tightening by each in turn.

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured, size_hint};
use spillway::config::Config;
use spillway::policy::{self, Policy};
use spillway::policy::{ExecCeiling, PolicyOverrides};

/// One level's overrides, as the fuzzer draws them.
#[derive(Debug)]
pub struct Level {
    retention_ms: Option<u64>,
    session_ttl_ms: Option<u64>,
    max_session_bytes: Option<u64>,
    max_payload_bytes: Option<u64>,
    max_payloads: Option<u64>,
    delete_on_close: Option<bool>,
    allow_download: Option<bool>,
    allow_exec: Option<bool>,
    compliance_can_read: Option<bool>,
    exec_ceiling: Option<(u64, u64, u64, u64)>,
    redact: Vec<u8>,
    locked: bool,
}

/// Field by field, in order: the layout `#[derive(Arbitrary)]` gave the
/// committed corpus (written by hand so that the main package's tests need
/// no `derive` feature).
impl<'a> Arbitrary<'a> for Level {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Self {
            retention_ms: u.arbitrary()?,
            session_ttl_ms: u.arbitrary()?,
            max_session_bytes: u.arbitrary()?,
            max_payload_bytes: u.arbitrary()?,
            max_payloads: u.arbitrary()?,
            delete_on_close: u.arbitrary()?,
            allow_download: u.arbitrary()?,
            allow_exec: u.arbitrary()?,
            compliance_can_read: u.arbitrary()?,
            exec_ceiling: u.arbitrary()?,
            redact: u.arbitrary()?,
            locked: u.arbitrary()?,
        })
    }

    fn size_hint(depth: usize) -> (usize, Option<usize>) {
        let u64s = <Option<u64> as Arbitrary>::size_hint(depth);
        let bools = <Option<bool> as Arbitrary>::size_hint(depth);
        size_hint::and_all(&[
            u64s,
            u64s,
            u64s,
            u64s,
            u64s,
            bools,
            bools,
            bools,
            bools,
            <Option<(u64, u64, u64, u64)> as Arbitrary>::size_hint(depth),
            <Vec<u8> as Arbitrary>::size_hint(depth),
            <bool as Arbitrary>::size_hint(depth),
        ])
    }
}

const RULES: &[&str] = &["secrets", "emails", "pii", "card-numbers", "x"];

impl Level {
    fn overrides(&self) -> PolicyOverrides {
        PolicyOverrides {
            retention_ms: self.retention_ms,
            session_ttl_ms: self.session_ttl_ms,
            max_session_bytes: self.max_session_bytes,
            max_payload_bytes: self.max_payload_bytes,
            max_payloads: self.max_payloads,
            delete_on_close: self.delete_on_close,
            allow_download: self.allow_download,
            allow_exec: self.allow_exec,
            compliance_can_read: self.compliance_can_read,
            exec_ceiling: self.exec_ceiling.map(|(t, m, o, f)| ExecCeiling {
                timeout_ms: t,
                memory_bytes: m,
                max_stdout_bytes: o,
                fuel: f,
            }),
            redact: self
                .redact
                .iter()
                .map(|&r| RULES[r as usize % RULES.len()].to_owned())
                .collect(),
            locked: self.locked,
        }
    }
}

/// True when `q` is at least as strict a quota as `p` (zero = none).
fn quota_ok(q: u64, p: u64) -> bool {
    p == 0 || (q != 0 && q <= p)
}

fn no_looser(e: &Policy, p: &Policy) -> bool {
    e.retention <= p.retention
        && e.session_ttl <= p.session_ttl
        && quota_ok(e.max_session_bytes, p.max_session_bytes)
        && quota_ok(e.max_payload_bytes, p.max_payload_bytes)
        && quota_ok(e.max_payloads, p.max_payloads)
        && (e.delete_on_close || !p.delete_on_close)
        && (!e.allow_download || p.allow_download)
        && (!e.allow_exec || p.allow_exec)
        && (!e.compliance_can_read || p.compliance_can_read)
        && quota_ok(e.exec_ceiling.timeout_ms, p.exec_ceiling.timeout_ms)
        && quota_ok(e.exec_ceiling.memory_bytes, p.exec_ceiling.memory_bytes)
        && quota_ok(
            e.exec_ceiling.max_stdout_bytes,
            p.exec_ceiling.max_stdout_bytes,
        )
        && quota_ok(e.exec_ceiling.fuel, p.exec_ceiling.fuel)
        && p.redact.iter().all(|r| e.redact.contains(r))
}

/// What libFuzzer's bytes decode to (through `arbitrary`).
pub type Input = (Level, Level, Level, u32);

/// The target's checks on one input: a panic is a finding.
pub fn check(input: Input) {
    let (t, s, extra, retention_s) = input;
    let mut config = Config::default();
    config.policy.retention = Duration::from_secs(u64::from(retention_s));
    let server = Policy::server_default(&config.policy);
    let (t, s, extra) = (t.overrides(), s.overrides(), extra.overrides());

    let e = policy::effective(&server, &t, &s);
    assert!(
        no_looser(&e, &server),
        "looser than the server default: {e:?}"
    );
    let only_tenant = policy::effective(&server, &t, &PolicyOverrides::default());
    assert!(
        no_looser(&e, &only_tenant),
        "a session loosened the tenant policy"
    );
    assert_eq!(e.locked, t.locked);

    // combine(a, b) is "as strict as both": the same as tightening by each.
    let combined = policy::combine(&s, &extra);
    let a = server.clone().tightened_by(&combined);
    let b = server.clone().tightened_by(&s).tightened_by(&extra);
    assert_eq!(
        (
            a.retention,
            a.session_ttl,
            a.max_session_bytes,
            a.max_payload_bytes,
            a.max_payloads
        ),
        (
            b.retention,
            b.session_ttl,
            b.max_session_bytes,
            b.max_payload_bytes,
            b.max_payloads
        )
    );
    assert_eq!(
        (
            a.delete_on_close,
            a.allow_download,
            a.allow_exec,
            a.compliance_can_read
        ),
        (
            b.delete_on_close,
            b.allow_download,
            b.allow_exec,
            b.compliance_can_read
        )
    );
    assert_eq!(a.exec_ceiling, b.exec_ceiling);

    // The checks never panic, whatever they are given.
    let _ = policy::validate(&t, true);
    let _ = policy::validate(&s, false);
    let _ = policy::check_overrides(&e, &s);
    let _ = policy::check_locked(&t, &extra);
}
