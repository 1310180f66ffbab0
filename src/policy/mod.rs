//! Policies: the server default, a tenant's policy and a session's overrides,
//! merged into the session's effective policy, and the checks that keep
//! overrides and locked policies tighten-only.
//!
//! The effective policy is the strictest of the three levels, field by
//! field: the shorter retention and TTL, the smaller nonzero quota (zero is
//! "no quota at this level"), `allow_*` and `compliance_can_read` ANDed,
//! `delete_on_close` ORed (deleting is the stricter), the lower exec ceiling
//! field by field, and the union of the redaction rules. `locked` comes from
//! the tenant. It is computed at request time from the current tenant
//! policy, so tightening a tenant policy applies to existing sessions at
//! once.
//!
//! Everything here is pure: the API layer loads the levels and converts them
//! from and to messages.

use std::time::Duration;

use crate::redact::{self, Redactor};

mod levels;

pub use levels::{ExecCeiling, PolicyDefaults, PolicyOverrides};

/// The longest retention or TTL a policy may name (100 years).
const MAX_DURATION_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A field with a value no policy may have.
    #[error("{field}: {message}")]
    Invalid {
        /// The field, e.g. `policy.retention`.
        field: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// A field looser than the policy it may only tighten.
    #[error("{field}: {asked} would loosen the {what} ({current}); {rule}")]
    Loosens {
        /// The field, e.g. `policy.retention`.
        field: &'static str,
        /// The value asked for.
        asked: String,
        /// The value in force.
        current: String,
        /// "locked tenant policy" or "tenant's effective policy".
        what: &'static str,
        /// What may be done instead.
        rule: &'static str,
    },
}

/// A complete policy: the server default, or a session's effective policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Maximum payload age.
    pub retention: Duration,
    /// Maximum session age.
    pub session_ttl: Duration,
    /// Byte quota of a session; 0 = none.
    pub max_session_bytes: u64,
    /// Largest payload; 0 = none beyond the server's limits.
    pub max_payload_bytes: u64,
    /// Payload count quota; 0 = none.
    pub max_payloads: u64,
    /// Delete a session's payloads when it is closed.
    pub delete_on_close: bool,
    /// Whether raw bytes may be downloaded (and read beyond a preview).
    pub allow_download: bool,
    /// Whether scripts may run.
    pub allow_exec: bool,
    /// Whether compliance principals may read content.
    pub compliance_can_read: bool,
    /// The most any exec may ask for.
    pub exec_ceiling: ExecCeiling,
    /// Redaction rules.
    pub redact: Vec<String>,
    /// Whether the tenant policy is locked.
    pub locked: bool,
}

impl Policy {
    /// The server default, from the `[policy]` section.
    pub fn server_default(d: &PolicyDefaults) -> Policy {
        Policy {
            retention: d.retention,
            session_ttl: d.session_ttl,
            max_session_bytes: d.max_session_bytes,
            max_payload_bytes: d.max_payload_bytes,
            max_payloads: d.max_payloads,
            delete_on_close: d.delete_on_close,
            allow_download: d.allow_download,
            allow_exec: d.allow_exec,
            compliance_can_read: d.compliance_can_read,
            exec_ceiling: d.exec_ceiling,
            redact: d.redact.clone(),
            locked: false,
        }
    }

    /// This policy made stricter by one level.
    pub fn tightened_by(mut self, level: &PolicyOverrides) -> Policy {
        if let Some(ms) = level.retention_ms {
            self.retention = self.retention.min(Duration::from_millis(ms));
        }
        if let Some(ms) = level.session_ttl_ms {
            self.session_ttl = self.session_ttl.min(Duration::from_millis(ms));
        }
        self.max_session_bytes = min_quota(self.max_session_bytes, level.max_session_bytes);
        self.max_payload_bytes = min_quota(self.max_payload_bytes, level.max_payload_bytes);
        self.max_payloads = min_quota(self.max_payloads, level.max_payloads);
        self.delete_on_close |= level.delete_on_close.unwrap_or(false);
        self.allow_download &= level.allow_download.unwrap_or(true);
        self.allow_exec &= level.allow_exec.unwrap_or(true);
        self.compliance_can_read &= level.compliance_can_read.unwrap_or(true);
        if let Some(c) = level.exec_ceiling {
            self.exec_ceiling = self.exec_ceiling.stricter(c);
        }
        self.redact = redact::union(&self.redact, &level.redact);
        self
    }
}

/// The effective policy of a session: the strictest of the server default,
/// the tenant's policy and the session's overrides; `locked` is the tenant's.
pub fn effective(server: &Policy, tenant: &PolicyOverrides, session: &PolicyOverrides) -> Policy {
    let mut p = server.clone().tightened_by(tenant).tightened_by(session);
    p.locked = tenant.locked;
    p
}

/// Two levels combined into one that is as strict as both: how a sub-agent
/// session's overrides add to the parent's it inherits.
pub fn combine(a: &PolicyOverrides, b: &PolicyOverrides) -> PolicyOverrides {
    fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    fn quota(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        let q = min_quota(a.unwrap_or(0), b);
        (q != 0).then_some(q)
    }
    fn and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a && b),
            (a, b) => a.or(b),
        }
    }
    PolicyOverrides {
        retention_ms: min(a.retention_ms, b.retention_ms),
        session_ttl_ms: min(a.session_ttl_ms, b.session_ttl_ms),
        max_session_bytes: quota(a.max_session_bytes, b.max_session_bytes),
        max_payload_bytes: quota(a.max_payload_bytes, b.max_payload_bytes),
        max_payloads: quota(a.max_payloads, b.max_payloads),
        delete_on_close: match (a.delete_on_close, b.delete_on_close) {
            (Some(a), Some(b)) => Some(a || b),
            (a, b) => a.or(b),
        },
        allow_download: and(a.allow_download, b.allow_download),
        allow_exec: and(a.allow_exec, b.allow_exec),
        compliance_can_read: and(a.compliance_can_read, b.compliance_can_read),
        exec_ceiling: match (a.exec_ceiling, b.exec_ceiling) {
            (Some(a), Some(b)) => Some(a.stricter(b)),
            (a, b) => a.or(b),
        },
        redact: redact::union(&a.redact, &b.redact),
        locked: a.locked || b.locked,
    }
}

/// The smaller of two quotas, where zero (or absent) means "none".
fn min_quota(a: u64, b: Option<u64>) -> u64 {
    match (a, b.unwrap_or(0)) {
        (a, 0) => a,
        (0, b) => b,
        (a, b) => a.min(b),
    }
}

/// Checks the values of one level on their own: positive durations within
/// bounds, redaction rules that compile, no `locked` on a session.
pub fn validate(level: &PolicyOverrides, is_tenant: bool) -> Result<(), PolicyError> {
    for (field, value) in [
        ("policy.retention", level.retention_ms),
        ("policy.session_ttl", level.session_ttl_ms),
    ] {
        match value {
            Some(0) => {
                return Err(PolicyError::Invalid {
                    field,
                    message:
                        "must be longer than zero; leave it unset to defer to the other levels"
                            .into(),
                });
            }
            Some(ms) if ms > MAX_DURATION_MS => {
                return Err(PolicyError::Invalid {
                    field,
                    message: format!(
                        "{} is longer than the most a policy may name ({})",
                        fmt_ms(ms),
                        fmt_ms(MAX_DURATION_MS)
                    ),
                });
            }
            _ => {}
        }
    }
    if let Err(e) = Redactor::compile(&level.redact) {
        return Err(PolicyError::Invalid {
            field: "policy.redact",
            message: e.to_string(),
        });
    }
    if level.locked && !is_tenant {
        return Err(PolicyError::Invalid {
            field: "policy.locked",
            message: "only a tenant policy can be locked (SetPolicy); leave it false on a session"
                .into(),
        });
    }
    Ok(())
}

/// Checks that a merged policy's redaction rules can be applied together:
/// each level's rules compile on their own ([`validate`]), but their union
/// may still hold too many.
pub fn validate_effective(p: &Policy) -> Result<(), PolicyError> {
    match Redactor::compile(&p.redact) {
        Ok(_) => Ok(()),
        Err(e) => Err(PolicyError::Invalid {
            field: "policy.redact",
            message: format!("with the rules of the other levels added: {e}"),
        }),
    }
}

/// Refuses session overrides that would loosen `effective` (the tenant's
/// effective policy before the overrides), naming the first such field.
/// Absent overrides defer, so they never loosen.
pub fn check_overrides(effective: &Policy, o: &PolicyOverrides) -> Result<(), PolicyError> {
    let fields = Fields {
        what: "tenant's effective policy",
        rule: "session overrides can only tighten it",
    };
    fields.duration(
        "policy.retention",
        Some(effective.retention),
        o.retention_ms,
        false,
    )?;
    fields.duration(
        "policy.session_ttl",
        Some(effective.session_ttl),
        o.session_ttl_ms,
        false,
    )?;
    fields.quota(
        "policy.max_session_bytes",
        effective.max_session_bytes,
        o.max_session_bytes,
        false,
    )?;
    fields.quota(
        "policy.max_payload_bytes",
        effective.max_payload_bytes,
        o.max_payload_bytes,
        false,
    )?;
    fields.quota(
        "policy.max_payloads",
        effective.max_payloads,
        o.max_payloads,
        false,
    )?;
    fields.flag(
        "policy.delete_on_close",
        Some(effective.delete_on_close),
        o.delete_on_close,
        true,
        false,
    )?;
    fields.flag(
        "policy.allow_download",
        Some(effective.allow_download),
        o.allow_download,
        false,
        false,
    )?;
    fields.flag(
        "policy.allow_exec",
        Some(effective.allow_exec),
        o.allow_exec,
        false,
        false,
    )?;
    fields.flag(
        "policy.compliance_can_read",
        Some(effective.compliance_can_read),
        o.compliance_can_read,
        false,
        false,
    )?;
    fields.ceiling(Some(effective.exec_ceiling), o.exec_ceiling, false)?;
    Ok(())
}

/// Refuses a new tenant policy that would loosen a locked one, naming the
/// first looser field. Here an absent value is looser than a present one:
/// it would hand the decision back to the server default.
pub fn check_locked(old: &PolicyOverrides, new: &PolicyOverrides) -> Result<(), PolicyError> {
    if !old.locked {
        return Ok(());
    }
    let fields = Fields {
        what: "locked tenant policy",
        rule: "a locked policy can only be tightened",
    };
    let ms = |v: Option<u64>| v.map(Duration::from_millis);
    fields.duration(
        "policy.retention",
        ms(old.retention_ms),
        new.retention_ms,
        true,
    )?;
    fields.duration(
        "policy.session_ttl",
        ms(old.session_ttl_ms),
        new.session_ttl_ms,
        true,
    )?;
    let q = |v: Option<u64>| v.unwrap_or(0);
    fields.quota(
        "policy.max_session_bytes",
        q(old.max_session_bytes),
        new.max_session_bytes,
        true,
    )?;
    fields.quota(
        "policy.max_payload_bytes",
        q(old.max_payload_bytes),
        new.max_payload_bytes,
        true,
    )?;
    fields.quota(
        "policy.max_payloads",
        q(old.max_payloads),
        new.max_payloads,
        true,
    )?;
    fields.flag(
        "policy.delete_on_close",
        old.delete_on_close,
        new.delete_on_close,
        true,
        true,
    )?;
    fields.flag(
        "policy.allow_download",
        old.allow_download,
        new.allow_download,
        false,
        true,
    )?;
    fields.flag(
        "policy.allow_exec",
        old.allow_exec,
        new.allow_exec,
        false,
        true,
    )?;
    fields.flag(
        "policy.compliance_can_read",
        old.compliance_can_read,
        new.compliance_can_read,
        false,
        true,
    )?;
    fields.ceiling(old.exec_ceiling, new.exec_ceiling, true)?;
    if let Some(dropped) = old.redact.iter().find(|r| !new.redact.contains(r)) {
        return Err(fields.loosens(
            "policy.redact",
            format!("dropping rule {dropped:?}"),
            format!("{} rules", old.redact.len()),
        ));
    }
    if !new.locked {
        return Err(fields.loosens("policy.locked", "false".into(), "true".into()));
    }
    Ok(())
}

/// Field comparisons for one kind of check.
struct Fields {
    what: &'static str,
    rule: &'static str,
}

impl Fields {
    fn loosens(&self, field: &'static str, asked: String, current: String) -> PolicyError {
        PolicyError::Loosens {
            field,
            asked,
            current,
            what: self.what,
            rule: self.rule,
        }
    }

    /// A maximum age: longer is looser.
    fn duration(
        &self,
        field: &'static str,
        current: Option<Duration>,
        asked: Option<u64>,
        absent_loosens: bool,
    ) -> Result<(), PolicyError> {
        let Some(current) = current else {
            return Ok(());
        };
        match asked {
            Some(ms) if Duration::from_millis(ms) > current => {
                Err(self.loosens(field, fmt_ms(ms), fmt_duration(current)))
            }
            None if absent_loosens => {
                Err(self.loosens(field, "unset".into(), fmt_duration(current)))
            }
            _ => Ok(()),
        }
    }

    /// A quota where zero is "none": larger, or none, is looser.
    fn quota(
        &self,
        field: &'static str,
        current: u64,
        asked: Option<u64>,
        absent_loosens: bool,
    ) -> Result<(), PolicyError> {
        if current == 0 {
            return Ok(());
        }
        match asked.unwrap_or(0) {
            0 if absent_loosens => Err(self.loosens(field, "no quota".into(), current.to_string())),
            0 => Ok(()),
            n if n > current => Err(self.loosens(field, n.to_string(), current.to_string())),
            _ => Ok(()),
        }
    }

    /// A flag whose strict value is `strict`.
    fn flag(
        &self,
        field: &'static str,
        current: Option<bool>,
        asked: Option<bool>,
        strict: bool,
        absent_loosens: bool,
    ) -> Result<(), PolicyError> {
        if current != Some(strict) {
            return Ok(());
        }
        match asked {
            Some(v) if v != strict => Err(self.loosens(field, v.to_string(), strict.to_string())),
            None if absent_loosens => Err(self.loosens(field, "unset".into(), strict.to_string())),
            _ => Ok(()),
        }
    }

    /// The exec ceiling, field by field; zero is "no ceiling".
    fn ceiling(
        &self,
        current: Option<ExecCeiling>,
        asked: Option<ExecCeiling>,
        absent_loosens: bool,
    ) -> Result<(), PolicyError> {
        let Some(c) = current else {
            return Ok(());
        };
        let a = asked.map(|a| {
            [
                Some(a.timeout_ms),
                Some(a.memory_bytes),
                Some(a.max_stdout_bytes),
                Some(a.fuel),
            ]
        });
        let a = a.unwrap_or([None; 4]);
        self.quota(
            "policy.exec_ceiling.timeout_ms",
            c.timeout_ms,
            a[0],
            absent_loosens,
        )?;
        self.quota(
            "policy.exec_ceiling.memory_bytes",
            c.memory_bytes,
            a[1],
            absent_loosens,
        )?;
        self.quota(
            "policy.exec_ceiling.max_stdout_bytes",
            c.max_stdout_bytes,
            a[2],
            absent_loosens,
        )?;
        self.quota("policy.exec_ceiling.fuel", c.fuel, a[3], absent_loosens)
    }
}

/// A duration in milliseconds as humans write it (`7days`, `1h 30m`).
pub fn fmt_ms(ms: u64) -> String {
    fmt_duration(Duration::from_millis(ms))
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 3600 * 1000;

    fn server() -> Policy {
        Policy::server_default(&PolicyDefaults::default())
    }

    #[test]
    fn server_default_matches_the_contract() {
        let p = server();
        assert_eq!(p.retention, Duration::from_millis(7 * DAY));
        assert_eq!(p.session_ttl, Duration::from_millis(7 * DAY));
        assert_eq!(
            (p.max_session_bytes, p.max_payload_bytes, p.max_payloads),
            (0, 0, 0)
        );
        assert!(!p.delete_on_close && p.allow_download && p.allow_exec && !p.compliance_can_read);
        assert_eq!(p.exec_ceiling, ExecCeiling::CEILING);
        assert!(p.redact.is_empty() && !p.locked);
    }

    #[test]
    fn effective_takes_the_strictest_of_the_three_levels_field_by_field() {
        let tenant = PolicyOverrides {
            retention_ms: Some(3 * DAY),
            session_ttl_ms: Some(30 * DAY),
            max_session_bytes: Some(1000),
            max_payloads: Some(10),
            allow_download: Some(false),
            exec_ceiling: Some(ExecCeiling {
                timeout_ms: 1000,
                memory_bytes: 0,
                max_stdout_bytes: 0,
                fuel: 0,
            }),
            redact: vec!["builtin:email".into()],
            locked: true,
            ..Default::default()
        };
        let session = PolicyOverrides {
            retention_ms: Some(5 * DAY),
            session_ttl_ms: Some(DAY),
            max_session_bytes: Some(500),
            max_payload_bytes: Some(100),
            max_payloads: Some(0),
            allow_download: Some(true),
            allow_exec: Some(false),
            delete_on_close: Some(true),
            exec_ceiling: Some(ExecCeiling {
                timeout_ms: 5000,
                memory_bytes: 1 << 20,
                max_stdout_bytes: 0,
                fuel: 0,
            }),
            redact: vec!["builtin:email".into(), "secret-[0-9]+".into()],
            ..Default::default()
        };
        let e = effective(&server(), &tenant, &session);
        assert_eq!(
            e.retention,
            Duration::from_millis(3 * DAY),
            "tenant's is shortest"
        );
        assert_eq!(
            e.session_ttl,
            Duration::from_millis(DAY),
            "session's is shortest"
        );
        assert_eq!(e.max_session_bytes, 500);
        assert_eq!(e.max_payload_bytes, 100, "0 elsewhere means no quota");
        assert_eq!(
            e.max_payloads, 10,
            "a session's 0 does not lift the tenant's quota"
        );
        assert!(!e.allow_download, "ANDed: the session's true does not win");
        assert!(!e.allow_exec);
        assert!(e.delete_on_close, "ORed");
        assert!(!e.compliance_can_read);
        assert_eq!(e.exec_ceiling.timeout_ms, 1000);
        assert_eq!(e.exec_ceiling.memory_bytes, 1 << 20);
        assert_eq!(
            e.exec_ceiling.max_stdout_bytes,
            ExecCeiling::CEILING.max_stdout_bytes
        );
        assert_eq!(
            e.redact,
            vec!["builtin:email".to_owned(), "secret-[0-9]+".to_owned()]
        );
        assert!(e.locked);
    }

    #[test]
    fn a_combined_level_is_as_strict_as_both() {
        let parent = PolicyOverrides {
            retention_ms: Some(DAY),
            allow_download: Some(false),
            max_payloads: Some(10),
            ..Default::default()
        };
        let child = PolicyOverrides {
            retention_ms: Some(2 * DAY),
            allow_download: Some(true),
            max_payloads: Some(5),
            allow_exec: Some(false),
            ..Default::default()
        };
        let both = combine(&parent, &child);
        let s = server();
        assert_eq!(
            effective(&s, &PolicyOverrides::default(), &both),
            effective(&s, &parent, &child)
        );
        assert_eq!(both.retention_ms, Some(DAY));
        assert_eq!(both.allow_download, Some(false));
        assert_eq!(both.max_payloads, Some(5));
        assert_eq!(both.allow_exec, Some(false));
    }

    #[test]
    fn compliance_can_read_needs_every_level_to_grant_it() {
        let mut s = server();
        let grant = PolicyOverrides {
            compliance_can_read: Some(true),
            ..Default::default()
        };
        assert!(!effective(&s, &grant, &PolicyOverrides::default()).compliance_can_read);
        s.compliance_can_read = true;
        assert!(effective(&s, &grant, &PolicyOverrides::default()).compliance_can_read);
        let deny = PolicyOverrides {
            compliance_can_read: Some(false),
            ..Default::default()
        };
        assert!(!effective(&s, &grant, &deny).compliance_can_read);
    }

    #[test]
    fn overrides_that_loosen_are_refused_naming_the_field() {
        let tenant = PolicyOverrides {
            retention_ms: Some(DAY),
            allow_download: Some(false),
            max_payloads: Some(10),
            ..Default::default()
        };
        let e = effective(&server(), &tenant, &PolicyOverrides::default());
        let longer = PolicyOverrides {
            retention_ms: Some(2 * DAY),
            ..Default::default()
        };
        let err = check_overrides(&e, &longer).unwrap_err().to_string();
        assert!(
            err.starts_with("policy.retention: 2days would loosen"),
            "{err}"
        );
        let download = PolicyOverrides {
            allow_download: Some(true),
            ..Default::default()
        };
        let err = check_overrides(&e, &download).unwrap_err().to_string();
        assert!(err.starts_with("policy.allow_download"), "{err}");
        let more = PolicyOverrides {
            max_payloads: Some(11),
            ..Default::default()
        };
        let err = check_overrides(&e, &more).unwrap_err().to_string();
        assert!(err.starts_with("policy.max_payloads: 11"), "{err}");
        let stdout = PolicyOverrides {
            exec_ceiling: Some(ExecCeiling {
                timeout_ms: 0,
                memory_bytes: 0,
                max_stdout_bytes: ExecCeiling::CEILING.max_stdout_bytes + 1,
                fuel: 0,
            }),
            ..Default::default()
        };
        let err = check_overrides(&e, &stdout).unwrap_err().to_string();
        assert!(
            err.starts_with("policy.exec_ceiling.max_stdout_bytes"),
            "{err}"
        );
        let tighter = PolicyOverrides {
            retention_ms: Some(DAY / 2),
            allow_download: Some(false),
            max_payloads: Some(5),
            max_session_bytes: Some(0),
            delete_on_close: Some(true),
            redact: vec!["builtin:email".into()],
            ..Default::default()
        };
        check_overrides(&e, &tighter).unwrap();
        check_overrides(&e, &PolicyOverrides::default()).unwrap();
    }

    #[test]
    fn a_locked_policy_accepts_tightening_and_refuses_loosening_naming_the_field() {
        let old = PolicyOverrides {
            retention_ms: Some(7 * DAY),
            allow_exec: Some(false),
            max_payloads: Some(10),
            redact: vec!["builtin:email".into()],
            locked: true,
            ..Default::default()
        };
        let tighter = PolicyOverrides {
            retention_ms: Some(DAY),
            max_payloads: Some(3),
            allow_download: Some(false),
            redact: vec!["builtin:email".into(), "builtin:private_key".into()],
            ..old.clone()
        };
        check_locked(&old, &tighter).unwrap();
        check_locked(&old, &old).unwrap();

        let cases: Vec<(PolicyOverrides, &str)> = vec![
            (
                PolicyOverrides {
                    retention_ms: Some(30 * DAY),
                    ..old.clone()
                },
                "policy.retention: 30days would loosen the locked tenant policy (7days); a locked policy can only be tightened",
            ),
            (
                PolicyOverrides {
                    retention_ms: None,
                    ..old.clone()
                },
                "policy.retention: unset would loosen",
            ),
            (
                PolicyOverrides {
                    allow_exec: Some(true),
                    ..old.clone()
                },
                "policy.allow_exec: true would loosen",
            ),
            (
                PolicyOverrides {
                    max_payloads: Some(0),
                    ..old.clone()
                },
                "policy.max_payloads: no quota would loosen",
            ),
            (
                PolicyOverrides {
                    redact: vec![],
                    ..old.clone()
                },
                "policy.redact: dropping rule \"builtin:email\"",
            ),
            (
                PolicyOverrides {
                    locked: false,
                    ..old.clone()
                },
                "policy.locked: false would loosen",
            ),
        ];
        for (new, want) in cases {
            let err = check_locked(&old, &new).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err}\nwanted: {want}");
        }
    }

    #[test]
    fn an_unlocked_policy_may_change_freely() {
        let old = PolicyOverrides {
            retention_ms: Some(DAY),
            ..Default::default()
        };
        check_locked(&old, &PolicyOverrides::default()).unwrap();
    }

    #[test]
    fn validation_refuses_zero_durations_bad_regexes_and_locked_sessions() {
        let zero = PolicyOverrides {
            retention_ms: Some(0),
            ..Default::default()
        };
        assert!(
            validate(&zero, true)
                .unwrap_err()
                .to_string()
                .starts_with("policy.retention")
        );
        let bad = PolicyOverrides {
            redact: vec!["(unclosed".into()],
            ..Default::default()
        };
        let err = validate(&bad, true).unwrap_err().to_string();
        assert!(err.starts_with("policy.redact: redaction rule 0"), "{err}");
        let locked = PolicyOverrides {
            locked: true,
            ..Default::default()
        };
        validate(&locked, true).unwrap();
        assert!(validate(&locked, false).is_err());
    }
}
