//! The policy's data: one level as stored ([`PolicyOverrides`]), the
//! `[policy]` config section ([`PolicyDefaults`]) and the exec ceiling a
//! policy carries ([`ExecCeiling`]). Stored records and config files hold
//! these, so their serialized forms stay as they are.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most an exec may ask for, as a policy level stores it; a zero field
/// sets no ceiling at that level. The sandbox has its own runtime type
/// ([`crate::sandbox::limits::ExecLimits`]); [`From`] converts, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecCeiling {
    /// Wall-clock time, in milliseconds.
    pub timeout_ms: u64,
    /// Linear memory, summed over the guest's memories.
    pub memory_bytes: u64,
    /// Bytes of stdout kept.
    pub max_stdout_bytes: u64,
    /// Fuel units (instructions, roughly); zero means no fuel metering.
    pub fuel: u64,
}

impl Default for ExecCeiling {
    /// The sandbox's request defaults: what a field missing from a stored
    /// or configured ceiling has always decoded as.
    fn default() -> Self {
        Self {
            timeout_ms: 30_000,
            memory_bytes: 512 << 20,
            max_stdout_bytes: 1 << 20,
            fuel: 0,
        }
    }
}

impl ExecCeiling {
    /// The default tenant ceiling of the contract: 5 min, 4 GiB, 64 MiB.
    pub const CEILING: ExecCeiling = ExecCeiling {
        timeout_ms: 300_000,
        memory_bytes: 4 << 30,
        max_stdout_bytes: 64 << 20,
        fuel: 1_000_000_000_000_000,
    };

    /// Every field zero: no ceiling of its own at this level.
    pub const ZERO: ExecCeiling = ExecCeiling {
        timeout_ms: 0,
        memory_bytes: 0,
        max_stdout_bytes: 0,
        fuel: 0,
    };

    /// The field-wise minimum (the stricter of two ceilings). A zero field
    /// means "no ceiling of its own".
    pub fn stricter(self, other: ExecCeiling) -> ExecCeiling {
        fn min(a: u64, b: u64) -> u64 {
            match (a, b) {
                (0, b) => b,
                (a, 0) => a,
                (a, b) => a.min(b),
            }
        }
        ExecCeiling {
            timeout_ms: min(self.timeout_ms, other.timeout_ms),
            memory_bytes: min(self.memory_bytes, other.memory_bytes),
            max_stdout_bytes: min(self.max_stdout_bytes, other.max_stdout_bytes),
            fuel: min(self.fuel, other.fuel),
        }
    }
}

impl From<ExecCeiling> for crate::sandbox::limits::ExecLimits {
    fn from(c: ExecCeiling) -> Self {
        Self {
            timeout_ms: c.timeout_ms,
            memory_bytes: c.memory_bytes,
            max_stdout_bytes: c.max_stdout_bytes,
            fuel: c.fuel,
        }
    }
}

/// One level of policy: a tenant's policy as set, or a session's overrides
/// as asked for at creation. Absent values (and zero quotas or exec-ceiling
/// fields) defer to the other levels; [`crate::policy`] merges the levels
/// into the effective policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct PolicyOverrides {
    /// Maximum payload age.
    pub retention_ms: Option<u64>,
    /// Maximum session age.
    pub session_ttl_ms: Option<u64>,
    /// Byte quota of the session.
    pub max_session_bytes: Option<u64>,
    /// Largest payload.
    pub max_payload_bytes: Option<u64>,
    /// Payload count quota.
    pub max_payloads: Option<u64>,
    /// Delete the session's payloads when it is closed.
    pub delete_on_close: Option<bool>,
    /// Whether raw bytes may be downloaded.
    pub allow_download: Option<bool>,
    /// Whether scripts may run.
    pub allow_exec: Option<bool>,
    /// Whether compliance principals may read content.
    pub compliance_can_read: Option<bool>,
    /// Exec ceiling; a zero field sets no ceiling at this level.
    pub exec_ceiling: Option<ExecCeiling>,
    /// Redaction rules, added to the other levels' rules.
    pub redact: Vec<String>,
    /// A locked tenant policy can only be tightened (tenant level only).
    pub locked: bool,
}

/// The `[policy]` section: the server default policy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyDefaults {
    /// Maximum payload age (default 7 days).
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Maximum session age (default 7 days).
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Byte quota of a session; 0 = none (default).
    pub max_session_bytes: u64,
    /// Largest payload; 0 = none beyond `limits.max_payload_bytes` (default).
    pub max_payload_bytes: u64,
    /// Payload count quota of a session; 0 = none (default).
    pub max_payloads: u64,
    /// Delete a session's payloads when it is closed (default false).
    pub delete_on_close: bool,
    /// Whether raw bytes may be downloaded, and read beyond the preview size
    /// (default true).
    pub allow_download: bool,
    /// Whether scripts may run (default true).
    pub allow_exec: bool,
    /// Whether compliance principals may read content (default false). The
    /// effective policy ANDs the levels, so a tenant can grant it only where
    /// this is true.
    pub compliance_can_read: bool,
    /// The most any exec may ask for (default 5 min, 4 GiB, 64 MiB stdout).
    pub exec_ceiling: ExecCeiling,
    /// Redaction rules every session gets (default none).
    pub redact: Vec<String>,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(7 * 24 * 3600),
            session_ttl: Duration::from_secs(7 * 24 * 3600),
            max_session_bytes: 0,
            max_payload_bytes: 0,
            max_payloads: 0,
            delete_on_close: false,
            allow_download: true,
            allow_exec: true,
            compliance_can_read: false,
            exec_ceiling: ExecCeiling::CEILING,
            redact: Vec::new(),
        }
    }
}

