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

use crate::redact::Redactor;

mod ceiling;
mod kinds;
mod levels;

pub use ceiling::ExecCeiling;
use kinds::{Check, Mode};
pub use levels::{FIELDS, Policy, PolicyDefaults, PolicyOverrides, combine};

/// The longest retention or TTL a policy may name (100 years).
pub(crate) const MAX_DURATION_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

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

/// The effective policy of a session: the strictest of the server default,
/// the tenant's policy and the session's overrides; `locked` is the tenant's.
pub fn effective(server: &Policy, tenant: &PolicyOverrides, session: &PolicyOverrides) -> Policy {
    let mut p = server.clone().tightened_by(tenant).tightened_by(session);
    p.locked = tenant.locked;
    p
}

/// Checks the values of one level on their own: positive durations within
/// bounds, redaction rules that compile, no `locked` on a session.
pub fn validate(level: &PolicyOverrides, is_tenant: bool) -> Result<(), PolicyError> {
    levels::validate_fields(level)?;
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
    let check = Check {
        mode: Mode::Overrides,
        what: "tenant's effective policy",
        rule: "session overrides can only tighten it",
    };
    levels::check_against_policy(&check, effective, o)
}

/// Refuses a new tenant policy that would loosen a locked one, naming the
/// first looser field. Here an absent value is looser than a present one:
/// it would hand the decision back to the server default.
pub fn check_locked(old: &PolicyOverrides, new: &PolicyOverrides) -> Result<(), PolicyError> {
    if !old.locked {
        return Ok(());
    }
    let check = Check {
        mode: Mode::Locked,
        what: "locked tenant policy",
        rule: "a locked policy can only be tightened",
    };
    levels::check_against_level(&check, old, new)?;
    if !new.locked {
        return Err(check.loosens("policy.locked", "false".into(), "true".into()));
    }
    Ok(())
}

/// A duration in milliseconds as humans write it (`7days`, `1h 30m`).
pub fn fmt_ms(ms: u64) -> String {
    fmt_duration(Duration::from_millis(ms))
}

pub(crate) fn fmt_duration(d: Duration) -> String {
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
    fn stored_levels_keep_their_encoding_field_for_field() {
        let level = PolicyOverrides {
            retention_ms: Some(DAY),
            max_payloads: Some(3),
            allow_exec: Some(false),
            exec_ceiling: Some(ExecCeiling {
                timeout_ms: 1000,
                ..ExecCeiling::ZERO
            }),
            redact: vec!["builtin:email".into()],
            locked: true,
            ..Default::default()
        };
        let json = serde_json::to_string(&level).unwrap();
        assert_eq!(
            json,
            r#"{"retention_ms":86400000,"session_ttl_ms":null,"max_session_bytes":null,"max_payload_bytes":null,"max_payloads":3,"delete_on_close":null,"allow_download":null,"allow_exec":false,"compliance_can_read":null,"exec_ceiling":{"timeout_ms":1000,"memory_bytes":0,"max_stdout_bytes":0,"fuel":0},"redact":["builtin:email"],"locked":true}"#
        );
        assert_eq!(
            serde_json::from_str::<PolicyOverrides>(&json).unwrap(),
            level
        );
        // Older records leave fields out; a missing ceiling field decodes
        // as it always did.
        let old: PolicyOverrides =
            serde_json::from_str(r#"{"retention_ms":5,"exec_ceiling":{"timeout_ms":7}}"#).unwrap();
        assert_eq!(old.retention_ms, Some(5));
        assert_eq!(old.exec_ceiling.unwrap().timeout_ms, 7);
        assert_eq!(old.exec_ceiling.unwrap().memory_bytes, 512 << 20);
        assert!(old.redact.is_empty() && !old.locked);
    }

    #[test]
    fn the_field_table_names_every_field_once_locked_last() {
        assert_eq!(FIELDS.len(), 12);
        assert_eq!(FIELDS.first(), Some(&"retention"));
        assert_eq!(FIELDS.last(), Some(&"locked"));
        let unique: std::collections::BTreeSet<_> = FIELDS.iter().collect();
        assert_eq!(unique.len(), FIELDS.len());
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
