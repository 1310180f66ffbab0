//! The policy's data, from ONE field list (the `policy_fields!` macro below): a complete
//! policy ([`Policy`]), one level as stored ([`PolicyOverrides`], every
//! field optional), the `[policy]` config section ([`PolicyDefaults`]),
//! their merge (strictest wins), validation, tighten-only checks and a
//! field-name table.
//!
//! Adding a policy field is one line in the list (its name, its stored
//! name, its [`super::kinds`] kind, its config serde attributes and its
//! default), plus its proto field and conversion. Stored records and config
//! files keep their serialized forms: the stored names (`retention_ms`),
//! the config names (`retention`, humantime) and the field order are those
//! of the structs written out by hand before.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::PolicyError;
use super::ceiling::ExecCeiling;
use super::kinds::{Age, Ceiling, Check, Flag, Kind, Mode, Quota, Rules};

/// Generates everything per policy field from the list below; each entry is
/// `docs name / stored_name: Kind [config serde attributes] = default;`.
macro_rules! policy_fields {
    ($(
        $(#[doc = $doc:expr])*
        $name:ident / $stored:ident : $kind:ty [$($cfg:meta),*] = $default:expr;
    )*) => {
        /// A complete policy: the server default, or a session's effective
        /// policy.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Policy {
            $(
                $(#[doc = $doc])*
                pub $name: <$kind as Kind>::Value,
            )*
            /// Whether the tenant policy is locked.
            pub locked: bool,
        }

        /// One level of policy: a tenant's policy as set, or a session's
        /// overrides as asked for at creation. Absent values (and zero
        /// quotas or exec-ceiling fields) defer to the other levels;
        /// [`super::effective`] merges the levels into the effective policy.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
        #[serde(default)]
        pub struct PolicyOverrides {
            $(
                $(#[doc = $doc])*
                pub $stored: <$kind as Kind>::Level,
            )*
            /// A locked tenant policy can only be tightened (tenant level
            /// only).
            pub locked: bool,
        }

        /// The `[policy]` section: the server default policy.
        #[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields, default)]
        pub struct PolicyDefaults {
            $(
                $(#[doc = $doc])*
                $(#[$cfg])*
                pub $name: <$kind as Kind>::Value,
            )*
        }

        impl Default for PolicyDefaults {
            fn default() -> Self {
                Self {
                    $($name: $default,)*
                }
            }
        }

        /// The policy fields by name, in the order checks report them
        /// (`locked` last).
        pub const FIELDS: &[&str] = &[$(stringify!($name),)* "locked"];

        impl Policy {
            /// The server default, from the `[policy]` section.
            pub fn server_default(d: &PolicyDefaults) -> Policy {
                Policy {
                    $($name: d.$name.clone(),)*
                    locked: false,
                }
            }

            /// This policy made stricter by one level.
            pub fn tightened_by(mut self, level: &PolicyOverrides) -> Policy {
                $(self.$name = <$kind as Kind>::tighten(self.$name, &level.$stored);)*
                self
            }
        }

        /// Two levels combined into one that is as strict as both: how a
        /// sub-agent session's overrides add to the parent's it inherits.
        pub fn combine(a: &PolicyOverrides, b: &PolicyOverrides) -> PolicyOverrides {
            PolicyOverrides {
                $($stored: <$kind as Kind>::combine(&a.$stored, &b.$stored),)*
                locked: a.locked || b.locked,
            }
        }

        /// Checks each field of one level on its own, in list order.
        pub(super) fn validate_fields(level: &PolicyOverrides) -> Result<(), PolicyError> {
            $(<$kind as Kind>::validate(concat!("policy.", stringify!($name)), &level.$stored)?;)*
            Ok(())
        }

        /// Refuses session overrides that would loosen `effective`, naming
        /// the first such field.
        pub(super) fn check_against_policy(
            check: &Check,
            effective: &Policy,
            o: &PolicyOverrides,
        ) -> Result<(), PolicyError> {
            debug_assert_eq!(check.mode, Mode::Overrides);
            $(<$kind as Kind>::check(
                check,
                concat!("policy.", stringify!($name)),
                <$kind as Kind>::current_of_value(&effective.$name),
                &o.$stored,
            )?;)*
            Ok(())
        }

        /// Refuses a level that would loosen the level `old`, naming the
        /// first such field (`locked` is the caller's).
        pub(super) fn check_against_level(
            check: &Check,
            old: &PolicyOverrides,
            new: &PolicyOverrides,
        ) -> Result<(), PolicyError> {
            $(<$kind as Kind>::check(
                check,
                concat!("policy.", stringify!($name)),
                <$kind as Kind>::current_of_level(&old.$stored),
                &new.$stored,
            )?;)*
            Ok(())
        }
    };
}

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

policy_fields! {
    /// Maximum payload age (default 7 days).
    retention / retention_ms: Age [serde(with = "humantime_serde")] = WEEK;
    /// Maximum session age (default 7 days).
    session_ttl / session_ttl_ms: Age [serde(with = "humantime_serde")] = WEEK;
    /// Byte quota of a session; 0 = none (default).
    max_session_bytes / max_session_bytes: Quota [] = 0;
    /// Largest payload; 0 = none beyond `limits.max_payload_bytes` (default).
    max_payload_bytes / max_payload_bytes: Quota [] = 0;
    /// Payload count quota of a session; 0 = none (default).
    max_payloads / max_payloads: Quota [] = 0;
    /// Delete a session's payloads when it is closed (default false).
    delete_on_close / delete_on_close: Flag<true> [] = false;
    /// Whether raw bytes may be downloaded, and read beyond the preview size
    /// (default true).
    allow_download / allow_download: Flag<false> [] = true;
    /// Whether scripts may run (default true).
    allow_exec / allow_exec: Flag<false> [] = true;
    /// Whether compliance principals may read content (default false). The
    /// effective policy ANDs the levels, so a tenant can grant it only where
    /// the server default does.
    compliance_can_read / compliance_can_read: Flag<false> [] = false;
    /// The most any exec may ask for (default 5 min, 4 GiB, 64 MiB stdout);
    /// a zero field sets no ceiling at that level.
    exec_ceiling / exec_ceiling: Ceiling [] = ExecCeiling::CEILING;
    /// Redaction rules (default none); every level's rules apply.
    redact / redact: Rules [] = Vec::new();
}
