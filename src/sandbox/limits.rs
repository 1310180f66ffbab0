//! Exec limits: what a request asks for, the defaults when it asks for
//! nothing, and the ceiling nothing may exceed.
//!
//! Zero in a request means "the default". A request above the ceiling is
//! clamped, and the clamp is reported in words so the model knows it ran
//! with less than it asked for.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A set of limits; in requests, zero means "the default", in a ceiling
/// (a policy level stores one as this type), "no ceiling of its own".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecLimits {
    /// Wall-clock time, in milliseconds.
    pub timeout_ms: u64,
    /// Linear memory, summed over the guest's memories.
    pub memory_bytes: u64,
    /// Bytes of stdout kept.
    pub max_stdout_bytes: u64,
    /// Fuel units (instructions, roughly); zero means no fuel metering.
    pub fuel: u64,
}

impl Default for ExecLimits {
    fn default() -> Self {
        Self::DEFAULTS
    }
}

impl ExecLimits {
    /// What a request that names no limits gets.
    pub const DEFAULTS: ExecLimits = ExecLimits {
        timeout_ms: 30_000,
        memory_bytes: 512 << 20,
        max_stdout_bytes: 1 << 20,
        fuel: 0,
    };

    /// The default tenant ceiling of the contract: 5 min, 4 GiB, 64 MiB.
    pub const CEILING: ExecLimits = ExecLimits {
        timeout_ms: 300_000,
        memory_bytes: 4 << 30,
        max_stdout_bytes: 64 << 20,
        fuel: 1_000_000_000_000_000,
    };

    /// Every field zero: in a request, all defaults; in a policy level, no
    /// ceiling of its own.
    pub const ZERO: ExecLimits = ExecLimits {
        timeout_ms: 0,
        memory_bytes: 0,
        max_stdout_bytes: 0,
        fuel: 0,
    };

    /// The timeout as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The field-wise minimum (the stricter of two ceilings). A zero field
    /// means "no ceiling of its own".
    pub fn stricter(self, other: ExecLimits) -> ExecLimits {
        fn min(a: u64, b: u64) -> u64 {
            match (a, b) {
                (0, b) => b,
                (a, 0) => a,
                (a, b) => a.min(b),
            }
        }
        ExecLimits {
            timeout_ms: min(self.timeout_ms, other.timeout_ms),
            memory_bytes: min(self.memory_bytes, other.memory_bytes),
            max_stdout_bytes: min(self.max_stdout_bytes, other.max_stdout_bytes),
            fuel: min(self.fuel, other.fuel),
        }
    }
}

/// Limits after defaults and clamping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What the script runs with.
    pub limits: ExecLimits,
    /// One line per clamped field, e.g. `timeout_ms: 600000 -> 300000`.
    pub clamped: Vec<String>,
}

/// Applies `defaults` to the zero fields of `requested`, then clamps every
/// field to `ceiling`. Defaults are clamped too, silently: a ceiling below
/// the default is the operator's choice, not the caller's request.
pub fn resolve(requested: ExecLimits, defaults: ExecLimits, ceiling: ExecLimits) -> Resolved {
    let mut clamped = Vec::new();
    let mut field = |name: &str, asked: u64, default: u64, max: u64| -> u64 {
        if asked == 0 {
            return default.min(max);
        }
        if asked > max {
            clamped.push(format!("{name}: {asked} -> {max}"));
            return max;
        }
        asked
    };
    let limits = ExecLimits {
        timeout_ms: field(
            "timeout_ms",
            requested.timeout_ms,
            defaults.timeout_ms,
            ceiling.timeout_ms,
        ),
        memory_bytes: field(
            "memory_bytes",
            requested.memory_bytes,
            defaults.memory_bytes,
            ceiling.memory_bytes,
        ),
        max_stdout_bytes: field(
            "max_stdout_bytes",
            requested.max_stdout_bytes,
            defaults.max_stdout_bytes,
            ceiling.max_stdout_bytes,
        ),
        fuel: field("fuel", requested.fuel, 0, ceiling.fuel),
    };
    Resolved { limits, clamped }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: ExecLimits = ExecLimits::ZERO;

    #[test]
    fn zero_fields_take_the_defaults_without_a_clamp_note() {
        let r = resolve(ZERO, ExecLimits::DEFAULTS, ExecLimits::CEILING);
        assert_eq!(r.limits, ExecLimits::DEFAULTS);
        assert!(r.clamped.is_empty());
    }

    #[test]
    fn requests_above_the_ceiling_are_clamped_and_reported() {
        let asked = ExecLimits {
            timeout_ms: 600_000,
            memory_bytes: 1 << 20,
            ..ZERO
        };
        let r = resolve(asked, ExecLimits::DEFAULTS, ExecLimits::CEILING);
        assert_eq!(r.limits.timeout_ms, 300_000);
        assert_eq!(r.limits.memory_bytes, 1 << 20);
        assert_eq!(r.clamped, vec!["timeout_ms: 600000 -> 300000".to_owned()]);
    }

    #[test]
    fn a_ceiling_below_the_default_lowers_the_default() {
        let ceiling = ExecLimits {
            timeout_ms: 5_000,
            ..ExecLimits::CEILING
        };
        let r = resolve(ZERO, ExecLimits::DEFAULTS, ceiling);
        assert_eq!(r.limits.timeout_ms, 5_000);
        assert!(r.clamped.is_empty());
    }

    #[test]
    fn stricter_takes_the_smaller_nonzero_field() {
        let a = ExecLimits {
            timeout_ms: 10,
            memory_bytes: 0,
            ..ExecLimits::CEILING
        };
        let s = a.stricter(ExecLimits::CEILING);
        assert_eq!(s.timeout_ms, 10);
        assert_eq!(s.memory_bytes, ExecLimits::CEILING.memory_bytes);
    }
}
